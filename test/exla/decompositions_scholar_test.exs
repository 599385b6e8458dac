defmodule EXLA.DecompositionsScholarTest do
  # What Scholar's linear models and PCA need from the host's SVD (the
  # native kernel): singular values under the numerical rank floor
  # (max(m, n) x eps x the largest) are exact zeros, as Nx's own SVD gives
  # them, so that Nx.LinAlg.pinv (which drops values under an absolute eps
  # of 1e-10) gives the least squares of a rank-deficient problem, not
  # rounding divided by rounding. Values above the floor stay as computed.
  use ExUnit.Case, async: true

  @moduletag cpu_only:
               "the host computes decompositions natively (EXLA.Platform.native_linalg?/1)"

  # Scholar's LinearRegression test "matches sklearn for shapes {4, 6}, {4}":
  # four samples of six features, centred (rank 3).
  @a [
    [0.9106853604316711, 0.2549760937690735, 0.6961511969566345] ++
      [0.9727275371551514, 0.21542717516422272, 0.1134142205119133],
    [0.06984847038984299, 0.5999580025672913, 0.5002026557922363] ++
      [0.3873320519924164, 0.4304788112640381, 0.7481111884117126],
    [0.8257377743721008, 0.3594258427619934, 0.08661065995693207] ++
      [0.5118331909179688, 0.38879409432411194, 0.3640798032283783],
    [0.060781270265579224, 0.054385241121053696, 0.6188914775848389] ++
      [0.9003549218177795, 0.7764868140220642, 0.9584161043167114]
  ]
  @b [0.608439028263092, 0.6562057137489319, 0.9454836249351501, 0.8614323735237122]
  # sklearn's coefficients for it (the test's expectation)
  @sklearn [0.14827, -0.26309, -0.45938, -0.02043, 0.27158, 0.16200]

  defp centred(rows, type) do
    t = Nx.tensor(rows, type: type, backend: Nx.BinaryBackend)
    Nx.subtract(t, Nx.mean(t, axes: [0]))
  end

  # the SVD in EXLA.jit and eagerly (the same bits), on the binary backend
  defp svd(t) do
    EXLA.LoweringCase.jit_and_eager_bits(&Nx.LinAlg.svd(&1, full_matrices?: false), [t])
    |> Tuple.to_list()
  end

  defp reconstruction_error(a, [u, s, vt]) do
    back = u |> Nx.multiply(Nx.new_axis(s, 0)) |> Nx.dot(vt)
    back |> Nx.subtract(a) |> Nx.abs() |> Nx.reduce_max() |> Nx.to_number()
  end

  for type <- [:f32, :f64] do
    test "the rank-deficient singular values of a centred wide #{type} matrix are zeros" do
      a = centred(@a, unquote(type))
      [_u, s, _vt] = result = svd(a)
      assert [s1, s2, s3, s4] = Nx.to_flat_list(s)
      assert s4 == 0.0
      assert s1 >= s2 and s2 >= s3 and s3 > 0.1
      assert reconstruction_error(a, result) < 1.0e-5
    end

    test "rank-deficient #{type} products keep only their rank's singular values" do
      # 5x4 of rank 2 and its transpose: the third row/column is the sum of
      # the first two, the fourth twice the first minus the second
      x = Nx.tensor([1.0, -2.0, 0.5, 3.0, 1.5], type: unquote(type))
      y = Nx.tensor([0.25, 1.0, -1.0, 2.0, 0.75], type: unquote(type))
      a = Nx.stack([x, y, Nx.add(x, y), Nx.subtract(Nx.multiply(x, 2), y)], axis: 1)

      for m <- [a, Nx.transpose(a)] do
        [_, s, _] = result = svd(m)
        assert [_, s2, s3, s4] = Nx.to_flat_list(s)
        assert s3 == 0.0 and s4 == 0.0
        assert s2 > 1.0
        assert reconstruction_error(m, result) < 1.0e-5
      end
    end
  end

  # (Nx 0.13.1's evaluator raises an ArithmeticError on this matrix)
  @tag nx: :v0_7
  test "Nx 0.7.2's own SVD gives the same zeros" do
    for type <- [:f32, :f64] do
      {_, s, _} =
        Nx.with_default_backend(Nx.BinaryBackend, fn ->
          Nx.Defn.jit_apply(&Nx.LinAlg.svd(&1, full_matrices?: false), [centred(@a, type)],
            compiler: Nx.Defn.Evaluator
          )
        end)

      assert s |> Nx.to_flat_list() |> List.last() == 0.0
    end
  end

  test "pinv's least squares of the centred wide matrix is sklearn's, in jit and eagerly" do
    a = centred(@a, :f32)
    b = Nx.tensor(@b, backend: Nx.BinaryBackend)
    b = Nx.subtract(b, Nx.mean(b))
    lstsq = fn a, b -> Nx.dot(b, [0], Nx.LinAlg.pinv(a), [1]) end
    sklearn = Nx.tensor(@sklearn, backend: Nx.BinaryBackend)

    # (a sequence of eager programs need not give jit's bits; both are
    # within Scholar's 1e-2 of sklearn, where inverting 6e-8 put them up
    # to 0.2 away)
    eager_args = Enum.map([a, b], &Nx.backend_copy(&1, EXLA.Backend))
    eager = Nx.with_default_backend(EXLA.Backend, fn -> apply(lstsq, eager_args) end)

    for coefficients <- [EXLA.jit(lstsq).(a, b), eager] do
      coefficients = Nx.backend_copy(coefficients, Nx.BinaryBackend)

      assert Nx.to_number(Nx.all_close(coefficients, sklearn, atol: 1.0e-2)) == 1,
             inspect(coefficients)
    end
  end

  test "singular values above the floor stay, however small" do
    # a 1x1 matrix is its own singular value (Nx 0.7.2's own SVD gives 0
    # for [[1.0e-6]]); a diagonal one's are its entries
    [_, s, _] = svd(Nx.tensor([[1.0e-6]]))
    assert Nx.to_flat_list(s) == [Nx.to_number(Nx.tensor(1.0e-6))]

    d = Nx.tensor([[1.0, 0.0, 0.0], [0.0, 1.0e-2, 0.0], [0.0, 0.0, 1.0e-5]], type: :f64)
    [_, s, _] = svd(d)
    assert Nx.to_flat_list(s) == [1.0, 1.0e-2, 1.0e-5]
  end
end
