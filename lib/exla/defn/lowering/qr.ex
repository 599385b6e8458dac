defmodule EXLA.Defn.Lowering.QR do
  @moduledoc false
  # QR decomposition by Householder reflections, written as a defn, traced
  # to an expression and lowered in place of Nx's default implementation
  # (which builds each reflector as a full matrix, so Q . R loses several
  # ulps: an entry of iota({4, 4}) that should be 0 comes out -2.9e-6 in
  # f32).
  #
  # Reflector j is kept as LAPACK keeps it (larfg): a vector v with
  # v[j] = 1 and a scalar tau, H = I - tau v v*, so that the reflection of
  # a column whose head is 0 has tau = 1 exactly and gives exact zeros in
  # Q. Reflectors are applied to the trailing columns of R and accumulated
  # into Q by rank-1 updates.
  #
  # Working precision: on the host (see EXLA.Platform.qr_in_f64?/1), f32
  # and c64 are computed in f64 and c128 and rounded once: in f32, Q . R of
  # the rank-deficient iota({4, 4}) was 2.4e-6 off (2.5 ulp of its largest
  # entries; forward or backward accumulation of Q alike), in f64 rounded
  # to f32 it is within 1e-6, as EXLA 0.7.2's host QR. Elsewhere they are
  # computed in their own type. f16 and bf16 are computed as f32 is and
  # rounded once more from f32 (so they are f32's result rounded;
  # computing in f16 gave an error several times larger, and its squared
  # norms overflow from entries of 256). Each reflector is computed from its
  # column divided by a power of two near the column's largest entry: an
  # exact scaling (the results are the same bits) under which the squared
  # norm neither overflows nor underflows. Signs follow Nx's
  # default implementation, so Q and R match it up to rounding (and its
  # gradient applies): for real input H x = |x| e_j (R's diagonal is
  # non-negative), for complex input H x = -e^(i arg x_j) |x| e_j. A column
  # already zero below the diagonal is left alone.

  import Nx.Defn

  @doc false
  def expr(%Nx.Tensor{} = template, opts, in_f64?) do
    mode = Keyword.get(opts, :mode, :reduced)
    Nx.Defn.debug_expr(&qr(&1, mode: mode, in_f64: in_f64?)).(template)
  end

  defn qr(a, opts \\ []) do
    {batch, m, n} = batched_shape(a)
    r = a |> as_working_type(opts[:in_f64]) |> Nx.reshape({batch, m, n})
    q = Nx.broadcast(Nx.eye(m, type: Nx.type(r)), {batch, m, m})
    rows = Nx.iota({batch, m, 1}, axis: 1)
    matrix_rows = Nx.iota({batch, m, n}, axis: 1)
    matrix_cols = Nx.iota({batch, m, n}, axis: 2)

    {_j, q, r} =
      while {j = 0, q, r}, j < min(m, n) do
        x = Nx.select(rows >= j, Nx.slice_along_axis(r, j, 1, axis: 2), 0)
        scale = power_of_two_scale(x)
        x = x / scale
        alpha = Nx.slice_along_axis(x, j, 1, axis: 1)
        tail_sq = Nx.sum(abs_sq(Nx.select(rows > j, x, 0)), axes: [1], keep_axes: true)
        {head, tau, beta} = reflector(alpha, tail_sq)
        skip = tail_sq == 0
        tau = Nx.select(skip, 0, tau)
        beta = Nx.select(skip, alpha, beta) * scale
        v = Nx.select(rows > j, x / Nx.select(skip, 1, head), Nx.select(rows == j, 1, 0))
        v_adjoint = adjoint(v)

        # R <- H R on the trailing columns; column j becomes beta e_j
        updated = r - tau * v * batched_dot(v_adjoint, r)
        column = Nx.select(matrix_rows == j, beta, Nx.select(matrix_rows > j, 0, r))
        r = Nx.select(matrix_cols > j, updated, Nx.select(matrix_cols == j, column, r))

        # Q <- Q H
        q = q - tau * batched_dot(q, v) * v_adjoint
        {j + 1, q, r}
      end

    output(q, r, Nx.shape(a), opts[:mode], rounding_type(a))
  end

  # For the column head `alpha` and the squared norm of the rest, returns
  # `alpha - beta` (computed without cancellation), tau and beta, where
  # H x = beta e_j.
  deftransformp reflector(alpha, tail_sq) do
    case Nx.type(alpha) do
      {:c, _} -> complex_reflector(alpha, tail_sq)
      _ -> real_reflector(alpha, tail_sq)
    end
  end

  defnp real_reflector(alpha, tail_sq) do
    norm = Nx.sqrt(alpha * alpha + tail_sq)
    head = Nx.select(alpha <= 0, alpha - norm, -tail_sq / (alpha + norm))
    {head, -head / norm, norm}
  end

  defnp complex_reflector(alpha, tail_sq) do
    magnitude = Nx.abs(alpha)
    norm = Nx.sqrt(magnitude * magnitude + tail_sq)
    phase = Nx.select(magnitude == 0, 1, alpha / Nx.select(magnitude == 0, 1, magnitude))
    {alpha + phase * norm, 1 + magnitude / norm, -phase * norm}
  end

  # The largest power of two not above the largest magnitude in each
  # matrix of `x` (its exponent bits), or 1 when that is zero (or
  # subnormal). Dividing by it is exact.
  deftransformp power_of_two_scale(x) do
    top = x |> Nx.abs() |> Nx.reduce_max(axes: [1, 2], keep_axes: true)

    {bits, exponent} =
      case Nx.type(top) do
        {:f, 32} -> {{:s, 32}, 0x7F800000}
        {:f, 64} -> {{:s, 64}, 0x7FF0000000000000}
      end

    # The mask is a tensor of its own type: Nx 0.9 and later type an
    # integer constant s32.
    mask = Nx.tensor(exponent, type: bits, backend: Nx.BinaryBackend)
    scale = top |> Nx.bitcast(bits) |> Nx.bitwise_and(mask) |> Nx.bitcast(Nx.type(top))
    Nx.select(Nx.equal(scale, 0), 1, scale)
  end

  # See "Working precision" at the top of this module.
  deftransformp as_working_type(a, in_f64?) do
    case {Nx.Type.to_floating(Nx.type(a)), in_f64?} do
      {{:c, _}, true} -> Nx.as_type(a, {:c, 128})
      {{:c, _} = type, _} -> Nx.as_type(a, type)
      {_, true} -> Nx.as_type(a, {:f, 64})
      {{:f, 64}, _} -> Nx.as_type(a, {:f, 64})
      _ -> Nx.as_type(a, {:f, 32})
    end
  end

  # The type the results are rounded to before the output's own type: f32
  # for f16 and bf16, the output's type otherwise.
  deftransformp rounding_type(a) do
    case Nx.Type.to_floating(Nx.type(a)) do
      {:f, 16} -> {:f, 32}
      {:bf, 16} -> {:f, 32}
      type -> type
    end
  end

  deftransformp abs_sq(x) do
    case Nx.type(x) do
      {:c, _} -> x |> Nx.abs() |> Nx.pow(2)
      _ -> Nx.multiply(x, x)
    end
  end

  deftransformp adjoint(v) do
    v = Nx.transpose(v, axes: [0, 2, 1])
    if Nx.Type.complex?(Nx.type(v)), do: Nx.conjugate(v), else: v
  end

  defnp batched_dot(a, b), do: Nx.dot(a, [2], [0], b, [1], [0])

  deftransformp output(q, r, shape, mode, type) do
    rank = tuple_size(shape)
    {m, n} = {elem(shape, rank - 2), elem(shape, rank - 1)}
    batch = shape |> Tuple.delete_at(rank - 1) |> Tuple.delete_at(rank - 2) |> Tuple.to_list()
    k = if mode == :complete, do: m, else: min(m, n)
    q = q |> Nx.slice_along_axis(0, k, axis: 2) |> Nx.reshape(List.to_tuple(batch ++ [m, k]))
    r = r |> Nx.slice_along_axis(0, k, axis: 1) |> Nx.reshape(List.to_tuple(batch ++ [k, n]))
    {Nx.as_type(q, type), Nx.as_type(r, type)}
  end

  deftransformp batched_shape(a) do
    shape = Nx.shape(a)
    rank = tuple_size(shape)
    batch = shape |> Tuple.delete_at(rank - 1) |> Tuple.delete_at(rank - 2) |> Tuple.product()
    {batch, elem(shape, rank - 2), elem(shape, rank - 1)}
  end
end
