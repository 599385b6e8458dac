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
      expm1: 1
    ]

    doctest Nx, except: [:moduledoc] ++ @excluded
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
