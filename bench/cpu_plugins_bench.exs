# The CPU plugins EXLA knows (EXLA.Plugin.cpu_plugins/0), measured on the
# same workloads in one VM: one :host client per plugin (installed on first
# use where missing), the same programs compiled on each, the same inputs.
#
#   * tiny: a cached call of `x + 1` on f32[16], read back (µs per call);
#   * mlp: a step of the 784-512-512-10 MLP, batch 128 (bench/support/mlp.exs);
#   * conv: a training step of a small conv net (two 3×3 convolutions of 16
#     and 32 channels with ReLU and 2×2 max pooling, then a dense layer to
#     10 classes), batch 64 of 28×28;
#   * bert: a BERT-base-shaped encoder forward, batch 8, sequence 128
#     (bench/support/gpu_models.exs);
#   * gpt2: a GPT-2-small-shaped prefill, batch 4, 128 tokens: the forward
#     over the prompt, its key/value cache and the next token
#     (bench/support/gpu_models.exs);
#   * first call: the MLP step's first call, a program no cache holds
#     (lowering, compile, the run and reading the loss);
#   * compile set: the first calls of 24 small programs (elementwise
#     chains, reductions, products, a softmax, a sort, a cumulative sum, a
#     while loop, a convolution, on a few shapes), in total.
#
# A workload is prepared on every plugin (compiled, run twice), then runs
# in rounds; each round runs it once on each plugin, in a shuffled order,
# so the plugins see the same machine load. The table gives each plugin's
# medians over the rounds of the wall time and of the CPU time (all the
# VM's threads, the plugin's pools included: on a machine others share it
# moves less than wall time), their ratios to the default plugin's, and the
# 1-minute load average seen during the workload (min–max). Idle schedulers
# should not spin, or their spinning counts as CPU time:
#
#     ELIXIR_ERL_OPTIONS="+sbwt none +sbwtdcpu none +sbwtdio none" \
#       MIX_ENV=prod mix run bench/cpu_plugins_bench.exs
#
# Environment: BENCH_ROUNDS (default 5), BENCH_QUICK=1 (tiny models, for a
# check), BENCH_PLUGINS (comma-separated names, default: every known plugin
# with a wheel for this machine), BENCH_OUT (also write the table there).
Code.require_file("support/mlp.exs", __DIR__)
Code.require_file("support/timing.exs", __DIR__)
Code.require_file("support/gpu_models.exs", __DIR__)

defmodule CpuPluginsBench.ConvNet do
  @moduledoc false
  import Nx.Defn

  defn predict({{k1, c1}, {k2, c2}, {w, b}}, x) do
    x
    |> conv_block(k1, c1)
    |> conv_block(k2, c2)
    |> Nx.flatten(axes: [1, 2, 3])
    |> Nx.dot(w)
    |> Nx.add(b)
  end

  defnp conv_block(x, kernel, bias) do
    x
    |> Nx.conv(kernel, padding: :same)
    |> Nx.add(Nx.reshape(bias, {1, :auto, 1, 1}))
    |> Nx.max(0)
    |> Nx.window_max({1, 1, 2, 2}, strides: [1, 1, 2, 2])
  end

  defn loss(params, x, y) do
    logits = predict(params, x)
    -Nx.mean(Nx.sum(y * (logits - Nx.logsumexp(logits, axes: [1], keep_axes: true)), axes: [1]))
  end

  defn step(params, x, y) do
    CompilerBench.MLP.sgd(params, value_and_grad(params, &loss(&1, x, y)))
  end

  def shapes(batch) do
    params = [{{16, 1, 3, 3}, {16}}, {{32, 16, 3, 3}, {32}}, {{32 * 7 * 7, 10}, {10}}]
    {params, {batch, 1, 28, 28}, {batch, 10}}
  end
end

