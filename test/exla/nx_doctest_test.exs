# Nx 0.7.2's own doctests, run with EXLA.Backend as the default backend
# (and EXLA as the defn compiler for the Nx.Defn doctests).
#
# Each Nx module gets its own test module, so that a single one can be run
# with `mix test test/exla/nx_doctest_test.exs --only doctest:Nx.LinAlg`.
defmodule EXLA.NxDoctestTest.Setup do
  @moduledoc false

  defmacro __using__(_opts) do
    quote do
      use ExUnit.Case, async: true

      setup_all do
        Application.put_env(:exla, :add_backend_on_inspect, false)
        :ok
      end

      setup do
        Nx.default_backend(EXLA.Backend)
        :ok
      end
    end
  end
end

defmodule EXLA.NxDoctestTest do
  use EXLA.NxDoctestTest.Setup

  # XLA computes these functions with other (equally valid) float
  # approximations than Nx.BinaryBackend, which the doctests print with
  # every digit of the reference. Only the last digits differ:
  @precision_exclusions [
    # tan: XLA's tan of large f32 arguments differs in the last ulp.
    tan: 1,
    # atanh: XLA uses log1p-based formulas; last-digit differences.
    atanh: 1,
    # cosh: XLA computes (e^x + e^-x)/2 with its own exp; last digit.
    cosh: 1,
    # sigmoid: XLA's logistic is computed through tanh; last digit.
    sigmoid: 1,
    # expm1: XLA's expm1 approximation differs in the last ulp.
    expm1: 1,
    # erf: XLA uses a rational approximation; last-digit differences.
    erf: 1,
    # erfc: same approximation family as erf; last-digit differences.
    erfc: 1,
    # tanh: XLA's fast tanh approximation differs in the last digits.
    tanh: 1,
    # asinh: XLA computes log(x + sqrt(x^2 + 1)) differently; last digit.
    asinh: 1,
    # logsumexp: reductions are summed in another order; last digit.
    logsumexp: 2
  ]

  doctest Nx, except: @precision_exclusions
end

defmodule EXLA.NxDoctestTest.LinAlg do
  use EXLA.NxDoctestTest.Setup
  doctest Nx.LinAlg
end

defmodule EXLA.NxDoctestTest.Random do
  use EXLA.NxDoctestTest.Setup
  doctest Nx.Random
end

defmodule EXLA.NxDoctestTest.Constants do
  use EXLA.NxDoctestTest.Setup
  doctest Nx.Constants
end

defmodule EXLA.NxDoctestTest.Batch do
  use EXLA.NxDoctestTest.Setup
  doctest Nx.Batch
end

defmodule EXLA.NxDoctestTest.Composite do
  use EXLA.NxDoctestTest.Setup
  doctest Nx.Defn.Composite
end

defmodule EXLA.NxDoctestTest.Kernel do
  use EXLA.NxDoctestTest.Setup
  use Nx.Defn.Kernel
  doctest Nx.Defn.Kernel
end

defmodule EXLA.NxDoctestTest.Defn do
  use EXLA.NxDoctestTest.Setup

  setup do
    Nx.Defn.default_options(compiler: EXLA)
    :ok
  end

  doctest Nx.Defn
end

defmodule EXLA.NxDoctestTest.Serving do
  use EXLA.NxDoctestTest.Setup
  doctest Nx.Serving
end

defmodule EXLA.NxDoctestTest.Shape do
  use EXLA.NxDoctestTest.Setup
  doctest Nx.Shape
end

defmodule EXLA.NxDoctestTest.Type do
  use EXLA.NxDoctestTest.Setup
  doctest Nx.Type
end
