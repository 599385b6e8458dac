# The two transformer models of bench/gpu_bench.exs, in defn, and their
# shapes; bench/support/gpu_bench_jax.py has the same models in JAX, written
# op for op in the same order so both compute the same thing.
#
#   * GpuBench.Bert: a BERT-base-shaped encoder (post-LN blocks, erf GELU,
#     softmax attention without mask, word + position + type embeddings and
#     their layer norm); `forward/3` gives the last hidden states.
#   * GpuBench.GPT2: a GPT-2-small-shaped decoder (pre-LN blocks, tanh
#     GELU, learned positions, the LM head tied to the token embedding) with
#     a key/value cache: `prefill/3` runs the prompt and fills the cache,
#     `decode/5` runs one token at `pos`, writes its keys and values into
#     the cache (Nx.put_slice) and returns the greedy (argmax) next token.
#
# Layer norms and softmaxes compute their statistics in f32 whatever the
# activations' type (as mixed-precision BERT and GPT-2 implementations do);
# the matrix products, GELU and residuals run in the activations' type.
defmodule GpuBench.Transformer do
  @moduledoc false
  import Nx.Defn

  defn layer_norm(x, g, b, opts \\ []) do
    opts = keyword!(opts, eps: 1.0e-5)
    x32 = Nx.as_type(x, :f32)
    mean = Nx.sum(x32, axes: [-1], keep_axes: true) / Nx.axis_size(x, -1)
    centered = x32 - mean
    var = Nx.sum(centered * centered, axes: [-1], keep_axes: true) / Nx.axis_size(x, -1)
    as_type_of(centered * Nx.rsqrt(var + opts[:eps]), x) * g + b
  end

  # Softmax over the last axis, computed in f32, returned in the input type.
  defn softmax(scores) do
    s = Nx.as_type(scores, :f32)
    e = Nx.exp(s - Nx.reduce_max(s, axes: [-1], keep_axes: true))
    as_type_of(e / Nx.sum(e, axes: [-1], keep_axes: true), scores)
  end

  defn gelu_erf(x), do: 0.5 * x * (1 + Nx.erf(x * 0.7071067811865476))

  defn gelu_tanh(x), do: 0.5 * x * (1 + Nx.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))

  deftransform as_type_of(y, x), do: Nx.as_type(y, Nx.type(x))

  @doc "[B, S, H] to [B, heads, S, H / heads]."
  deftransform split_heads(x, heads) do
    {b, s, h} = Nx.shape(x)
    x |> Nx.reshape({b, s, heads, div(h, heads)}) |> Nx.transpose(axes: [0, 2, 1, 3])
  end

  @doc "[B, heads, S, D] to [B, S, heads * D]."
  deftransform merge_heads(x) do
    {b, heads, s, d} = Nx.shape(x)
    x |> Nx.transpose(axes: [0, 2, 1, 3]) |> Nx.reshape({b, s, heads * d})
  end

  @doc "Scaled dot-product attention of [B, heads, Q, D] on [B, heads, K, D]; `mask` nil or broadcastable to [B, heads, Q, K]."
  deftransform attention(q, k, v, mask) do
    scale = 1.0 / :math.sqrt(Nx.axis_size(q, 3))
    scores = q |> Nx.dot([3], [0, 1], k, [3], [0, 1]) |> Nx.multiply(scale)
    # Nx.select takes its shape from the predicate.
    scores =
      if mask == nil,
        do: scores,
        else: Nx.select(Nx.broadcast(mask, Nx.shape(scores)), scores, -1.0e9)

    Nx.dot(softmax(scores), [3], [0, 1], v, [2], [0, 1])
  end

  @doc """
  Token ids [batch, len] (s32): `rem(b * row + s * col + add, vocab)` at
  batch `b`, position `s`. The JAX twin repeats the formula.
  """
  def token_grid(batch, len, vocab, {row, col, add}) do
    data =
      for b <- 0..(batch - 1),
          s <- 0..(len - 1),
          into: <<>>,
          do: <<rem(b * row + s * col + add, vocab)::signed-32-little>>

    data |> Nx.from_binary(:s32) |> Nx.reshape({batch, len})
  end
end

