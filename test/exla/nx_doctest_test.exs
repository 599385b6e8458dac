# Nx 0.7.2's own doctests, run with EXLA.Backend as the default backend
# (and EXLA as the defn compiler for the Nx.Defn doctests).
#
# Nx.Serving is left out: its examples define modules (MyDefn, MyServing)
# in prose and Nx does not run them as doctests either.
#
# EXLA.Backend computes what EXLA.jit computes: f32 math functions, sums,
# dots and linear algebra are XLA's, in the input's precision, while the
# reference (Nx.BinaryBackend) computes with Erlang floats (f64) and rounds
# once, or uses other algorithms. So some doctests print other last digits;
# each exclusion below lists the examples that fail and by how much (ulp:
# unit in the last place of the f32 result), and a test after each module
# checks those functions against the reference within what was measured.
# The Nx and Nx.LinAlg exclusions are among those of EXLA 0.7.2, except
# Nx.LinAlg.qr/2 (see EXLA.NxDoctestTest.LinAlg). `flatten_list/2` is not
# a precision matter (see the Composite module).
#
# Each Nx module gets its own test module, so that a single one can be run
# with `mix test test/exla/nx_doctest_test.exs --only doctest:Nx.LinAlg`.
defmodule EXLA.NxDoctestTest.Helpers do
  @moduledoc false
  import ExUnit.Assertions

  @doc """
  Runs `fun` on EXLA.Backend copies of `args` and on the reference, and
  asserts every f32/c64 component is within `ulps` units in the last place.
  """
  def assert_within_ulps(fun, args, ulps) do
    got = Nx.with_default_backend(EXLA.Backend, fn -> apply(fun, copy(args, EXLA.Backend)) end)
    expected = Nx.with_default_backend(Nx.BinaryBackend, fn -> apply(fun, args) end)

    for {g, e} <- Enum.zip(List.wrap(flatten(got)), List.wrap(flatten(expected))) do
      assert %EXLA.Backend{} = g.data
      distance = ulp_distance(Nx.backend_copy(g, Nx.BinaryBackend), e)
      assert distance <= ulps, "#{distance} ulp from the reference:\n#{inspect(g)}\n#{inspect(e)}"
    end
  end

  defp copy(args, backend) do
    Enum.map(args, fn
      %Nx.Tensor{} = t -> Nx.backend_copy(t, backend)
      other -> other
    end)
  end

  defp flatten(tuple) when is_tuple(tuple), do: Tuple.to_list(tuple)
  defp flatten(tensor), do: tensor

  # The largest distance between the f32 bit patterns (as ordered integers)
  # of corresponding components.
  defp ulp_distance(a, b) do
    [a, b]
    |> Enum.map(fn t ->
      t = if Nx.Type.complex?(t.type), do: Nx.stack([Nx.real(t), Nx.imag(t)]), else: t
      t = t |> Nx.as_type(:f32) |> Nx.bitcast(:s32) |> Nx.as_type(:s64)
      # negative floats count down from -0.0
      Nx.select(Nx.less(t, 0), Nx.subtract(-2_147_483_648, t), t)
    end)
    |> then(fn [a, b] -> Nx.subtract(a, b) |> Nx.abs() |> Nx.reduce_max() |> Nx.to_number() end)
  end
end

