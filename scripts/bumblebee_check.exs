# Bumblebee on this EXLA: a BERT and a GPT-2 with random parameters, run by
# EXLA and by Nx.Defn.Evaluator on Nx.BinaryBackend, must agree.
#
# Bumblebee v0.7.0 asks for Nx ~> 0.12.0, so this runs on Nx 0.12 with
# Elixir >= 1.15. It needs no network: models are built from a spec
# (Bumblebee.configure/2) and initialized by Axon with a fixed seed, so no
# tokenizer and no Hugging Face download is involved. Run it from a
# Bumblebee checkout whose mix.exs takes Nx and EXLA by path:
#
#     cd bumblebee
#     NX_PATH=/path/to/nx-0.12/nx EXLA_PATH=/path/to/this/checkout \
#       MIX_ENV=test mix run /path/to/this/checkout/scripts/bumblebee_check.exs
#
# Arguments (after the script's path):
#
#   --more     also compare five more architectures, small and random the
#              same way: Llama (rotary embeddings, grouped-query attention),
#              BART and T5 (encoder-decoder; T5's relative position buckets),
#              ViT (patch convolution) and Whisper (1-D convolutions)
#   --serving  also serve the small BERT with Nx.Serving (EXLA, batch size 4)
#              to 16 concurrent callers, one sequence each, and compare every
#              reply with the evaluator's forward pass of that sequence
#   --large    also run BERT-base and GPT-2 small (124M parameters) on EXLA
#              alone, 128 tokens, and print the forward time (the reference
#              evaluator would take hours at that size)
#
# For each small model it prints the largest absolute difference of every
# output and of the initialized parameters, and raises unless every output
# is all_close (atol 1.0e-4, rtol 1.0e-4, f32). For GPT-2 it also runs
# Bumblebee's generation loop (a defn while loop over the model with its
# key-value cache) under both compilers, with greedy search, contrastive
# search and multinomial sampling (top-k and top-p, seeded), and requires
# the same tokens.

