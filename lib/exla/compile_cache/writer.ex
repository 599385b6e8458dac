defmodule EXLA.CompileCache.Writer do
  @moduledoc false
  # Writes new executables to the compile cache directory in the
  # background, one at a time, so that the compile that made one returns
  # without waiting for its serialization (a job of the plugin's compile
  # threads, queued behind the compiles of other processes) and its file.
  # Measured on Scholar's suite with an empty cache directory, writing in
  # the caller cost 40% as much as compiling (`bench/scholar_bench.md`).
  #
  # A program a VM asks for again meanwhile is served from memory (see
  # `EXLA.CompileCache.Memory`) or compiled again; a VM that ends first
  # leaves the write undone (or a temporary file, removed later by a trim),
  # which costs the next VM a compile and nothing else.
  use GenServer
  require Logger

  def start_link(_opts), do: GenServer.start_link(__MODULE__, :ok, name: __MODULE__)

  @doc """
  Runs `write` (a function of no arguments) in the background, or here
  when this process is not running.
  """
  def write(write) do
    case GenServer.whereis(__MODULE__) do
      nil -> write.()
      pid -> GenServer.cast(pid, {:write, write})
    end

    :ok
  end

  @doc "Waits until the writes this process asked for before are done."
  def flush do
    if GenServer.whereis(__MODULE__), do: GenServer.call(__MODULE__, :flush, :infinity)
    :ok
  end

  @impl true
  def init(:ok), do: {:ok, nil}

  @impl true
  def handle_cast({:write, write}, state) do
    write.()
    {:noreply, state}
  catch
    kind, reason ->
      Logger.warning(
        "EXLA's compile cache could not write a program: " <>
          Exception.format(kind, reason, __STACKTRACE__)
      )

      {:noreply, state}
  end

  @impl true
  def handle_call(:flush, _from, state), do: {:reply, :ok, state}
end
