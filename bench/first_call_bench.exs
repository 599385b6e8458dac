# The first call of the MLP training step (bench/support/mlp.exs) in a
# fresh operating-system process, each measurement its own process:
#
#   * EXLA without a compile cache, with an empty one (cold) and with the
#     step already in it (warm);
#   * the same three for JAX (a fresh Python process each time), with its
#     persistent compilation cache (`jax_compilation_cache_dir`, and
#     `jax_persistent_cache_min_compile_time_secs` 0: its default of 1 s
#     would not keep a step that compiles faster);
#   * where the difference without a cache comes from: EXLA compiling the
#     same step written with JAX's logsumexp (its max under stop_grad), and
#     EXLA's plugin compiling the MLIR JAX lowers the step to; and the
#     XLA:CPU kernels each program compiles to (one LLVM module per fusion,
#     counted in an XLA dump), which compile time follows;
#   * the CPU client's warm-up (EXLA.Client's `:warm_up`: oneDNN's kernel
#     generation and XLA's first-compile set-up, done in the background
#     when the client is created): the step without it, and both ways when
#     the client is created right before the call (so the warm-up overlaps
#     the call's compile instead of the making of the inputs);
#   * platform discovery in a fresh VM (choosing the default client),
#     against the Python lookup of GPU and TPU plugins that it no longer
#     does on a machine without their device files, and client creation.
#
# "First call" is the step's first call with its inputs already on the
# device (so the client or backend exists): evaluation, lowering, compile or
# cache load, and the first execution, until the loss is read. JAX pays
# oneDNN's kernel generation in its first execution, EXLA where the client
# is created; the "client made at the call" cases count it. Cases run in
# shuffled order within each round, so all see the same machine load; the
# table gives medians of wall time and of the process's CPU time (user +
# system of all its threads, over the call), which a loaded machine
# disturbs less.
#
#     MIX_ENV=prod JAX_PYTHON=/path/to/venv/bin/python mix run bench/first_call_bench.exs
#
# Environment: JAX_PYTHON (a python with jax; without it JAX is skipped),
# BENCH_ROUNDS (default 7).
Code.require_file("support/mlp.exs", __DIR__)
Code.require_file("support/timing.exs", __DIR__)

defmodule FirstCallBench.StopMax do
  @moduledoc """
  CompilerBench.MLP.step with JAX's logsumexp (jax.scipy.special.logsumexp): the
  max is a constant for the gradient (stop_grad, and 0 where it is not
  finite). The same loss; the gradient differs from Nx's in the last bits,
  where Nx's gradient through the max cancels only approximately.
  """
  import Nx.Defn

  defn loss(params, x, y) do
    logits = CompilerBench.MLP.predict(params, x)
    max = Nx.reduce_max(logits, axes: [1], keep_axes: true)
    max = stop_grad(Nx.select(Nx.is_infinity(max) or Nx.is_nan(max), 0.0, max))
    lse = Nx.log(Nx.sum(Nx.exp(logits - max), axes: [1], keep_axes: true)) + max
    -Nx.mean(Nx.sum(y * (logits - lse), axes: [1]))
  end

  defn step(params, x, y) do
    CompilerBench.MLP.sgd(params, value_and_grad(params, &loss(&1, x, y)))
  end
end