defmodule BumblebeeCheck do
  @atol 1.0e-4
  @rtol 1.0e-4
  @seed 42

  def main(argv) do
    {opts, _, _} =
      OptionParser.parse(argv, strict: [large: :boolean, more: :boolean, serving: :boolean])

    IO.puts(
      "Nx #{Application.spec(:nx, :vsn)}, Bumblebee #{Application.spec(:bumblebee, :vsn)}, " <>
        "Axon #{Application.spec(:axon, :vsn)}, Elixir #{System.version()}, " <>
        "OTP #{System.otp_release()}, EXLA client #{inspect(EXLA.Client.fetch!(:host).platform)}"
    )

    bert_spec = Bumblebee.configure(Bumblebee.Text.Bert, [architecture: :base] ++ size(:small))

    {bert, bert_params} =
      compare(
        "BERT (:base, 2 blocks, hidden 64)",
        bert_spec,
        bert_inputs(1000, 2, 16)
      )

    gpt2_spec =
      Bumblebee.configure(
        Bumblebee.Text.Gpt2,
        [architecture: :for_causal_language_modeling] ++ size(:small)
      )

    {gpt2, gpt2_params} =
      compare(
        "GPT-2 (:for_causal_language_modeling, 2 blocks, hidden 64)",
        gpt2_spec,
        gpt2_inputs(1000, 2, 16)
      )

    generation = generate(gpt2_spec, gpt2_params)

    more =
      if opts[:more],
        do:
          more_models()
          |> Enum.map(fn {name, spec, inputs} -> elem(compare(name, spec, inputs), 0) end)
          |> Enum.all?(),
        else: true

    serving = if opts[:serving], do: serve(bert_spec, bert_params), else: true

    if opts[:large] do
      timed(
        "BERT-base (:base, 12 blocks, hidden 768, vocab 30522)",
        Bumblebee.configure(
          Bumblebee.Text.Bert,
          [architecture: :base, vocab_size: 30522, max_positions: 512] ++ size(:base)
        ),
        bert_inputs(30522, 1, 128)
      )

      timed(
        "GPT-2 small (:for_causal_language_modeling, 12 blocks, hidden 768, vocab 50257)",
        Bumblebee.configure(
          Bumblebee.Text.Gpt2,
          [architecture: :for_causal_language_modeling, vocab_size: 50257, max_positions: 1024] ++
            size(:base)
        ),
        gpt2_inputs(50257, 1, 128)
      )
    end

    unless bert and gpt2 and generation and more and serving do
      raise "EXLA and Nx.Defn.Evaluator disagree (see above)"
    end

    IO.puts("\nall agree")
  end

  # Builds the model, initializes its parameters with the evaluator (the
  # reference) and with EXLA from the same seed, runs the forward pass both
  # ways from the reference parameters, and compares every output. Returns
  # whether all agree, and the reference parameters.
  defp compare(name, spec, inputs) do
    IO.puts("\n== #{name}")
    model = Bumblebee.build_model(spec)
    templates = Map.new(inputs, fn {k, t} -> {k, Nx.to_template(t)} end)

    {ref_init, ref_predict} = Axon.build(model, seed: @seed, compiler: Nx.Defn.Evaluator)
    {exla_init, exla_predict} = Axon.build(model, seed: @seed, compiler: EXLA)

    Nx.default_backend(Nx.BinaryBackend)
    {t_ref_init, params} = :timer.tc(fn -> ref_init.(templates, Axon.ModelState.empty()) end)
    {t_ref, ref_out} = :timer.tc(fn -> ref_predict.(params, inputs) end)

    Nx.default_backend(EXLA.Backend)
    exla_params = exla_init.(templates, Axon.ModelState.empty())

    {t_exla, exla_out} =
      :timer.tc(fn ->
        exla_predict.(Nx.backend_copy(params, EXLA.Backend), exla_inputs(inputs))
        |> tap(&on_host/1)
      end)

    Nx.default_backend(Nx.BinaryBackend)

    count = params.data |> leaves([]) |> Enum.map(fn {_, t} -> Nx.size(t) end) |> Enum.sum()

    IO.puts(
      "#{count} parameters; evaluator: init #{ms(t_ref_init)}, forward #{ms(t_ref)}; " <>
        "EXLA forward (compile + run) #{ms(t_exla)}"
    )

    {init_ok, init_diff} = diff(params.data, exla_params.data)

    IO.puts(
      "init (EXLA vs evaluator, seed #{@seed}): max abs diff #{fmt(init_diff)}" <>
        if(init_ok, do: "", else: "  NOT all_close")
    )

    # Every output of the reference, and only those, compared.
    ref_leaves = leaves(ref_out, [])
    exla_leaves = leaves(exla_out, [])

    true =
      ref_leaves != [] and
        Enum.map(ref_leaves, &elem(&1, 0)) == Enum.map(exla_leaves, &elem(&1, 0))

    ok =
      ref_leaves
      |> Enum.zip(exla_leaves)
      |> Enum.map(fn {{path, ref}, {path, got}} ->
        {ok, max} = diff(ref, got)

        IO.puts(
          "  #{Enum.join(path, ".")} #{inspect(Nx.shape(ref))} #{inspect(Nx.type(ref))}: max abs diff #{fmt(max)}#{if ok, do: "", else: "  MISMATCH"}"
        )

        ok
      end)
      |> Enum.all?()

    IO.puts(if ok, do: "outputs agree (atol #{@atol}, rtol #{@rtol})", else: "outputs DISAGREE")

    {ok, params}
  end

  # The small models' sizes (BERT, GPT-2, Llama), and BERT-base's.
  defp size(:small) do
    [
      vocab_size: 1000,
      max_positions: 64,
      hidden_size: 64,
      num_blocks: 2,
      num_attention_heads: 4,
      intermediate_size: 128
    ]
  end

  defp size(:base) do
    [hidden_size: 768, num_blocks: 12, num_attention_heads: 12, intermediate_size: 3072]
  end

  # BART's and Whisper's (T5 has one intermediate size for both stacks).
  defp size(:encoder_decoder) do
    [
      vocab_size: 1000,
      hidden_size: 64,
      encoder_num_blocks: 2,
      decoder_num_blocks: 2,
      encoder_num_attention_heads: 4,
      decoder_num_attention_heads: 4,
      encoder_intermediate_size: 128,
      decoder_intermediate_size: 128
    ]
  end

  defp more_models do
    key = Nx.Random.key(5)
    {pixels, key} = Nx.Random.normal(key, shape: {2, 32, 32, 3})
    {features, _key} = Nx.Random.normal(key, shape: {2, 32, 8})
    decoder = Map.new(gpt2_inputs(1000, 2, 8), fn {k, v} -> {"decoder_" <> k, v} end)

    [
      {"Llama (:for_causal_language_modeling, 2 blocks, 4 heads, 2 key-value heads)",
       Bumblebee.configure(
         Bumblebee.Text.Llama,
         [architecture: :for_causal_language_modeling, num_key_value_heads: 2] ++ size(:small)
       ), gpt2_inputs(1000, 2, 16)},
      {"BART (:for_conditional_generation, 2+2 blocks)",
       Bumblebee.configure(
         Bumblebee.Text.Bart,
         [architecture: :for_conditional_generation, max_positions: 64] ++
           size(:encoder_decoder)
       ), Map.merge(gpt2_inputs(1000, 2, 16), decoder)},
      # T5 scales no attention logits, so at its default initializer scale
      # (1.0) random weights give hidden states near 300, where f32 rounding
      # alone (summation order) moves outputs by up to 2e-2 between any two
      # implementations; the gap falls with the scale (1e-7 at 0.05), so the
      # comparison uses 0.05. See docs/bumblebee.md.
      {"T5 (:for_conditional_generation, 2+2 blocks, initializer scale 0.05)",
       Bumblebee.configure(
         Bumblebee.Text.T5,
         [
           architecture: :for_conditional_generation,
           initializer_scale: 0.05,
           attention_head_size: 16,
           intermediate_size: 128
         ] ++
           Keyword.drop(size(:encoder_decoder), [
             :encoder_intermediate_size,
             :decoder_intermediate_size
           ])
       ), Map.merge(gpt2_inputs(1000, 2, 16), decoder)},
      {"ViT (:for_image_classification, 32x32 image, patch 8, 2 blocks)",
       Bumblebee.configure(Bumblebee.Vision.Vit,
         architecture: :for_image_classification,
         image_size: 32,
         patch_size: 8,
         hidden_size: 64,
         num_blocks: 2,
         num_attention_heads: 4,
         intermediate_size: 128,
         num_labels: 10
       ), %{"pixel_values" => pixels}},
      {"Whisper (:for_conditional_generation, 32 frames of 8 features, 2+2 blocks)",
       Bumblebee.configure(
         Bumblebee.Audio.Whisper,
         [
           architecture: :for_conditional_generation,
           feature_size: 8,
           encoder_max_positions: 16,
           decoder_max_positions: 32
         ] ++ size(:encoder_decoder)
       ),
       %{
         "input_features" => features,
         "decoder_input_ids" => decoder["decoder_input_ids"],
         "decoder_attention_mask" => decoder["decoder_attention_mask"]
       }}
    ]
  end

  # What a Bumblebee serving does (a jitted predict called with the params
  # and a padded batch), with 16 callers at once: their sequences are
  # batched 4 at a time by Nx.Serving, and each reply must match the
  # evaluator's forward pass of that one sequence.
  defp serve(spec, params) do
    IO.puts("\n== BERT through Nx.Serving (EXLA, batch size 4), 16 concurrent callers")
    callers = 16
    inputs = bert_inputs(1000, callers, 16)
    {_init, predict} = Axon.build(Bumblebee.build_model(spec))
    {_, ref_predict} = Axon.build(Bumblebee.build_model(spec), compiler: Nx.Defn.Evaluator)
    ref = ref_predict.(params, inputs)
    exla_params = Nx.backend_copy(params, EXLA.Backend)

    serving =
      Nx.Serving.new(
        fn defn_options ->
          jitted = Nx.Defn.jit(predict, defn_options)
          fn batch -> jitted.(exla_params, batch) end
        end,
        compiler: EXLA
      )

    {:ok, pid} =
      Nx.Serving.start_link(serving: serving, name: BumblebeeCheck.Serving, batch_size: 4)

    replies =
      0..(callers - 1)
      |> Task.async_stream(
        fn i ->
          one = Map.new(inputs, fn {k, t} -> {k, t[i]} end)
          Nx.Serving.batched_run(BumblebeeCheck.Serving, Nx.Batch.stack([one]))
        end,
        max_concurrency: callers,
        timeout: 120_000
      )
      |> Enum.map(fn {:ok, reply} -> reply end)

    GenServer.stop(pid)

    {ok, max} =
      replies
      |> Enum.with_index()
      |> Enum.reduce({true, 0.0}, fn {reply, i}, {ok, max} ->
        expected = Map.new([:hidden_state, :pooled_state], &{&1, ref[&1][i..i]})
        {ok1, max1} = diff(expected, Map.take(reply, [:hidden_state, :pooled_state]))
        {ok and ok1, max(max, max1)}
      end)

    IO.puts(
      "#{length(replies)} replies; max abs diff #{fmt(max)} from the evaluator" <>
        if(ok, do: ": agree", else: ": DISAGREE")
    )

    ok
  end

  # Bumblebee's generation (Bumblebee.Text.Generation.build_generate/3)
  # jitted by each compiler: a defn while loop that calls the model, updates
  # its cache and picks the next token, for each strategy.
  defp generate(spec, params) do
    strategies = [
      %{type: :greedy_search},
      %{type: :contrastive_search, top_k: 4, alpha: 0.6},
      %{type: :multinomial_sampling, top_k: 8, top_p: 0.9}
    ]

    strategies |> Enum.map(&generate(spec, params, &1)) |> Enum.all?()
  end

  defp generate(spec, params, strategy) do
    IO.puts("\n== GPT-2 generation, 8 new tokens, #{inspect(strategy)}")
    model = Bumblebee.build_model(spec)

    config =
      Bumblebee.configure(Bumblebee.Text.GenerationConfig,
        max_new_tokens: 8,
        bos_token_id: 0,
        eos_token_id: 999,
        pad_token_id: 0,
        strategy: strategy
      )

    generate = Bumblebee.Text.Generation.build_generate(model, spec, config)

    inputs =
      gpt2_inputs(1000, 2, 16)
      |> Map.put("seed", Nx.tensor([0, 1], type: :s64))

    ref = Nx.Defn.jit_apply(generate, [params, inputs], compiler: Nx.Defn.Evaluator)

    Nx.default_backend(EXLA.Backend)

    got =
      Nx.Defn.jit_apply(generate, [Nx.backend_copy(params, EXLA.Backend), exla_inputs(inputs)],
        compiler: EXLA
      )

    Nx.default_backend(Nx.BinaryBackend)

    ref_ids = Nx.to_list(ref.token_ids)
    got_ids = got.token_ids |> Nx.backend_transfer(Nx.BinaryBackend) |> Nx.to_list()

    IO.puts(
      "evaluator: #{inspect(ref_ids)} length #{inspect(Nx.to_list(ref.length), charlists: :as_lists)}"
    )

    IO.puts(
      "EXLA:      #{inspect(got_ids)} length #{inspect(Nx.to_list(Nx.backend_transfer(got.length, Nx.BinaryBackend)), charlists: :as_lists)}"
    )

    ok = ref_ids == got_ids
    IO.puts(if ok, do: "same tokens", else: "tokens DIFFER")
    ok
  end

  # EXLA alone at a realistic size: parameters initialized by EXLA, first
  # call (compile + run) and the median of 5 cached calls.
  defp timed(name, spec, inputs) do
    IO.puts("\n== #{name}, batch 1, 128 tokens, EXLA only")
    Nx.default_backend(EXLA.Backend)
    model = Bumblebee.build_model(spec)
    templates = Map.new(inputs, fn {k, t} -> {k, Nx.to_template(t)} end)
    {init, predict} = Axon.build(model, seed: @seed, compiler: EXLA)

    {t_init, params} =
      :timer.tc(fn -> init.(templates, Axon.ModelState.empty()) |> tap(&on_host(&1.data)) end)

    inputs = exla_inputs(inputs)
    # A call is timed until its outputs are on the host: the device may
    # still be computing when predict returns.
    forward = fn -> predict.(params, inputs) |> tap(&on_host/1) end
    {t_first, out} = :timer.tc(forward)
    times = for _ <- 1..5, do: elem(:timer.tc(forward), 0)

    count = params.data |> leaves([]) |> Enum.map(fn {_, t} -> Nx.size(t) end) |> Enum.sum()
    [{_, main} | _] = leaves(out, [])
    finite = main |> Nx.is_nan() |> Nx.any() |> Nx.to_number() == 0

    IO.puts(
      "#{count} parameters; init #{ms(t_init)}; first forward (compile + run) #{ms(t_first)}; " <>
        "forward (run, outputs copied to the host) median of 5 #{ms(Enum.at(Enum.sort(times), 2))} " <>
        "(min #{ms(Enum.min(times))}); outputs #{Enum.map_join(leaves(out, []), ", ", fn {p, t} -> "#{Enum.join(p, ".")} #{inspect(Nx.shape(t))}" end)}; " <>
        "no NaN: #{finite}"
    )

    Nx.default_backend(Nx.BinaryBackend)
  end

  defp on_host(container) do
    container |> leaves([]) |> Enum.each(fn {_, t} -> Nx.backend_copy(t, Nx.BinaryBackend) end)
  end

  defp bert_inputs(vocab, batch, length) do
    key = Nx.Random.key(7)
    {ids, _} = Nx.Random.randint(key, 0, vocab, shape: {batch, length}, type: :u32)

    %{
      "input_ids" => ids,
      "attention_mask" => mask(batch, length),
      "token_type_ids" =>
        Nx.iota({batch, length}, axis: 1, type: :u32)
        |> Nx.greater_equal(div(length, 2))
        |> Nx.as_type(:u32)
    }
  end

  defp gpt2_inputs(vocab, batch, length) do
    key = Nx.Random.key(11)
    {ids, _} = Nx.Random.randint(key, 0, vocab, shape: {batch, length}, type: :u32)
    %{"input_ids" => ids, "attention_mask" => mask(batch, length)}
  end

  # The last sequence of the batch is padded (its final quarter masked), so
  # masking is exercised; a batch of one is unpadded.
  defp mask(1, length), do: Nx.broadcast(Nx.tensor(1, type: :u32), {1, length})

  defp mask(batch, length) do
    row = Nx.iota({batch, length}, axis: 0)
    col = Nx.iota({batch, length}, axis: 1)

    Nx.logical_not(
      Nx.logical_and(Nx.equal(row, batch - 1), Nx.greater_equal(col, length - div(length, 4)))
    )
    |> Nx.as_type(:u32)
  end

  defp exla_inputs(inputs),
    do: Map.new(inputs, fn {k, t} -> {k, Nx.backend_copy(t, EXLA.Backend)} end)

  # Every tensor of a nested output (maps, structs, tuples), with its path;
  # %Axon.None{} (an output the model does not produce) has none.
  defp leaves(%Nx.Tensor{} = t, path), do: [{Enum.reverse(path), t}]
  defp leaves(%Axon.None{}, _path), do: []
  defp leaves(%_{} = struct, path), do: leaves(Map.from_struct(struct), path)

  defp leaves(map, path) when is_map(map) do
    map
    |> Enum.sort_by(fn {k, _} -> to_string(k) end)
    |> Enum.flat_map(fn {k, v} -> leaves(v, [to_string(k) | path]) end)
  end

  defp leaves(tuple, path) when is_tuple(tuple) do
    tuple
    |> Tuple.to_list()
    |> Enum.with_index()
    |> Enum.flat_map(fn {v, i} -> leaves(v, [to_string(i) | path]) end)
  end

  defp leaves(_other, _path), do: []

  # all_close over every leaf, and the largest absolute difference.
  defp diff(%Nx.Tensor{} = ref, %Nx.Tensor{} = got) do
    got = Nx.backend_transfer(got, Nx.BinaryBackend)
    true = Nx.shape(ref) == Nx.shape(got) and Nx.type(ref) == Nx.type(got)

    max =
      if Nx.size(ref) == 0,
        do: 0.0,
        else:
          Nx.subtract(Nx.as_type(ref, :f64), Nx.as_type(got, :f64))
          |> Nx.abs()
          |> Nx.reduce_max()
          |> Nx.to_number()

    ok = Nx.all_close(ref, got, atol: @atol, rtol: @rtol) |> Nx.to_number() == 1
    {ok, max}
  end

  defp diff(ref, got) do
    ref_leaves = leaves(ref, [])
    got_leaves = leaves(got, [])
    true = Enum.map(ref_leaves, &elem(&1, 0)) == Enum.map(got_leaves, &elem(&1, 0))

    Enum.zip_reduce(ref_leaves, got_leaves, {true, 0.0}, fn {_, r}, {_, g}, {ok, max} ->
      {ok1, max1} = diff(r, g)
      {ok and ok1, max(max, max1)}
    end)
  end

  defp ms(us), do: "#{Float.round(us / 1000, 1)} ms"
  defp fmt(x) when is_float(x), do: :erlang.float_to_binary(x, [{:scientific, 2}])
  defp fmt(x), do: inspect(x)
end

BumblebeeCheck.main(System.argv())