defmodule CpuPluginsBench.Small do
  @moduledoc false
  # The small programs whose compile time is measured: each is
  # `fn x -> ... end` on f32 `shape`, and `c` (a number that differs on
  # every call) makes each one a program no cache holds.

  def programs do
    for shape <- [{64}, {32, 32}, {8, 16, 16}],
        {name, fun} <- kinds(),
        do: {"#{name} #{inspect(shape)}", shape, fun}
  end

  defp kinds do
    [
      {"chain",
       fn x, c -> x |> Nx.multiply(c) |> Nx.sin() |> Nx.add(1) |> Nx.exp() |> Nx.tanh() end},
      {"sum", fn x, c -> Nx.sum(Nx.add(x, c), axes: [0]) end},
      {"dot",
       fn x, c ->
         x |> Nx.flatten() |> Nx.add(c) |> then(&Nx.outer(&1, &1)) |> Nx.sum(axes: [1])
       end},
      {"softmax",
       fn x, c ->
         e = Nx.exp(Nx.subtract(Nx.add(x, c), Nx.reduce_max(x)))
         Nx.divide(e, Nx.sum(e))
       end},
      {"sort", fn x, c -> x |> Nx.flatten() |> Nx.add(c) |> Nx.sort(direction: :desc) end},
      {"cumsum", fn x, c -> x |> Nx.flatten() |> Nx.multiply(c) |> Nx.cumulative_sum() end},
      {"while", fn x, c -> CpuPluginsBench.SmallDefn.loop(Nx.flatten(x), c) end},
      {"conv",
       fn x, c ->
         v = x |> Nx.flatten() |> Nx.reshape({1, 1, :auto})
         Nx.conv(Nx.add(v, c), Nx.iota({2, 1, 3}, type: :f32))
       end}
    ]
  end
end

defmodule CpuPluginsBench.SmallDefn do
  @moduledoc false
  import Nx.Defn

  defn loop(x, c) do
    {_, x} =
      while {i = 0, x}, i < 10 do
        {i + 1, Nx.cos(x) * c}
      end

    x
  end
end

