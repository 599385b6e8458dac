defmodule Mix.Tasks.Compile.ExlaNative do
  @moduledoc """
  Installs EXLA's NIF in `priv/libexla.so`: a precompiled one when there is
  one for this machine, else one built from source with cargo.

  ## Precompiled NIFs

  The package ships `checksum-exla.exs`, the SHA-256 of each precompiled
  archive of this version (`libexla-v<version>-nif-<nif>-<target>.so.tar.gz`,
  such as `libexla-v0.1.0-nif-2.16-x86_64-linux-gnu.so.tar.gz`). The
  compiler picks the archive of the host's target and of the newest NIF
  version the VM loads, downloads it (HTTPS peers verified against the
  operating system's certificate store), refuses it unless its SHA-256 is
  the listed one, and unpacks it into `priv/`. Verified archives are kept
  in `<cache>/nif`, where `<cache>` is `EXLA_CACHE_DIR` or
  `:filename.basedir(:user_cache, "exla")`; an archive placed there by
  hand (on a machine without network) is used once its digest checks out.

  It builds from source instead when no archive matches the target, when
  the native sources differ from those the archives were built from (the
  checksum file records their digest), or when asked to.

  ## Building from source

  Needs Rust (cargo, see `rust-version` in `Cargo.toml`) and a C++
  compiler. cargo builds the release profile; it runs again when a file
  under `native/` or a Cargo manifest is newer than the library in `priv/`,
  and cargo decides what to rebuild.

  The test environment adds the `fault-injection` cargo feature (a
  test-only NIF, see `native/exla/src/fault.rs`) and builds in its own
  cargo target folder, `target/fault-injection`, so switching environments
  does not rebuild the crate each time. Where cargo is not installed, the
  test environment installs the precompiled NIF, without that feature (the
  tests that need it are skipped, see `test/test_helper.exs`).

  `priv/libexla.so.features` records the cargo features of the library in
  `priv/` (empty for a precompiled one) and `priv/libexla.so.origin` where
  it came from.

  ## Environment

    * `EXLA_BUILD` - `true` (or `1`) builds from source, even where a
      precompiled NIF exists.
    * `EXLA_NIF_BASE_URL` - where archives are downloaded from (a URL, to
      which `/<archive name>` is added). Defaults to the `:nif_base_url` of
      the `:exla` application's configuration, else the project's GitHub
      release of this version.
    * `EXLA_NIF_TARGET` - the target whose archive to install, instead of
      the host's (such as `aarch64-linux-gnu`).
    * `EXLA_NIF_FEATURES` - cargo features to add (comma-separated), such
      as `no-tracing` for benchmarks (see `bench/call_cpu_bench.exs`);
      implies a source build.
    * `EXLA_CACHE_DIR` - see above.
    * `CARGO_TARGET_DIR` - cargo's target folder (default `target`).
  """
  use Mix.Task.Compiler

  alias Mix.ExlaNative.{Artifact, Sources}

  # The name `:erlang.load_nif/2` looks for on every Unix, macOS included.
  @library "libexla.so"
  @features_stamp @library <> ".features"
  @origin_stamp @library <> ".origin"

  @impl true
  def run(_args) do
    library = Path.join("priv", @library)
    plan = plan(Mix.env())

    if stale?(plan) do
      install!(plan, library)
    else
      {:noop, []}
    end
  end

  @doc """
  What to install, for the environment `env`: `{:cargo, features, why}`
  (why a source build, for messages) or `{:precompiled, name, digest}`.
  """
  def plan(env) do
    requested = requested_features()
    test_features = test_features(env)
    cargo? = System.find_executable("cargo") != nil

    cond do
      forced_build?() ->
        {:cargo, test_features ++ requested, "EXLA_BUILD is set"}

      requested != [] ->
        {:cargo, test_features ++ requested, "EXLA_NIF_FEATURES is set"}

      test_features != [] and cargo? ->
        {:cargo, test_features, "the test environment builds its NIF"}

      true ->
        precompiled_plan(test_features)
    end
  end

  defp precompiled_plan(features) do
    root = File.cwd!()
    checksums = Artifact.read_checksums(Artifact.checksum_path(root))
    nif = List.to_string(:erlang.system_info(:nif_version))

    with :ok <- same_sources(checksums, root),
         {:ok, name, digest} <-
           Artifact.select(checksums, version(), Artifact.host_target(), nif) do
      {:precompiled, name, digest}
    else
      {:error, why} -> {:cargo, features, why}
    end
  end

  defp same_sources(checksums, root) do
    case checksums[Artifact.sources_key()] do
      nil ->
        {:error, "#{Artifact.checksum_file()} lists no precompiled NIF"}

      digest ->
        if Sources.digest(root) == digest,
          do: :ok,
          else:
            {:error, "the native sources differ from those the precompiled NIFs were built from"}
    end
  end

  defp version, do: Mix.Project.config()[:version]

  defp forced_build?, do: System.get_env("EXLA_BUILD", "") in ["1", "true"]

  defp requested_features do
    System.get_env("EXLA_NIF_FEATURES", "")
    |> String.split(",", trim: true)
    |> Enum.map(&String.trim/1)
  end

  defp test_features(:test), do: ["fault-injection"]
  defp test_features(_env), do: []

  defp origin({:cargo, _features, _why}), do: "cargo"
  defp origin({:precompiled, name, digest}), do: "#{name} #{digest}"

  defp features({:cargo, features, _why}), do: Enum.uniq(features)
  defp features({:precompiled, _name, _digest}), do: []

  defp stale?(plan) do
    library = Path.join("priv", @library)

    recorded? =
      File.read(Path.join("priv", @origin_stamp)) == {:ok, origin(plan)} and
        File.read(Path.join("priv", @features_stamp)) == {:ok, Enum.join(features(plan), ",")}

    not recorded? or not File.exists?(library) or
      (elem(plan, 0) == :cargo and Mix.Utils.stale?(source_files(), [library]))
  end

  defp source_files, do: Sources.files(File.cwd!())

  defp install!({:precompiled, name, digest} = plan, library) do
    Mix.shell().info("Installing the precompiled NIF #{name}")
    url = base_url()

    case Artifact.fetch(name, digest, url, cache_dir()) do
      {:ok, bytes} ->
        case Artifact.unpack(bytes) do
          {:ok, binary} -> place!(binary, library, plan)
          {:error, reason} -> Mix.raise("The precompiled NIF #{name} is damaged: #{reason}")
        end

      {:error, :checksum, actual} ->
        Mix.raise("""
        The precompiled NIF downloaded from #{url}/#{name} has SHA-256 \
        #{actual}, but #{Artifact.checksum_file()} expects #{digest}. \
        Nothing was installed. The file served there is not the one this \
        release of EXLA was built with: check EXLA_NIF_BASE_URL (or the \
        :nif_base_url configuration), or build from source with \
        EXLA_BUILD=true (needs Rust, https://rustup.rs).\
        """)

      {:error, :download, reason} ->
        Mix.raise("""
        Could not download the precompiled NIF: #{reason}. \
        On a machine without network access, download #{name} elsewhere \
        and place it in #{cache_dir()}, or point EXLA_NIF_BASE_URL at a \
        reachable copy of the release files; or build from source with \
        EXLA_BUILD=true (needs Rust, https://rustup.rs).\
        """)
    end
  end

  defp install!({:cargo, _features, why} = plan, library) do
    features = features(plan)
    Mix.shell().info("Compiling NIF with cargo (release#{for f <- features, do: ", " <> f})")

    cargo =
      System.find_executable("cargo") ||
        Mix.raise("""
        EXLA's NIF must be built from source here (#{why}), and that needs \
        Rust's cargo, which is not on the PATH. Install Rust \
        (https://rustup.rs) and a C++ compiler (g++ or clang), then \
        compile again.\
        """)

    target_dir = Path.join([System.get_env("CARGO_TARGET_DIR", "target") | features])

    args =
      ["build", "--release", "--quiet", "-p", "exla_nif", "--target-dir", target_dir] ++
        Enum.flat_map(features, &["--features", &1])

    {_, status} = System.cmd(cargo, args, into: IO.stream(:stdio, :line), stderr_to_stdout: true)
    if status != 0, do: Mix.raise("cargo build failed with exit status #{status}")

    place!(
      File.read!(Path.join([target_dir, "release", cargo_library(:os.type())])),
      library,
      plan
    )
  end

  # Writes, then renames, so a running VM never maps a half-written file.
  defp place!(binary, library, plan) do
    File.mkdir_p!(Path.dirname(library))
    tmp = library <> ".tmp"
    File.write!(tmp, binary)
    File.rename!(tmp, library)
    File.write!(Path.join("priv", @features_stamp), Enum.join(features(plan), ","))
    File.write!(Path.join("priv", @origin_stamp), origin(plan))
    # Mix links priv/ into the build folder before the compilers run, and
    # only if it exists then: a Hex package has no priv/ until this created
    # it, so link it now, or the VM finds no NIF in the application's priv.
    Mix.Project.build_structure()
    {:ok, []}
  end

  @doc """
  Where archives are downloaded from: `EXLA_NIF_BASE_URL`, else the
  `:nif_base_url` of the `:exla` configuration, else the GitHub release of
  this version.
  """
  def base_url do
    case System.get_env("EXLA_NIF_BASE_URL", "") do
      "" ->
        Application.get_env(:exla, :nif_base_url) ||
          "#{Mix.Project.config()[:source_url]}/releases/download/v#{version()}"

      url ->
        url
    end
  end

  @doc false
  # Where precompiled NIF archives are kept: the `nif` folder of EXLA's
  # cache directory, whose layout EXLA.CacheDir owns (this runs before it
  # is compiled; a test checks that both say the same).
  def cache_dir do
    root =
      case System.get_env("EXLA_CACHE_DIR", "") do
        "" -> List.to_string(:filename.basedir(:user_cache, ~c"exla"))
        dir -> dir
      end

    Path.join(root, "nif")
  end

  @doc """
  The file name cargo gives the NIF library on the OS `os_type` (as
  `:os.type/0` returns it). On macOS it is a `.dylib`, which is copied to
  `priv/libexla.so` all the same.
  """
  def cargo_library({:unix, :darwin}), do: "libexla.dylib"
  def cargo_library({:unix, _}), do: @library
end
