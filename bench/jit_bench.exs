# Per-call cost of cached EXLA functions against the raw execute floor.
#
#     MIX_ENV=prod mix run bench/jit_bench.exs
#
# Every number is the median, over several rounds, of the mean time of one
# call (including waiting for its result) in a tight loop.
defmodule JitBench do
  @rounds 7

  def measure(name, iterations, fun) do
    for _ <- 1..div(iterations, 10), do: fun.()

    times =
      for _ <- 1..@rounds do
        {us, _} = :timer.tc(fn -> loop(fun, iterations) end)
        us / iterations
      end

    median = times |> Enum.sort() |> Enum.at(div(@rounds, 2))

    value = :erlang.float_to_binary(median / 1, decimals: 3)
    IO.puts(String.pad_trailing(name, 44) <> String.pad_leading(value, 12) <> " µs")

    median
  end

  defp loop(_fun, 0), do: :ok

  defp loop(fun, n) do
    fun.()
    loop(fun, n - 1)
  end

  def wait(%Nx.Tensor{data: %EXLA.Backend{buffer: buffer}}), do: EXLA.DeviceBuffer.await([buffer])
end

n = 20_000
x = Nx.tensor([1.0, 2.0, 3.0], backend: EXLA.Backend)
add = fn x -> Nx.add(x, x) end

# The floor: the executable EXLA compiles for x + x, run directly.
%{mlir_module: mlir} = EXLA.to_mlir_module(add, [x])
client = EXLA.Client.fetch!(EXLA.Client.default_name())
exe = EXLA.Executable.compile(client, mlir)
buffer = x.data.buffer

run_floor = fn ->
  [[out]] = EXLA.Executable.run(exe, [[buffer]])
  EXLA.DeviceBuffer.await([out])
end

floor1 = JitBench.measure("EXLA.Executable.run + await (floor)", n, run_floor)

jitted = EXLA.jit(add)
jitted.(x)
jit = JitBench.measure("cached EXLA.jit(x + x) f32[3]", n, fn -> JitBench.wait(jitted.(x)) end)

compiled = EXLA.compile(add, [x])
comp = JitBench.measure("EXLA.compile(x + x) f32[3]", n, fn -> JitBench.wait(compiled.(x)) end)

evaluator = Nx.Defn.jit(add, compiler: Nx.Defn.Evaluator)
xb = Nx.backend_copy(x, Nx.BinaryBackend)
JitBench.measure("Nx.Defn.Evaluator jit (BinaryBackend)", n, fn -> evaluator.(xb) end)

# The floor again, after everything is warm; the lower one counts.
floor = min(floor1, JitBench.measure("EXLA.Executable.run + await (floor, again)", n, run_floor))

IO.puts("""

jit / floor:     #{Float.round(jit / floor, 2)}x   (jit overhead #{Float.round(jit - floor, 3)} µs)
compile / floor: #{Float.round(comp / floor, 2)}x   (compile overhead #{Float.round(comp - floor, 3)} µs)
""")
