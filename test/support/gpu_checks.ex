defmodule EXLA.GPUChecks do
  @moduledoc false
  # What the :cuda tests (test/exla/gpu_test.exs) run, on this node or on
  # peer nodes that each have a CUDA client of their own options: functions
  # of a test module cannot run on a peer, those of this module can.

  @mib 1024 * 1024

  @doc """
  The memory in use on GPU 0 and its total, in bytes, as `nvidia-smi`
  reports them (it counts every process's memory, in MiB).
  """
  def nvidia_smi_memory do
    {out, 0} =
      System.cmd("nvidia-smi", [
        "--query-gpu=memory.used,memory.total",
        "--format=csv,noheader,nounits",
        "--id=0"
      ])

    [used, total] =
      out |> String.trim() |> String.split(",") |> Enum.map(&String.to_integer(String.trim(&1)))

    %{used: used * @mib, total: total * @mib}
  end

  @doc "Creates the :cuda client; returns its platform and device count."
  def start_client do
    client = EXLA.Client.fetch!(:cuda)
    {client.platform, client.device_count}
  end

  @doc "The memory statistics of the :cuda client."
  def stats, do: EXLA.Client.get_memory_statistics(:cuda)

  @doc """
  An f32 tensor of ones of `bytes` bytes, computed on the :cuda client's
  device (only a scalar is transferred).
  """
  def ones(bytes) do
    Nx.broadcast(Nx.tensor(1.0, type: :f32, backend: {EXLA.Backend, client: :cuda}), {
      div(bytes, 4)
    })
  end

  @doc """
  `ones/1`, or `{:error, exception}` where it raises; the
  exception is returned, so the caller sees its module and message.
  """
  def try_ones(bytes) do
    t = ones(bytes)
    # Reading one element waits for the program that made the tensor.
    {:ok, Nx.to_number(t[0])}
  rescue
    e -> {:error, e}
  end

  @doc "A small computation on the :cuda client: the sum of 0..999."
  def small_sum do
    Nx.iota({1000}, type: :s64, backend: {EXLA.Backend, client: :cuda})
    |> Nx.sum()
    |> Nx.to_number()
  end

  @doc """
  A straight-line program of `n` chained `size`×`size` matrix products,
  jitted on the :cuda client. Every product of ones divided by `size` is
  ones again, so the result is ones.
  """
  def chained_products(n, size) do
    EXLA.jit(
      fn x -> Enum.reduce(1..n, x, fn _, acc -> Nx.divide(Nx.dot(acc, x), size) end) end,
      client: :cuda
    )
  end

  @doc """
  Times a call of `chained_products/2` (compiled and run once before)
  until it returns, and until its result's sum is read. Returns
  `{call_us, total_us, sum}`.
  """
  def time_dispatch(n, size) do
    fun = chained_products(n, size)
    x = Nx.reshape(ones(size * size * 4), {size, size})
    fun.(x) |> Nx.sum() |> Nx.to_number()

    start = System.monotonic_time(:microsecond)
    y = fun.(x)
    returned = System.monotonic_time(:microsecond)
    sum = y |> Nx.sum() |> Nx.to_number()
    finished = System.monotonic_time(:microsecond)
    {returned - start, finished - start, sum}
  end

  @doc """
  Runs `rounds` times a program on the :cuda client and checks each
  result against Nx.BinaryBackend's (integers, so exactly); returns the
  number of correct results.
  """
  def run_rounds(rounds, seed) do
    fun = EXLA.jit(fn x -> Nx.sum(Nx.multiply(x, x)) end, client: :cuda)
    x = Nx.iota({256, 256}, type: :s64, backend: {EXLA.Backend, client: :cuda})
    x = Nx.add(x, seed)
    host = Nx.backend_copy(x, Nx.BinaryBackend)
    expected = Nx.to_number(Nx.sum(Nx.multiply(host, host)))
    Enum.count(1..rounds, fn _ -> Nx.to_number(fun.(x)) == expected end)
  end
end
