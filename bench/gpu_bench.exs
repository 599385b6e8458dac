# EXLA against JAX on the same device (written for one GPU; runs anywhere),
# in one run, each side in its own operating-system process, one after the
# other (EXLA first, then JAX), so they never share the device:
#
#   * tiny: a cached jitted `x + 1` on f32[16] already on the device, per
#     call in µs (median of many calls), waiting for the result on the
#     device (EXLA.DeviceBuffer.await / block_until_ready: no copy to the
#     host), and the same call reading the result back to the host;
#   * mlp: the MLP training step of bench/support/mlp.exs (784-512-512-10,
#     batch 128, f32, SGD), ms per step, each step fed the previous one's
#     parameters;
#   * bert: a BERT-base-shaped encoder forward (bench/support/gpu_models.exs:
#     hidden 768, 12 post-LN blocks, 12 heads, FFN 3072, erf GELU, seq 128)
#     at batch 8 and 64, in f32 and bf16 (weights and activations), ms per
#     forward and sequences per second;
#   * gpt2: greedy generation with a GPT-2-small-shaped decoder (hidden 768,
#     12 pre-LN layers, 12 heads, vocab 50257, tied LM head) and a
#     key/value cache: one prefill of a 32-token prompt, then one jitted
#     decode step per token (cache updated with put_slice, donated on both
#     sides) for 64 new tokens, at batch 1 and 8, f32 with the dots at
#     :highest precision on both sides (so the argmax, and thus the tokens,
#     do not hinge on TF32 rounding); tokens per second of the whole
#     generation, prompt included;
#   * the compile time of every program: its first call minus a steady call
#     (EXLA's disk cache is off; JAX's persistent cache is off by default).
#
# Both sides use the same weights: the EXLA process draws them (Nx.Random,
# fixed keys), writes them as raw little-endian f32 with a JSON manifest to
# a temporary folder, and JAX loads them with NumPy; bf16 weights are the
# f32 ones rounded on each side. JAX also reads EXLA's outputs from there
# and reports the largest difference (BERT outputs), the first losses
# (MLP) and whether the generated token ids are the same (GPT-2). With the
# default precision the GPU computes f32 dots in TF32 on both sides: the
# differences are reported, not asserted.
#
# Timing, the same on both sides: inputs already on the device, the first
# call (the compile) and warm-up calls left out, then rounds of calls for a
# fixed time (BENCH_SECONDS, at least a few rounds), median of the rounds.
# A round ends when its device work has finished: EXLA waits on every
# output buffer of the round's calls (EXLA.DeviceBuffer.await, which waits
# for the device, without a copy), JAX calls jax.block_until_ready on the
# same outputs. Tiny calls are timed one by one; MLP rounds are 10 chained
# steps, BERT rounds 5 forwards, GPT-2 rounds one whole generation.
#
#     MIX_ENV=prod JAX_PYTHON=python3 mix run bench/gpu_bench.exs
#
# Environment: JAX_PYTHON (a python with jax; without it only EXLA runs),
# BENCH_QUICK=1 (tiny models and short rounds, for a check on the CPU),
# BENCH_ONLY=tiny,mlp,bert,gpt2 (the parts to run), BENCH_SECONDS (time per
# measurement, default 1.5, 0.3 quick), BENCH_OUT (a path: the Markdown
# table is written there too), BENCH_DUMP (a folder: each side has XLA dump
# the HLO of its programs, as text, into DUMP/exla and DUMP/jax, to compare
# the kernels they launch; the dump's writing then counts in the compile
# times). A part that raises is reported and the
# others still run. On an H200 the EXLA side took 62 s (tiny 4.1 s, mlp
# 3.7, bert 27.7, gpt2 26.4) and JAX's first three parts 38 s: the whole
# run needs about 2.5 minutes there.
Code.require_file("support/mlp.exs", __DIR__)
Code.require_file("support/timing.exs", __DIR__)
Code.require_file("support/gpu_models.exs", __DIR__)

