defmodule HelloExla.MixProject do
  use Mix.Project

  # An application that uses EXLA, packed as a release with ERTS included
  # (`scripts/release`, see docs/gpu.md): the target needs neither Erlang,
  # Elixir nor Rust.
  def project do
    [
      app: :hello_exla,
      version: "0.1.0",
      elixir: "~> 1.14",
      deps: deps(),
      releases: [hello_exla: [include_erts: true, include_executables_for: [:unix]]]
    ]
  end

  def application, do: [extra_applications: [:logger]]

  # EXLA from this repository; Nx from Hex, or from NX_PATH where Hex
  # cannot be reached (as EXLA's own mix.exs does).
  defp deps do
    nx =
      case System.get_env("NX_PATH") do
        path when path in [nil, ""] -> {:nx, "~> 0.7.2"}
        path -> {:nx, path: path, override: true}
      end

    [{:exla, path: "../.."}, nx]
  end
end
