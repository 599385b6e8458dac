defmodule EXLA.TriangularSolveTest do
  # Nx.LinAlg.triangular_solve/3's :transform_a, in jit and eagerly, on
  # real and complex matrices, against Nx's reference. On Nx 0.12 and later
  # :conjugate solves with conj(a), not transposed (StableHLO's ADJOINT
  # would also transpose a); Nx 0.7 refuses :conjugate before any backend
  # or compiler sees it.
  use EXLA.LoweringCase, async: true

  @lower Nx.tensor([[2.0, 0.0, 0.0], [1.0, 3.0, 0.0], [-1.0, 2.0, 4.0]], type: :f64)
  @complex Nx.tensor(
             [
               [Complex.new(2.0, 1.0), 0, 0],
               [Complex.new(1.0, -2.0), Complex.new(0.0, 3.0), 0],
               [Complex.new(-1.0, 0.5), 2.0, Complex.new(4.0, -1.0)]
             ],
             type: :c64
           )

  defp solve(a, b, opts), do: Nx.LinAlg.triangular_solve(a, b, opts)

  # Every combination of side and triangle, with a vector and a matrix b
  # (a matrix on the right side is solved as x.a = b).
  defp all_solves(transform) do
    fn a, b ->
      upper = Nx.transpose(a)

      %{
        left_lower: solve(a, b, transform_a: transform),
        left_lower_vector: solve(a, b[[.., 0]], transform_a: transform),
        left_upper: solve(upper, b, transform_a: transform, lower: false),
        right_lower: solve(a, Nx.transpose(b), transform_a: transform, left_side: false),
        right_upper:
          solve(upper, Nx.transpose(b), transform_a: transform, left_side: false, lower: false)
      }
    end
  end

  @b Nx.tensor([[1.0, 2.0], [3.0, -4.0], [5.0, 6.0]], type: :f64)

  # (real ones are in test/exla/lowering/lin_alg_test.exs)
  test ":none and :transpose on complex matrices" do
    for transform <- [:none, :transpose] do
      assert_jit_and_eager(all_solves(transform), [@complex, Nx.as_type(@b, :c64)], atol: 1.0e-5)
    end
  end

  if EXLA.NxVersion.line?([:v0_12, :v0_13]) do
    test ":conjugate solves with conj(a), not transposed" do
      a = Nx.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], type: :f64)
      x = assert_jit_and_eager(&solve(&1, &2, transform_a: :conjugate), [a, Nx.tensor([1, 2, 1])])
      assert Nx.to_flat_list(x) == [1.0, 1.0, -1.0]
    end

    test ":conjugate on real matrices is :none, each side and triangle" do
      assert_jit_and_eager(all_solves(:conjugate), [@lower, @b], atol: 1.0e-10)
      assert_jit_and_eager(all_solves(:conjugate), [Nx.as_type(@lower, :f32), @b], atol: 1.0e-5)
    end

    test ":conjugate on complex matrices, each side and triangle, batched too" do
      b = Nx.add(Nx.as_type(@b, :c64), Nx.multiply(Complex.new(0.0, 1.0), Nx.reverse(@b)))
      assert_jit_and_eager(all_solves(:conjugate), [@complex, b], atol: 1.0e-5)

      batch = Nx.stack([@complex, Nx.multiply(@complex, Complex.new(0.5, -1.0))])
      bs = Nx.stack([b, Nx.negate(b)])

      assert_jit_and_eager(
        fn a, b ->
          {solve(a, b, transform_a: :conjugate),
           solve(a, b[[.., .., 0]], transform_a: :conjugate)}
        end,
        [batch, bs],
        atol: 1.0e-5
      )
    end

    # one test per side and triangle: eager gradients compile each op
    for opts <- [[], [lower: false], [left_side: false]] do
      test "gradients through :conjugate, real and complex, #{inspect(opts)}" do
        opts = unquote(opts)

        loss = fn a, b ->
          Nx.Defn.grad({a, b}, fn {a, b} ->
            solve(a, b, [transform_a: :conjugate] ++ opts) |> Nx.abs() |> Nx.sum()
          end)
        end

        {a, c} =
          if opts[:lower] == false,
            do: {Nx.transpose(@lower), Nx.transpose(@complex)},
            else: {@lower, @complex}

        b = if opts[:left_side] == false, do: Nx.transpose(@b), else: @b
        assert_jit_and_eager(loss, [a, b], atol: 1.0e-10)
        assert_jit_and_eager(loss, [c, Nx.as_type(b, :c64)], atol: 1.0e-4)
      end
    end
  else
    test ":conjugate is refused by Nx 0.7, in jit and eagerly" do
      eager = Nx.backend_copy(@lower, EXLA.Backend)

      assert_raise ArgumentError, "complex numbers not supported yet", fn ->
        solve(eager, @b, transform_a: :conjugate)
      end

      assert_raise ArgumentError, "complex numbers not supported yet", fn ->
        EXLA.jit(&solve(&1, &2, transform_a: :conjugate)).(@lower, @b)
      end
    end
  end
end
