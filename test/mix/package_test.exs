Code.require_file("loopback_http.exs", __DIR__)

defmodule EXLA.PackageTest do
  # Builds the project from exactly the files `package/0` in mix.exs lists,
  # copied into an empty folder, as a user's `mix deps.compile` would: with
  # a precompiled NIF from a server on the loopback interface, on a PATH
  # without cargo or C/C++ compilers, and from source where no archive
  # matches. Slow (a few minutes: Nx compiles in the copy, and cargo builds
  # there once); needs NX_PATH, since Hex cannot be reached here.
  use ExUnit.Case, async: false

  alias Mix.ExlaNative.{Artifact, Sources}

  @moduletag :slow
  @moduletag :tmp_dir
  @moduletag timeout: 900_000

  @package_files Mix.Project.config()[:package][:files]
  @version Mix.Project.config()[:version]

  # What scripts/package_release leaves: the Hex package and the archives
  # it lists (nifs/), exactly as a release publishes them.
  @release_dir Path.expand(System.get_env("RELEASE_DIR", "target/release"))
  @tarball Path.join(@release_dir, "exla_pjrt-#{@version}.tar")
  @no_release (cond do
                 System.get_env("NX_PATH") == nil -> "needs NX_PATH"
                 not File.exists?(@tarball) -> "needs scripts/package_release's #{@tarball}"
                 true -> false
               end)

  test "the package lists what a build needs and nothing else" do
    files = package_files(File.cwd!())

    for needed <- ~w(mix.exs README.md LICENSE checksum-exla.exs Cargo.toml Cargo.lock
                     native/pjrt/cpp/guard.cc native/pjrt/build.rs native/exla/src/lib.rs
                     native/test_plugin/Cargo.toml lib/exla.ex mix/compile_exla_native.exs) do
      assert needed in files, "#{needed} is not in the package"
    end

    for file <- files do
      refute file =~ ~r"^(test|bench|examples|target|priv|_build|deps|config|scripts|\.github)/",
             "#{file} should not be in the package"

      refute file =~ ~r"^native/[^/]+/(tests|examples)/", "#{file} should not be in the package"
    end

    refute "mix/exla_precompile.exs" in files
  end

  @tag skip: System.get_env("NX_PATH") == nil && "needs NX_PATH"
  test "a copy of the package installs a verified precompiled NIF, or builds one from source",
       %{tmp_dir: dir} do
    project = Path.join(dir, "exla")
    for file <- package_files(File.cwd!()), do: copy(file, File.cwd!(), project)

    # A release of one archive, for this machine, made from the NIF in use.
    served = Path.join(dir, "release")
    File.mkdir_p!(served)
    nif = List.to_string(:erlang.system_info(:nif_version))
    name = Artifact.name(Mix.Project.config()[:version], nif, Artifact.host_target())
    archive = Artifact.pack(File.read!(Path.join(:code.priv_dir(:exla), "libexla.so")))

    Artifact.write_checksums!(Artifact.checksum_path(project), %{
      name => Artifact.digest(archive),
      Artifact.sources_key() => Sources.digest(project)
    })

    {url, env} = user_env(dir, served)

    library = Path.join(project, "priv/libexla.so")

    # Offline: nothing there to download.
    {out, status} = mix(project, ["compile"], env)
    assert status != 0
    assert out =~ "Could not download the precompiled NIF: #{url}/#{name} answered HTTP 404"
    assert out =~ "place it in #{Path.join([dir, "cache", "nif"])}"
    refute File.exists?(library)

    # A tampered archive is refused, and nothing is installed.
    <<head::binary-size(100), byte, tail::binary>> = archive
    File.write!(Path.join(served, name), <<head::binary, Bitwise.bxor(byte, 1), tail::binary>>)
    {out, status} = mix(project, ["compile"], env)
    assert status != 0
    assert out =~ "has SHA-256 sha256:"

    assert out =~
             "but checksum-exla.exs expects #{Artifact.digest(archive)}. Nothing was installed."

    refute File.exists?(library)

    # The right one is installed, and runs.
    File.write!(Path.join(served, name), archive)
    {out, 0} = mix(project, ["compile"], env)
    assert out =~ "Installing the precompiled NIF #{name}"
    refute out =~ "cargo"
    assert File.read!(library) == File.read!(Path.join(:code.priv_dir(:exla), "libexla.so"))
    assert_runs(project, env)

    # No archive for the target and no cargo: says what to do.
    no_archive = %{env | "EXLA_NIF_TARGET" => "riscv64-linux-gnu"}
    {out, status} = mix(project, ["compile"], no_archive)
    assert status != 0
    assert out =~ "no precompiled NIF for riscv64-linux-gnu (NIF #{nif})"
    assert out =~ "that needs Rust's cargo, which is not on the PATH"

    # With cargo, it builds from source (in this project's cargo target
    # folder, which holds the dependencies built already).
    with_cargo =
      Map.merge(no_archive, %{
        "PATH" => System.get_env("PATH"),
        "CARGO_TARGET_DIR" => Path.expand("target")
      })

    {out, 0} = mix(project, ["compile"], with_cargo)
    assert out =~ "Compiling NIF with cargo (release)"
    assert File.read!(Path.join(project, "priv/libexla.so.origin")) == "cargo"
    assert_runs(project, with_cargo)
  end

  @tag skip: @no_release
  test "a new project installs the rehearsed release: the package, its NIFs from loopback, no toolchain",
       %{tmp_dir: dir} do
    package = unpack_hex(@tarball, Path.join(dir, "exla"))

    # The tarball holds exactly the package's files, with the checksums of
    # the archives the release serves.
    held =
      for f <- Path.wildcard(Path.join(package, "**/*"), match_dot: true),
          not File.dir?(f),
          do: Path.relative_to(f, package)

    assert Enum.sort(held) == Enum.sort(package_files(File.cwd!()))
    checksums = Artifact.read_checksums(Artifact.checksum_path(package))
    nifs = Path.join(@release_dir, "nifs")

    for {name, digest} <- checksums, name != Artifact.sources_key() do
      assert Artifact.digest(File.read!(Path.join(nifs, name))) == digest
    end

    assert checksums[Artifact.sources_key()] == Sources.digest(package)

    app = new_project(dir, ~s|{:exla, path: #{inspect(package)}}|)
    {_url, env} = user_env(dir, nifs)
    {out, 0} = mix(app, ["deps.compile"], env)
    assert out =~ "Installing the precompiled NIF #{host_archive(package)}"
    refute out =~ "cargo"
    assert File.read!(Path.join(package, "priv/libexla.so.origin")) =~ host_archive(package)
    assert_in_build(app)
    assert_mlp_runs(app, env)
  end

  # The release commits its checksum file on top of the release's commit and
  # tags that (scripts/package_release tag): a git dependency on the tag
  # installs the same archives as the Hex package.
  @tag skip: @no_release
  test "a new project installs the rehearsed release as a git dependency on its tag",
       %{tmp_dir: dir} do
    package = unpack_hex(@tarball, Path.join(dir, "package"))
    work = Path.join(dir, "work")
    bare = Path.join(dir, "exla.git")
    {_, 0} = git(dir, ["clone", "--quiet", File.cwd!(), work])
    File.cp!(Artifact.checksum_path(package), Artifact.checksum_path(work))
    who = for v <- ~w(AUTHOR COMMITTER), f <- ~w(NAME EMAIL), do: {"GIT_#{v}_#{f}", "release"}

    {out, 0} =
      System.cmd(Path.join(work, "scripts/package_release"), ["tag"],
        cd: work,
        env: who,
        stderr_to_stdout: true
      )

    assert out =~ "tagged v#{@version}"
    {_, 0} = git(dir, ["init", "--quiet", "--bare", bare])
    {_, 0} = git(work, ["push", "--quiet", bare, "v#{@version}"])

    app = new_project(dir, ~s|{:exla, git: "file://#{bare}", tag: "v#{@version}"}|)
    {_url, env} = user_env(dir, Path.join(@release_dir, "nifs"))
    {out, 0} = mix(app, ["deps.get"], env)
    assert out =~ "exla"
    {out, 0} = mix(app, ["deps.compile"], env)
    assert out =~ "Installing the precompiled NIF #{host_archive(package)}"
    refute out =~ "cargo"
    assert_in_build(app)
    assert_mlp_runs(app, env)
  end

  # Where the VM looks for the NIF once the dependency is compiled, before
  # anything compiles it again (a Hex or git dependency is not rechecked).
  defp assert_in_build(app) do
    assert File.exists?(Path.join(app, "_build/prod/lib/exla/priv/libexla.so"))
  end

  # The archive the compiler picks for this VM from a package's checksums.
  defp host_archive(package) do
    nif = List.to_string(:erlang.system_info(:nif_version))
    checksums = Artifact.read_checksums(Artifact.checksum_path(package))
    {:ok, name, _} = Artifact.select(checksums, @version, Artifact.host_target(), nif)
    name
  end

  # A Hex tarball is an outer tar whose contents.tar.gz holds the files.
  defp unpack_hex(tarball, dir) do
    {:ok, files} = :erl_tar.extract(String.to_charlist(tarball), [:memory])
    {_, contents} = List.keyfind(files, ~c"contents.tar.gz", 0)
    :ok = :erl_tar.extract({:binary, contents}, [:compressed, cwd: String.to_charlist(dir)])
    dir
  end

  # A user's new project, with EXLA as its only dependency besides Nx (from
  # NX_PATH, as Hex cannot be reached here), and the MLP example.
  defp new_project(dir, exla_dep) do
    app = Path.join(dir, "app")
    File.mkdir_p!(app)

    File.write!(Path.join(app, "mix.exs"), """
    defmodule App.MixProject do
      use Mix.Project

      def project do
        [app: :app, version: "0.1.0", elixir: "~> 1.14", deps: deps()]
      end

      defp deps do
        [#{exla_dep}, {:nx, path: #{inspect(Path.expand(System.get_env("NX_PATH")))}, override: true}]
      end
    end
    """)

    File.cp!("examples/mlp.exs", Path.join(app, "mlp.exs"))
    app
  end

  # A user's build: prod, no Rust or C compiler on the PATH, archives from
  # `served` on the loopback interface, and the CPU plugin already installed.
  defp user_env(dir, served) do
    {url, stop} = EXLA.LoopbackHTTP.serve(served)
    on_exit(stop)

    env = %{
      "MIX_ENV" => "prod",
      # A relative NX_PATH (the README's `../shared/deps/nx`) names a folder
      # from this project, not from the copy.
      "NX_PATH" => Path.expand(System.get_env("NX_PATH")),
      "PATH" => without_toolchain(Path.join(dir, "bin")),
      "EXLA_NIF_BASE_URL" => url,
      "EXLA_CACHE_DIR" => Path.join(dir, "cache"),
      "EXLA_PJRT_PLUGIN_HOST" => EXLA.Client.fetch!(:host).plugin_path,
      "EXLA_BUILD" => nil,
      "EXLA_NIF_TARGET" => nil,
      "EXLA_NIF_FEATURES" => nil,
      # This project's own build folder settings (one per toolchain) are not
      # the user's: their build goes to their project's _build.
      "MIX_BUILD_ROOT" => nil,
      "MIX_BUILD_PATH" => nil
    }

    {url, env}
  end

  defp assert_mlp_runs(app, env) do
    {out, 0} = mix(app, ["run", "mlp.exs"], env)
    assert out =~ "client: host"
    [first, last] = for e <- [1, 10], do: loss(out, e)
    assert last < first
  end

  defp loss(out, epoch) do
    [_, loss] = Regex.run(~r/epoch #{epoch}: loss ([\d.]+)/, out)
    String.to_float(loss)
  end

  defp git(dir, args), do: System.cmd("git", args, cd: dir, stderr_to_stdout: true)

  defp assert_runs(project, env) do
    code = """
    f = EXLA.jit(fn a, b -> Nx.multiply(Nx.add(a, b), 2) end)
    IO.puts("result: " <> Enum.join(Nx.to_flat_list(f.(Nx.tensor([1, 2]), Nx.tensor([3, 4]))), ","))
    """

    {out, 0} = mix(project, ["run", "-e", code], env)
    assert out =~ "result: 8,12"
  end

  # Every file the package holds, as Hex expands `:files` (globs, and
  # folders taken whole), relative to `root`.
  defp package_files(root) do
    @package_files
    |> Enum.flat_map(&Path.wildcard(Path.join(root, &1)))
    |> Enum.flat_map(fn path ->
      if File.dir?(path), do: Path.wildcard(Path.join(path, "**/*")), else: [path]
    end)
    |> Enum.reject(&File.dir?/1)
    |> Enum.map(&Path.relative_to(&1, root))
    |> Enum.uniq()
  end

  defp copy(file, from, to) do
    File.mkdir_p!(Path.dirname(Path.join(to, file)))
    File.cp!(Path.join(from, file), Path.join(to, file))
  end

  defp mix(project, args, env) do
    System.cmd(System.find_executable("mix"), args,
      cd: project,
      env: Map.to_list(env),
      stderr_to_stdout: true
    )
  end

  # A folder of links to every program on the PATH except Rust's and the
  # C and C++ compilers (the first of each name, as the PATH would find it).
  @hidden ~r/^(cargo|rustc|rustup|rustdoc|zig|cc|c\+\+|cpp|g\+\+|gcc|clang|c89|c99|x86_64-linux-gnu-(g|c)|aarch64-linux-gnu-(g|c)).*/

  defp without_toolchain(bin) do
    File.mkdir_p!(bin)

    for dir <- String.split(System.get_env("PATH"), ":"),
        File.dir?(dir),
        program <- File.ls!(dir),
        not (program =~ @hidden),
        not File.exists?(Path.join(bin, program)) do
      File.ln_s!(Path.join(dir, program), Path.join(bin, program))
    end

    for program <- ~w(cargo g++ gcc cc c++), do: refute(File.exists?(Path.join(bin, program)))
    bin
  end
end
