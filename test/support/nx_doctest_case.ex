defmodule EXLA.NxDoctestCase do
  @moduledoc false
  # The case for Nx's own doctests run with EXLA.Backend as the default
  # backend: nx_doctest_test.exs (Nx 0.7.2, `nx: :v0_7`) and
  # nx_line_doctest_test.exs (Nx 0.12 and 0.13, `nx: :blocks?`).
  #
  # Options: `:nx`, the module's nx tag (test_helper.exs excludes the
  # modules of the other Nx line), and `:defn_options`, given to
  # Nx.Defn.default_options/1 before each test when present.

  defmacro __using__(opts) do
    nx = Keyword.fetch!(opts, :nx)
    defn_options = Keyword.get(opts, :defn_options)

    quote do
      use ExUnit.Case, async: true

      @moduletag nx: unquote(nx)

      setup_all do
        Application.put_env(:exla, :add_backend_on_inspect, false)
        :ok
      end

      setup do
        Nx.default_backend(EXLA.Backend)
        if defn_options = unquote(defn_options), do: Nx.Defn.default_options(defn_options)
        :ok
      end
    end
  end
end
