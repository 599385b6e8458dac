"""The JAX side of bench/gpu_bench.exs, run by it after the EXLA side:

    python gpu_bench_jax.py DIR

DIR holds what the Elixir side wrote: config.json (sizes, parts, seconds
per measurement), mlp_jax.py (the MLP step of bench/support/mlp.exs), the
weights (NAME.bin, raw little-endian f32, and NAME.json, the manifest) and
EXLA's outputs (BERT outputs, generated tokens). Results go to
DIR/jax_results.txt as `key<TAB>value` lines, with the same keys as EXLA's,
plus how far EXLA's outputs are from JAX's.

The models are those of bench/support/gpu_models.exs, op for op in the same
order; the timing is the same as on the Elixir side (see its header): inputs
on the device, first call and warm-up left out, rounds for a fixed time,
jax.block_until_ready on every output of a round, median of the rounds.
Only stable public APIs: jax.jit, jax.numpy, jax.lax, jax.device_put,
jax.block_until_ready, jax.tree_util.
"""
import functools
import json
import math
import os
import sys
import time
import traceback

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax

HIGHEST = lax.Precision.HIGHEST


## Timing


def now():
    return time.perf_counter()


def time_rounds(state, fun, min_rounds, seconds):
    """Runs fun (state -> state) in rounds until `seconds` have passed and at
    least min_rounds ran: (seconds of each round, last state)."""
    deadline = now() + seconds
    times = []
    while len(times) < min_rounds or now() < deadline:
        start = now()
        state = fun(state)
        times.append(now() - start)
    return times, state


def timed(fun):
    start = now()
    result = fun()
    jax.block_until_ready(result)
    return now() - start, result


