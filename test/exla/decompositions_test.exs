defmodule EXLA.DecompositionsTest do
  # QR, eigh, SVD, Cholesky and LU as the host computes them (the NIF's
  # native kernels, EXLA.Defn.Lowering.Decompositions), checked by their
  # properties rather than by the reference's digits: reconstruction,
  # orthonormality, triangular factors, the order and signs EXLA gives, and
  # what bad input gives. Each is computed in EXLA.jit and eagerly on
  # EXLA.Backend, which must give the same bits.
  use ExUnit.Case, async: true

  @moduletag cpu_only:
               "the host computes decompositions natively (EXLA.Platform.native_linalg?/1); " <>
                 "other platforms keep their lowerings, checked in lowering/lin_alg_test.exs"

  ## Helpers

  defp random(shape, type, seed) do
    key = Nx.Random.key(seed) |> Nx.backend_copy(Nx.BinaryBackend)

    case type do
      {:c, bits} ->
        {re, key} = Nx.Random.normal(key, 0.0, 1.0, shape: shape, type: {:f, div(bits, 2)})
        {im, _} = Nx.Random.normal(key, 0.0, 1.0, shape: shape, type: {:f, div(bits, 2)})
        Nx.complex(re, im)

      type ->
        {t, _} = Nx.Random.normal(key, 0.0, 1.0, shape: shape, type: type)
        t
    end
  end

  # The results of `fun` on `args` in EXLA.jit and eagerly, which must be
  # the same bits; returned on the binary backend.
  defp both(fun, args), do: EXLA.LoweringCase.jit_and_eager_bits(fun, args)

  defp flatten(tuple) when is_tuple(tuple), do: Tuple.to_list(tuple)
  defp flatten(tensor), do: [tensor]

  # NaN payloads aside.
  defp bits(t), do: t |> Nx.backend_copy(Nx.BinaryBackend) |> Nx.to_binary()

  # Products and norms in the widest type, on the binary backend.
  defp wide(t) do
    t = Nx.backend_copy(t, Nx.BinaryBackend)
    if Nx.Type.complex?(t.type), do: Nx.as_type(t, :c128), else: Nx.as_type(t, :f64)
  end

  defp adjoint(t), do: t |> wide() |> Nx.LinAlg.adjoint()

  # Batched matrix product of the last two axes.
  defp mul(a, b) do
    {a, b} = {wide(a), wide(b)}
    batch = Enum.to_list(0..(Nx.rank(a) - 3)//1)
    Nx.dot(a, [-1], batch, b, [-2], batch)
  end

  defp max_abs(t), do: t |> Nx.abs() |> Nx.reduce_max() |> Nx.to_number()

  # The largest distance of `a` from `b`, relative to the largest entry of
  # `b` (1 for a zero `b`).
  defp error(a, b) do
    scale = max_abs(wide(b))
    max_abs(Nx.subtract(wide(a), wide(b))) / if(scale == 0, do: 1, else: scale)
  end

  # How far the columns of `q` are from orthonormal: max |QᴴQ - I|.
  defp orthonormality(q) do
    gram = mul(adjoint(q), q)
    k = Nx.axis_size(gram, -1)
    max_abs(Nx.subtract(gram, Nx.broadcast(Nx.eye(k, type: gram.type), gram.shape)))
  end

  # A tolerance for type `type` and matrices of size `n`: 20 ulp times n.
  defp tol(type, n) do
    eps =
      case type do
        {:f, 64} -> 2.2e-16
        {:c, 128} -> 2.2e-16
        {:f, 16} -> 9.8e-4
        {:bf, 16} -> 7.8e-3
        _ -> 1.2e-7
      end

    20 * eps * n
  end

  defp diagonal_matrix(d) do
    d = wide(d)
    Nx.multiply(Nx.new_axis(d, -2), Nx.eye(Nx.axis_size(d, -1), type: d.type))
  end

  # The diagonals of a batch of matrices.
  defp diagonal(t) do
    t = wide(t)
    n = Nx.axis_size(t, -1)
    Nx.sum(Nx.multiply(t, Nx.eye(n, type: t.type)), axes: [-1])
  end

  defp triangular?(t, :lower), do: max_abs(Nx.triu(wide(t), k: 1)) == 0
  defp triangular?(t, :upper), do: max_abs(Nx.tril(wide(t), k: -1)) == 0

  defp hermitian(a) do
    a = wide(a)
    Nx.divide(Nx.add(a, Nx.LinAlg.adjoint(a)), 2)
  end

  @types [{:f, 32}, {:f, 64}, {:c, 64}, {:c, 128}]

  # Calls `fun` with a random batch of square matrices of each type and
  # shape (1x1, 6x6, 3x2 of 9x9), its size and the tolerance for it.
  defp for_square_matrices(seed, fun) do
    for type <- @types, shape <- [{1, 1}, {6, 6}, {3, 2, 9, 9}] do
      n = elem(shape, tuple_size(shape) - 1)
      fun.(random(shape, type, seed), n, tol(type, n))
    end
  end

  ## QR

  describe "qr" do
    test "Q . R is A, Q's columns are orthonormal, R is upper triangular" do
      for type <- @types,
          shape <- [{6, 4}, {4, 6}, {5, 5}, {2, 3, 7, 3}],
          mode <- [:reduced, :complete] do
        a = random(shape, type, 1)
        {q, r} = both(&Nx.LinAlg.qr(&1, mode: mode), [a])
        {m, n} = {elem(shape, tuple_size(shape) - 2), elem(shape, tuple_size(shape) - 1)}
        k = if mode == :complete, do: m, else: min(m, n)
        assert Nx.axis_size(q, -1) == k and Nx.axis_size(r, -2) == k
        assert {q.type, r.type} == {type, type}
        assert error(mul(q, r), a) <= tol(type, n), "#{inspect({type, shape, mode})}"
        assert orthonormality(q) <= tol(type, m)
        assert triangular?(r, :upper)
      end
    end

    test "R's diagonal is real and non-negative where a reflection happened" do
      # (the last one of a square matrix keeps the sign of the determinant,
      # as in Nx's default implementation)
      for type <- @types do
        {_q, r} = both(&Nx.LinAlg.qr/1, [random({3, 6, 4}, type, 2)])
        d = diagonal(r)
        assert max_abs(Nx.imag(d)) == 0
        assert Nx.to_number(Nx.reduce_min(Nx.real(d))) >= 0
      end
    end

    test "rank-deficient, zero and identity matrices" do
      for type <- [{:f, 32}, {:f, 64}] do
        rank_one = Nx.outer(Nx.iota({6}, type: type), Nx.tensor([1.0, -2.0, 3.0], type: type))

        for a <- [
              Nx.iota({4, 4}, type: type),
              rank_one,
              Nx.broadcast(Nx.tensor(0, type: type), {4, 3})
            ] do
          {q, r} = both(&Nx.LinAlg.qr/1, [a])
          assert error(mul(q, r), a) <= tol(type, 6)
          assert orthonormality(q) <= tol(type, 6)
        end

        {q, r} = both(&Nx.LinAlg.qr/1, [Nx.eye(4, type: type)])
        assert bits(q) == bits(Nx.eye(4, type: type)) and bits(r) == bits(Nx.eye(4, type: type))
      end
    end
  end

  ## eigh

  describe "eigh" do
    test "V . Λ . Vᴴ is A, V is orthonormal, eigenvalues by decreasing magnitude" do
      # (Nx 0.13's default eigh fails to trace on a batch of 1x1 matrices,
      # so those are one matrix)
      for type <- [{:f, 32}, {:f, 64}], {batch, n} <- [{[], 1}, {[3], 2}, {[3], 7}, {[2], 33}] do
        a = hermitian(random(List.to_tuple(batch ++ [n, n]), type, 3)) |> Nx.as_type(type)
        {values, vectors} = both(&Nx.LinAlg.eigh/1, [a])
        assert values.type == type
        back = mul(mul(vectors, diagonal_matrix(values)), adjoint(vectors))
        assert error(back, a) <= tol(type, n), "#{inspect({type, n})}"
        assert orthonormality(vectors) <= tol(type, n)
        magnitudes = values |> Nx.abs() |> Nx.reshape({:auto, n}) |> Nx.to_list()
        for row <- magnitudes, do: assert(row == Enum.sort(row, :desc))
        # each eigenvector's entry of largest magnitude is positive
        largest = vectors |> wide() |> Nx.abs() |> Nx.argmax(axis: -2, tie_break: :low)
        picked = Nx.take_along_axis(wide(vectors), Nx.new_axis(largest, -2), axis: -2)
        assert Nx.to_number(Nx.reduce_min(picked)) > 0
      end
    end

    # Nx 0.7 refuses complex input to eigh on any backend but its own: its
    # default implementation gives real eigenvalues where its template is
    # complex (Nx.Shared.optional raises on the mismatch, in jit and eager).
    @tag nx: :blocks?
    test "complex Hermitian matrices (Nx 0.12 and later)" do
      for type <- [{:c, 64}, {:c, 128}] do
        a = hermitian(random({2, 6, 6}, type, 4)) |> Nx.as_type(type)
        {values, vectors} = both(&Nx.LinAlg.eigh/1, [a])
        assert max_abs(Nx.imag(wide(values))) == 0
        back = mul(mul(vectors, diagonal_matrix(values)), adjoint(vectors))
        assert error(back, a) <= tol(type, 6)
        assert orthonormality(vectors) <= tol(type, 6)
      end
    end

    test "only the Hermitian part is read, (A + Aᴴ) / 2" do
      a = random({5, 5}, {:f, 64}, 5)
      {values, vectors} = both(&Nx.LinAlg.eigh/1, [a])
      {sym_values, sym_vectors} = both(&Nx.LinAlg.eigh/1, [Nx.as_type(hermitian(a), :f64)])
      assert error(values, sym_values) <= 1.0e-14 and error(vectors, sym_vectors) <= 1.0e-13
    end

    test "identity and zero matrices" do
      {values, vectors} = both(&Nx.LinAlg.eigh/1, [Nx.eye(4)])
      assert Nx.to_list(values) == [1.0, 1.0, 1.0, 1.0]
      assert orthonormality(vectors) <= 1.0e-6
      {values, _} = both(&Nx.LinAlg.eigh/1, [Nx.broadcast(0.0, {3, 3})])
      assert Nx.to_list(values) == [0.0, 0.0, 0.0]
    end
  end

  ## SVD

  describe "svd" do
    test "U . S . Vᴴ is A, U and V orthonormal, singular values non-increasing" do
      for type <- [{:f, 32}, {:f, 64}],
          shape <- [{8, 6}, {6, 8}, {5, 5}, {3, 2, 9, 4}, {1, 1}],
          full? <- [true, false] do
        a = random(shape, type, 6)
        {u, s, vt} = both(&Nx.LinAlg.svd(&1, full_matrices?: full?), [a])
        {m, n} = {elem(shape, tuple_size(shape) - 2), elem(shape, tuple_size(shape) - 1)}
        k = min(m, n)
        u_k = Nx.slice_along_axis(u, 0, k, axis: -1)
        vt_k = Nx.slice_along_axis(vt, 0, k, axis: -2)
        back = mul(mul(u_k, diagonal_matrix(s)), vt_k)
        assert error(back, a) <= tol(type, max(m, n)), "#{inspect({type, shape, full?})}"
        assert orthonormality(u) <= tol(type, m)
        assert orthonormality(adjoint(vt)) <= tol(type, n)
        assert Nx.axis_size(u, -1) == if(full?, do: m, else: k)

        for row <- s |> Nx.reshape({:auto, k}) |> Nx.to_list() do
          assert row == Enum.sort(row, :desc) and Enum.all?(row, &(&1 >= 0))
        end
      end
    end

    test "the largest entry of each row of Vᴴ is positive, U turned with it" do
      a = random({4, 7, 5}, {:f, 64}, 7)
      {u, s, vt} = both(&Nx.LinAlg.svd/1, [a])
      largest = vt |> Nx.abs() |> Nx.argmax(axis: -1, tie_break: :low)
      picked = Nx.take_along_axis(vt, Nx.new_axis(largest, -1), axis: -1)
      assert Nx.to_number(Nx.reduce_min(picked)) > 0
      # U's columns carry the same signs: U . S . Vᴴ is still A
      back = mul(mul(Nx.slice_along_axis(u, 0, 5, axis: -1), diagonal_matrix(s)), vt)
      assert error(back, a) <= tol({:f, 64}, 7)
    end

    # Issue 36, point 10: Nx's default SVD gave a U far from orthonormal here.
    test "a rank-deficient tall matrix has an orthonormal U" do
      for type <- [{:f, 32}, {:f, 64}], full? <- [true, false] do
        a = Nx.iota({12, 4}, type: type)
        {u, s, vt} = both(&Nx.LinAlg.svd(&1, full_matrices?: full?), [a])
        assert orthonormality(u) <= tol(type, 12)
        back = mul(mul(Nx.slice_along_axis(u, 0, 4, axis: -1), diagonal_matrix(s)), vt)
        assert error(back, a) <= tol(type, 12)
        # rank 2: two singular values vanish
        assert Nx.to_number(s[2]) <= tol(type, 12) * Nx.to_number(s[0])
      end
    end

    test "a zero matrix gives identities, an ill-conditioned one its singular values" do
      for {m, n} <- [{3, 3}, {3, 4}, {4, 3}] do
        {u, s, vt} = both(&Nx.LinAlg.svd/1, [Nx.broadcast(0.0, {m, n})])
        assert bits(u) == bits(Nx.eye(m, type: :f32)) and bits(vt) == bits(Nx.eye(n, type: :f32))
        assert Nx.to_list(s) == List.duplicate(0.0, min(m, n))
      end

      # the Hilbert matrix of order 8 has a condition number of 1.5e10
      indices = Nx.add(Nx.iota({8, 8}, axis: 0, type: :f64), Nx.iota({8, 8}, axis: 1))
      hilbert = Nx.divide(1.0, Nx.add(indices, 1))
      {u, s, vt} = both(&Nx.LinAlg.svd/1, [hilbert])
      assert error(mul(mul(u, diagonal_matrix(s)), vt), hilbert) <= 1.0e-14
      assert_in_delta Nx.to_number(s[0]) / Nx.to_number(s[7]), 1.5258e10, 1.0e7
    end

    test "vectorized inputs" do
      a = random({2, 5, 3}, {:f, 32}, 8) |> Nx.vectorize(:x)
      {u, s, vt} = EXLA.jit(&Nx.LinAlg.svd/1).(a)
      assert u.vectorized_axes == [x: 2] and s.vectorized_axes == [x: 2]

      back =
        mul(
          mul(Nx.devectorize(u)[[.., .., 0..2]], diagonal_matrix(Nx.devectorize(s))),
          Nx.devectorize(vt)
        )

      assert error(back, Nx.devectorize(a)) <= tol({:f, 32}, 5)
    end
  end

  ## Cholesky

  describe "cholesky" do
    test "L . Lᴴ is A, L lower triangular with a positive real diagonal" do
      for_square_matrices(9, fn x, n, tolerance ->
        spd = mul(x, adjoint(x)) |> Nx.add(Nx.multiply(Nx.eye(n), n)) |> Nx.as_type(x.type)
        {l} = both(&Nx.LinAlg.cholesky/1, [spd])
        assert error(mul(l, adjoint(l)), spd) <= tolerance
        assert triangular?(l, :lower)
        d = diagonal(l)
        assert max_abs(Nx.imag(d)) == 0 and Nx.to_number(Nx.reduce_min(Nx.real(d))) > 0
      end)
    end

    test "a matrix that is not positive definite gives NaN, the others of a batch their factor" do
      a = Nx.tensor([[[1.0, 2.0], [2.0, 1.0]], [[4.0, 2.0], [2.0, 5.0]]])
      {l} = both(&Nx.LinAlg.cholesky/1, [a])
      assert l[0] |> Nx.is_nan() |> Nx.all() |> Nx.to_number() == 1
      assert Nx.to_list(l[1]) == [[2.0, 0.0], [1.0, 2.0]]
    end
  end

  ## LU

  describe "lu" do
    test "P . L . U is A, P a permutation, L unit lower and U upper triangular" do
      for_square_matrices(10, fn a, _n, tolerance ->
        {p, l, u} = both(&Nx.LinAlg.lu/1, [a])
        assert error(mul(mul(p, l), u), a) <= tolerance
        assert triangular?(l, :lower) and triangular?(u, :upper)
        assert max_abs(Nx.subtract(diagonal(l), 1)) == 0
        # a permutation: zeros and ones, a one in each row and column
        assert max_abs(Nx.subtract(Nx.sum(wide(p), axes: [-1]), 1)) == 0
        assert max_abs(Nx.subtract(Nx.sum(wide(p), axes: [-2]), 1)) == 0
      end)
    end

    test "pivots on the largest entry of the column, as LAPACK's getrf" do
      a = Nx.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 10.0]])
      {p, l, _u} = both(&Nx.LinAlg.lu/1, [a])
      assert Nx.to_list(p) == [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
      assert l |> Nx.abs() |> Nx.reduce_max() |> Nx.to_number() <= 1.0
    end

    test "a singular matrix: the rows below a zero pivot are left alone" do
      a = Nx.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 2.0], [1.0, 1.0, 1.0]])
      {p, l, u} = both(&Nx.LinAlg.lu/1, [a])
      assert error(mul(mul(p, l), u), a) == 0
      assert u |> Nx.is_nan() |> Nx.any() |> Nx.to_number() == 0
    end
  end

  ## solve and determinant

  describe "solve" do
    test "A X = B for a batch of matrices or of vectors, every type" do
      for type <- @types,
          {a_shape, b_shape} <- [{{5, 5}, {5}}, {{5, 5}, {5, 3}}, {{2, 4, 4}, {2, 4}}] do
        a = random(a_shape, type, 12)
        rhs = random(b_shape, type, 13)
        {x} = both(&Nx.LinAlg.solve/2, [a, rhs])
        assert x.shape == b_shape and x.type == type

        product =
          if tuple_size(b_shape) < tuple_size(a_shape),
            do: mul(a, Nx.new_axis(wide(x), -1)) |> Nx.squeeze(axes: [-1]),
            else: mul(a, x)

        assert error(product, rhs) <= 10 * tol(type, 5), "#{inspect({type, a_shape, b_shape})}"
      end
    end

    test "a singular matrix gives infinities or NaN, as LAPACK's gesv" do
      a =
        Nx.tensor([
          [1.0, 2.0, 3.0, 4.0],
          [2.0, 4.0, 6.0, 8.0],
          [0.0, 1.0, 0.0, 1.0],
          [1.0, 0.0, 0.0, 1.0]
        ])

      {x} = both(&Nx.LinAlg.solve/2, [a, Nx.tensor([1.0, 2.0, 3.0, 4.0])])

      assert x |> Nx.is_infinity() |> Nx.logical_or(Nx.is_nan(x)) |> Nx.any() |> Nx.to_number() ==
               1
    end
  end

  describe "determinant" do
    test "from 4x4 the product of U's diagonal, signed; 2x2 and 3x3 Nx's exact formula" do
      for type <- [{:f, 32}, {:f, 64}], n <- [4, 9] do
        a = random({3, n, n}, type, 14)
        {d} = both(&Nx.LinAlg.determinant/1, [a])
        # Nx's own determinant in f64 on the binary backend, sign included
        expected = Nx.LinAlg.determinant(wide(a))
        assert error(d, expected) <= 10 * tol(type, n)
      end

      {d} = both(&Nx.LinAlg.determinant/1, [Nx.tensor([[[2, 3], [4, 5]], [[6, 3], [4, 8]]])])
      assert Nx.to_list(d) == [-2.0, 36.0]
      # a 3x3 (the closed formula), a swap of rows, and two equal rows
      # (elimination makes an exact zero pivot)
      for {rows, expected} <- [
            {[[1, 2, 3], [1, 5, 3], [7, 6, 9]], -36.0},
            {[[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 2, 0], [0, 0, 0, 3]], -6.0},
            {[[1, 2, 3, 4], [1, 2, 3, 4], [0, 1, 0, 1], [1, 0, 0, 1]], 0.0}
          ] do
        {d} = both(&Nx.LinAlg.determinant/1, [Nx.tensor(rows, type: :f32)])
        assert abs(Nx.to_number(d)) == abs(expected) and Nx.to_number(d) * expected >= 0
      end
    end

    test "invert goes through them" do
      # (eagerly it is several programs, whose last bits may differ from
      # the one jit compiles)
      a = random({2, 6, 6}, {:f, 64}, 15)
      eye = Nx.broadcast(Nx.eye(6, type: :f64), {2, 6, 6})

      for x <- [
            EXLA.jit(&Nx.LinAlg.invert/1).(a),
            Nx.LinAlg.invert(Nx.backend_copy(a, EXLA.Backend))
          ] do
        assert max_abs(Nx.subtract(mul(a, x), eye)) <= 1.0e-12
      end
    end
  end

  ## All of them

  describe "every decomposition" do
    test "f16 and bf16 are computed in f32 and rounded once" do
      for type <- [:f16, :bf16] do
        a = Nx.as_type(random({5, 5}, {:f, 32}, 11), type)
        spd = Nx.as_type(Nx.add(mul(a, adjoint(a)), Nx.multiply(Nx.eye(5), 5)), type)

        for {fun, input} <- [
              {&Nx.LinAlg.qr/1, a},
              {&Nx.LinAlg.svd/1, a},
              {&Nx.LinAlg.eigh/1, Nx.as_type(hermitian(a), type)},
              {&Nx.LinAlg.cholesky/1, spd},
              {&Nx.LinAlg.lu/1, a}
            ] do
          got = both(fun, [input])
          in_f32 = EXLA.jit(fun).(Nx.as_type(input, :f32)) |> flatten()

          for {g, f} <- Enum.zip(Tuple.to_list(got), in_f32) do
            assert g.type == Nx.Type.normalize!(type)
            assert bits(g) == bits(Nx.as_type(f, type))
          end
        end
      end
    end

    test "integers are computed in f32" do
      a = Nx.tensor([[4, 2], [2, 3]])
      {q, r} = both(&Nx.LinAlg.qr/1, [a])
      assert {q.type, r.type} == {{:f, 32}, {:f, 32}}
      {l} = both(&Nx.LinAlg.cholesky/1, [a])
      assert error(mul(l, adjoint(l)), a) <= tol({:f, 32}, 2)
    end

    test "NaN and infinity: eigh and SVD give NaN, QR and LU carry them" do
      for bad <- [:nan, :infinity] do
        a = Nx.tensor([[1.0, 2.0, 0.0], [2.0, 1.0, 3.0], [0.0, 3.0, bad]])
        {values, vectors} = both(&Nx.LinAlg.eigh/1, [a])
        {u, s, vt} = both(&Nx.LinAlg.svd/1, [a])

        for t <- [values, vectors, u, s, vt] do
          assert t |> Nx.is_nan() |> Nx.all() |> Nx.to_number() == 1
        end

        {q, r} = both(&Nx.LinAlg.qr/1, [a])

        assert Nx.concatenate([Nx.flatten(q), Nx.flatten(r)])
               |> Nx.is_nan()
               |> Nx.any()
               |> Nx.to_number() == 1
      end
    end

    test "bad input is refused as Nx refuses it: not square, complex SVD" do
      not_square = Nx.iota({2, 3}, type: :f32)

      for {fun, a} <- [
            {&Nx.LinAlg.eigh/1, not_square},
            {&Nx.LinAlg.cholesky/1, not_square},
            {&Nx.LinAlg.lu/1, not_square},
            {&Nx.LinAlg.svd/1, random({3, 3}, {:c, 64}, 17)}
          ] do
        reference =
          assert_raise(ArgumentError, fn -> fun.(Nx.backend_copy(a, Nx.BinaryBackend)) end)

        eager = assert_raise(ArgumentError, fn -> fun.(Nx.backend_copy(a, EXLA.Backend)) end)
        jitted = assert_raise(ArgumentError, fn -> EXLA.jit(fun).(a) end)
        assert eager.message == reference.message and jitted.message == reference.message
      end
    end

    test "gradients agree with the reference" do
      a = Nx.tensor([[4.0, 1.0, 0.5], [1.0, 3.0, 0.25], [0.5, 0.25, 2.0]], type: :f64)

      b =
        Nx.tensor([[2.0, -1.0, 0.5], [1.0, 3.0, -2.0], [0.0, 1.0, 4.0], [1.0, 1.0, 1.0]],
          type: :f64
        )

      # from 4x4, where the determinant is native too
      c = Nx.add(random({5, 5}, {:f, 64}, 16), Nx.multiply(Nx.eye(5, type: :f64), 4))

      # The gradients are Nx's own: through the default implementations'
      # custom gradients (and Nx.Defn.Grad's for LU), on their results,
      # computed in the same program. The SVD's iterates to the default's
      # tolerance, where the evaluator and XLA round apart (Nx 0.7's takes
      # square matrices only).
      for {fun, input, tolerance} <- [
            {fn a -> a |> Nx.LinAlg.svd() |> elem(1) |> Nx.sum() end, a, 1.0e-4},
            {fn a -> a |> Nx.LinAlg.cholesky() |> Nx.sum() end, a, 1.0e-12},
            {fn a ->
               a |> Nx.LinAlg.qr() |> then(fn {q, r} -> Nx.add(Nx.sum(q), Nx.sum(r)) end)
             end, b, 1.0e-12},
            {fn a ->
               a |> Nx.LinAlg.lu() |> then(fn {_p, l, u} -> Nx.add(Nx.sum(l), Nx.sum(u)) end)
             end, c, 1.0e-12},
            {&Nx.LinAlg.determinant/1, c, 1.0e-12},
            {fn a -> a |> Nx.LinAlg.invert() |> Nx.sum() end, c, 1.0e-12},
            {fn a -> a |> Nx.LinAlg.solve(Nx.iota({5}, type: :f64)) |> Nx.sum() end, c, 1.0e-12}
          ] do
        grad = &Nx.Defn.grad(&1, fun)
        expected = Nx.Defn.jit_apply(grad, [input], compiler: Nx.Defn.Evaluator)
        got = EXLA.jit(grad).(input)
        assert error(got, expected) <= tolerance, "#{inspect(fun)}"
      end
    end

    test "eigh's gradient fails to build as on the reference" do
      # Nx's eigh has no gradient of its own, and Nx.Defn.Grad fails on
      # its default implementation, with the evaluator too (Nx 0.7.2 and
      # 0.13.1: "cannot reshape, current shape {} is not compatible with
      # new shape {1, 3, 3}"); EXLA gives the same exception.
      a = Nx.tensor([[4.0, 1.0, 0.5], [1.0, 3.0, 0.25], [0.5, 0.25, 2.0]], type: :f64)

      for pick <- [0, 1] do
        grad = &Nx.Defn.grad(&1, fn a -> a |> Nx.LinAlg.eigh() |> elem(pick) |> Nx.sum() end)

        reference =
          assert_raise(ArgumentError, fn ->
            Nx.Defn.jit_apply(grad, [a], compiler: Nx.Defn.Evaluator)
          end)

        got = assert_raise(ArgumentError, fn -> EXLA.jit(grad).(a) end)
        assert got.message == reference.message
      end
    end

    test "identity, zero and ill-conditioned matrices" do
      eye = Nx.eye(5, type: :f64)
      zero = Nx.broadcast(Nx.tensor(0.0, type: :f64), {5, 5})
      {l} = both(&Nx.LinAlg.cholesky/1, [eye])
      {p, lower, u} = both(&Nx.LinAlg.lu/1, [eye])
      {x} = both(&Nx.LinAlg.solve/2, [eye, Nx.iota({5}, type: :f64)])
      {d} = both(&Nx.LinAlg.determinant/1, [eye])

      for t <- [l, p, lower, u], do: assert(bits(t) == bits(eye))
      assert Nx.to_list(x) == [0.0, 1.0, 2.0, 3.0, 4.0] and Nx.to_number(d) == 1.0

      {p, lower, u} = both(&Nx.LinAlg.lu/1, [zero])
      assert bits(p) == bits(eye) and bits(lower) == bits(eye) and bits(u) == bits(zero)
      {d} = both(&Nx.LinAlg.determinant/1, [zero])
      assert Nx.to_number(d) == 0.0
      {l} = both(&Nx.LinAlg.cholesky/1, [zero])
      assert l |> Nx.is_nan() |> Nx.all() |> Nx.to_number() == 1

      # the Hilbert matrix of order 8: symmetric positive definite, with a
      # condition number of 1.5e10; the residuals stay at rounding
      indices = Nx.add(Nx.iota({8, 8}, axis: 0, type: :f64), Nx.iota({8, 8}, axis: 1))
      hilbert = Nx.divide(1.0, Nx.add(indices, 1))
      {q, r} = both(&Nx.LinAlg.qr/1, [hilbert])
      assert error(mul(q, r), hilbert) <= tol({:f, 64}, 8)
      assert orthonormality(q) <= tol({:f, 64}, 8)
      {values, vectors} = both(&Nx.LinAlg.eigh/1, [hilbert])
      back = mul(mul(vectors, diagonal_matrix(values)), adjoint(vectors))
      assert error(back, hilbert) <= tol({:f, 64}, 8)
      assert orthonormality(vectors) <= tol({:f, 64}, 8)
      {l} = both(&Nx.LinAlg.cholesky/1, [hilbert])
      assert error(mul(l, adjoint(l)), hilbert) <= tol({:f, 64}, 8)
      {p, lower, u} = both(&Nx.LinAlg.lu/1, [hilbert])
      assert error(mul(mul(p, lower), u), hilbert) <= tol({:f, 64}, 8)
      ones = Nx.broadcast(Nx.tensor(1.0, type: :f64), {8})
      {x} = both(&Nx.LinAlg.solve/2, [hilbert, ones])
      # (backward stable: |A x - b| is rounding relative to |A| |x|)
      residual = mul(hilbert, Nx.new_axis(wide(x), -1)) |> Nx.squeeze(axes: [-1])
      assert max_abs(Nx.subtract(residual, ones)) / max_abs(x) <= tol({:f, 64}, 8)
    end
  end

  describe "under the evaluator" do
    test "a defn the evaluator runs on EXLA.Backend tensors calls the native kernels" do
      # (Nx 0.7's evaluator ran Nx's default implementations op by op
      # there: pinv of this matrix was 4.004 where the exact one is 4)
      a = Nx.tensor([[1.0, 1.0], [3.0, 4.0]]) |> Nx.backend_copy(EXLA.Backend)
      pinv = Nx.Defn.jit_apply(&Nx.LinAlg.pinv/1, [a], compiler: Nx.Defn.Evaluator)
      assert error(pinv, Nx.tensor([[4.0, -1.0], [-3.0, 1.0]])) <= 1.0e-5

      for fun <- [
            &Nx.LinAlg.svd/1,
            &Nx.LinAlg.qr/1,
            &Nx.LinAlg.eigh/1,
            &Nx.LinAlg.cholesky/1
          ] do
        spd = Nx.add(Nx.dot(a, Nx.transpose(a)), Nx.eye(2, backend: EXLA.Backend))
        evaluated = Nx.Defn.jit_apply(fun, [spd], compiler: Nx.Defn.Evaluator) |> flatten()
        jitted = EXLA.jit(fun).(spd) |> flatten()
        for {e, j} <- Enum.zip(evaluated, jitted), do: assert(bits(e) == bits(j))
      end
    end
  end

  describe "lowering" do
    test "the host calls the native kernels; other platforms keep their lowerings" do
      for {fun, target} <- [
            {&Nx.LinAlg.qr/1, "exla_linalg_qr"},
            {&Nx.LinAlg.eigh/1, "exla_linalg_eigh"},
            {&Nx.LinAlg.svd/1, "exla_linalg_svd"},
            {&Nx.LinAlg.cholesky/1, "exla_linalg_cholesky"},
            {&Nx.LinAlg.lu/1, "exla_linalg_lu"},
            {&Nx.LinAlg.solve(&1, Nx.tensor([1.0, 2.0, 3.0, 4.0])), "exla_linalg_solve"},
            {&Nx.LinAlg.determinant/1, "exla_linalg_determinant"}
          ] do
        expr = Nx.Defn.debug_expr(fun).(Nx.template({4, 4}, :f32))
        shapes = [EXLA.Shape.make_shape({:f, 32}, {4, 4})]
        host = EXLA.Defn.Lowering.client_options(EXLA.Client.fetch!(:host))
        native = EXLA.Defn.Lowering.to_mlir(expr, shapes, host).program.text
        other = EXLA.Defn.Lowering.to_mlir(expr, shapes, native_linalg: false).program.text
        assert native =~ ~s("#{target}") and not (native =~ "stablehlo.while")
        refute other =~ "exla_linalg"
      end

      assert EXLA.Platform.native_linalg?(:host)
      refute Enum.any?([:cuda, :rocm, :tpu, :pjrt_plugin], &EXLA.Platform.native_linalg?/1)
    end
  end
end