defmodule GpuBench.Bert do
  @moduledoc false
  import Nx.Defn
  import GpuBench.Transformer

  defn forward(params, ids, opts \\ []) do
    opts = keyword!(opts, [:heads])
    emb = params.emb
    positions = Nx.slice_along_axis(emb.pos, 0, Nx.axis_size(ids, 1), axis: 0)
    x = Nx.take(emb.word, ids) + positions + emb.type
    x = layer_norm(x, emb.ln_g, emb.ln_b, eps: 1.0e-12)
    blocks(x, params.layers, opts[:heads])
  end

  deftransformp blocks(x, layers, heads) do
    layers |> Tuple.to_list() |> Enum.reduce(x, &block(&2, &1, heads: heads))
  end

  defn block(x, p, opts \\ []) do
    opts = keyword!(opts, [:heads])
    x = layer_norm(x + self_attention(x, p, opts[:heads]), p.ln1_g, p.ln1_b, eps: 1.0e-12)
    h = gelu_erf(Nx.dot(x, p.w1) + p.b1)
    layer_norm(x + (Nx.dot(h, p.w2) + p.b2), p.ln2_g, p.ln2_b, eps: 1.0e-12)
  end

  deftransformp self_attention(x, p, heads) do
    q = split_heads(Nx.add(Nx.dot(x, p.wq), p.bq), heads)
    k = split_heads(Nx.add(Nx.dot(x, p.wk), p.bk), heads)
    v = split_heads(Nx.add(Nx.dot(x, p.wv), p.bv), heads)
    ctx = merge_heads(attention(q, k, v, nil))
    Nx.add(Nx.dot(ctx, p.wo), p.bo)
  end

  @doc "Sizes: BERT-base, or tiny ones for a CPU check."
  def config(quick?) do
    if quick?,
      do: %{
        vocab: 97,
        hidden: 32,
        layers: 2,
        heads: 4,
        ffn: 64,
        max_pos: 64,
        seq: 16,
        batches: [2, 4]
      },
      else: %{
        vocab: 30522,
        hidden: 768,
        layers: 12,
        heads: 12,
        ffn: 3072,
        max_pos: 512,
        seq: 128,
        batches: [8, 64]
      }
  end

  @doc "The parameters' shapes, as the parameters' container."
  def spec(c) do
    h = c.hidden
    f = c.ffn

    layer = %{
      wq: {h, h},
      bq: {h},
      wk: {h, h},
      bk: {h},
      wv: {h, h},
      bv: {h},
      wo: {h, h},
      bo: {h},
      ln1_g: {h},
      ln1_b: {h},
      w1: {h, f},
      b1: {f},
      w2: {f, h},
      b2: {h},
      ln2_g: {h},
      ln2_b: {h}
    }

    %{
      emb: %{word: {c.vocab, h}, pos: {c.max_pos, h}, type: {h}, ln_g: {h}, ln_b: {h}},
      layers: List.to_tuple(List.duplicate(layer, c.layers))
    }
  end

  @doc "Token ids [batch, seq] (s32), from a formula the JAX twin repeats."
  def ids(c, batch), do: GpuBench.Transformer.token_grid(batch, c.seq, c.vocab, {131, 17, 7})
end