defmodule FirstCallBench do
  ## The measured processes

  @doc """
  Runs in the child VM: measures the first call of `program` and prints
  it. Programs: `"nx"`, the step; `"stop_max"`, the step with JAX's
  logsumexp; `"mlir:PATH"`, a StableHLO file compiled and run by
  EXLA.Executable. `"nx_cold_plugin"` is `"nx"` without the client's
  warm-up; `"nx_at_once"` and `"nx_at_once_cold_plugin"` create the
  client right before the call, which transfers the inputs (made on
  Nx.BinaryBackend before), so the warm-up runs during the call's compile.
  """
  def exla_child(cache, program) do
    Application.put_env(:exla, :cache_dir, if(cache == "off", do: false, else: cache))

    if String.ends_with?(program, "_cold_plugin") do
      clients = Application.fetch_env!(:exla, :clients)
      Application.put_env(:exla, :clients, for({n, o} <- clients, do: {n, [warm_up: false] ++ o}))
    end

    if String.starts_with?(program, "nx_at_once"), do: at_once_child(), else: call_child(program)
  end

  defp call_child(program) do
    {discovery, name} = :timer.tc(&EXLA.Client.default_name/0)
    {client_creation, _} = :timer.tc(fn -> EXLA.Client.fetch!(name) end)
    created = System.monotonic_time(:microsecond)
    {params, x, y} = CompilerBench.MLP.pattern_inputs(EXLA.Backend)
    parent = self()
    handler = fn _, m, meta, _ -> send(parent, {:compilation, m, meta}) end
    :telemetry.attach("first-call", [:exla, :compilation, :details], handler, nil)

    cpu = cpu_us()
    start = System.monotonic_time(:microsecond)
    first_call(program, params, x, y)
    wall = System.monotonic_time(:microsecond) - start
    cpu = cpu_us() - cpu

    {eval, compile, status} =
      receive do
        {:compilation, m, meta} -> {m.eval_time, m.compile_time, meta.disk_cache}
      after
        0 -> {0, 0, :off}
      end

    # What finding GPU and TPU plugins cost before: asking Python.
    {python, _} = :timer.tc(fn -> for p <- [:cuda, :rocm, :tpu], do: EXLA.Plugin.find(p) end)

    IO.puts(
      "RESULT wall=#{wall} cpu=#{cpu} eval=#{eval} compile=#{compile} cache=#{status} " <>
        "discovery=#{discovery} client=#{client_creation} python=#{python} " <>
        "before_call=#{start - created}"
    )
  end

  # Client creation, the inputs' transfer and the first call, all measured.
  defp at_once_child do
    {params, x, y} = CompilerBench.MLP.pattern_inputs(Nx.BinaryBackend)
    cpu = cpu_us()
    start = System.monotonic_time(:microsecond)
    client = EXLA.Client.fetch!(EXLA.Client.default_name())
    step = EXLA.jit(&CompilerBench.MLP.step/3, client: client.name)
    {_params, loss} = step.(params, x, y)
    Nx.to_number(loss)
    wall = System.monotonic_time(:microsecond) - start
    IO.puts("RESULT wall=#{wall} cpu=#{cpu_us() - cpu} eval=0 compile=0")
  end

  defp first_call("mlir:" <> path, params, x, y) do
    client = EXLA.Client.fetch!(EXLA.Client.default_name())
    exe = EXLA.Executable.compile(client, File.read!(path))
    buffers = Enum.map(Nx.Defn.Composite.flatten_list([params, x, y]), & &1.data.buffer)
    [outputs] = EXLA.Executable.run(exe, [buffers])
    EXLA.DeviceBuffer.read(List.last(outputs))
  end

  defp first_call(program, params, x, y) do
    step =
      if program == "stop_max",
        do: &FirstCallBench.StopMax.step/3,
        else: &CompilerBench.MLP.step/3

    {_params, loss} = EXLA.jit(step).(params, x, y)
    Nx.to_number(loss)
  end

  # User + system CPU time of this process (all threads), in microseconds.
  defp cpu_us do
    fields =
      "/proc/self/stat" |> File.read!() |> String.split(") ") |> List.last() |> String.split()

    ticks = String.to_integer(Enum.at(fields, 11)) + String.to_integer(Enum.at(fields, 12))
    div(ticks * 1_000_000, 100)
  end

  @jax_child """
  import os, time
  #{CompilerBench.MLP.jax_source()}
  cache = os.environ["FIRST_CALL_CACHE"]
  if cache != "off":
      jax.config.update("jax_compilation_cache_dir", cache)
      jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  params, x, y = pattern_inputs()
  jax.block_until_ready((params, x, y))
  cpu = time.process_time()
  start = time.perf_counter()
  params1, value = step(params, x, y)
  float(value)
  wall = time.perf_counter() - start
  cpu = time.process_time() - cpu
  print("RESULT wall=%d cpu=%d" % (wall * 1e6, cpu * 1e6), flush=True)
  if os.environ.get("FIRST_CALL_LOWER_TO"):
      with open(os.environ["FIRST_CALL_LOWER_TO"], "w") as f:
          f.write(step.lower(params, x, y).as_text())
  """

  ## The driver

  @doc """
  Runs one case in a fresh process: `{system, program}` (`:exla` or
  `:jax`; the program of exla_child/2), with the cache in `dir` (nil: no
  cache). Returns the fields of its RESULT line.
  """
  def run({system, program}, dir, env \\ []) do
    {cmd, args} =
      case system do
        :exla -> {"mix", ["run", "--no-compile", "--no-deps-check", __ENV__.file]}
        :jax -> {System.get_env("JAX_PYTHON"), ["-c", @jax_child]}
      end

    env = [
      {"FIRST_CALL_CHILD", "exla"},
      {"FIRST_CALL_CACHE", dir || "off"},
      {"FIRST_CALL_PROGRAM", program},
      # Busy-waiting schedulers would count as CPU time.
      {"ELIXIR_ERL_OPTIONS", "+sbwt none +sbwtdcpu none +sbwtdio none"},
      {"TF_CPP_MIN_LOG_LEVEL", "2"} | env
    ]

    case System.cmd(cmd, args, env: env, stderr_to_stdout: true) do
      {out, 0} ->
        case Regex.run(~r/RESULT (.*)/, out) do
          [_, fields] -> parse(fields)
          nil -> raise "no result from #{system} #{program}:\n#{out}"
        end

      {out, status} ->
        raise "#{system} #{program} exited with #{status}:\n#{out}"
    end
  end

  defp parse(fields) do
    for field <- String.split(fields), into: %{} do
      [key, value] = String.split(field, "=")

      value =
        case Integer.parse(value) do
          {n, ""} -> n
          _ -> value
        end

      {String.to_atom(key), value}
    end
  end

  @doc """
  The XLA:CPU kernels the case compiles for the step: XLA:CPU compiles
  each fusion to its own LLVM module, dumped as `*.ir-with-opt.ll`; the
  count of the largest module (the step).
  """
  def kernels(case_key) do
    dump = tmp("dump")
    File.rm_rf!(dump)
    run(case_key, nil, [{"XLA_FLAGS", "--xla_dump_to=#{dump}"}])

    dump
    |> File.ls!()
    |> Enum.filter(&String.ends_with?(&1, ".ir-with-opt.ll"))
    |> Enum.frequencies_by(&(&1 |> String.split(".") |> hd()))
    |> Map.values()
    |> Enum.max(fn -> 0 end)
  after
    File.rm_rf(tmp("dump"))
  end

  def tmp(name), do: Path.join(System.tmp_dir!(), "exla_first_call_bench_#{name}")
