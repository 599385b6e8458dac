# The NIF compiler (and the maintainers' release tasks, which the package
# leaves out) must exist before the project compiles: they live in mix/.
for file <- Path.wildcard(Path.join(__DIR__, "mix/*.exs")), do: Code.require_file(file)

defmodule EXLA.MixProject do
  use Mix.Project

  @version "0.7.2"
  @source_url "https://github.com/exla-pjrt/exla"

  def project do
    [
      app: :exla,
      version: @version,
      elixir: "~> 1.14",
      elixirc_paths: elixirc_paths(Mix.env()),
      compilers: [:exla_native | Mix.compilers()],
      deps: deps(),
      name: "EXLA",
      description:
        "Nx on XLA: a tensor backend and defn compiler that drive XLA through PJRT plugins",
      docs: [main: "EXLA"],
      source_url: @source_url,
      package: package(),
      preferred_cli_env: [bench: :prod]
    ]
  end

  def application do
    [
      mod: {EXLA.Application, []},
      extra_applications: [:logger, :crypto],
      env: [
        clients: [
          cuda: [platform: :cuda, memory_fraction: 0.8],
          rocm: [platform: :rocm, memory_fraction: 0.8],
          tpu: [platform: :tpu],
          host: [platform: :host]
        ],
        preferred_clients: [:cuda, :rocm, :tpu, :host],
        add_backend_on_inspect: true
      ]
    ]
  end

  # Exactly what a user's build reads: the Elixir sources, the NIF compiler,
  # the native sources (Mix.ExlaNative.Sources lists them; the test plugin
  # crate is there because the Cargo workspace names it) and the checksums
  # of the precompiled NIFs. No tests, benches, examples or build outputs.
  defp package do
    [
      licenses: ["Apache-2.0"],
      links: %{"GitHub" => @source_url},
      files:
        ~w(lib mix/compile_exla_native.exs mix/exla_native_artifact.exs mix/exla_native_sources.exs) ++
          Mix.ExlaNative.Sources.patterns() ++
          ~w(checksum-exla.exs mix.exs README.md LICENSE)
    ]
  end

  defp elixirc_paths(:test), do: ["lib", "test/support"]
  defp elixirc_paths(_), do: ["lib"]

  # Real users get Nx from Hex: any of the three lines EXLA supports (the
  # one compiled decides what EXLA implements, see EXLA.NxVersion). A local
  # checkout (NX_PATH pointing at the `nx` folder of an Nx repository) is
  # used where Hex cannot be reached.
  @nx_requirement "~> 0.7.2 or ~> 0.12.0 or ~> 0.13.0"

  defp deps do
    case System.get_env("NX_PATH") do
      nil -> [{:nx, @nx_requirement}]
      "" -> [{:nx, @nx_requirement}]
      path -> [{:nx, path: path, override: true}]
    end
  end
end