def median(xs):
    return sorted(xs)[len(xs) // 2]


## The models (bench/support/gpu_models.exs)


def mm(x, w, precision=None):
    return jnp.matmul(x, w, precision=precision)


def layer_norm(x, g, b, eps=1e-5):
    x32 = x.astype(jnp.float32)
    n = x.shape[-1]
    mean = jnp.sum(x32, axis=-1, keepdims=True) / n
    centered = x32 - mean
    var = jnp.sum(centered * centered, axis=-1, keepdims=True) / n
    return (centered * lax.rsqrt(var + eps)).astype(x.dtype) * g + b


def softmax(scores):
    s = scores.astype(jnp.float32)
    e = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
    return (e / jnp.sum(e, axis=-1, keepdims=True)).astype(scores.dtype)


def gelu_erf(x):
    return 0.5 * x * (1 + lax.erf(x * 0.7071067811865476))


def gelu_tanh(x):
    return 0.5 * x * (1 + jnp.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def split_heads(x, heads):
    b, s, h = x.shape
    return x.reshape(b, s, heads, h // heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    b, heads, s, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, heads * d)


def attention(q, k, v, mask, precision=None):
    scale = 1.0 / math.sqrt(q.shape[3])
    scores = lax.dot_general(q, k, (((3,), (3,)), ((0, 1), (0, 1))), precision=precision) * scale
    if mask is not None:
        scores = jnp.where(mask, scores, -1.0e9)
    return lax.dot_general(softmax(scores), v, (((3,), (2,)), ((0, 1), (0, 1))), precision=precision)


def bert_forward(params, ids, heads):
    emb = params["emb"]
    positions = emb["pos"][: ids.shape[1]]
    x = jnp.take(emb["word"], ids, axis=0) + positions + emb["type"]
    x = layer_norm(x, emb["ln_g"], emb["ln_b"], eps=1.0e-12)
    for p in params["layers"]:
        x = bert_block(x, p, heads)
    return x


def bert_block(x, p, heads):
    x = layer_norm(x + bert_attention(x, p, heads), p["ln1_g"], p["ln1_b"], eps=1.0e-12)
    h = gelu_erf(mm(x, p["w1"]) + p["b1"])
    return layer_norm(x + (mm(h, p["w2"]) + p["b2"]), p["ln2_g"], p["ln2_b"], eps=1.0e-12)


def bert_attention(x, p, heads):
    q = split_heads(mm(x, p["wq"]) + p["bq"], heads)
    k = split_heads(mm(x, p["wk"]) + p["bk"], heads)
    v = split_heads(mm(x, p["wv"]) + p["bv"], heads)
    ctx = merge_heads(attention(q, k, v, None))
    return mm(ctx, p["wo"]) + p["bo"]


def gpt2_prefill(params, tokens, heads, max_len):
    t = tokens.shape[1]
    x = jnp.take(params["wte"], tokens, axis=0) + params["wpe"][:t]
    mask = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]
    cache = []
    for p in params["layers"]:
        q, k, v = gpt2_qkv(x, p, heads)
        x = gpt2_finish(x, attention(q, k, v, mask, HIGHEST), p)
        pad = [(0, 0, 0), (0, 0, 0), (0, max_len - k.shape[2], 0), (0, 0, 0)]
        zero = jnp.zeros((), k.dtype)
        cache.append((lax.pad(k, zero, pad), lax.pad(v, zero, pad)))
    return gpt2_next_token(params, x[:, t - 1, :]), tuple(cache)


def gpt2_decode(params, cache, token, pos, heads):
    h = params["wte"].shape[1]
    x = jnp.take(params["wte"], token, axis=0) + lax.dynamic_slice(params["wpe"], (pos, 0), (1, h))
    x = x[:, None, :]
    mask = jnp.arange(cache[0][0].shape[2]) <= pos
    new_cache = []
    for p, (ck, cv) in zip(params["layers"], cache):
        q, k, v = gpt2_qkv(x, p, heads)
        ck = lax.dynamic_update_slice(ck, k, (0, 0, pos, 0))
        cv = lax.dynamic_update_slice(cv, v, (0, 0, pos, 0))
        new_cache.append((ck, cv))
        x = gpt2_finish(x, attention(q, ck, cv, mask, HIGHEST), p)
    return gpt2_next_token(params, x[:, 0, :]), tuple(new_cache)


def gpt2_next_token(params, x):
    x = layer_norm(x, params["lnf_g"], params["lnf_b"])
    logits = lax.dot_general(x, params["wte"], (((1,), (1,)), ((), ())), precision=HIGHEST)
    return jnp.argmax(logits, axis=1).astype(jnp.int32)


def gpt2_qkv(x, p, heads):
    h = x.shape[2]
    y = layer_norm(x, p["ln1_g"], p["ln1_b"])
    qkv = mm(y, p["w_qkv"], HIGHEST) + p["b_qkv"]
    return tuple(split_heads(qkv[:, :, i * h : (i + 1) * h], heads) for i in range(3))


def gpt2_finish(x, ctx, p):
    x = x + (mm(merge_heads(ctx), p["wo"], HIGHEST) + p["bo"])
    y = layer_norm(x, p["ln2_g"], p["ln2_b"])
    return x + (mm(gelu_tanh(mm(y, p["w1"], HIGHEST) + p["b1"]), p["w2"], HIGHEST) + p["b2"])


## Inputs


def load_weights(d, name):
    """The parameters EXLA wrote, nested by their names (a.0.b: a tuple of
    layers), on the device."""
    with open(os.path.join(d, name + ".json")) as f:
        manifest = json.load(f)
    flat = np.fromfile(os.path.join(d, name + ".bin"), dtype="<f4")
    assert flat.size == manifest["total"], "weights file of the wrong size"
    root = {}
    for t in manifest["tensors"]:
        size = int(np.prod(t["shape"]))
        node = root
        path = t["name"].split(".")
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = flat[t["offset"] : t["offset"] + size].reshape(t["shape"])

    def fix(node):
        if isinstance(node, dict):
            node = {k: fix(v) for k, v in node.items()}
            if node and all(k.isdigit() for k in node):
                return tuple(node[str(i)] for i in range(len(node)))
        return node

    return jax.device_put(fix(root))


def bert_ids(c, batch):
    b = np.arange(batch)[:, None]
    s = np.arange(c["seq"])[None, :]
    return ((b * 131 + s * 17 + 7) % c["vocab"]).astype(np.int32)


def gpt2_prompt(c, batch):
    b = np.arange(batch)[:, None]
    s = np.arange(c["prompt"])[None, :]
    return ((b * 7919 + s * 104729 + 13) % c["vocab"]).astype(np.int32)


def read_exla_output(path, dtype):
    if dtype == "bf16":
        bits = np.fromfile(path, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32)
    return np.fromfile(path, dtype="<f4")


## The parts


def tiny(d, s, record):
    x = jax.device_put(np.arange(s["tiny_size"], dtype=np.float32))
    fun = jax.jit(lambda x: x + 1)
    first, y = timed(lambda: fun(x))
    record("tiny.check", float(np.sum(np.asarray(y))))
    for _ in range(200):
        fun(x).block_until_ready()
    times, _ = time_rounds(None, lambda _: fun(x).block_until_ready(), 100, s["seconds"])
    read, _ = time_rounds(None, lambda _: np.asarray(fun(x)), 100, s["seconds"])
    record("tiny.await_us", median(times) * 1e6)
    record("tiny.read_us", median(read) * 1e6)
    record("tiny.compile_ms", (first - median(times)) * 1000)


def mlp(d, s, record):
    ns = {}
    with open(os.path.join(d, "mlp_jax.py")) as f:
        exec(f.read(), ns)
    step = ns["step"]
    params, x, y = ns["pattern_inputs"]()
    first, (params, loss) = timed(lambda: step(params, x, y))
    record("mlp.loss", float(loss))
    n = s["mlp_steps"]

    def steps(params):
        loss = None
        for _ in range(n):
            params, loss = step(params, x, y)
        jax.block_until_ready((params, loss))
        return params

    params = steps(params)
    times, _ = time_rounds(params, steps, 5, s["seconds"])
    per_step = median(times) / n
    record("mlp.step_ms", per_step * 1000)
    record("mlp.compile_ms", (first - per_step) * 1000)


def bert(d, s, record):
    c = s["bert"]
    params = load_weights(d, "bert")
    forward = jax.jit(functools.partial(bert_forward, heads=c["heads"]))
    to_bf16 = jax.jit(lambda p: jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), p))
    n = s["bert_calls"]
    for dtype in ["f32", "bf16"]:
        p = params if dtype == "f32" else to_bf16(params)
        for batch in c["batches"]:
            key = "bert.%s.b%d" % (dtype, batch)
            ids = jax.device_put(bert_ids(c, batch))
            first, out = timed(lambda: forward(p, ids))
            for _ in range(2):
                forward(p, ids).block_until_ready()

            def calls(_):
                jax.block_until_ready([forward(p, ids) for _ in range(n)])

            times, _ = time_rounds(None, calls, 5, s["seconds"])
            per_call = median(times) / n
            record(key + ".ms", per_call * 1000)
            record(key + ".seq_s", batch / per_call)
            record(key + ".compile_ms", (first - per_call) * 1000)

            mine = np.asarray(out.astype(jnp.float32), dtype=np.float64).ravel()
            path = os.path.join(d, key + ".bin")
            if os.path.exists(path):
                theirs = read_exla_output(path, dtype).astype(np.float64)
                record(key + ".maxdiff", "%.3e" % np.max(np.abs(theirs - mine)))
                record(key + ".sum_exla", "%.6g" % np.sum(theirs))
            record(key + ".maxabs", "%.3g" % np.max(np.abs(mine)))
            record(key + ".sum_jax", "%.6g" % np.sum(mine))


