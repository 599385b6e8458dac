defmodule EXLA.Lowering.LinAlgTest do
  use EXLA.LoweringCase, async: true

  test "dot: matrix, vector, batched, contracting axes and types" do
    a = Nx.iota({2, 3, 4}, type: :f32) |> Nx.divide(7)
    b = Nx.iota({2, 4, 5}, type: :f32) |> Nx.subtract(10)

    fun = fn a, b ->
      %{
        batched: Nx.dot(a, [2], [0], b, [1], [0]),
        outer_axes: Nx.dot(a, [0, 2], b, [0, 1]),
        matrix: Nx.dot(a[0], b[1]),
        vector: Nx.dot(a[0][0], b[0][[.., 0]]),
        int: Nx.dot(Nx.as_type(a[0], :s32), Nx.as_type(b[0], :s32)),
        mixed: Nx.dot(Nx.as_type(a[0], :s64), b[1]),
        outer: Nx.outer(a[0][0], b[0][0])
      }
    end

    for precision <- [:default, :highest] do
      assert_same(fun, [a, b], precision: precision, atol: 1.0e-4)
    end

    assert_same(fun, [Nx.as_type(a, :f64), b], atol: 1.0e-10)
  end

  test "conv: strides, padding, dilations and groups" do
    x = Nx.iota({2, 4, 5, 5}, type: :f32) |> Nx.divide(10)
    k = Nx.iota({6, 2, 3, 2}, type: :f32) |> Nx.subtract(3)

    fun = fn x, k ->
      %{
        plain: Nx.conv(x, Nx.slice(k, [0, 0, 0, 0], [6, 2, 3, 2]) |> Nx.tile([1, 2, 1, 1])),
        strided: Nx.conv(x, Nx.tile(k, [1, 2, 1, 1]), strides: [2, 1], padding: [{1, 2}, {0, 1}]),
        same: Nx.conv(x, Nx.tile(k, [1, 2, 1, 1]), padding: :same, kernel_dilation: [1, 2]),
        input_dilation: Nx.conv(x, Nx.tile(k, [1, 2, 1, 1]), input_dilation: [2, 1]),
        feature_groups: Nx.conv(x, k, feature_group_size: 2),
        batch_groups:
          Nx.conv(x, Nx.slice(k, [0, 0, 0, 0], [4, 2, 3, 2]) |> Nx.tile([1, 2, 1, 1]),
            batch_group_size: 2
          )
      }
    end

    assert_same(fun, [x, k], atol: 1.0e-3)
  end

  test "conv: permutations and 1-d/3-d" do
    x = Nx.iota({2, 5, 6, 3}, type: :f32) |> Nx.divide(20)
    k = Nx.iota({3, 2, 3, 4}, type: :f32) |> Nx.divide(-5)

    fun = fn x, k ->
      {Nx.conv(x, k,
         input_permutation: [0, 3, 1, 2],
         kernel_permutation: [3, 2, 0, 1],
         output_permutation: [0, 3, 1, 2]
       ), Nx.conv(Nx.reshape(x, {2, 3, 30}), Nx.reshape(k, {4, 3, 6}), strides: [3]),
       Nx.conv(Nx.reshape(x, {1, 2, 5, 6, 3}), Nx.reshape(k, {3, 2, 2, 2, 3}))}
    end

    assert_same(fun, [x, k], atol: 1.0e-3)
  end

  test "fft and ifft with lengths and axes" do
    x = Nx.tensor([[1.0, 2.0, 0.5, -1.0], [0.0, 1.0, 3.0, 2.0]])

    fun = fn x ->
      %{
        fft: Nx.fft(x),
        ifft: Nx.ifft(x),
        pad: Nx.fft(x, length: 6),
        trunc: Nx.ifft(x, length: 3),
        c128: Nx.fft(Nx.as_type(x, :c128)),
        fft2: Nx.fft2(x),
        axis0: Nx.fft(Nx.transpose(x), axis: 0),
        ifft_axis0: Nx.ifft(Nx.transpose(x), axis: 0, length: 3)
      }
    end

    assert_same(fun, [x], atol: 1.0e-5)
  end

  # Nx.BinaryBackend's fft along an axis before the last two of a rank-3
  # tensor misplaces its results (it moves the axis last and swaps it back),
  # so the reference here transforms the last axis of a transposed copy.
  test "fft and ifft along each axis of a rank-3 tensor" do
    x = Nx.iota({3, 2, 5}, type: :f32) |> Nx.multiply(Nx.iota({3, 2, 5}) |> Nx.remainder(3))

    for fun <- [&Nx.fft/2, &Nx.ifft/2], axis <- [0, 1, 2], length <- [2, 5, 7] do
      opts = [axis: axis, length: length]
      perm = List.delete([0, 1, 2], axis) ++ [axis]
      back = Enum.map(0..2, fn i -> Enum.find_index(perm, &(&1 == i)) end)
      moved = Nx.transpose(Nx.backend_copy(x, Nx.BinaryBackend), axes: perm)
      expected = Nx.transpose(fun.(moved, axis: 2, length: length), axes: back)
      actual = EXLA.jit(&fun.(&1, opts)).(x) |> Nx.backend_copy(Nx.BinaryBackend)
      assert Nx.shape(actual) == Nx.shape(expected)
      assert Nx.all_close(actual, expected, atol: 1.0e-4, rtol: 1.0e-4) |> Nx.to_number() == 1
    end
  end

  test "triangular_solve" do
    a = Nx.tensor([[2.0, 0.0, 0.0], [1.0, 3.0, 0.0], [-1.0, 2.0, 4.0]])
    b = Nx.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])

    fun = fn a, b ->
      %{
        lower: Nx.LinAlg.triangular_solve(a, b),
        vector: Nx.LinAlg.triangular_solve(a, b[[.., 0]]),
        transposed: Nx.LinAlg.triangular_solve(a, b, transform_a: :transpose),
        upper: Nx.LinAlg.triangular_solve(Nx.transpose(a), b, lower: false),
        right: Nx.LinAlg.triangular_solve(a, Nx.transpose(b), left_side: false)
      }
    end

    assert_same(fun, [a, b], atol: 1.0e-5)
  end

  test "triangular_solve with batches of vectors and matrices" do
    a = Nx.tensor([[[1.0, 0.0], [2.0, 3.0]], [[4.0, 0.0], [5.0, 6.0]]])

    fun = fn a, v, m ->
      {Nx.LinAlg.triangular_solve(a, v), Nx.LinAlg.triangular_solve(a, m),
       Nx.LinAlg.triangular_solve(a, v, left_side: false, transform_a: :transpose)}
    end

    assert_same(fun, [a, Nx.tensor([[2.0, -1.0], [3.0, 7.0]]), Nx.iota({2, 2, 3}, type: :f32)],
      atol: 1.0e-5
    )
  end

  test "optional linear algebra through the default implementations" do
    a = Nx.tensor([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]])
    b = Nx.tensor([1.0, -2.0, 0.5])

    fun = fn a, b ->
      {q, r} = Nx.LinAlg.qr(a)

      %{
        cholesky: Nx.LinAlg.cholesky(a),
        solve: Nx.LinAlg.solve(a, b),
        determinant: Nx.LinAlg.determinant(a),
        qr: Nx.dot(q, r),
        r_abs: Nx.abs(r),
        invert: Nx.LinAlg.invert(a)
      }
    end

    assert_same(fun, [a, b], atol: 1.0e-4)
  end

  describe "qr (in f64 on the host)" do
    # Contracts axis `ca` of `a` with axis `cb` of `b`, batched on a leading
    # axis if the tensors have one.
    defp matmul(a, ca, b, cb) do
      batch = if Nx.rank(a) > 2, do: [0], else: []
      Nx.dot(a, [ca], batch, b, [cb], batch)
    end

    defp qr_jit_and_eager(a, opts \\ []) do
      {q, r} = EXLA.jit(&Nx.LinAlg.qr(&1, opts)).(a)
      {qe, re} = Nx.LinAlg.qr(Nx.backend_copy(a, EXLA.Backend), opts)
      assert Nx.to_binary(qe) == Nx.to_binary(q) and Nx.to_binary(re) == Nx.to_binary(r)
      {Nx.backend_copy(q, Nx.BinaryBackend), Nx.backend_copy(r, Nx.BinaryBackend)}
    end

    defp max_error(q, r, a) do
      q |> Nx.dot(r) |> Nx.subtract(a) |> Nx.abs() |> Nx.reduce_max() |> Nx.to_number()
    end

    @tag cpu_only:
           "EXLA computes f32 QR in f64 on the host client only " <>
             "(EXLA.Platform.qr_in_f64?/1); on a GPU it stays in f32, where " <>
             "Q . R was 3.3e-6 from iota({4, 4}) on an H200"
    test "f32 iota({4, 4}): Q . R within 1e-6" do
      a = Nx.iota({4, 4}, type: :f32)
      {q, r} = qr_jit_and_eager(a)
      # Nx's default expression gave -2.9e-6 for the entry at [0][0]
      assert Nx.to_number(Nx.dot(q, r)[0][0]) == 0.0
      # computed in f32 it was 2.3e-6 (2.4 ulp of the entries of 12 to 15)
      assert max_error(q, r, a) <= 1.0e-6
      # and with XLA's f32 dot for the product too
      qr = Nx.dot(Nx.backend_copy(q, EXLA.Backend), Nx.backend_copy(r, EXLA.Backend))
      assert Nx.to_number(Nx.all_close(qr, a, atol: 1.0e-6, rtol: 0)) == 1
    end

    test "f64 on the host only: GPU and TPU lowerings stay in f32" do
      lower = fn in_f64? ->
        expr = Nx.Defn.debug_expr(&Nx.LinAlg.qr/1).(Nx.template({4, 4}, :f32))
        shapes = [EXLA.Shape.make_shape({:f, 32}, {4, 4})]
        EXLA.Defn.Lowering.to_mlir(expr, shapes, qr_in_f64: in_f64?).program.text
      end

      assert lower.(true) =~ "f64"
      refute lower.(false) =~ "f64"
      assert EXLA.Platform.qr_in_f64?(:host)
      refute EXLA.Platform.qr_in_f64?(:cuda) or EXLA.Platform.qr_in_f64?(:rocm)
      refute EXLA.Platform.qr_in_f64?(:tpu)
    end

    test "f16 iota({4, 4}): exact zeros where A has them" do
      a = Nx.iota({4, 4}, type: :f16)
      {q, r} = qr_jit_and_eager(a)
      assert {q.type, r.type} == {{:f, 16}, {:f, 16}}
      # Nx's default expression gave -0.0016
      assert Nx.to_number(Nx.dot(q, r)[0][0]) == 0.0
      assert max_error(q, r, a) <= 0.0078125
    end

    test "f16 and bf16 are computed in f32 and rounded once" do
      {rand, _} = Nx.Random.uniform(Nx.Random.key(5), -1.0, 1.0, shape: {2, 6, 5})
      # iota({16, 16}) has squared norms over f16's largest finite value.
      for type <- [:f16, :bf16], a <- [Nx.iota({16, 16}), Nx.iota({4, 6}), rand] do
        a = Nx.as_type(a, type)
        {q, r} = qr_jit_and_eager(a)
        # rounded by XLA (Nx.BinaryBackend truncates to bf16)
        {q32, r32} = EXLA.jit(&Nx.LinAlg.qr/1).(Nx.as_type(a, :f32))
        assert Nx.to_binary(q) == Nx.to_binary(Nx.as_type(q32, type))
        assert Nx.to_binary(r) == Nx.to_binary(Nx.as_type(r32, type))
        assert Nx.to_number(Nx.all(Nx.is_nan(q) |> Nx.logical_not())) == 1
      end
    end

    test "huge and tiny entries: the same bits as the matrix scaled by a power of two" do
      {rand, _} = Nx.Random.uniform(Nx.Random.key(9), -1.0, 1.0, shape: {5, 4}, type: :f64)

      # Their squares overflow or underflow the type.
      for {type, exponents} <- [f32: [80, -80, 120], f64: [600, -600]],
          a <- [Nx.iota({4, 4}), rand],
          e <- exponents do
        a = Nx.as_type(a, type)
        # (a number would become an f32 constant first)
        scale = Nx.tensor(2.0 ** e, type: type)
        {q, r} = qr_jit_and_eager(a)
        {qs, rs} = qr_jit_and_eager(Nx.multiply(a, scale))
        assert Nx.to_binary(qs) == Nx.to_binary(q)
        # Scaled by XLA, which flushes subnormal results to zero as the
        # rounding of an f64 result to f32 does: an f32 R holds the f64
        # computation's residue (1e-15) where Q . R cancels, and scaled by
        # 2^-80 that is below f32's normal range.
        scaled_r = Nx.multiply(Nx.backend_copy(r, EXLA.Backend), scale)
        assert Nx.to_binary(rs) == Nx.to_binary(scaled_r)
      end
    end

    test "f64 iota({4, 4}) within 1e-14" do
      a = Nx.iota({4, 4}, type: :f64)
      {q, r} = qr_jit_and_eager(a)
      assert max_error(q, r, a) <= 1.0e-14
    end

    test "shapes, modes, batches, complex and integer input" do
      key = Nx.Random.key(7)
      {t, key} = Nx.Random.uniform(key, -1.0, 1.0, shape: {2, 5, 3})
      {re, key} = Nx.Random.uniform(key, -1.0, 1.0, shape: {4, 4})
      {im, _} = Nx.Random.uniform(key, -1.0, 1.0, shape: {4, 4})

      for {a, opts, q_shape, r_shape} <- [
            {t[0], [], {5, 3}, {3, 3}},
            {t[0], [mode: :complete], {5, 5}, {5, 3}},
            {Nx.transpose(t[0]), [], {3, 3}, {3, 5}},
            {t, [], {2, 5, 3}, {2, 3, 3}},
            {Nx.complex(re, im), [], {4, 4}, {4, 4}},
            {Nx.tensor([[3, 2, 1], [0, 1, 1], [0, 0, 1], [0, 0, 1]]), [], {4, 3}, {3, 3}}
          ] do
        {q, r} = qr_jit_and_eager(a, opts)
        assert {q.shape, r.shape} == {q_shape, r_shape}
        assert_tensor(Nx.as_type(a, r.type), matmul(q, -1, r, -2), atol: 1.0e-6, rtol: 1.0e-6)

        # R is upper triangular, with exact zeros below the diagonal
        assert Nx.to_number(Nx.all(Nx.equal(Nx.abs(Nx.tril(r, k: -1)), 0))) == 1

        # Q has orthonormal columns
        qh = q |> Nx.conjugate() |> matmul(-2, q, -2)
        eye = Nx.broadcast(Nx.eye(elem(q_shape, tuple_size(q_shape) - 1)), qh.shape)
        assert_tensor(Nx.as_type(eye, qh.type), qh, atol: 1.0e-6, rtol: 0)

        # real: the signs are those of Nx's default implementation (the
        # reference); complex: R's diagonal is real and non-negative where
        # Nx's has the phase of a pivot, so they agree once Q's columns (and
        # R's rows) are turned by those phases. The columns of a complete Q
        # beyond min(m, n) are an orthonormal basis of the rest, which the
        # host's LAPACK-style reflectors (native/linalg) choose otherwise
        # than Nx's.
        {ref_q, ref_r} = Nx.LinAlg.qr(a, opts)
        k = min(elem(r_shape, tuple_size(r_shape) - 2), elem(r_shape, tuple_size(r_shape) - 1))
        columns = &Nx.slice_along_axis(&1, 0, k, axis: -1)
        {q, r} = turned_like(columns.(q), r, ref_r)
        assert_tensor(columns.(ref_q), q, atol: 1.0e-6, rtol: 1.0e-5)
        assert_tensor(ref_r, r, atol: 1.0e-6, rtol: 1.0e-5)
      end
    end

    # Complex Q and R turned by the phases that make R's diagonal that of
    # `ref_r` (real ones are returned as they are).
    defp turned_like(q, r, ref_r) do
      if Nx.Type.complex?(q.type) do
        ratio = Nx.divide(Nx.take_diagonal(ref_r), Nx.take_diagonal(r))
        phase = Nx.divide(ratio, Nx.abs(ratio))

        {Nx.multiply(q, Nx.new_axis(Nx.conjugate(phase), -2)),
         Nx.multiply(r, Nx.new_axis(phase, -1))}
      else
        {q, r}
      end
    end

    test "gradients go through Nx's custom gradient" do
      a = Nx.tensor([[2.0, -1.0, 0.5], [1.0, 3.0, -2.0], [0.0, 1.0, 4.0]])
      loss = fn a -> Nx.LinAlg.qr(a) |> then(fn {q, r} -> Nx.add(Nx.sum(q), Nx.sum(r)) end) end
      expected = Nx.Defn.grad(a, loss)
      [got] = run(fn a -> Nx.Defn.grad(a, loss) end, [a])
      assert_tensor(expected, got, atol: 1.0e-5)
    end
  end

  test "lu, determinant and invert" do
    a = Nx.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 10.0]])

    b =
      Nx.tensor([
        [[2.0, 1.0, 0.0, 3.0], [1.0, 4.0, 1.0, 0.5], [0.0, 2.0, 5.0, 1.0], [1.0, 0.0, 1.0, 6.0]]
      ])

    [p, l, u] = run(&Nx.LinAlg.lu/1, [a])
    assert_tensor(a, Nx.dot(p, Nx.dot(l, u)), atol: 1.0e-5)

    assert_tensor(
      Nx.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]),
      Nx.multiply(l, Nx.eye(3))
    )

    [p, l, u] = run(&Nx.LinAlg.lu/1, [Nx.tensor([[1, 2], [3, 4]])])
    # P has the input's type (s64 on Nx 0.7, s32 later)
    assert p.type == EXLA.NxVersion.default_integer()
    assert_tensor(Nx.tensor([[1.0, 2.0], [3.0, 4.0]]), Nx.dot(p, Nx.dot(l, u)))

    fun = fn a, b ->
      {Nx.LinAlg.determinant(a), Nx.LinAlg.determinant(b), Nx.LinAlg.invert(a),
       Nx.LinAlg.invert(b)}
    end

    assert_same(fun, [a, b], atol: 1.0e-4)
  end

  @tag :slow
  test "eigh and svd through the default implementations" do
    a = Nx.tensor([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]])

    {expected, _} = reference(fn a -> Nx.LinAlg.eigh(a) end, [a])
    [vals | _] = run(fn a -> Nx.LinAlg.eigh(a) end, [a])
    assert_tensor(Nx.sort(expected), Nx.sort(vals), atol: 1.0e-2)

    [_u, s, _vt] = run(fn a -> Nx.LinAlg.svd(a) end, [a])
    assert_tensor(Nx.sort(expected), Nx.sort(s), atol: 1.0e-2)
  end
end