end

if System.get_env("FIRST_CALL_CHILD") == "exla" do
  FirstCallBench.exla_child(
    System.fetch_env!("FIRST_CALL_CACHE"),
    System.fetch_env!("FIRST_CALL_PROGRAM")
  )

  System.halt(0)
end

rounds = String.to_integer(System.get_env("BENCH_ROUNDS", "7"))
jax? = System.get_env("JAX_PYTHON") not in [nil, ""]
exla = {:exla, "nx"}
jax = {:jax, "nx"}
stop_max = {:exla, "stop_max"}
cold_plugin = {:exla, "nx_cold_plugin"}
at_once = {:exla, "nx_at_once"}
at_once_cold = {:exla, "nx_at_once_cold_plugin"}
jax_mlir_path = FirstCallBench.tmp("jax_step.mlir")
jax_mlir = {:exla, "mlir:" <> jax_mlir_path}

warm = %{exla => FirstCallBench.tmp("warm_exla"), jax => FirstCallBench.tmp("warm_jax")}
cold = %{exla => FirstCallBench.tmp("cold_exla"), jax => FirstCallBench.tmp("cold_jax")}
Enum.each(Map.values(warm) ++ Map.values(cold), &File.rm_rf!/1)

# One cold run per system fills its warm directory; JAX's also writes the
# MLIR it lowers the step to.
FirstCallBench.run(exla, warm[exla])
if jax?, do: FirstCallBench.run(jax, warm[jax], [{"FIRST_CALL_LOWER_TO", jax_mlir_path}])