def gpt2(d, s, record):
    c = s["gpt2"]
    params = load_weights(d, "gpt2")
    max_len = c["prompt"] + c["new"]
    prefill = jax.jit(functools.partial(gpt2_prefill, heads=c["heads"], max_len=max_len))
    decode = jax.jit(functools.partial(gpt2_decode, heads=c["heads"]), donate_argnums=(1,))
    for batch in c["batches"]:
        key = "gpt2.b%d" % batch
        prompt = jax.device_put(gpt2_prompt(c, batch))
        positions = [jax.device_put(np.int32(c["prompt"] + i)) for i in range(c["new"] - 1)]
        pos = positions[0]

        prefill_first, (token, cache) = timed(lambda: prefill(params, prompt))
        decode_first, (token, cache) = timed(lambda: decode(params, cache, token, pos))
        prefill_call = median([timed(lambda: prefill(params, prompt))[0] for _ in range(3)])
        decode_calls = []
        for _ in range(3):
            t, (token, cache) = timed(lambda: decode(params, cache, token, pos))
            decode_calls.append(t)
        record(key + ".prefill_compile_ms", (prefill_first - prefill_call) * 1000)
        record(key + ".decode_compile_ms", (decode_first - median(decode_calls)) * 1000)

        def generate(_):
            token, cache = prefill(params, prompt)
            tokens = [token]
            for pos in positions:
                token, cache = decode(params, cache, token, pos)
                tokens.append(token)
            jax.block_until_ready(tokens)
            return tokens

        generate(None)
        times, tokens = time_rounds(None, generate, 3, s["seconds"])
        per_generation = median(times)
        record(key + ".tok_s", batch * c["new"] / per_generation)
        record(key + ".ms_token", per_generation / c["new"] * 1000)

        mine = np.stack([np.asarray(t) for t in tokens], axis=1)
        path = os.path.join(d, key + ".tokens")
        if os.path.exists(path):
            theirs = np.loadtxt(path, dtype=np.int64, ndmin=2)
            same = int(np.sum(theirs == mine)) if theirs.shape == mine.shape else 0
            if theirs.shape == mine.shape and same == mine.size:
                record(key + ".match", "yes, all %d" % mine.size)
            else:
                where = np.argwhere(theirs != mine) if theirs.shape == mine.shape else [[-1, -1]]
                record(
                    key + ".match",
                    "NO, %d of %d (first difference: sequence %d, token %d)"
                    % (same, mine.size, where[0][0], where[0][1]),
                )
        record(key + ".first_tokens", " ".join(str(t) for t in mine[0][:8]))


PARTS = {"tiny": tiny, "mlp": mlp, "bert": bert, "gpt2": gpt2}


def main(d):
    with open(os.path.join(d, "config.json")) as f:
        s = json.load(f)
    try:
        # The persistent compilation cache is off unless a folder is set;
        # keep it off so the compile times are compiles.
        jax.config.update("jax_enable_compilation_cache", False)
    except Exception:
        pass
    out = open(os.path.join(d, "jax_results.txt"), "w")

    def record(key, value):
        text = repr(value) if isinstance(value, float) else value
        out.write("%s\t%s\n" % (key, text))
        out.flush()
        # Also in the log, so a run stopped before the table keeps its numbers.
        print("  %s = %s" % (key, text), flush=True)

    device = jax.devices()[0]
    record("info.device", "JAX %s, %s (%s)" % (jax.__version__, device.device_kind, device.platform))
    for part in s["parts"]:
        start = now()
        try:
            PARTS[part](d, s, record)
        except Exception as e:
            traceback.print_exc()
            record("error." + part, " ".join(("%s: %s" % (type(e).__name__, e)).split())[:300])
        print("JAX %s done in %.1f s" % (part, now() - start), flush=True)
    out.close()


if __name__ == "__main__":
    main(sys.argv[1])
