defmodule EXLA.Defn.Lowering.Eigh do
  @moduledoc false
  # Eigen-decomposition of Hermitian matrices written as a defn, traced to
  # an expression and lowered like any other op.
  #
  # It follows Nx.BinaryBackend's algorithm, not Nx's default expression,
  # because the two converge to different eigenvectors and the reference
  # is what Nx documents: a Householder reduction to Hessenberg form, then
  # unshifted QR iterations (QR by Householder reflections too) until Q
  # changes by at most `eps` entry-wise or `max_iter` is reached. Entries
  # below `eps` are flushed to zero where the reference flushes them. The
  # arithmetic is done in double precision and rounded once at the end,
  # like the reference's Erlang floats. Each matrix of a batch stops
  # iterating when it converges, as it would on its own.

  import Nx.Defn
  import EXLA.Defn.Lowering.Double, only: [as_work: 1, real_part: 1]

  @doc false
  def expr(%Nx.Tensor{} = template, opts) do
    eps = Keyword.fetch!(opts, :eps)
    max_iter = Keyword.fetch!(opts, :max_iter)
    Nx.Defn.debug_expr(&eigh(&1, eps: eps, max_iter: max_iter)).(template)
  end

  defn eigh(a, opts \\ []) do
    eps = opts[:eps]
    max_iter = opts[:max_iter]
    work = a |> Nx.reshape(batched_shape(a)) |> as_work()
    {h, q} = hessenberg(work, eps)

    {_i, h, q, _done} =
      while {i = 0, h, q, done = Nx.broadcast(Nx.u8(0), {Nx.axis_size(work, 0)})},
            i < max_iter and not Nx.all(done) do
        {q_step, r_step} = qr(h, eps)
        h_next = batched_dot(r_step, q_step)
        q_next = batched_dot(q, q_step)
        diff = Nx.abs(q - q_next)
        same = Nx.all(diff <= eps or Nx.is_nan(diff), axes: [1, 2])
        keep = done |> Nx.reshape({:auto, 1, 1}) |> Nx.broadcast(h)
        {i + 1, Nx.select(keep, h, h_next), Nx.select(keep, q, q_next), done or same}
      end

    diag = Nx.take_diagonal(h) |> real_part()
    vals = flush(diag, eps) |> Nx.reshape(vals_shape(a))
    vecs = flush(q, eps) |> Nx.reshape(Nx.shape(a))
    {vals, vecs}
  end

  # H = Q* A Q with Householder reflectors applied to columns 0..n-2.
  defnp hessenberg(a, eps) do
    n = Nx.axis_size(a, -1)
    eye = Nx.broadcast(Nx.eye(n, type: Nx.type(a)), Nx.shape(a))

    {_i, h, q} =
      while {i = 0, h = a, q = eye}, i < n - 1 do
        reflector = householder(h, i, i + 1, eps)
        h = reflector |> batched_dot(h) |> batched_dot(adjoint(reflector))
        {i + 1, h, batched_dot(q, reflector)}
      end

    {flush(h, eps), flush(q, eps)}
  end

  # A = Q R, reflecting columns 0..n-2 (the reference stops one short of n).
  defnp qr(a, eps) do
    n = Nx.axis_size(a, -1)
    eye = Nx.broadcast(Nx.eye(n, type: Nx.type(a)), Nx.shape(a))

    {_i, q, r} =
      while {i = 0, q = eye, r = a}, i < n - 1 do
        reflector = householder(r, i, i, eps)
        {i + 1, batched_dot(q, reflector), batched_dot(reflector, r)}
      end

    {flush(q, eps), flush(r, eps)}
  end

  # The n x n reflector that zeroes column `col` of `m` below row `start`;
  # rows and columns before `start` are the identity's.
  defnp householder(m, col, start, eps) do
    n = Nx.axis_size(m, -1)
    x = Nx.take(m, col, axis: 2)
    rows = Nx.iota(Nx.shape(x), axis: 1)
    x = Nx.select(rows >= start, x, 0)
    a0 = Nx.take(x, start, axis: 1) |> Nx.new_axis(1)
    {v, scale} = reflector_vector(x, a0, rows, start, eps)
    outer = Nx.new_axis(scale * v, 2) * Nx.new_axis(conjugate_if_complex(v), 1)
    inside = Nx.new_axis(rows >= start, 2) and Nx.new_axis(rows >= start, 1)
    eye = Nx.broadcast(Nx.eye(n, type: Nx.type(m)), Nx.shape(m))
    Nx.select(inside, eye - outer, eye)
  end

  deftransformp reflector_vector(x, a0, rows, start, eps) do
    case Nx.type(x) do
      {:c, _} -> complex_reflector(x, a0, rows, start)
      _ -> real_reflector(x, a0, rows, start, eps)
    end
  end

  defnp real_reflector(x, a0, rows, start, eps) do
    norm_sq = Nx.sum(x * x, axes: [1], keep_axes: true)
    norm_sq_tail = norm_sq - a0 * a0
    norm = Nx.sqrt(norm_sq)
    v0 = Nx.select(a0 <= 0, a0 - norm, -norm_sq_tail / (a0 + norm))
    v0_sq = v0 * v0
    small = Nx.broadcast(norm_sq_tail < eps, x)
    scale = Nx.select(norm_sq_tail < eps, 0, 2 * v0_sq / (norm_sq_tail + v0_sq))
    tail = Nx.select(small, x, x / v0)
    v = Nx.select(rows == start, 1, Nx.select(rows > start, tail, 0))
    {v, scale}
  end

  defnp complex_reflector(x, a0, rows, start) do
    tail = Nx.select(rows > start, x, 0)
    norm_sq_tail = Nx.sum(abs_squared(tail), axes: [1], keep_axes: true)
    norm = Nx.sqrt(norm_sq_tail + abs_squared(a0))
    phase = Nx.phase(a0)
    alpha = Nx.complex(Nx.cos(phase), Nx.sin(phase)) * norm
    u0 = a0 + alpha
    norm_u = Nx.sqrt(norm_sq_tail + abs_squared(u0))
    v = Nx.select(rows == start, u0, tail) / norm_u
    {v, 2}
  end

  defnp abs_squared(z), do: Nx.real(z) * Nx.real(z) + Nx.imag(z) * Nx.imag(z)

  # Like the reference, a flushed entry keeps its sign (0 * x).
  defnp flush(x, eps), do: Nx.select(Nx.abs(x) < eps, 0 * x, x)

  defnp batched_dot(x, y), do: Nx.dot(x, [2], [0], y, [1], [0])

  defnp adjoint(m), do: m |> Nx.transpose(axes: [0, 2, 1]) |> conjugate_if_complex()

  deftransformp conjugate_if_complex(x) do
    case Nx.type(x) do
      {:c, _} -> Nx.conjugate(x)
      _ -> x
    end
  end

  deftransformp batched_shape(a) do
    shape = Nx.shape(a)
    rank = tuple_size(shape)
    n = elem(shape, rank - 1)
    {div(Nx.size(a), n * n), n, n}
  end

  deftransformp vals_shape(a) do
    shape = Nx.shape(a)
    Tuple.delete_at(shape, tuple_size(shape) - 1)
  end
end
