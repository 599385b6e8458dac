# One measurement of the three per-line benchmarks, in this VM, on the Nx
# this project is compiled with: bench/nx_lines_bench.sh runs it once per
# line and round, each in a fresh process, and prints the table.
#
#   * first call - the MLP training step's first call (bench/support/mlp.exs,
#     inputs already on the device, no compile cache): evaluation, lowering,
#     compile and the first run, until the loss is read;
#   * MLP step - a cached call of that step (median of rounds of 50);
#   * tiny call - a cached jitted add of a 3-element tensor already on the
#     device, waiting for its result (median of rounds of 20,000).
#
# Prints one line: `line first_call_ms mlp_step_ms tiny_call_us`.
Code.require_file("support/mlp.exs", __DIR__)
Code.require_file("support/timing.exs", __DIR__)

defmodule NxLinesBench do
  def per_call_us(n, fun) do
    for _ <- 1..div(n, 10), do: fun.()

    BenchTiming.median(
      for _ <- 1..7 do
        {us, _} = :timer.tc(fn -> Enum.each(1..n, fn _ -> fun.() end) end)
        us / n
      end
    )
  end

  def wait(%Nx.Tensor{data: %EXLA.Backend{buffer: buffer}}), do: EXLA.DeviceBuffer.await([buffer])
end

alias CompilerBench.MLP

{params, x, y} = MLP.pattern_inputs(EXLA.Backend)
step = EXLA.jit(&MLP.step/3, cache: false)

{first_us, _} =
  :timer.tc(fn ->
    {_params, loss} = step.(params, x, y)
    Nx.to_number(loss)
  end)

step = EXLA.jit(&MLP.step/3)
mlp_us = NxLinesBench.per_call_us(50, fn -> step.(params, x, y) |> elem(1) |> Nx.to_number() end)

t = Nx.tensor([1.0, 2.0, 3.0], backend: EXLA.Backend)
add = EXLA.jit(fn a -> Nx.add(a, a) end)
tiny_us = NxLinesBench.per_call_us(20_000, fn -> NxLinesBench.wait(add.(t)) end)

IO.puts(
  Enum.join(
    [
      EXLA.NxVersion.version(),
      Float.round(first_us / 1000, 1),
      Float.round(mlp_us / 1000, 3),
      Float.round(tiny_us, 2)
    ],
    " "
  )
)