defmodule GpuBench.GPT2 do
  @moduledoc false
  import Nx.Defn
  import GpuBench.Transformer

  @doc "Runs the prompt [B, T]: `{next token [B] (s32), cache}`, the cache holding `max_len` positions."
  defn prefill(params, tokens, opts \\ []) do
    opts = keyword!(opts, [:heads, :max_len])
    t = Nx.axis_size(tokens, 1)
    x = Nx.take(params.wte, tokens) + Nx.slice_along_axis(params.wpe, 0, t, axis: 0)
    mask = Nx.iota({t, 1}) >= Nx.iota({1, t})
    {x, cache} = prefill_blocks(x, params.layers, mask, opts[:heads], opts[:max_len])
    {next_token(params, Nx.squeeze(Nx.slice_along_axis(x, t - 1, 1, axis: 1), axes: [1])), cache}
  end

  @doc "Runs `token` [B] at position `pos` (s32 scalar): `{next token, cache with its keys and values}`."
  defn decode(params, cache, token, pos, opts \\ []) do
    opts = keyword!(opts, [:heads])
    h = Nx.axis_size(params.wte, 1)
    x = Nx.take(params.wte, token) + Nx.slice(params.wpe, [pos, 0], [1, h])
    x = Nx.new_axis(x, 1)
    mask = Nx.iota({Nx.axis_size(elem(elem(cache, 0), 0), 2)}) <= pos
    {x, cache} = decode_blocks(x, params.layers, cache, pos, mask, opts[:heads])
    {next_token(params, Nx.squeeze(x, axes: [1])), cache}
  end

  defnp next_token(params, x) do
    x = layer_norm(x, params.lnf_g, params.lnf_b)
    logits = Nx.dot(x, [1], params.wte, [1])
    Nx.argmax(logits, axis: 1) |> Nx.as_type(:s32)
  end

  deftransformp prefill_blocks(x, layers, mask, heads, max_len) do
    {cache, x} =
      layers
      |> Tuple.to_list()
      |> Enum.map_reduce(x, fn p, x ->
        {q, k, v} = qkv(x, p, heads)
        x = finish_block(x, attention(q, k, v, mask), p)
        pad = [{0, 0, 0}, {0, 0, 0}, {0, max_len - Nx.axis_size(k, 2), 0}, {0, 0, 0}]
        zero = Nx.tensor(0, type: Nx.type(k))
        {{Nx.pad(k, zero, pad), Nx.pad(v, zero, pad)}, x}
      end)

    {x, List.to_tuple(cache)}
  end

  deftransformp decode_blocks(x, layers, cache, pos, mask, heads) do
    {cache, x} =
      layers
      |> Tuple.to_list()
      |> Enum.zip(Tuple.to_list(cache))
      |> Enum.map_reduce(x, fn {p, {ck, cv}}, x ->
        {q, k, v} = qkv(x, p, heads)
        ck = Nx.put_slice(ck, [0, 0, pos, 0], k)
        cv = Nx.put_slice(cv, [0, 0, pos, 0], v)
        {{ck, cv}, finish_block(x, attention(q, ck, cv, mask), p)}
      end)

    {x, List.to_tuple(cache)}
  end

  deftransformp qkv(x, p, heads) do
    h = Nx.axis_size(x, 2)
    y = layer_norm(x, p.ln1_g, p.ln1_b)
    qkv = Nx.add(Nx.dot(y, p.w_qkv), p.b_qkv)
    part = fn i -> split_heads(Nx.slice_along_axis(qkv, i * h, h, axis: 2), heads) end
    {part.(0), part.(1), part.(2)}
  end

  defnp finish_block(x, ctx, p) do
    x = x + (Nx.dot(merge_heads(ctx), p.wo) + p.bo)
    y = layer_norm(x, p.ln2_g, p.ln2_b)
    x + (Nx.dot(gelu_tanh(Nx.dot(y, p.w1) + p.b1), p.w2) + p.b2)
  end

  @doc "Sizes: GPT-2 small, or tiny ones for a CPU check."
  def config(quick?) do
    if quick?,
      do: %{
        vocab: 211,
        hidden: 32,
        layers: 2,
        heads: 4,
        ffn: 128,
        n_pos: 64,
        prompt: 8,
        new: 8,
        batches: [1, 2]
      },
      else: %{
        vocab: 50257,
        hidden: 768,
        layers: 12,
        heads: 12,
        ffn: 3072,
        n_pos: 1024,
        prompt: 32,
        new: 64,
        batches: [1, 8]
      }
  end

  def spec(c) do
    h = c.hidden

    layer = %{
      ln1_g: {h},
      ln1_b: {h},
      w_qkv: {h, 3 * h},
      b_qkv: {3 * h},
      wo: {h, h},
      bo: {h},
      ln2_g: {h},
      ln2_b: {h},
      w1: {h, c.ffn},
      b1: {c.ffn},
      w2: {c.ffn, h},
      b2: {h}
    }

    %{
      wte: {c.vocab, h},
      wpe: {c.n_pos, h},
      lnf_g: {h},
      lnf_b: {h},
      layers: List.to_tuple(List.duplicate(layer, c.layers))
    }
  end

  @doc "The prompt [batch, prompt] (s32), from a formula the JAX twin repeats."
  def prompt(c, batch),
    do: GpuBench.Transformer.token_grid(batch, c.prompt, c.vocab, {7919, 104_729, 13})
end
