# The compiler, measured in one run:
#
#   * one training step of an MLP (784-512-512-10, batch 128, SGD) with
#     EXLA.jit against the same step on Nx.BinaryBackend (Nx.Defn.Evaluator);
#   * the time to lower that step to MLIR text against XLA's compile time.
#
#     mix run bench/compiler_bench.exs
defmodule CompilerBench.MLP do
  import Nx.Defn

  defn predict({{w1, b1}, {w2, b2}, {w3, b3}}, x) do
    x
    |> Nx.dot(w1)
    |> Nx.add(b1)
    |> Nx.max(0)
    |> Nx.dot(w2)
    |> Nx.add(b2)
    |> Nx.max(0)
    |> Nx.dot(w3)
    |> Nx.add(b3)
  end

  defn loss(params, x, y) do
    logits = predict(params, x)
    log_probs = logits - Nx.logsumexp(logits, axes: [1], keep_axes: true)
    -Nx.mean(Nx.sum(y * log_probs, axes: [1]))
  end

  defn step(params, x, y) do
    {loss, {g1, g2, g3}} = value_and_grad(params, &loss(&1, x, y))
    {l1, l2, l3} = params
    {{update(l1, g1), update(l2, g2), update(l3, g3)}, loss}
  end

  defnp update({w, b}, {gw, gb}), do: {w - 0.01 * gw, b - 0.01 * gb}

  def inputs(backend) do
    key = Nx.Random.key(0)

    {params, key} =
      Enum.map_reduce([{784, 512}, {512, 512}, {512, 10}], key, fn {i, o}, key ->
        {w, key} = Nx.Random.normal(key, 0.0, 0.05, shape: {i, o})
        {{w, Nx.broadcast(0.0, {o})}, key}
      end)

    {x, key} = Nx.Random.uniform(key, shape: {128, 784})
    {labels, _} = Nx.Random.randint(key, 0, 10, shape: {128, 1})
    y = Nx.equal(labels, Nx.iota({1, 10})) |> Nx.as_type(:f32)
    Nx.backend_transfer({List.to_tuple(params), x, y}, backend)
  end
end

defmodule CompilerBench do
  def time_us(fun) do
    {us, value} = :timer.tc(fun)
    {us, value}
  end

  def median(list), do: list |> Enum.sort() |> Enum.at(div(length(list), 2))
end

alias CompilerBench.MLP

{params, x, y} = MLP.inputs(EXLA.Backend)
step = EXLA.jit(&MLP.step/3)
{compile_and_first, _} = CompilerBench.time_us(fn -> step.(params, x, y) end)

exla_steps = 200

{exla_us, _} =
  CompilerBench.time_us(fn ->
    Enum.reduce(1..exla_steps, params, fn _, params ->
      {params, loss} = step.(params, x, y)
      Nx.to_number(loss)
      params
    end)
  end)

exla_per_step = exla_us / exla_steps

{bparams, bx, by} = MLP.inputs(Nx.BinaryBackend)
evaluator = Nx.Defn.jit(&MLP.step/3, compiler: Nx.Defn.Evaluator)
{binary_per_step, _} = CompilerBench.time_us(fn -> evaluator.(bparams, bx, by) end)

# Lowering (Nx.Defn.Expr -> MLIR text) against XLA's compile of that text.
lower = fn -> EXLA.to_mlir_module(&MLP.step/3, [params, x, y]) end
%{mlir_module: mlir} = lower.()
lower_us = CompilerBench.median(for _ <- 1..5, do: elem(CompilerBench.time_us(lower), 0))
client = EXLA.Client.fetch!(EXLA.Client.default_name())

compile_us =
  CompilerBench.median(
    for _ <- 1..3,
        do: elem(CompilerBench.time_us(fn -> EXLA.Executable.compile(client, mlir) end), 0)
  )

r = fn x -> Float.round(x / 1, 2) end

IO.puts("""
MLP 784-512-512-10, batch 128, one SGD step
  EXLA.jit (cached)         #{r.(exla_per_step / 1000)} ms/step   #{r.(1_000_000 / exla_per_step)} steps/s
  Nx.BinaryBackend          #{r.(binary_per_step / 1000)} ms/step
  speed-up EXLA / Binary    #{r.(binary_per_step / exla_per_step)}x
  first call (lower + compile + run): #{r.(compile_and_first / 1000)} ms

lowering the step to MLIR text  #{r.(lower_us / 1000)} ms
XLA compile of that text        #{r.(compile_us / 1000)} ms
ratio lowering / compile        #{Float.round(lower_us / compile_us, 4)}
""")
