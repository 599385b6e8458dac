"""The JAX side of bench/linalg_bench.exs, which starts it and talks to it
over stdin/stdout, one command and one answer a line:

    case OP TYPE M N PATH
        reads the input (PATH: raw little-endian f64, M x N), compiles OP
        for it in TYPE (f32 or f64) with jax.jit(f).lower(x).compile() and
        answers `COMPILE_MS NAME=ERROR...`: the errors of its results (see
        errors() below), computed in f64 with NumPy
    run K
        runs the compiled case K times, waiting for each result, and
        answers the K times in milliseconds
    quit

Run with JAX_PLATFORMS=cpu (the bench sets it) and jax==0.10.2, as
issue 40's table was. Inputs are transferred to the device once; each run
times one call up to block_until_ready.
"""
import sys
import time

import numpy as np
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

jax.config.update("jax_enable_x64", True)

OPS = {
    "qr": lambda a: jnp.linalg.qr(a),
    "svd": lambda a: jnp.linalg.svd(a, full_matrices=False),
    "eigh": lambda a: jnp.linalg.eigh(a),
    "cholesky": lambda a: jnp.linalg.cholesky(a),
    "lu": lambda a: jsl.lu(a),
    "solve": lambda a, b: jnp.linalg.solve(a, b),
    "invert": lambda a: jnp.linalg.inv(a),
    "determinant": lambda a: jnp.linalg.det(a),
    "least_squares": lambda a, b: jnp.linalg.lstsq(a, b)[0],
    "pinv": lambda a: jnp.linalg.pinv(a),
}


def inputs(op, a):
    """The op's arguments for the matrix a (what the Elixir side passes)."""
    if op in ("solve", "least_squares"):
        b = a.sum(axis=1) / a.shape[1]
        return (a, b)
    return (a,)


def orthonormality(q):
    q = np.asarray(q, dtype=np.float64)
    return float(np.max(np.abs(q.T @ q - np.eye(q.shape[1]))))


def relative(x, reference):
    x = np.asarray(x, dtype=np.float64)
    return float(np.max(np.abs(x - reference)) / max(np.max(np.abs(reference)), 1e-300))


def errors(op, args, out):
    """How far the results are from what they should be, in f64: the
    orthonormality of Q, U, V and eigenvectors (max |QᵀQ - I|) and the
    reconstruction (max |A - product| / max |A|), or for the solvers the
    residual of what they solve."""
    a = np.asarray(args[0], dtype=np.float64)
    if op == "qr":
        q, r = out
        return {"orth": orthonormality(q), "recon": relative(np.asarray(q, np.float64) @ r, a)}
    if op == "svd":
        u, s, vt = (np.asarray(x, np.float64) for x in out)
        return {
            "orth": max(orthonormality(u), orthonormality(vt.T)),
            "recon": relative((u * s) @ vt, a),
        }
    if op == "eigh":
        w, v = (np.asarray(x, np.float64) for x in out)
        return {"orth": orthonormality(v), "recon": relative((v * w) @ v.T, a)}
    if op == "cholesky":
        l = np.asarray(out, np.float64)
        return {"recon": relative(l @ l.T, a)}
    if op == "lu":
        p, l, u = (np.asarray(x, np.float64) for x in out)
        return {"recon": relative(p @ l @ u, a)}
    if op == "solve":
        b = np.asarray(args[1], np.float64)
        return {"recon": relative(a @ np.asarray(out, np.float64), b)}
    if op == "invert":
        return {"recon": float(np.max(np.abs(a @ np.asarray(out, np.float64) - np.eye(a.shape[0]))))}
    if op == "determinant":
        sign, logdet = np.linalg.slogdet(a)
        exact = sign * np.exp(logdet)
        return {"recon": float(abs(float(out) - exact) / abs(exact))}
    if op == "least_squares":
        b = np.asarray(args[1], np.float64)
        x = np.asarray(out, np.float64)
        # the normal equations' residual, relative to |Aᵀ b|
        return {"recon": float(np.max(np.abs(a.T @ (a @ x - b))) / np.max(np.abs(a.T @ b)))}
    if op == "pinv":
        p = np.asarray(out, np.float64)
        return {"recon": relative(a @ p @ a, a)}
    raise ValueError(op)


def main():
    compiled = None
    device_args = None
    for line in sys.stdin:
        words = line.split()
        if words[0] == "quit":
            break
        if words[0] == "case":
            op, type_, m, n, path = words[1:]
            dtype = {"f32": np.float32, "f64": np.float64}[type_]
            a = np.fromfile(path, dtype="<f8").reshape(int(m), int(n)).astype(dtype)
            args = inputs(op, a)
            device_args = [jax.device_put(x) for x in args]
            start = time.perf_counter()
            compiled = jax.jit(OPS[op]).lower(*device_args).compile()
            compile_ms = (time.perf_counter() - start) * 1e3
            out = jax.block_until_ready(compiled(*device_args))
            found = errors(op, args, out)
            reply = " ".join([repr(compile_ms)] + [f"{k}={v!r}" for k, v in found.items()])
        elif words[0] == "run":
            times = []
            for _ in range(int(words[1])):
                start = time.perf_counter()
                jax.block_until_ready(compiled(*device_args))
                times.append((time.perf_counter() - start) * 1e3)
            reply = " ".join(repr(t) for t in times)
        else:
            raise ValueError(words[0])
        sys.stdout.write(reply + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
