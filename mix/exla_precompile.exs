defmodule Mix.Tasks.Exla.Precompile do
  @shortdoc "Builds a precompiled NIF archive for one target (maintainers)"
  @moduledoc """
  Builds EXLA's NIF for a Rust target triple and a NIF version and packs it
  into `<out>/libexla-v<version>-nif-<nif>-<target>.so.tar.gz`, printing
  its SHA-256. `mix exla.checksum` then writes the checksum file that ships
  in the package. Not part of the package: release builds only.

      mix exla.precompile --target x86_64-unknown-linux-gnu
      mix exla.precompile --target aarch64-unknown-linux-gnu --glibc 2.28
      mix exla.precompile --target aarch64-apple-darwin

  ## Options

    * `--target` - the Rust target triple (required).
    * `--nif-version` - `2.16` (the default; loads on OTP 24 and later) or
      `2.17`.
    * `--glibc` - the oldest glibc a Linux GNU build runs on (default
      `2.28`, as manylinux_2_28).
    * `--out` - the folder for the archive (default `target/precompiled`).

  ## Linux (GNU)

  Built with `cargo zigbuild` (`pip install ziglang cargo-zigbuild`), which
  links against the chosen glibc version's symbols. The C++ guard shim is
  compiled against the target's libstdc++ headers and linked to its
  `libstdc++.so.6` and `libgcc_s.so.1`, like the plugins it calls (see
  `native/pjrt/build.rs`): zig's own libc++ cannot catch their exceptions.
  On Debian, the native target uses `libstdc++-12-dev`; a cross target uses
  the `libstdc++-12-dev-<arch>-cross` package (such as `arm64` for
  aarch64). `PJRT_GUARD_STDCXX_INCLUDE` and `PJRT_GUARD_STDCXX_LIBDIR`,
  when set, are used instead of those Debian paths.

  ## macOS

  Built on a Mac with Xcode's command line tools and rustup's targets
  (`rustup target add aarch64-apple-darwin x86_64-apple-darwin`): plain
  `cargo build --target`, with the system's clang and libc++, which the
  macOS plugins use too. `MACOSX_DEPLOYMENT_TARGET` sets the oldest macOS.
  """
  use Mix.Task

  alias Mix.ExlaNative.Artifact

  @switches [target: :string, nif_version: :string, glibc: :string, out: :string]
  @nif_versions ["2.16", "2.17"]
  @build_dir "target/precompile"

  @impl true
  def run(args) do
    {opts, _rest} = OptionParser.parse!(args, strict: @switches)

    triple =
      opts[:target] || Mix.raise("mix exla.precompile needs --target (a Rust target triple)")

    nif = opts[:nif_version] || "2.16"

    unless nif in @nif_versions do
      Mix.raise("--nif-version must be one of #{Enum.join(@nif_versions, ", ")}, got: #{nif}")
    end

    {command, env} = command(triple, nif, opts[:glibc] || "2.28")
    Mix.shell().info("Building the NIF for #{triple} (NIF #{nif}): #{Enum.join(command, " ")}")
    [program | args] = command

    {_, status} =
      System.cmd(program, args, env: env, into: IO.stream(:stdio, :line), stderr_to_stdout: true)

    if status != 0, do: Mix.raise("#{Enum.join(command, " ")} failed with exit status #{status}")

    library = Path.join([@build_dir, triple, "release", library_name(triple)])
    archive = Artifact.pack(File.read!(library))
    name = Artifact.name(Mix.Project.config()[:version], nif, Artifact.target_of_triple(triple))
    out = opts[:out] || "target/precompiled"
    File.mkdir_p!(out)
    File.write!(Path.join(out, name), archive)
    Mix.shell().info("#{Path.join(out, name)} #{Artifact.digest(archive)}")
  end

  defp library_name(triple) do
    if triple =~ "apple-darwin", do: "libexla.dylib", else: "libexla.so"
  end

  defp command(triple, nif, glibc) do
    features =
      if nif == "2.16",
        do: [],
        else: ["--features", "nif_version_" <> String.replace(nif, ".", "_")]

    common = ["--release", "-p", "exla_nif", "--target-dir", @build_dir] ++ features

    if triple =~ ~r/-linux-gnu$/ do
      {["cargo", "zigbuild", "--target", "#{triple}.#{glibc}" | common], stdcxx_env(triple)}
    else
      {["cargo", "build", "--target", triple | common], []}
    end
  end

  # The target's libstdc++ headers and libraries, in Debian's layout: the
  # host's own for the host's architecture, the cross packages' otherwise.
  defp stdcxx_env(triple) do
    [arch | _] = String.split(triple, "-")
    gnu = "#{arch}-linux-gnu"

    host_arch =
      :erlang.system_info(:system_architecture) |> List.to_string() |> String.split("-") |> hd()

    {include_root, lib} =
      if arch == host_arch,
        do: {"/usr/include", "/usr/lib/#{gnu}"},
        else: {"/usr/#{gnu}/include", "/usr/#{gnu}/lib"}

    headers =
      Path.wildcard(Path.join(include_root, "c++/*/exception"))
      |> Enum.map(&Path.dirname/1)
      |> Enum.max_by(&(&1 |> Path.basename() |> Integer.parse() |> elem(0)), fn -> nil end)

    include =
      System.get_env("PJRT_GUARD_STDCXX_INCLUDE") ||
        (headers &&
           Enum.join(
             [
               headers,
               Path.join(headers, gnu),
               Path.join([include_root, gnu, "c++", Path.basename(headers)])
             ],
             ":"
           )) ||
        Mix.raise(
          "no libstdc++ headers for #{gnu} under #{include_root}/c++: install Debian's " <>
            "libstdc++-12-dev#{if arch != host_arch, do: "-#{debian_arch(arch)}-cross"}, or set PJRT_GUARD_STDCXX_INCLUDE"
        )

    libdir = System.get_env("PJRT_GUARD_STDCXX_LIBDIR") || lib

    unless File.exists?(Path.join(libdir, "libstdc++.so.6")) do
      Mix.raise(
        "no libstdc++.so.6 in #{libdir}: install the target's libstdc++, or set PJRT_GUARD_STDCXX_LIBDIR"
      )
    end

    [{"PJRT_GUARD_STDCXX_INCLUDE", include}, {"PJRT_GUARD_STDCXX_LIBDIR", libdir}]
  end

  defp debian_arch("x86_64"), do: "amd64"
  defp debian_arch("aarch64"), do: "arm64"
  defp debian_arch(arch), do: arch