defmodule EXLA.NxDoctestTest do
  use EXLA.NxDoctestCase, nx: :v0_7
  import EXLA.NxDoctestTest.Helpers

  # XLA's f32 approximations of these functions are 1 or 2 ulp from the
  # reference's correctly rounded f64 results (measured on the doctests'
  # inputs, each example that fails):
  #
  #   * asinh/1: asinh(1) 0.8813736438751221 for 0.8813735842704773 and
  #     asinh(3): 1 ulp
  #   * atanh/1: atanh(0.1) 0.10033534467220306 for 0.10033535212278366: 1 ulp
  #   * cosh/1: cosh(1) 1.5430805683135986 for 1.5430806875228882 and
  #     cosh(2): 1 ulp
  #   * erf/1: erf(1), erf(2), erf(3): 1 ulp each
  #   * erfc/1: erfc(1) 0.1572992354631424 for 0.15729920566082: 2 ulp
  #   * expm1/1: expm1(1) 1.7182817459106445 for 1.718281865119934: 1 ulp
  #   * logsumexp/2: 2.3132615089416504 for 2.3132617473602295 (two
  #     examples): 1 ulp (the sum of exponentials is f32)
  #   * sigmoid/1: sigmoid(2) 0.8807970285415649 for 0.8807970881462097: 1 ulp
  #   * tanh/1: tanh(3) 0.9950547218322754 for 0.9950547814369202: 1 ulp
  #
  # tan/1, also excluded by EXLA 0.7.2, passes.
  @xla_f32_math [asinh: 1, atanh: 1, cosh: 1, erf: 1, erfc: 1, expm1: 1] ++
                  [logsumexp: 2, sigmoid: 1, tanh: 1]

  # On CUDA (jax-cuda13-pjrt 0.11.2 on an H200), XLA's GPU math and its f32
  # division and square roots (within 2 ulp, as CUDA's default precision
  # allows) print 1 ulp from the reference in these examples: cos(2),
  # sin(1), sin(2), tan(1), atan(0.1), atan2(1, 2), acosh(3), phase/1 (two
  # examples), rsqrt(2), and the divisions of standard_deviation/2 (three
  # examples), variance/2, covariance/3 and weighted_mean/3.
  @cuda_f32_math [cos: 1, sin: 1, tan: 1, atan: 1, atan2: 2, acosh: 1, phase: 1] ++
                   [rsqrt: 1, standard_deviation: 2, variance: 2, covariance: 3] ++
                   [weighted_mean: 3]

  # XLA's GPU backend has no complex convolution: conv/3's c64 example
  # raises UNIMPLEMENTED on CUDA (checked below); its real examples are
  # checked there too.
  @cuda_unimplemented [conv: 3]

  @excluded @xla_f32_math ++ EXLA.TestPlatform.on_cuda(@cuda_f32_math ++ @cuda_unimplemented)

  doctest Nx, except: @excluded

  test "the excluded math functions are within 2 ulp of the reference" do
    x = Nx.tensor([0.1, 0.5, 0.9, 1.0, 2.0, 3.0, -1.5, 0.0])

    for fun <-
          [&Nx.asinh/1, &Nx.cosh/1, &Nx.erf/1, &Nx.erfc/1, &Nx.expm1/1] ++
            [&Nx.sigmoid/1, &Nx.tanh/1] do
      assert_within_ulps(fun, [x], 2)
    end

    assert_within_ulps(&Nx.atanh/1, [Nx.multiply(x, 0.3)], 2)
    assert_within_ulps(&Nx.logsumexp(&1, axes: [1]), [Nx.reshape(Nx.iota({6}), {3, 2})], 1)
  end

  @tag :cuda
  test "conv on CUDA: real convolutions as the reference, complex ones a clear error" do
    lhs = Nx.iota({2, 3, 7, 5}, type: :f32) |> Nx.divide(40)
    rhs = Nx.iota({4, 3, 3, 2}, type: :f32) |> Nx.subtract(30) |> Nx.divide(25)
    opts = [strides: [2, 1], padding: [{1, 1}, {0, 1}], kernel_dilation: [1, 2]]
    got = Nx.conv(lhs, rhs, opts)
    # BinaryBackend's conv pads on the default backend: make it its own.
    expected =
      Nx.with_default_backend(Nx.BinaryBackend, fn ->
        Nx.conv(to_binary(lhs), to_binary(rhs), opts)
      end)

    assert Nx.to_number(Nx.all_close(got, expected, atol: 1.0e-2, rtol: 1.0e-2)) == 1

    complex = Nx.complex(Nx.iota({1, 1, 3}, type: :f32), 1.0)

    assert_raise RuntimeError, ~r/UNIMPLEMENTED: Convolutions must have floating-point/, fn ->
      Nx.conv(complex, Nx.tensor([[[1.0, 0.0, -1.0]]]), padding: [{2, 2}])
    end
  end

  defp to_binary(t), do: Nx.backend_copy(t, Nx.BinaryBackend)

  @tag :cuda
  test "the math functions excluded on CUDA are within 2 ulp of the reference" do
    x = Nx.tensor([0.1, 0.5, 0.9, 1.0, 2.0, 3.0, -1.5, 0.0])

    for fun <- [&Nx.cos/1, &Nx.sin/1, &Nx.tan/1, &Nx.atan/1, &Nx.rsqrt(Nx.abs(&1))] do
      assert_within_ulps(fun, [x], 2)
    end

    assert_within_ulps(&Nx.acosh/1, [Nx.add(Nx.abs(x), 1)], 2)
    assert_within_ulps(&Nx.atan2/2, [x, Nx.reverse(x)], 2)
    assert_within_ulps(&Nx.phase/1, [Nx.complex(x, Nx.reverse(x))], 2)

    m = Nx.tensor([[1, 2], [10, 20], [3, 5]])
    assert_within_ulps(&Nx.standard_deviation(&1, axes: [0], ddof: 1), [m], 2)
    assert_within_ulps(&Nx.variance/1, [m], 2)
    assert_within_ulps(&Nx.covariance/1, [Nx.tensor([[1, 2], [3, 4], [5, 6.5]])], 2)
    assert_within_ulps(&Nx.weighted_mean/2, [m, Nx.tensor([[1, 2], [3, 4], [5, 6]])], 2)
  end
