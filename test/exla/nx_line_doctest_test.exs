# The doctests of Nx 0.12 and 0.13 (whichever is compiled), run with
# EXLA.Backend as the default backend and EXLA as the defn compiler. Nx
# 0.7.2's are in nx_doctest_test.exs.
#
# The exclusions are exactly those of EXLA 0.13.1's own tests, which are the
# same in EXLA 0.12.1 (elixir-nx/nx at tags v0.13.1 and v0.12.1):
#
#   * exla/test/exla/backend_test.exs - `doctest Nx` without the moduledoc
#     and the f32 math functions whose last digits are XLA's, not the
#     reference's (asin, atan, tan, acos, cosh, erf_inv, erfc, sinh, atanh,
#     asinh, logsumexp, exp, expm1), with `precision: :default`;
#   * (ours) `Nx.rsqrt/1`, whose f64 examples depend on the host's ISA: see
#     EXLA.NxLineDoctestTest.CappedISA below;
#   * exla/test/exla/nx_linalg_doctest_test.exs - `doctest Nx.LinAlg`
#     without the moduledoc, solve/2 and triangular_solve/3 (function
#     clause errors there) and the rounding differences (svd, pinv, eigh,
#     cholesky, least_squares, determinant, matrix_power, lu, qr), with
#     `precision: :highest`.
defmodule EXLA.NxLineDoctestTest do
  use EXLA.NxDoctestCase, nx: :blocks?, defn_options: [compiler: EXLA, precision: :default]

  if EXLA.NxVersion.blocks?() do
    # Nx's examples write vectors and matrices with ~VEC and ~MAT (the
    # import is compiled on Nx 0.7 too, where nothing uses it).
    import Nx, only: :sigils, warn: false

    @excluded [
      asin: 1,
      atan: 1,
      tan: 1,
      acos: 1,
      cosh: 1,
      erf_inv: 1,
      erfc: 1,
      sinh: 1,
      atanh: 1,
      asinh: 1,
      logsumexp: 2,
      exp: 1,
      expm1: 1,
      rsqrt: 1
    ]

    doctest Nx, except: [:moduledoc] ++ @excluded
  end
end

defmodule EXLA.NxLineDoctestTest.CappedISA do
  # XLA:CPU compiles f64 rsqrt for the host's instruction set. With AVX-512
  # it is up to 2 ulp off the reference (1 / the rounded sqrt), 1 ulp for a
  # quarter of random inputs and 2 for 0.1% (200,000 measured): rsqrt(3) is
  # 0.5773502691896257 where Nx's doctest prints 0.5773502691896258; with
  # AVX2 (the default where the host has no AVX-512) it gives the
  # reference's digits for all 4,006 inputs below. So the doctest runs on a
  # client capped at AVX2, on any x86-64 host, and the test below bounds what
  # every host computes, jit and eager alike: f64 within 2 ulp, f32 within
  # 1 ulp (88 of the 4,006 inputs on AVX2 and AVX-512 alike).
  use EXLA.NxDoctestCase, nx: :blocks?, defn_options: [compiler: EXLA, client: :avx2_capped]

  @moduletag :x86_64

  setup_all do
    EXLA.TestClients.add(:avx2_capped, platform: :host, xla_options: [xla_cpu_max_isa: "AVX2"])
  end

  setup do
    Nx.default_backend({EXLA.Backend, client: :avx2_capped})
    :ok
  end

  if EXLA.NxVersion.blocks?() do
    doctest Nx, only: [rsqrt: 1]
  end

  # The distance in units in the last place between two tensors of the same
  # float type, the largest over their elements.
  defp ulps(a, b) do
    {:f, bits} = a.type
    int = {:s, bits}

    [a, b]
    |> Enum.map(fn t ->
      t = t |> Nx.backend_copy(Nx.BinaryBackend) |> Nx.bitcast(int)
      # negative floats count down from -0.0
      Nx.select(Nx.less(t, 0), Nx.subtract(Nx.Constants.min_finite(int), t), t)
    end)
    |> then(fn [a, b] -> Nx.subtract(a, b) |> Nx.abs() |> Nx.reduce_max() |> Nx.to_number() end)
  end

  test "rsqrt on the host's own ISA is within 2 ulp of the reference in f64, 1 in f32" do
    reference = &Nx.with_default_backend(Nx.BinaryBackend, &1)

    x =
      reference.(fn ->
        powers = Nx.pow(10.0, Nx.linspace(-300.0, 300.0, n: 4001, type: :f64))
        Nx.concatenate([powers, Nx.tensor([1.0, 2.0, 3.0, 7.0, 0.5], type: :f64)])
      end)

    for type <- [:f64, :f32] do
      x =
        if type == :f32,
          do: reference.(fn -> Nx.as_type(Nx.clip(x, 1.0e-30, 1.0e30), :f32) end),
          else: x

      expected = reference.(fn -> Nx.rsqrt(x) end)
      eager = Nx.rsqrt(Nx.backend_copy(x, {EXLA.Backend, client: :host}))
      jitted = EXLA.jit(&Nx.rsqrt/1, client: :host).(x)
      assert Nx.to_binary(eager) == Nx.to_binary(jitted)
      assert ulps(eager, expected) <= if(type == :f64, do: 2, else: 1)
    end
  end
end

defmodule EXLA.NxLineDoctestTest.LinAlg do
  use EXLA.NxDoctestCase, nx: :blocks?, defn_options: [compiler: EXLA, precision: :highest]

  if EXLA.NxVersion.blocks?() do
    @excluded [solve: 2, triangular_solve: 3] ++
                [svd: 2, pinv: 2, eigh: 2, cholesky: 1, least_squares: 3] ++
                [determinant: 1, matrix_power: 2, lu: 1, qr: 2]

    doctest Nx.LinAlg, except: [:moduledoc] ++ @excluded
  end
end
