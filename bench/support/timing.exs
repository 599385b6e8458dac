# Timing helpers that every bench shares (load with
# `Code.require_file("support/timing.exs", __DIR__)`).
defmodule BenchTiming do
  @doc "The median of a non-empty list (its upper middle for an even length)."
  def median(list), do: list |> Enum.sort() |> Enum.at(div(length(list), 2))

  @doc """
  Times `fun` by the wall clock: after `iterations / 10` warm-up calls,
  `rounds` rounds of `iterations` calls in a tight loop; prints and returns
  the median over the rounds of the mean time of one call (µs).
  """
  def measure(name, iterations, fun, rounds) do
    loop(fun, max(div(iterations, 10), 1))

    times =
      for _ <- 1..rounds do
        {us, _} = :timer.tc(fn -> loop(fun, iterations) end)
        us / iterations
      end

    median = median(times)
    value = :erlang.float_to_binary(median / 1, decimals: 3)
    IO.puts(String.pad_trailing(name, 44) <> String.pad_leading(value, 12) <> " µs")
    median
  end

  @doc "Calls `fun` `n` times."
  def loop(_fun, 0), do: :ok

  def loop(fun, n) do
    fun.()
    loop(fun, n - 1)
  end

  @doc "Waits for the result of an EXLA.Backend tensor (others are ready)."
  def wait(%Nx.Tensor{data: %EXLA.Backend{buffer: buffer}}), do: EXLA.DeviceBuffer.await([buffer])
  def wait(%Nx.Tensor{}), do: :ok

  @doc "Prints `a / b`."
  def ratio(name, a, b), do: IO.puts("#{name}: #{Float.round(a / b, 2)}x")

  @doc """
  The per-call floor of a tiny program: the executable that EXLA compiles
  for `x + x` on f32[3], run directly on an EXLA.Backend tensor `x`.
  Returns `{x, add, run}`, where `add` is that function and `run` one
  run of the executable, waiting for its result.
  """
  def add_floor do
    x = Nx.tensor([1.0, 2.0, 3.0], backend: EXLA.Backend)
    add = fn x -> Nx.add(x, x) end
    %{mlir_module: mlir} = EXLA.to_mlir_module(add, [x])
    client = EXLA.Client.fetch!(EXLA.Client.default_name())
    exe = EXLA.Executable.compile(client, mlir)
    buffer = x.data.buffer

    run = fn ->
      [[out]] = EXLA.Executable.run(exe, [[buffer]])
      EXLA.DeviceBuffer.await([out])
    end

    {x, add, run}
  end
end