end

defmodule EXLA.NxDoctestTest.LinAlg do
  use EXLA.NxDoctestCase, nx: :v0_7
  import EXLA.NxDoctestTest.Helpers

  # The same functions as EXLA 0.13.1's own list (its
  # nx_linalg_doctest_test.exs: solve and triangular_solve, and the
  # rounding differences of svd, pinv, eigh, cholesky, least_squares,
  # determinant, matrix_power, lu and qr), with what each prints here, as
  # measured on the doctests with the host's native decompositions:
  #
  #   * cholesky/1 (LAPACK's order of operations): 1 ulp, as in
  #     2.1213202476501465 for 2.1213204860687256
  #   * determinant/1: the sign of a zero, 0.0-6.0i for -0.0-6.0i (c64), and
  #     1 ulp in f32 (LU in another order than the reference's formula)
  #   * eigh/2: eigenvalues by decreasing magnitude ([4.0, 1.0] where the
  #     reference prints [1.0, 4.0]), eigenvectors accurate where the
  #     reference's QR iterations stop at eps 1.0e-4 (0.40824830532073975
  #     for 0.4075949788093567; exactly 1/sqrt(6) = 0.408248...)
  #   * least_squares/2 and pinv/2 (through the native SVD): the exact
  #     solution to f32 rounding where the reference's Jacobi SVD is off,
  #     1.0 and -0.9500002264976501 for 0.9966151118278503 and
  #     -0.947966456413269, pinv 3.9999983310699463 for 3.9924824237823486
  #     (the exact value is 4)
  #   * lu/2: another permutation (three examples): pivots are chosen
  #     on the current column while eliminating (LAPACK's partial
  #     pivoting); the reference picks them from the original matrix
  #   * matrix_power/2 (inverse through LU and QR): -110.37469482421875 for
  #     -110.37397766113281 (the exact value is -110.375)
  #   * qr/2: -0.0 for 0.0 in Q, and 0.7071067690849304 for
  #     0.7071068286895752 (1 ulp)
  #   * solve/2: `Nx.round` of solutions within 1e-7 of zero gives -0.0
  #     where the reference gives 0.0 (two examples)
  #   * svd/2: -0.0 for 0.0 in U, and 1.0 where the reference prints
  #     0.9999999403953552 (1 ulp)
  #   * triangular_solve/3 (XLA's f32 solver): 1 or 2 ulp in four examples
  @xla_linear_algebra [cholesky: 1, determinant: 1, eigh: 2, least_squares: 2, lu: 2] ++
                        [matrix_power: 2, pinv: 2, qr: 2, solve: 2, svd: 2, triangular_solve: 3]

  doctest Nx.LinAlg, except: @xla_linear_algebra

  test "cholesky, determinant, matrix_power, qr, svd and triangular_solve within 2 ulp" do
    spd =
      Nx.tensor(
        [[6.0, 3.0, 4.0, 8.0], [3.0, 6.0, 5.0, 1.0], [4.0, 5.0, 10.0, 7.0]] ++
          [[8.0, 1.0, 7.0, 25.0]]
      )

    assert_within_ulps(&Nx.LinAlg.cholesky/1, [spd], 1)

    assert_within_ulps(
      &Nx.LinAlg.determinant/1,
      [Nx.tensor([[1, 0, 0, 0], [0, 1, 2, 3], [0, 1, -2, 3], [0, 7, 8, 9.0]])],
      1
    )

    assert_within_ulps(&Nx.LinAlg.matrix_power(&1, -3), [Nx.iota({2, 2, 2})], 2)
    qr_input = Nx.tensor([[3, 2, 1], [0, 1, 1], [0, 0, 1], [0, 0, 1]], type: :f32)
    assert_within_ulps(&Nx.LinAlg.qr/1, [qr_input], 1)

    assert_within_ulps(
      &Nx.LinAlg.svd/1,
      [Nx.tensor([[2, 0, 0], [0, 3, 0], [0, 0, -1], [0, 0, 0]])],
      1
    )

    lower = Nx.tensor([[3, 0, 0, 0], [2, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1]])
    assert_within_ulps(&Nx.LinAlg.triangular_solve/2, [lower, Nx.tensor([4, 2, 4, 2])], 2)
  end

  test "lu, solve, pinv and least_squares solve the doctests' systems" do
    a = Nx.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 10]], backend: EXLA.Backend)
    {p, l, u} = Nx.LinAlg.lu(a)
    assert Nx.to_number(Nx.all_close(p |> Nx.dot(l) |> Nx.dot(u), a, atol: 1.0e-6)) == 1

    a = Nx.tensor([[1, 0, 1], [1, 1, 0], [0, 1, 1]], backend: EXLA.Backend)
    b = Nx.tensor([[2, 2, 3], [2, 2, 4], [2, 0, 1]])
    expected = Nx.tensor([[1.0, 2.0, 3.0], [1.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert Nx.to_number(Nx.all_close(Nx.LinAlg.solve(a, b), expected, atol: 1.0e-6)) == 1

    # the exact inverse; the reference's own result is 7.5e-3 away from it
    pinv = Nx.LinAlg.pinv(Nx.tensor([[1, 1], [3, 4]], backend: EXLA.Backend))
    exact = Nx.tensor([[4.0, -1.0], [-3.0, 1.0]])
    assert Nx.to_number(Nx.all_close(pinv, exact, atol: 5.0e-3, rtol: 0)) == 1

    # the least squares line through the doctest's points is y = x - 0.95;
    # the reference's result is 3.4e-3 away from it
    x = Nx.tensor([[0, 1], [1, 1], [2, 1], [3, 1]], backend: EXLA.Backend)
    fit = Nx.LinAlg.least_squares(x, Nx.tensor([-1, 0.2, 0.9, 2.1]))
    assert Nx.to_number(Nx.all_close(fit, Nx.tensor([1.0, -0.95]), atol: 5.0e-3, rtol: 0)) == 1
  end

  test "eigh: A . V = V . diag(vals), eigenvalues as the reference's" do
    a = Nx.tensor([[2, 5], [5, 6]])
    {vals, vecs} = Nx.LinAlg.eigh(Nx.backend_copy(a, EXLA.Backend))
    {ref_vals, _} = Nx.LinAlg.eigh(a)
    av = Nx.dot(Nx.backend_copy(a, EXLA.Backend), vecs)
    assert Nx.to_number(Nx.all_close(av, Nx.multiply(vecs, vals), atol: 1.0e-2)) == 1
    got = Nx.backend_copy(vals, Nx.BinaryBackend)
    assert Nx.to_number(Nx.all_close(got, ref_vals, atol: 1.0e-4)) == 1
  end
end

defmodule EXLA.NxDoctestTest.Random do
  use EXLA.NxDoctestCase, nx: :v0_7
  import EXLA.NxDoctestTest.Helpers

  # Nx.Random.normal/4 and multivariate_normal/4 draw through erf_inv,
  # which XLA evaluates in f32 (chlo.erf_inv, as EXLA 0.7.2) and the
  # reference in f64 before rounding: 1 ulp apart in three normal examples
  # (1.369469404220581 for 1.3694695234298706; the mean of 1,000 draws,
  # summed in f32, 9.700222969055176 for 9.70022201538086) and two
  # multivariate_normal examples (-0.4081205725669861 for
  # -0.40812060236930847). EXLA 0.7.2 did not run Nx.Random's doctests.
  #
  # On CUDA, gumbel/2's first example prints one draw 1 ulp from the
  # reference (0.6247938871383667 for 0.6247938275337219): its two
  # logarithms are CUDA's.
  doctest Nx.Random,
    except:
      [normal: 4, multivariate_normal: 4] ++
        EXLA.TestPlatform.on_cuda(gumbel: 2)

  @tag :cuda
  test "gumbel within 2 ulp of the reference on CUDA" do
    assert_within_ulps(&elem(Nx.Random.gumbel(&1, shape: {2, 3}), 0), [Nx.Random.key(1)], 2)
  end

  test "normal and multivariate_normal within 1 ulp of the reference" do
    assert_within_ulps(&elem(Nx.Random.normal(&1, shape: {1000}), 0), [Nx.Random.key(42)], 1)

    assert_within_ulps(
      &elem(Nx.Random.normal(&1, 0, 1, shape: {3, 2}, type: :c64), 0),
      [Nx.Random.key(42)],
      1
    )

    assert_within_ulps(
      &elem(Nx.Random.multivariate_normal(&1, Nx.tensor([0, 0]), Nx.eye(2), shape: {3, 2}), 0),
      [Nx.Random.key(12)],
      1
    )
  end
end

defmodule EXLA.NxDoctestTest.Constants do
  use EXLA.NxDoctestCase, nx: :v0_7
  doctest Nx.Constants
end

defmodule EXLA.NxDoctestTest.Batch do
  use EXLA.NxDoctestCase, nx: :v0_7
  doctest Nx.Batch
end

defmodule EXLA.NxDoctestTest.Composite do
  use EXLA.NxDoctestCase, nx: :v0_7

  # Not a precision exclusion: flatten_list/2's second example compares a
  # freshly built `Nx.tensor(4)` with `===`. Two tensors are `===` only when
  # their data terms are identical, which holds for two BinaryBackend
  # binaries with the same bytes but never for two EXLA.Backend tensors
  # (each owns its own device buffer). The test below checks the same
  # example with EXLA tensors, comparing the tail by identity and by value.
  doctest Nx.Defn.Composite, except: [flatten_list: 2]

  test "flatten_list/2 (doctest examples, with EXLA.Backend tensors)" do
    assert Nx.Defn.Composite.flatten_list([1, {2, 3}]) == [1, 2, 3]

    tail = Nx.tensor(4)
    assert [1, 2, 3, ^tail] = Nx.Defn.Composite.flatten_list([1, {2, 3}], [tail])
    assert %EXLA.Backend{} = tail.data

    flat = Nx.Defn.Composite.flatten_list([Nx.tensor(1), {2, Nx.tensor([3])}], [Nx.tensor(4)])
    assert Enum.map(flat, &Nx.to_number(Nx.sum(&1))) == [1, 2, 3, 4]
  end
end

defmodule EXLA.NxDoctestTest.Kernel do
  use EXLA.NxDoctestCase, nx: :v0_7
  use Nx.Defn.Kernel
  doctest Nx.Defn.Kernel
end

defmodule EXLA.NxDoctestTest.Defn do
  use EXLA.NxDoctestCase, nx: :v0_7, defn_options: [compiler: EXLA]
  doctest Nx.Defn
end

defmodule EXLA.NxDoctestTest.Shape do
  use EXLA.NxDoctestCase, nx: :v0_7
  doctest Nx.Shape
end

defmodule EXLA.NxDoctestTest.Type do
  use EXLA.NxDoctestCase, nx: :v0_7
  doctest Nx.Type
end