programs = if jax?, do: [exla, jax], else: [exla]

cases =
  for(program <- programs, cache <- [:off, :cold, :warm], do: {program, cache}) ++
    [{cold_plugin, :off}, {at_once, :off}, {at_once_cold, :off}, {stop_max, :off}] ++
    if(jax?, do: [{jax_mlir, :off}], else: [])

results =
  for _round <- 1..rounds, {program, cache} = key <- Enum.shuffle(cases), reduce: %{} do
    acc ->
      dir =
        case cache do
          :off -> nil
          :warm -> warm[program]
          :cold -> File.rm_rf!(cold[program]) && cold[program]
        end

      result = FirstCallBench.run(program, dir)
      Map.update(acc, key, [result], &[result | &1])
  end

med = fn key, field -> BenchTiming.median(Enum.map(results[key], & &1[field])) end
ms = fn us -> :erlang.float_to_binary(us / 1000, decimals: 1) end
kernel_cases = [exla, stop_max] ++ if(jax?, do: [jax_mlir, jax], else: [])
kernels = Map.new(kernel_cases, &{&1, FirstCallBench.kernels(&1)})

labels = %{
  exla => "EXLA",
  jax => "JAX #{if jax?, do: "(jaxlib's XLA)"}",
  stop_max => "EXLA, JAX's logsumexp",
  cold_plugin => "EXLA without warm-up",
  at_once => "EXLA, client at the call",
  at_once_cold => "the same, no warm-up",
  jax_mlir => "EXLA's plugin, JAX's MLIR"
}

IO.puts("""
First call of the MLP training step (784-512-512-10, batch 128, loss read
back) in a fresh process, inputs already on the device; median of #{rounds}
shuffled rounds, each case its own process each time.

  case                                  wall ms   CPU ms   kernels   EXLA: eval + lower and compile or load + run
""")

for {program, cache} = key <- cases do
  split =
    if elem(program, 0) == :exla and program not in [jax_mlir, at_once, at_once_cold] do
      rest = med.(key, :wall) - med.(key, :eval) - med.(key, :compile)
      "#{ms.(med.(key, :eval))} + #{ms.(med.(key, :compile))} + #{ms.(rest)}"
    else
      ""
    end

  k = if cache == :off, do: Map.get(kernels, program, ""), else: ""

  IO.puts(
    "  " <>
      String.pad_trailing("#{labels[program]}, cache #{cache}", 36) <>
      String.pad_leading(ms.(med.(key, :wall)), 9) <>
      String.pad_leading(ms.(med.(key, :cpu)), 9) <>
      String.pad_leading("#{k}", 10) <> "   " <> split
  )
end

all_exla =
  Enum.flat_map(results, fn {{{system, _}, _}, rows} ->
    if system == :exla, do: Enum.filter(rows, & &1[:discovery]), else: []
  end)

field_med = fn field -> BenchTiming.median(Enum.map(all_exla, & &1[field])) end

IO.puts("""

Fresh VM, before the first call (medians over all EXLA runs):
  choosing the default client (platform discovery)   #{ms.(field_med.(:discovery))} ms
  the Python lookup of GPU/TPU plugins it skips       #{ms.(field_med.(:python))} ms
  creating the client (plugin load, PJRT client)      #{ms.(field_med.(:client))} ms
  from the client's creation to the first call        #{ms.(field_med.(:before_call))} ms
    (making the inputs; the client's warm-up runs meanwhile, in the background)
""")

# How far the two gradients are apart, here and now.
Application.put_env(:exla, :cache_dir, false)
{params, x, y} = CompilerBench.MLP.pattern_inputs(EXLA.Backend)

difference =
  [&CompilerBench.MLP.step/3, &FirstCallBench.StopMax.step/3]
  |> Enum.map(&Nx.Defn.Composite.flatten_list([EXLA.jit(&1).(params, x, y)]))
  |> Enum.zip_with(fn [a, b] -> Nx.to_number(Nx.reduce_max(Nx.abs(Nx.subtract(a, b)))) end)
  |> Enum.max()

if jax? do
  ratio = fn a, b, field -> Float.round(med.(a, field) / med.(b, field), 2) end

  IO.puts("""
  EXLA / JAX, warm cache:             wall #{ratio.({exla, :warm}, {jax, :warm}, :wall)}   CPU #{ratio.({exla, :warm}, {jax, :warm}, :cpu)}   (target: at most 0.5)
  EXLA / JAX, without a cache:        wall #{ratio.({exla, :off}, {jax, :off}, :wall)}   CPU #{ratio.({exla, :off}, {jax, :off}, :cpu)}   (issue 21's target: at most 0.8)
  the same without the warm-up:       wall #{ratio.({cold_plugin, :off}, {jax, :off}, :wall)}   CPU #{ratio.({cold_plugin, :off}, {jax, :off}, :cpu)}
  client at the call, with / without warm-up:  wall #{ratio.({at_once, :off}, {at_once_cold, :off}, :wall)}   CPU #{ratio.({at_once, :off}, {at_once_cold, :off}, :cpu)}
  the same step, JAX's logsumexp:    wall #{ratio.({stop_max, :off}, {jax, :off}, :wall)}   CPU #{ratio.({stop_max, :off}, {jax, :off}, :cpu)}   (EXLA / JAX without a cache)
  JAX's own MLIR on EXLA's plugin:   wall #{ratio.({jax_mlir, :off}, {jax, :off}, :wall)}   CPU #{ratio.({jax_mlir, :off}, {jax, :off}, :cpu)}   (the plugin's compile of JAX's program / JAX)
  EXLA warm / EXLA without a cache:   wall #{ratio.({exla, :warm}, {exla, :off}, :wall)}
  JAX warm / JAX without a cache:     wall #{ratio.({jax, :warm}, {jax, :off}, :wall)}

  Where the difference without a cache comes from. XLA compiles each kernel
  (a fusion) separately: fusion emitter, LLVM optimization, machine code;
  compile time follows the kernel count. The step with JAX's logsumexp,
  whose max is a constant for the gradient, compiles to
  #{kernels[stop_max]} kernels on EXLA's plugin (JAX's own MLIR: #{kernels[jax_mlir]}), against
  #{kernels[exla]} for Nx's: Nx 0.7.2 differentiates logsumexp through its max (the
  reduce_max gradient counts the ties, in a u64 reduce, and shares the
  gradient among them), which costs the extra kernels. Its contributions
  cancel only approximately, so results differ in the last bits (here by
  up to #{Float.round(difference, 12)}): EXLA keeps Nx's semantics. The rest is the
  compiler: jaxlib 0.10.2's XLA compiles JAX's program to #{kernels[jax]} kernels,
  EXLA's plugin (xla-cpu-pjrt 0.0.1) to #{kernels[jax_mlir]}. The lowering clean-ups
  (constants in their converted type, constants and broadcasts shared)
  change neither the kernels nor the compile time: XLA's simplifier folds
  what they remove.
  """)
end
