# EXLA.Backend against Nx.BinaryBackend, the raw execute floor and the
# same operations inside EXLA.jit (an eager op is the op jit emits, so the
# eager/jit ratios of large inputs should be about 1).
#
#     MIX_ENV=prod mix run bench/backend_bench.exs
#
# Every number is the median, over several rounds, of the mean time of one
# call (including waiting for its result) in a tight loop.
Code.require_file("support/timing.exs", __DIR__)

defmodule BackendBench do
  @rounds 5

  def measure(name, iterations, fun), do: BenchTiming.measure(name, iterations, fun, @rounds)
end

client = EXLA.Client.fetch!(EXLA.Client.default_name())

# Tiny: Nx.add on f32[3]
x = Nx.tensor([1.0, 2.0, 3.0], backend: EXLA.Backend)
xb = Nx.backend_copy(x, Nx.BinaryBackend)
%{mlir_module: mlir} = EXLA.to_mlir_module(&Nx.add/2, [x, x])
exe = EXLA.Executable.compile(client, mlir)
buffer = x.data.buffer

floor =
  BackendBench.measure("floor: Executable.run add f32[3]", 20_000, fn ->
    [[out]] = EXLA.Executable.run(exe, [[buffer, buffer]])
    EXLA.DeviceBuffer.await([out])
  end)

exla_add =
  BackendBench.measure("EXLA.Backend Nx.add f32[3]", 20_000, fn ->
    BenchTiming.wait(Nx.add(x, x))
  end)

bin_add = BackendBench.measure("BinaryBackend Nx.add f32[3]", 20_000, fn -> Nx.add(xb, xb) end)

# Large element-wise: exp(a) + a on f32[1_000_000]
big = Nx.iota({1_000_000}, type: {:f, 32}, backend: EXLA.Backend) |> Nx.divide(1_000_000)
bigb = Nx.backend_copy(big, Nx.BinaryBackend)
ew = fn t -> Nx.add(Nx.exp(t), t) end

exla_ew =
  BackendBench.measure("EXLA.Backend exp(a)+a f32[1e6]", 20, fn -> BenchTiming.wait(ew.(big)) end)

bin_ew = BackendBench.measure("BinaryBackend exp(a)+a f32[1e6]", 2, fn -> ew.(bigb) end)

# Matmul f32[128x128]
m = Nx.iota({128, 128}, type: {:f, 32}, backend: EXLA.Backend) |> Nx.divide(128 * 128)
mb = Nx.backend_copy(m, Nx.BinaryBackend)

exla_mm =
  BackendBench.measure("EXLA.Backend dot f32[128x128]", 200, fn ->
    BenchTiming.wait(Nx.dot(m, m))
  end)

bin_mm = BackendBench.measure("BinaryBackend dot f32[128x128]", 2, fn -> Nx.dot(mb, mb) end)

# Large inputs, eager against the same op inside EXLA.jit (jit: cached
# closure, same resident device tensors)
a = Nx.iota({1024, 1024}, type: {:f, 32}, backend: EXLA.Backend) |> Nx.divide(1024 * 1024)
b = Nx.transpose(a)
v = Nx.iota({4_000_000}, type: {:f, 32}, backend: EXLA.Backend) |> Nx.divide(4_000_000)
jit_dot = EXLA.jit(&Nx.dot/2)
jit_sum = EXLA.jit(&Nx.sum/1)
jit_max = EXLA.jit(&Nx.reduce_max/1)

large =
  for {name, eager, jitted} <- [
        {"dot f32[1024x1024]", fn -> Nx.dot(a, b) end, fn -> jit_dot.(a, b) end},
        {"sum f32[4M]", fn -> Nx.sum(v) end, fn -> jit_sum.(v) end},
        {"reduce_max f32[4M]", fn -> Nx.reduce_max(v) end, fn -> jit_max.(v) end}
      ] do
    # interleaved rounds, so that both see the same machine load; the
    # fastest round of each
    {e, j} =
      Enum.reduce(1..7, {[], []}, fn _, {es, js} ->
        e = BackendBench.measure("EXLA.Backend #{name}", 20, fn -> BenchTiming.wait(eager.()) end)

        j = BackendBench.measure("EXLA.jit #{name}", 20, fn -> BenchTiming.wait(jitted.()) end)
        {[e | es], [j | js]}
      end)

    {name, Enum.min(e), Enum.min(j)}
  end

IO.puts("")
BenchTiming.ratio("Nx.add f32[3] EXLA / floor", exla_add, floor)

for {name, e, j} <- large do
  BenchTiming.ratio("#{name} EXLA.Backend / EXLA.jit", e, j)
end

BenchTiming.ratio("Nx.add f32[3] BinaryBackend / EXLA", bin_add, exla_add)
BenchTiming.ratio("exp(a)+a f32[1e6] BinaryBackend / EXLA", bin_ew, exla_ew)
BenchTiming.ratio("dot 128x128 BinaryBackend / EXLA", bin_mm, exla_mm)
