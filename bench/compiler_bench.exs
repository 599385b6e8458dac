# The compiler, measured in one run:
#
#   * training steps per second of an MLP (784-512-512-10, batch 128, f32,
#     SGD) with EXLA.jit, reading the loss back after every step, split into
#     the XLA execution alone (EXLA.Executable.run on resident buffers) and
#     the cost of EXLA.jit around it;
#   * optionally the same step in JAX on the same machine, measured in
#     interleaved rounds with EXLA so both see the same machine load;
#   * the same step on Nx.BinaryBackend (Nx.Defn.Evaluator), one call;
#   * the time to lower that step to MLIR text against XLA's compile time.
#
#     mix run bench/compiler_bench.exs
#
# Environment:
#
#   * JAX_PYTHON - a python executable that can `import jax` (for example a
#     virtual environment with `pip install jax==0.10.2`). JAX runs the step
#     on its own jaxlib CPU backend, with the step's inputs resident on the
#     device and the loss read back every step, like EXLA here.
#   * BENCH_BINARY=false - skip the Nx.BinaryBackend step (it takes minutes).
#   * BENCH_ROUNDS, BENCH_STEPS - rounds (default 11) of steps (default 20).
Code.require_file("support/mlp.exs", __DIR__)
Code.require_file("support/timing.exs", __DIR__)

# XLA's compile is measured here, not the compile cache on disk.
Application.put_env(:exla, :cache_dir, false)

defmodule CompilerBench.JAX do
  @moduledoc """
  The same training step in JAX, in a python process driven over a port:
  each `run/2` runs that many steps (reading the loss back after each, like
  the EXLA loop) and answers the elapsed seconds.
  """

  @script """
  import sys, time
  #{CompilerBench.MLP.jax_source()}
  keys = jax.random.split(jax.random.PRNGKey(0), 5)
  sizes = [(784, 512), (512, 512), (512, 10)]
  params = [(jax.random.normal(keys[i], s) * 0.05, jnp.zeros((s[1],))) for i, s in enumerate(sizes)]
  x = jax.random.uniform(keys[3], (128, 784))
  y = jax.nn.one_hot(jax.random.randint(keys[4], (128,), 0, 10), 10)
  for _ in range(5):
      params, value = step(params, x, y)
      float(value)
  print("ready", jax.__version__, jax.devices()[0].platform, flush=True)
  for line in sys.stdin:
      n = int(line)
      start = time.perf_counter()
      for _ in range(n):
          params, value = step(params, x, y)
          float(value)
      print(time.perf_counter() - start, flush=True)
  """

  def start(nil), do: nil

  def start(python) do
    path = System.find_executable(python) || raise "JAX_PYTHON=#{python} is not an executable"
    port = Port.open({:spawn_executable, path}, [:binary, {:line, 4096}, args: ["-c", @script]])

    case read_line(port) do
      "ready " <> version -> {port, version}
      other -> raise "JAX did not start: #{other}"
    end
  end

  @doc "Runs `n` steps and returns the microseconds they took."
  def run(port, n) do
    Port.command(port, "#{n}\n")
    port |> read_line() |> String.to_float() |> Kernel.*(1_000_000)
  end

  def stop(port), do: Port.close(port)

  defp read_line(port, acc \\ "") do
    receive do
      {^port, {:data, {:eol, line}}} -> acc <> line
      {^port, {:data, {:noeol, part}}} -> read_line(port, acc <> part)
    after
      120_000 -> raise "JAX did not answer within 2 minutes"
    end
  end
end

defmodule CompilerBench do
  def time_us(fun) do
    {us, value} = :timer.tc(fun)
    {us, value}
  end

  def env_integer(name, default) do
    case System.get_env(name) do
      nil -> default
      value -> String.to_integer(value)
    end
  end

  @doc """
  Runs each named loop for `steps` steps per round, the loops taking turns
  within every round, and returns the median microseconds per step of each.
  A loop is a function of the step count returning the microseconds taken.
  """
  def interleaved(loops, rounds, steps) do
    Enum.each(loops, fn {_name, loop} -> loop.(2) end)

    per_round =
      for _ <- 1..rounds do
        for {name, loop} <- loops, do: {name, loop.(steps) / steps}
      end

    per_round
    |> List.flatten()
    |> Enum.group_by(&elem(&1, 0), &elem(&1, 1))
    |> Map.new(fn {name, times} -> {name, BenchTiming.median(times)} end)
  end

  # `steps` calls of `fun`, which takes and returns the loop state.
  def loop_us(state, steps, fun) do
    {us, _} = time_us(fn -> Enum.reduce(1..steps, state, fn _, state -> fun.(state) end) end)
    us
  end
