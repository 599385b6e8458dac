defmodule EXLA.MixProject do
  use Mix.Project

  @version "0.7.2"

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
        "Google's XLA (Accelerated Linear Algebra) compiler/backend for Nx, on PJRT plugins",
      docs: [main: "EXLA"],
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

  defp elixirc_paths(:test), do: ["lib", "test/support"]
  defp elixirc_paths(_), do: ["lib"]

  # Real users get Nx from Hex. A local checkout (NX_PATH pointing at the
  # `nx` folder of an Nx repository) is used where Hex cannot be reached.
  defp deps do
    case System.get_env("NX_PATH") do
      nil -> [{:nx, "~> 0.7.2"}]
      "" -> [{:nx, "~> 0.7.2"}]
      path -> [{:nx, path: path, override: true}]
    end
  end
end

defmodule Mix.Tasks.Compile.ExlaNative do
  @moduledoc """
  Builds the Rust NIF with cargo (release profile) and places it in `priv/`.

  It runs cargo only when a file under `native/` or a Cargo manifest is newer
  than the library already in `priv/`; cargo itself decides what to rebuild.
  """
  use Mix.Task.Compiler

  @library "libexla.so"

  @impl true
  def run(_args) do
    target = Path.join("priv", @library)

    if stale?(target) do
      build!(target)
    else
      {:noop, []}
    end
  end

  defp stale?(target) do
    sources = ["Cargo.toml" | Path.wildcard("native/**/{*.rs,Cargo.toml}")]
    Mix.Utils.stale?(sources, [target])
  end

  defp build!(target) do
    Mix.shell().info("Compiling NIF with cargo (release)")
    cargo = System.find_executable("cargo") || Mix.raise("cargo is required to build EXLA's NIF")

    {_, status} =
      System.cmd(cargo, ["build", "--release", "--quiet", "-p", "exla_nif"],
        into: IO.stream(:stdio, :line),
        stderr_to_stdout: true
      )

    if status != 0, do: Mix.raise("cargo build failed with exit status #{status}")

    File.mkdir_p!("priv")
    # Copy, then rename, so a running VM never maps a half-written file.
    tmp = target <> ".tmp"
    File.cp!(Path.join(["target", "release", @library]), tmp)
    File.rename!(tmp, target)
    {:ok, []}
  end
end
