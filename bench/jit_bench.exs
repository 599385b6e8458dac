# Per-call cost of cached EXLA functions against the raw execute floor.
#
#     MIX_ENV=prod mix run bench/jit_bench.exs
#
# Every number is the median, over several rounds, of the mean time of one
# call (including waiting for its result) in a tight loop.
Code.require_file("support/timing.exs", __DIR__)

defmodule JitBench do
  @rounds 7

  def measure(name, iterations, fun), do: BenchTiming.measure(name, iterations, fun, @rounds)
end

n = 20_000
# The floor: the executable EXLA compiles for x + x, run directly.
{x, add, run_floor} = BenchTiming.add_floor()

floor1 = JitBench.measure("EXLA.Executable.run + await (floor)", n, run_floor)

jitted = EXLA.jit(add)
jitted.(x)
jit = JitBench.measure("cached EXLA.jit(x + x) f32[3]", n, fn -> BenchTiming.wait(jitted.(x)) end)

compiled = EXLA.compile(add, [x])
comp = JitBench.measure("EXLA.compile(x + x) f32[3]", n, fn -> BenchTiming.wait(compiled.(x)) end)

evaluator = Nx.Defn.jit(add, compiler: Nx.Defn.Evaluator)
xb = Nx.backend_copy(x, Nx.BinaryBackend)
JitBench.measure("Nx.Defn.Evaluator jit (BinaryBackend)", n, fn -> evaluator.(xb) end)

# The floor again, after everything is warm; the lower one counts.
floor = min(floor1, JitBench.measure("EXLA.Executable.run + await (floor, again)", n, run_floor))

IO.puts("""

jit / floor:     #{Float.round(jit / floor, 2)}x   (jit overhead #{Float.round(jit - floor, 3)} µs)
compile / floor: #{Float.round(comp / floor, 2)}x   (compile overhead #{Float.round(comp - floor, 3)} µs)
""")