end

alias CompilerBench.MLP
alias CompilerBench.JAX

rounds = CompilerBench.env_integer("BENCH_ROUNDS", 11)
steps = CompilerBench.env_integer("BENCH_STEPS", 20)

{params, x, y} = MLP.inputs(EXLA.Backend)
step = EXLA.jit(&MLP.step/3)
{compile_and_first, _} = CompilerBench.time_us(fn -> step.(params, x, y) end)

# The compiled step alone: the same MLIR, run on the resident parameters,
# waiting for every output and reading the loss back.
%{mlir_module: mlir} = EXLA.to_mlir_module(&MLP.step/3, [params, x, y])
client = EXLA.Client.fetch!(EXLA.Client.default_name())
executable = EXLA.Executable.compile(client, mlir)
{{{w1, b1}, {w2, b2}, {w3, b3}}, _, _} = {params, x, y}
buffers = Enum.map([w1, b1, w2, b2, w3, b3, x, y], & &1.data.buffer)

exla_loop = fn n ->
  CompilerBench.loop_us(params, n, fn params ->
    {params, loss} = step.(params, x, y)
    Nx.to_number(loss)
    params
  end)
end

execute_loop = fn n ->
  CompilerBench.loop_us(nil, n, fn _ ->
    [outputs] = EXLA.Executable.run(executable, [buffers])
    EXLA.DeviceBuffer.await(outputs)
    EXLA.DeviceBuffer.read(List.last(outputs))
  end)
end

jax = JAX.start(System.get_env("JAX_PYTHON"))

loops =
  [{:exla, exla_loop}, {:execute, execute_loop}] ++
    if jax, do: [{:jax, &JAX.run(elem(jax, 0), &1)}], else: []

per_step = CompilerBench.interleaved(loops, rounds, steps)
if jax, do: JAX.stop(elem(jax, 0))

binary_per_step =
  if System.get_env("BENCH_BINARY") != "false" do
    {bparams, bx, by} = MLP.inputs(Nx.BinaryBackend)
    evaluator = Nx.Defn.jit(&MLP.step/3, compiler: Nx.Defn.Evaluator)
    {us, _} = CompilerBench.time_us(fn -> evaluator.(bparams, bx, by) end)
    us
  end

# Lowering (Nx.Defn.Expr -> MLIR text) against XLA's compile of that text.
lower = fn -> EXLA.to_mlir_module(&MLP.step/3, [params, x, y]) end
lower_us = BenchTiming.median(for _ <- 1..5, do: elem(CompilerBench.time_us(lower), 0))

compile_us =
  BenchTiming.median(
    for _ <- 1..3,
        do: elem(CompilerBench.time_us(fn -> EXLA.Executable.compile(client, mlir) end), 0)
  )

r = fn x -> Float.round(x / 1, 2) end
ms = fn us -> String.pad_leading("#{r.(us / 1000)} ms/step", 16) end
rate = fn us -> String.pad_leading("#{r.(1_000_000 / us)} steps/s", 18) end
line = fn label, us -> "  #{String.pad_trailing(label, 34)}#{ms.(us)}#{rate.(us)}" end
%{exla: exla, execute: execute} = per_step

jax_lines =
  case jax do
    nil ->
      ["  JAX: not measured (set JAX_PYTHON to a python with jax)"]

    {_port, version} ->
      [
        line.("JAX #{version} jit (same loop)", per_step.jax),
        "  EXLA / JAX throughput           #{Float.round(per_step.jax / exla, 3)}x"
      ]
  end

binary_lines =
  case binary_per_step do
    nil ->
      ["  Nx.BinaryBackend: skipped (BENCH_BINARY=false)"]

    us ->
      [
        "  Nx.BinaryBackend                  #{r.(us / 1000)} ms/step",
        "  speed-up EXLA / Binary            #{r.(us / exla)}x"
      ]
  end

IO.puts("""
MLP 784-512-512-10, batch 128, one SGD step, loss read back every step
(median over #{rounds} interleaved rounds of #{steps} steps)
#{line.("EXLA.jit (cached)", exla)}
#{line.("  XLA execution alone", execute)}
  EXLA.jit overhead per step        #{r.((exla - execute) / 1000)} ms
#{Enum.join(jax_lines, "\n")}
#{Enum.join(binary_lines, "\n")}
  first call (lower + compile + run): #{r.(compile_and_first / 1000)} ms

lowering the step to MLIR text  #{r.(lower_us / 1000)} ms
XLA compile of that text        #{r.(compile_us / 1000)} ms
ratio lowering / compile        #{Float.round(lower_us / compile_us, 4)}
""")