end

defmodule Mix.Tasks.Exla.Checksum do
  @shortdoc "Writes checksum-exla.exs from a folder of NIF archives (maintainers)"
  @moduledoc """
  Writes `checksum-exla.exs`, which ships in the package: the SHA-256 of
  every archive of this version in the given folder (default
  `target/precompiled`) and of the native sources they were built from.
  Run it on the tree the archives were built from, before `mix hex.publish`.

      mix exla.checksum target/precompiled
  """
  use Mix.Task

  alias Mix.ExlaNative.{Artifact, Sources}

  @impl true
  def run(args) do
    dir = List.first(args) || "target/precompiled"
    prefix = "libexla-v#{Mix.Project.config()[:version]}-nif-"

    archives =
      for path <- Path.wildcard(Path.join(dir, prefix <> "*.so.tar.gz")),
          into: %{},
          do: {Path.basename(path), Artifact.digest(File.read!(path))}

    if archives == %{}, do: Mix.raise("no #{prefix}*.so.tar.gz archives in #{dir}")

    checksums = Map.put(archives, Artifact.sources_key(), Sources.digest(File.cwd!()))
    Artifact.write_checksums!(Artifact.checksum_path(File.cwd!()), checksums)
    for {name, digest} <- Enum.sort(checksums), do: Mix.shell().info("#{digest}  #{name}")
  end
end
