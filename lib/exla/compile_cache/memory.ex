defmodule EXLA.CompileCache.Memory do
  @moduledoc false
  # The executables of this VM by program text: a program whose MLIR is
  # the same as one compiled before (on the same client and device, with
  # the same replicas and partitions) gets that executable instead of a new
  # compile. The plugin's compile is a function of exactly those (and of
  # the client's XLA options and the process's XLA_FLAGS, fixed for a
  # client), so the executable is the one a compile would give, and runs
  # give the same bits; the disk cache relies on the same fact.
  #
  # The jit, stream and EXLA.Backend caches are keyed by what the program
  # is made from (the function, the operation and its arguments, the
  # options); many different keys lower to one text (a closure made anew
  # for each call, an operation reached with equivalent static arguments, a
  # jitted function of one operation and that operation on EXLA.Backend),
  # and each paid a compile.
  #
  # At most `@capacity` executables are kept, the oldest dropped first
  # (they live on as long as a cached program holds them). Reads go to an
  # ETS table; this process is the only writer.
  use GenServer

  @table __MODULE__
  @capacity 512

  def start_link(_opts), do: GenServer.start_link(__MODULE__, :ok, name: __MODULE__)

  @doc """
  As `EXLA.CompileCache.compile/4`, but with `cache: true` it first looks
  for the executable of the same program here (the status is then
  `:memory`), and keeps what it returns. `cache: false` keeps nothing and
  a file path asks for that file to be read or written, so these only
  call that.
  """
  def compile(client, program, opts, cache) when cache != true,
    do: EXLA.CompileCache.compile(client, program, opts, cache)

  def compile(client, program, opts, cache) do
    case get(client, program, opts) do
      nil ->
        {executable, status} = EXLA.CompileCache.compile(client, program, opts, cache)
        put(client, program, opts, executable)
        {executable, status}

      executable ->
        {executable, :memory}
    end
  end

  @doc """
  The executable kept for `program` compiled for `client` with `opts` (those
  of `EXLA.Executable.compile/3`), or nil.
  """
  def get(client, program, opts) do
    case :ets.lookup(@table, key(client, program, opts)) do
      [{_key, executable}] -> executable
      [] -> nil
    end
  rescue
    # The table is not there (EXLA's application is not started).
    ArgumentError -> nil
  end

  @doc "Keeps `executable`, compiled from `program` for `client` with `opts`."
  def put(client, program, opts, executable) do
    GenServer.cast(__MODULE__, {:put, key(client, program, opts), executable})
  end

  @doc """
  Forgets every executable kept here: later compiles go to the disk cache
  or the plugin again (what a measurement of compile times needs), and the
  executables that no cached program still holds are freed.
  """
  def clear, do: GenServer.call(__MODULE__, :clear)

  defp key(client, %EXLA.MLIR.Program{text: text}, opts) do
    {client.ref, opts[:device_id] || client.default_device_id, opts[:num_replicas] || 1,
     opts[:num_partitions] || 1, opts[:partitioner] || :gspmd, :crypto.hash(:sha256, text)}
  end

  @impl true
  def init(:ok) do
    :ets.new(@table, [:named_table, :protected, :set, read_concurrency: true])
    {:ok, :queue.new()}
  end

  @impl true
  def handle_call(:clear, _from, _order) do
    :ets.delete_all_objects(@table)
    {:reply, :ok, :queue.new()}
  end

  @impl true
  def handle_cast({:put, key, executable}, order) do
    if :ets.insert_new(@table, {key, executable}) do
      {:noreply, trim(:queue.in(key, order))}
    else
      {:noreply, order}
    end
  end

  defp trim(order) do
    if :queue.len(order) > @capacity do
      {{:value, oldest}, order} = :queue.out(order)
      :ets.delete(@table, oldest)
      order
    else
      order
    end
  end
end