defmodule GpuBench do
  alias GpuBench.{Bert, GPT2}

  @parts ~w(tiny mlp bert gpt2)

  ## Settings (the parent writes them to config.json for both sides)

  def settings do
    quick? = System.get_env("BENCH_QUICK") in ["1", "true"]

    parts =
      case System.get_env("BENCH_ONLY") do
        only when only in [nil, ""] -> @parts
        only -> Enum.filter(@parts, &(&1 in String.split(only, ",", trim: true)))
      end

    seconds =
      case System.get_env("BENCH_SECONDS") do
        s when s in [nil, ""] -> if quick?, do: 0.3, else: 1.5
        s -> elem(Float.parse(s), 0)
      end

    %{
      quick: quick?,
      parts: parts,
      seconds: seconds,
      tiny_size: 16,
      mlp_steps: 10,
      bert_calls: 5,
      bert: Bert.config(quick?),
      gpt2: GPT2.config(quick?)
    }
  end

  ## Timing

  @doc """
  Runs `fun` (state -> state) in rounds until `seconds` have passed and at
  least `min` rounds ran: `{seconds of each round, last state}`.
  """
  def time_rounds(state, fun, min, seconds) do
    deadline = now() + seconds
    time_rounds(state, fun, min, deadline, [])
  end

  defp time_rounds(state, fun, min, deadline, acc) do
    if length(acc) >= min and now() >= deadline do
      {Enum.reverse(acc), state}
    else
      start = now()
      state = fun.(state)
      time_rounds(state, fun, min, deadline, [now() - start | acc])
    end
  end

  @doc "`{seconds, result}` of `fun`, waiting for the result's device work."
  def timed(fun) do
    start = now()
    result = fun.()
    await(result)
    {now() - start, result}
  end

  def now, do: System.monotonic_time(:nanosecond) / 1.0e9

  @doc "Waits until every EXLA buffer of `result` (a container or a list of them) is computed."
  def await(result) when is_list(result), do: Enum.each(result, &await/1)

  def await(result) do
    buffers =
      for %Nx.Tensor{data: %EXLA.Backend{buffer: buffer}} <-
            Nx.Defn.Composite.flatten_list([result]),
          do: buffer

    EXLA.DeviceBuffer.await(buffers)
  end

  def device(tensor), do: Nx.backend_transfer(tensor, EXLA.Backend)

  ## Results: `key<TAB>value` lines, appended as they come

  def record(dir, key, value) do
    value = if is_float(value), do: Float.to_string(value), else: to_string(value)
    File.write!(Path.join(dir, "exla_results.txt"), "#{key}\t#{value}\n", [:append])
    # Also in the log, so a run stopped before the table keeps its numbers.
    IO.puts("  #{key} = #{value}")
  end

  ## The EXLA process

  def exla_child(dir) do
    # XLA's compile is measured, not the compile cache on disk.
    Application.put_env(:exla, :cache_dir, false)
    s = settings()
    client = EXLA.Client.fetch!(EXLA.Client.default_name())

    record(
      dir,
      "info.device",
      "EXLA #{Application.spec(:exla, :vsn)}, client #{client.name} (#{client.platform_name})"
    )

    for part <- s.parts do
      start = now()

      try do
        apply(__MODULE__, String.to_atom(part), [dir, s])
      rescue
        e ->
          IO.puts("EXLA #{part} failed:\n" <> Exception.format(:error, e, __STACKTRACE__))
          record(dir, "error.#{part}", one_line(Exception.message(e)))
      end

      IO.puts("EXLA #{part} done in #{Float.round(now() - start, 1)} s")
    end
  end

  defp one_line(text), do: text |> String.replace(~r/\s+/, " ") |> String.slice(0, 300)

  def tiny(dir, s) do
    x = device(Nx.iota({s.tiny_size}, type: :f32))
    fun = EXLA.jit(fn x -> Nx.add(x, 1) end)
    {first, y} = timed(fn -> fun.(x) end)
    record(dir, "tiny.check", Nx.to_number(Nx.sum(Nx.backend_transfer(y))))
    for _ <- 1..200, do: await(fun.(x))
    {times, _} = time_rounds(nil, fn _ -> await(fun.(x)) end, 100, s.seconds)
    {read, _} = time_rounds(nil, fn _ -> Nx.to_binary(fun.(x)) end, 100, s.seconds)
    record(dir, "tiny.await_us", BenchTiming.median(times) * 1.0e6)
    record(dir, "tiny.read_us", BenchTiming.median(read) * 1.0e6)
    record(dir, "tiny.compile_ms", (first - BenchTiming.median(times)) * 1000)
  end

  def mlp(dir, s) do
    {params, x, y} = CompilerBench.MLP.pattern_inputs(EXLA.Backend)
    step = EXLA.jit(&CompilerBench.MLP.step/3)
    {first, {params, loss}} = timed(fn -> step.(params, x, y) end)
    record(dir, "mlp.loss", Nx.to_number(loss))
    n = s.mlp_steps

    steps = fn params ->
      {params, loss} = Enum.reduce(1..n, {params, nil}, fn _, {p, _} -> step.(p, x, y) end)
      await({params, loss})
      params
    end

    params = steps.(params)
    {times, _} = time_rounds(params, steps, 5, s.seconds)
    per_step = BenchTiming.median(times) / n
    record(dir, "mlp.step_ms", per_step * 1000)
    record(dir, "mlp.compile_ms", (first - per_step) * 1000)
  end

  def bert(dir, s) do
    c = s.bert
    params = weights(dir, "bert", Bert.spec(c), 1)
    forward = EXLA.jit(&Bert.forward(&1, &2, heads: c.heads))
    n = s.bert_calls

    for type <- [:f32, :bf16], batch <- c.batches do
      key = "bert.#{type}.b#{batch}"
      p = cast(params, type)
      ids = device(Bert.ids(c, batch))
      {first, out} = timed(fn -> forward.(p, ids) end)
      File.write!(Path.join(dir, key <> ".bin"), Nx.to_binary(out))
      for _ <- 1..2, do: await(forward.(p, ids))
      calls = fn _ -> await(for _ <- 1..n, do: forward.(p, ids)) end
      {times, _} = time_rounds(nil, calls, 5, s.seconds)
      per_call = BenchTiming.median(times) / n
      record(dir, key <> ".ms", per_call * 1000)
      record(dir, key <> ".seq_s", batch / per_call)
      record(dir, key <> ".compile_ms", (first - per_call) * 1000)
    end
  end

  defp cast(params, :f32), do: params

  defp cast(params, type) do
    EXLA.jit(fn p -> Nx.Defn.Composite.traverse(p, &Nx.as_type(&1, type)) end).(params)
  end

  def gpt2(dir, s) do
    c = s.gpt2
    params = weights(dir, "gpt2", GPT2.spec(c), 2)
    max_len = c.prompt + c.new

    prefill =
      EXLA.jit(&GPT2.prefill(&1, &2, heads: c.heads, max_len: max_len), precision: :highest)

    decode =
      EXLA.jit(&GPT2.decode(&1, &2, &3, &4, heads: c.heads), precision: :highest, donate: [1])

    for batch <- c.batches do
      key = "gpt2.b#{batch}"
      prompt = device(GPT2.prompt(c, batch))
      positions = for i <- 0..(c.new - 2), do: device(Nx.tensor(c.prompt + i, type: :s32))
      pos = hd(positions)

      {prefill_first, {token, cache}} = timed(fn -> prefill.(params, prompt) end)
      {decode_first, {token, cache}} = timed(fn -> decode.(params, cache, token, pos) end)

      # One call of each, waited for, to take from the first calls.
      prefill_call =
        BenchTiming.median(for _ <- 1..3, do: elem(timed(fn -> prefill.(params, prompt) end), 0))

      {decode_calls, _} =
        Enum.map_reduce(1..3, {token, cache}, fn _, {t, c} ->
          timed(fn -> decode.(params, c, t, pos) end)
        end)

      record(dir, key <> ".prefill_compile_ms", (prefill_first - prefill_call) * 1000)

      record(
        dir,
        key <> ".decode_compile_ms",
        (decode_first - BenchTiming.median(decode_calls)) * 1000
      )

      generate = fn _ ->
        {token, cache} = prefill.(params, prompt)

        {tokens, _} =
          Enum.map_reduce(positions, {token, cache}, fn pos, {t, c} ->
            {t, c} = decode.(params, c, t, pos)
            {t, {t, c}}
          end)

        tokens = [token | tokens]
        await(tokens)
        tokens
      end

      generate.(nil)
      {times, tokens} = time_rounds(nil, generate, 3, s.seconds)
      per_generation = BenchTiming.median(times)
      record(dir, key <> ".tok_s", batch * c.new / per_generation)
      record(dir, key <> ".ms_token", per_generation / c.new * 1000)

      # [batch][new] token ids, one line per sequence.
      rows =
        tokens
        |> Enum.map(&Nx.to_flat_list/1)
        |> Enum.zip_with(&Enum.join(&1, " "))

      File.write!(Path.join(dir, key <> ".tokens"), Enum.join(rows, "\n") <> "\n")
    end
  end

  ## Weights

  @doc """
  Draws the parameters of `spec` (normal, standard deviation 0.02; layer
  norm gains 1 + that), writes them to `dir` as NAME.bin (little-endian
  f32, in the manifest's order) and NAME.json (the manifest: name, shape
  and offset in elements of each tensor), and returns them on the device.
  """
  def weights(dir, name, spec, seed) do
    entries = flatten_spec(spec, [])
    total = entries |> Enum.map(fn {_, shape} -> Tuple.product(shape) end) |> Enum.sum()

    flat =
      EXLA.jit(fn key -> elem(Nx.Random.normal(key, 0.0, 0.02, shape: {total}), 0) end).(
        Nx.Random.key(seed)
      )

    binary = Nx.to_binary(flat)

    {parts, _} =
      Enum.map_reduce(entries, 0, fn {path, shape}, offset ->
        size = Tuple.product(shape)
        data = binary_part(binary, offset * 4, size * 4)
        data = if String.ends_with?(to_string(List.last(path)), "_g"), do: gain(data), else: data
        {{path, shape, offset, data}, offset + size}
      end)

    File.write!(Path.join(dir, name <> ".bin"), Enum.map(parts, &elem(&1, 3)))

    manifest =
      for {path, shape, offset, _} <- parts,
          do: %{name: Enum.join(path, "."), shape: Tuple.to_list(shape), offset: offset}

    File.write!(Path.join(dir, name <> ".json"), json(%{total: total, tensors: manifest}))

    tensors =
      Map.new(parts, fn {path, shape, _, data} ->
        {path, data |> Nx.from_binary(:f32) |> Nx.reshape(shape) |> device()}
      end)

    build_spec(spec, [], tensors)
  end

  defp gain(data),
    do: for(<<v::float-32-little <- data>>, into: <<>>, do: <<1.0 + v::float-32-little>>)

  # A spec is a map (sorted by key), a tuple of specs (layers), or a shape.
  defp flatten_spec(spec, path) when is_map(spec),
    do: Enum.flat_map(Enum.sort(spec), fn {k, v} -> flatten_spec(v, path ++ [k]) end)

  defp flatten_spec(spec, path) when is_tuple(spec) do
    if shape?(spec),
      do: [{path, spec}],
      else:
        spec
        |> Tuple.to_list()
        |> Enum.with_index()
        |> Enum.flat_map(fn {v, i} -> flatten_spec(v, path ++ [i]) end)
  end

  defp build_spec(spec, path, tensors) when is_map(spec),
    do: Map.new(spec, fn {k, v} -> {k, build_spec(v, path ++ [k], tensors)} end)

  defp build_spec(spec, path, tensors) when is_tuple(spec) do
    if shape?(spec),
      do: Map.fetch!(tensors, path),
      else:
        spec
        |> Tuple.to_list()
        |> Enum.with_index()
        |> Enum.map(fn {v, i} -> build_spec(v, path ++ [i], tensors) end)
        |> List.to_tuple()
  end

  defp shape?(tuple), do: tuple |> Tuple.to_list() |> Enum.all?(&is_integer/1)

  def json(nil), do: "null"
  def json(b) when is_boolean(b), do: to_string(b)
  def json(n) when is_number(n), do: to_string(n)
  def json(a) when is_atom(a), do: json(to_string(a))
  def json(s) when is_binary(s), do: inspect(s)
  def json(l) when is_list(l), do: "[" <> Enum.map_join(l, ",", &json/1) <> "]"

  def json(m) when is_map(m),
    do: "{" <> Enum.map_join(m, ",", fn {k, v} -> json(to_string(k)) <> ":" <> json(v) end) <> "}"

  ## The parent: runs both sides, then prints the table

  def main do
    s = settings()
    dir = Path.join(System.tmp_dir!(), "exla_gpu_bench_#{System.os_time(:millisecond)}")
    File.rm_rf!(dir)
    File.mkdir_p!(dir)
    File.write!(Path.join(dir, "config.json"), json(s))
    File.write!(Path.join(dir, "mlp_jax.py"), CompilerBench.MLP.jax_source())
    started = now()

    IO.puts(
      "Parts: #{Enum.join(s.parts, ", ")}#{if s.quick, do: " (quick sizes)"}; folder #{dir}"
    )

    {exla_status, exla_s} =
      side(
        "mix",
        ["run", "--no-compile", "--no-deps-check", __ENV__.file],
        [{"GPU_BENCH_CHILD", "exla"}, {"GPU_BENCH_DIR", dir}]
      )

    python = System.get_env("JAX_PYTHON")

    {jax_status, jax_s} =
      if python in [nil, ""],
        do: {:skipped, 0.0},
        else: side(python, [Path.join(__DIR__, "support/gpu_bench_jax.py"), dir], [])

    exla = results(Path.join(dir, "exla_results.txt"))
    jax = results(Path.join(dir, "jax_results.txt"))

    report =
      report(s, exla, jax, %{
        exla: {exla_status, exla_s},
        jax: {jax_status, jax_s},
        total: now() - started
      })

    IO.puts("\n" <> report)

    case System.get_env("BENCH_OUT") do
      out when out in [nil, ""] -> :ok
      out -> File.write!(out, report)
    end

    unless System.get_env("BENCH_KEEP") in ["1", "true"], do: File.rm_rf!(dir)
  end

  # Runs one side, its output streamed: {exit status, seconds}.
  defp side(cmd, args, env) do
    start = now()
    env = [{"TF_CPP_MIN_LOG_LEVEL", "2"} | dump_env(cmd, env)]

    status =
      try do
        path = System.find_executable(cmd) || raise "#{cmd} is not an executable"

        {_, status} =
          System.cmd(path, args, env: env, into: IO.stream(:stdio, :line), stderr_to_stdout: true)

        status
      rescue
        e -> Exception.message(e)
      end

    {status, now() - start}
  end

  # XLA_FLAGS asking XLA to dump the side's programs into its own folder.
  defp dump_env(cmd, env) do
    case System.get_env("BENCH_DUMP") do
      dump when dump in [nil, ""] ->
        env

      dump ->
        folder = Path.join(Path.expand(dump), if(cmd == "mix", do: "exla", else: "jax"))
        File.mkdir_p!(folder)
        flags = "--xla_dump_to=#{folder} --xla_dump_hlo_as_text"
        [{"XLA_FLAGS", String.trim("#{System.get_env("XLA_FLAGS")} #{flags}")} | env]
    end
  end

  defp results(path) do
    case File.read(path) do
      {:ok, text} ->
        for line <- String.split(text, "\n", trim: true), into: %{} do
          [key, value] = String.split(line, "\t", parts: 2)
          {key, value}
        end

      {:error, _} ->
        %{}
    end
  end

  # {label, key, unit, target}: target {:max, r} (EXLA/JAX at most r) or {:min, r}, nil for none.
  defp rows(s) do
    b = s.bert
    g = s.gpt2
    bert = "BERT #{b.layers}x#{b.hidden} s#{b.seq}"
    gpt = "GPT-2 #{g.layers}x#{g.hidden} prompt #{g.prompt} +#{g.new}"

    speed =
      [
        {"tiny x + 1, waited on device", "tiny.await_us", "µs", {:max, 0.5}},
        {"tiny x + 1, read back to host", "tiny.read_us", "µs", {:max, 0.5}},
        {"MLP training step", "mlp.step_ms", "ms", {:max, 1.0}}
      ] ++
        for type <- [:f32, :bf16],
            batch <- b.batches,
            {what, unit, target} <- [{"ms", "ms", {:max, 1.0}}, {"seq_s", "seq/s", {:min, 1.0}}] do
          {"#{bert} #{type} b#{batch}", "bert.#{type}.b#{batch}.#{what}", unit, target}
        end ++
        for batch <- g.batches,
            {what, unit, target} <- [
              {"tok_s", "tok/s", {:min, 1.0}},
              {"ms_token", "ms/token", {:max, 1.0}}
            ] do
          {"#{gpt} b#{batch}", "gpt2.b#{batch}.#{what}", unit, target}
        end

    compile =
      [{"tiny x + 1", "tiny.compile_ms"}, {"MLP training step", "mlp.compile_ms"}] ++
        for(
          type <- [:f32, :bf16],
          batch <- b.batches,
          do: {"#{bert} #{type} b#{batch}", "bert.#{type}.b#{batch}.compile_ms"}
        ) ++
        for batch <- g.batches, step <- ["prefill", "decode"] do
          {"GPT-2 #{step} b#{batch}", "gpt2.b#{batch}.#{step}_compile_ms"}
        end

    speed ++ for {label, key} <- compile, do: {"compile: " <> label, key, "ms", nil}
  end

  defp report(s, exla, jax, runs) do
    parts = fn key -> hd(String.split(key, ".")) in s.parts end

    table =
      for {label, key, unit, target} <- rows(s), parts.(key) do
        e = number(exla[key])
        j = number(jax[key])
        ratio = if e && j && j != 0, do: e / j

        {goal, met} =
          case {target, ratio} do
            {nil, _} -> {"", ""}
            {{:max, r}, nil} -> {"≤ #{r}", ""}
            {{:min, r}, nil} -> {"≥ #{r}", ""}
            {{:max, r}, x} -> {"≤ #{r}", if(x <= r, do: "yes", else: "no")}
            {{:min, r}, x} -> {"≥ #{r}", if(x >= r, do: "yes", else: "no")}
          end

        "| #{label} (#{unit}) | #{fmt(e)} | #{fmt(j)} | #{fmt(ratio)} | #{goal} | #{met} |"
      end

    agreement = agreement(s, exla, jax, parts)

    errors =
      for {side, results} <- [{"EXLA", exla}, {"JAX", jax}],
          {"error." <> part, message} <- Enum.sort(results),
          do: "- #{side} #{part} failed: #{message}"

    status = fn {status, seconds} -> "#{inspect(status)} after #{Float.round(seconds, 1)} s" end

    """
    ## EXLA against JAX#{if s.quick, do: " (BENCH_QUICK: tiny sizes)"}

    #{exla["info.device"] || "EXLA: no result"}; #{jax["info.device"] || "JAX: no result"}.
    EXLA exited #{status.(runs.exla)}, JAX #{status.(runs.jax)}; #{Float.round(runs.total, 1)} s in all.
    Medians of rounds of #{s.seconds} s; ratio EXLA / JAX; targets: throughput at least JAX's,
    the tiny call at most half of JAX's.

    | measurement | EXLA | JAX | EXLA/JAX | target | met |
    | --- | ---: | ---: | ---: | --- | --- |
    #{Enum.join(table, "\n")}

    Agreement (same weights and inputs on both sides):

    #{Enum.join(agreement, "\n")}
    #{if errors == [], do: "", else: "\nErrors:\n\n" <> Enum.join(errors, "\n") <> "\n"}
    """
  end

  defp agreement(s, exla, jax, parts) do
    tiny =
      if parts.("tiny"),
        do: ["- tiny: sum of x + 1, EXLA #{exla["tiny.check"]}, JAX #{jax["tiny.check"]}"],
        else: []

    mlp =
      if parts.("mlp") do
        e = number(exla["mlp.loss"])
        j = number(jax["mlp.loss"])
        diff = if e && j, do: " (difference #{fmt_e(abs(e - j))})", else: ""
        ["- MLP first loss: EXLA #{exla["mlp.loss"]}, JAX #{jax["mlp.loss"]}#{diff}"]
      else
        []
      end

    bert =
      for type <- [:f32, :bf16], batch <- s.bert.batches, parts.("bert") do
        key = "bert.#{type}.b#{batch}"

        "- BERT #{type} b#{batch} output: max |EXLA - JAX| #{jax[key <> ".maxdiff"] || "-"}, " <>
          "max |JAX| #{jax[key <> ".maxabs"] || "-"}, sum EXLA #{jax[key <> ".sum_exla"] || "-"}, " <>
          "sum JAX #{jax[key <> ".sum_jax"] || "-"}"
      end

    gpt2 =
      for batch <- s.gpt2.batches, parts.("gpt2") do
        key = "gpt2.b#{batch}"

        "- GPT-2 b#{batch} generated token ids identical: #{jax[key <> ".match"] || "-"} " <>
          "(JAX's first ids of sequence 0: #{jax[key <> ".first_tokens"] || "-"})"
      end

    tiny ++ mlp ++ bert ++ gpt2
  end

  defp number(nil), do: nil

  defp number(text) do
    case Float.parse(text) do
      {x, _} -> x
      :error -> nil
    end
  end

  defp fmt(nil), do: "-"
  defp fmt(x) when abs(x) >= 100, do: :erlang.float_to_binary(x / 1, decimals: 0)
  defp fmt(x) when abs(x) >= 10, do: :erlang.float_to_binary(x / 1, decimals: 1)
  defp fmt(x), do: :erlang.float_to_binary(x / 1, decimals: 2)

  defp fmt_e(x), do: :io_lib.format("~.2e", [x / 1]) |> to_string()
end

if System.get_env("GPU_BENCH_CHILD") == "exla" do
  GpuBench.exla_child(System.fetch_env!("GPU_BENCH_DIR"))
  System.halt(0)
else
  GpuBench.main()
end