defmodule CpuPluginsBench do
  @moduledoc false
  alias GpuBench.{Bert, GPT2}

  def now, do: System.monotonic_time(:nanosecond) / 1.0e9

  def load, do: File.read!("/proc/loadavg") |> String.split() |> hd() |> String.to_float()

  @doc """
  Runs `fun`: `{wall seconds, CPU seconds}`, each divided by `n`. The CPU
  time is that of all the VM's threads (the plugin's thread pools
  included), from each thread's scheduler statistics.
  """
  def measure(n \\ 1, fun) do
    {cpu, start} = {cpu(), now()}
    fun.()
    {(now() - start) / n, (cpu() - cpu) / n}
  end

  defp cpu do
    nanoseconds =
      for task <- File.ls!("/proc/self/task"),
          {:ok, stat} <- [File.read("/proc/self/task/#{task}/schedstat")],
          reduce: 0,
          do: (acc -> acc + String.to_integer(hd(String.split(stat))))

    nanoseconds / 1.0e9
  end

  ## Plugins and their clients

  def plugins do
    known = EXLA.Plugin.cpu_plugins()

    wanted =
      case System.get_env("BENCH_PLUGINS") do
        none when none in [nil, ""] -> known
        names -> String.split(names, ",", trim: true)
      end

    for name <- wanted do
      EXLA.Plugin.check_cpu_plugin!(name, "BENCH_PLUGINS entry")
    end

    arch = EXLA.Plugin.Install.arch()

    {here, elsewhere} =
      Enum.split_with(wanted, fn name ->
        match?({:ok, _}, EXLA.Plugin.Install.cpu_wheel(EXLA.Plugin.Install.pin(name), arch))
      end)

    for name <- elsewhere, do: IO.puts("#{name}: no wheel for #{arch}, left out")

    clients =
      for {name, i} <- Enum.with_index(here) do
        client = :"cpu_plugin_#{i}"
        {client, [platform: :host, cpu_plugin: name]}
      end

    Application.put_env(:exla, :clients, Application.fetch_env!(:exla, :clients) ++ clients)

    for {{client, _}, name} <- Enum.zip(clients, here) do
      c = EXLA.Client.fetch!(client)
      version = EXLA.Plugin.Install.cpu_version(name)
      IO.puts("#{name} #{version}: #{c.plugin_path} (#{c.platform_version})")
      {name, client}
    end
  end

  def on(tensor, client), do: Nx.backend_copy(tensor, {EXLA.Backend, client: client})

  # Runs `fun` once, and returns a function that measures a call of it.
  defp timed(fun) do
    fun.()
    fn -> measure(fun) end
  end

  ## Workloads: each returns, for one plugin's client, a function that runs
  ## one measurement and returns its seconds.

  def tiny(client, _s) do
    x = on(Nx.iota({16}, type: :f32), client)
    fun = EXLA.jit(fn x -> Nx.add(x, 1) end, client: client)
    for _ <- 1..200, do: Nx.to_binary(fun.(x))
    n = 20_000
    fn -> measure(n, fn -> for _ <- 1..n, do: Nx.to_binary(fun.(x)) end) end
  end

  def mlp(client, _s) do
    {params, x, y} = CompilerBench.MLP.pattern_inputs({EXLA.Backend, client: client})
    training(EXLA.jit(&CompilerBench.MLP.step/3, client: client), {params, x, y}, 20)
  end

  def conv(client, _s) do
    {param_shapes, x_shape, y_shape} = CpuPluginsBench.ConvNet.shapes(64)
    pattern = fn shape, scale -> pattern(shape, scale, client) end

    params =
      param_shapes
      |> Enum.map(fn {w, b} -> {pattern.(w, 0.05), pattern.(b, 0.0)} end)
      |> List.to_tuple()

    x = pattern.(x_shape, 1.0)
    y = on(Nx.equal(Nx.remainder(Nx.iota(y_shape), 10), 3) |> Nx.as_type(:f32), client)
    training(EXLA.jit(&CpuPluginsBench.ConvNet.step/3, client: client), {params, x, y}, 5)
  end

  # `n` training steps from the same parameters, per step: reading the
  # last loss waits for the last step.
  defp training(step, {params, x, y}, n) do
    Nx.to_binary(elem(step.(params, x, y), 1))

    fn ->
      measure(n, fn ->
        {_, loss} = Enum.reduce(1..n, {params, nil}, fn _, {p, _} -> step.(p, x, y) end)
        Nx.to_binary(loss)
      end)
    end
  end

  # A deterministic tensor of `shape` with values in [-scale, scale], made
  # on the client.
  defp pattern(shape, scale, client) do
    make = fn scale ->
      Nx.iota(shape, type: :f32) |> Nx.multiply(0.618) |> Nx.sin() |> Nx.multiply(scale)
    end

    EXLA.jit(make, client: client).(scale)
  end

  def bert(client, s) do
    c = Bert.config(s.quick)
    params = weights(Bert.spec(c), client)
    ids = on(Bert.ids(c, if(s.quick, do: 2, else: 8)), client)
    forward = EXLA.jit(&Bert.forward(&1, &2, heads: c.heads), client: client)
    # The hidden states are read back (3 MB, about 1 ms).
    timed(fn -> Nx.to_binary(forward.(params, ids)) end)
  end

  def gpt2(client, s) do
    c = GPT2.config(s.quick)
    {batch, len} = if s.quick, do: {2, 16}, else: {4, 128}
    params = weights(GPT2.spec(c), client)
    tokens = on(GpuBench.Transformer.token_grid(batch, len, c.vocab, {7919, 104_729, 13}), client)
    prefill = EXLA.jit(&GPT2.prefill(&1, &2, heads: c.heads, max_len: len), client: client)
    # Reading the next tokens waits for the cache too (the same run).
    timed(fn -> Nx.to_binary(elem(prefill.(params, tokens), 0)) end)
  end

  # Parameters of `spec` (a map, a tuple of layers, or a shape): each a
  # deterministic pattern of standard deviation about 0.02, made on the
  # client (nothing to transfer).
  defp weights(spec, client) when is_map(spec),
    do: Map.new(spec, fn {k, v} -> {k, weights(v, client)} end)

  defp weights(spec, client) when is_tuple(spec) do
    if Enum.all?(Tuple.to_list(spec), &is_integer/1) do
      pattern(spec, 0.028, client)
    else
      spec |> Tuple.to_list() |> Enum.map(&weights(&1, client)) |> List.to_tuple()
    end
  end

  def first_call(client, _s) do
    {params, x, y} = CompilerBench.MLP.pattern_inputs({EXLA.Backend, client: client})

    fn ->
      c = :rand.uniform()
      step = fn p, x, y -> CompilerBench.MLP.step(p, Nx.multiply(x, c), y) end

      measure(fn ->
        {_, loss} = EXLA.jit(step, client: client, cache: false).(params, x, y)
        Nx.to_number(loss)
      end)
    end
  end

  def compile_set(client, _s) do
    programs =
      for {_, shape, fun} <- CpuPluginsBench.Small.programs() do
        {fun, on(Nx.iota(shape, type: :f32) |> Nx.multiply(0.01), client)}
      end

    fn ->
      c = :rand.uniform()

      measure(fn ->
        for {fun, x} <- programs do
          Nx.to_binary(EXLA.jit(&fun.(&1, c), client: client, cache: false).(x))
        end
      end)
    end
  end

  @workloads [
    {"tiny", "cached tiny call (f32[16] + 1, read back)", :tiny, :us},
    {"mlp", "MLP step 784-512-512-10, batch 128", :mlp, :ms},
    {"conv", "conv net training step, batch 64 of 28×28", :conv, :ms},
    {"bert", "BERT-base forward, batch 8, sequence 128", :bert, :ms},
    {"gpt2", "GPT-2-small prefill, batch 4, 128 tokens", :gpt2, :ms},
    {"first", "first call of the MLP step (lower, compile, run)", :first_call, :ms},
    {"compile", "first calls of 24 small programs, in total", :compile_set, :ms}
  ]

  def main do
    quick? = System.get_env("BENCH_QUICK") in ["1", "true"]
    rounds = String.to_integer(System.get_env("BENCH_ROUNDS") || "5")
    s = %{quick: quick?}
    # Every program is compiled, none loaded from the disk cache.
    Application.put_env(:exla, :cache_dir, false)
    :rand.seed(:exsss, {1, 2, 3})
    plugins = plugins()
    names = Enum.map(plugins, &elem(&1, 0))
    IO.puts("#{rounds} rounds#{if quick?, do: " (quick)", else: ""}; load #{load()}")

    only =
      case System.get_env("BENCH_ONLY") do
        none when none in [nil, ""] -> nil
        list -> String.split(list, ",", trim: true)
      end

    rows =
      for {key, title, fun, unit} <- @workloads, only == nil or key in only do
        started = now()
        runs = for {name, client} <- plugins, do: {name, apply(__MODULE__, fun, [client, s])}

        {times, loads} =
          Enum.reduce(1..rounds, {%{}, []}, fn _, {times, loads} ->
            times =
              Enum.reduce(Enum.shuffle(runs), times, fn {name, run}, times ->
                Map.update(times, name, [run.()], &[run.() | &1])
              end)

            {times, [load() | loads]}
          end)

        medians =
          Map.new(times, fn {name, list} ->
            {name,
             {BenchTiming.median(Enum.map(list, &elem(&1, 0))),
              BenchTiming.median(Enum.map(list, &elem(&1, 1)))}}
          end)

        :erlang.garbage_collect()
        row = {title, unit, medians, Enum.min_max(loads)}
        IO.puts(format_row(row, names) <> " (#{round(now() - started)} s)")
        row
      end

    table = table(rows, names, rounds)
    IO.puts("\n" <> table)

    case System.get_env("BENCH_OUT") do
      out when out in [nil, ""] -> :ok
      out -> File.write!(out, table)
    end
  end

  defp value(seconds, :us), do: :erlang.float_to_binary(seconds * 1.0e6, decimals: 2) <> " µs"

  defp value(seconds, :ms) when seconds < 0.01,
    do: :erlang.float_to_binary(seconds * 1.0e3, decimals: 3) <> " ms"

  defp value(seconds, :ms), do: :erlang.float_to_binary(seconds * 1.0e3, decimals: 1) <> " ms"

  # A cell: wall time, CPU time, and for the other plugins both as ratios
  # to the default's.
  defp format_row({title, unit, medians, {low, high}}, [default | _] = names) do
    {default_wall, default_cpu} = medians[default]

    cells =
      for name <- names do
        {wall, cpu} = medians[name]
        cell = "#{value(wall, unit)}, CPU #{value(cpu, unit)}"

        if name == default,
          do: cell,
          else: cell <> " (#{ratio(wall, default_wall)}, #{ratio(cpu, default_cpu)})"
      end

    "| #{Enum.join([title | cells], " | ")} | #{low}–#{high} |"
  end

  defp ratio(value, default), do: :erlang.float_to_binary(value / default, decimals: 2) <> "×"

  defp table(rows, names, rounds) do
    header =
      "| workload (median of #{rounds} rounds; wall, CPU) | " <>
        Enum.join(names ++ ["load"], " | ") <> " |"

    separator = "|" <> String.duplicate(" --- |", length(names) + 2)
    Enum.join([header, separator | Enum.map(rows, &format_row(&1, names))], "\n") <> "\n"
  end
end

CpuPluginsBench.main()
