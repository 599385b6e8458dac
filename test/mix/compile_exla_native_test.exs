Code.require_file("loopback_http.exs", __DIR__)

defmodule Mix.Tasks.Compile.ExlaNativeTest do
  # Sets environment variables the compiler reads.
  use ExUnit.Case, async: false

  import EXLA.TestEnv, only: [with_envs: 2]
  alias Mix.ExlaNative.{Artifact, Sources}
  alias Mix.Tasks.Compile.ExlaNative

  @moduletag :tmp_dir

  test "copies the library cargo builds for the OS" do
    assert ExlaNative.cargo_library({:unix, :linux}) == "libexla.so"
    assert ExlaNative.cargo_library({:unix, :freebsd}) == "libexla.so"
    assert ExlaNative.cargo_library({:unix, :darwin}) == "libexla.dylib"
  end

  describe "targets" do
    test "are read from the VM's system architecture" do
      assert Artifact.target_of("x86_64-pc-linux-gnu") == "x86_64-linux-gnu"
      assert Artifact.target_of("aarch64-unknown-linux-gnu") == "aarch64-linux-gnu"
      assert Artifact.target_of("x86_64-pc-linux-musl") == "x86_64-linux-musl"
      assert Artifact.target_of("arm-unknown-linux-gnueabihf") == "arm-linux-gnueabihf"
      assert Artifact.target_of("aarch64-apple-darwin23.4.0") == "aarch64-apple-darwin"
      assert Artifact.target_of("x86_64-apple-darwin21.6.0") == "x86_64-apple-darwin"
      assert Artifact.target_of("amd64-portbld-freebsd14.0") == "x86_64-freebsd"
    end

    test "map to Rust target triples and back" do
      for {target, triple} <- [
            {"x86_64-linux-gnu", "x86_64-unknown-linux-gnu"},
            {"aarch64-linux-gnu", "aarch64-unknown-linux-gnu"},
            {"aarch64-apple-darwin", "aarch64-apple-darwin"}
          ] do
        assert Artifact.rust_triple(target) == triple
        assert Artifact.target_of_triple(triple) == target
      end
    end

    test "EXLA_NIF_TARGET overrides the host's" do
      with_envs([{"EXLA_NIF_TARGET", "riscv64-linux-gnu"}], fn ->
        assert Artifact.host_target() == "riscv64-linux-gnu"
      end)

      assert Artifact.host_target() ==
               Artifact.target_of(List.to_string(:erlang.system_info(:system_architecture)))
    end
  end

  describe "select/4" do
    @checksums %{
      "libexla-v1.0.0-nif-2.16-x86_64-linux-gnu.so.tar.gz" => "sha256:aa",
      "libexla-v1.0.0-nif-2.17-aarch64-linux-gnu.so.tar.gz" => "sha256:bb",
      "native sources" => "sha256:cc"
    }

    test "picks the newest NIF version the VM loads" do
      name = "libexla-v1.0.0-nif-2.16-x86_64-linux-gnu.so.tar.gz"

      assert Artifact.select(@checksums, "1.0.0", "x86_64-linux-gnu", "2.16") ==
               {:ok, name, "sha256:aa"}

      assert Artifact.select(@checksums, "1.0.0", "x86_64-linux-gnu", "2.17") ==
               {:ok, name, "sha256:aa"}

      assert {:ok, "libexla-v1.0.0-nif-2.17-aarch64-linux-gnu.so.tar.gz", "sha256:bb"} =
               Artifact.select(@checksums, "1.0.0", "aarch64-linux-gnu", "2.17")
    end

    test "says what it has when nothing matches" do
      assert {:error, message} = Artifact.select(@checksums, "1.0.0", "aarch64-linux-gnu", "2.16")
      assert message =~ "no precompiled NIF for aarch64-linux-gnu (NIF 2.16) in checksum-exla.exs"
      assert message =~ "it lists: libexla-v1.0.0-nif-2.16-x86_64-linux-gnu.so.tar.gz, "
      refute message =~ "native sources"

      assert {:error, _} = Artifact.select(@checksums, "1.0.1", "x86_64-linux-gnu", "2.16")
      assert {:error, _} = Artifact.select(%{}, "1.0.0", "x86_64-linux-gnu", "2.16")
    end
  end

  test "archives hold libexla.so alone" do
    library = :crypto.strong_rand_bytes(4096)
    assert Artifact.unpack(Artifact.pack(library)) == {:ok, library}
    assert {:error, "not a .tar.gz archive" <> _} = Artifact.unpack("not an archive")
  end

  test "checksum files are written sorted and read back", %{tmp_dir: dir} do
    path = Artifact.checksum_path(dir)
    assert Artifact.read_checksums(path) == %{}
    checksums = %{"b.tar.gz" => Artifact.digest("b"), "a.tar.gz" => Artifact.digest("a")}
    Artifact.write_checksums!(path, checksums)
    assert Artifact.read_checksums(path) == checksums
    text = File.read!(path)
    assert :binary.match(text, "a.tar.gz") < :binary.match(text, "b.tar.gz")

    assert Artifact.digest("a") ==
             "sha256:ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"
  end

  test "the sources digest follows the native sources only", %{tmp_dir: dir} do
    File.mkdir_p!(Path.join(dir, "native/x/src"))
    File.write!(Path.join(dir, "Cargo.toml"), "[workspace]")
    File.write!(Path.join(dir, "native/x/src/lib.rs"), "fn a() {}")
    digest = Sources.digest(dir)
    assert Sources.files(dir) == ["Cargo.toml", "native/x/src/lib.rs"]

    File.write!(Path.join(dir, "README.md"), "not a source")
    assert Sources.digest(dir) == digest
    File.write!(Path.join(dir, "native/x/src/lib.rs"), "fn b() {}")
    refute Sources.digest(dir) == digest
  end

  test "starts the applications the download needs, or says which one is missing" do
    # ssl is not among the test project's applications: on Elixir 1.15 and
    # later Mix leaves it off the code path until the download puts it back.
    assert Artifact.start_app(:ssl) == :ok
    assert {:ssl, _, _} = List.keyfind(Application.started_applications(), :ssl, 0)

    assert {:error, :download, message} = Artifact.start_app(:no_such_otp_app)
    assert message =~ "has no no_such_otp_app application; install it"
    assert message =~ "apt-get install erlang-no_such_otp_app"
  end

  describe "fetch/4 from a server on the loopback interface" do
    setup %{tmp_dir: dir} do
      served = Path.join(dir, "served")
      File.mkdir_p!(served)
      archive = Artifact.pack("a library")
      File.write!(Path.join(served, "good.tar.gz"), archive)
      File.write!(Path.join(served, "tampered.tar.gz"), Artifact.pack("another library"))
      {url, stop} = EXLA.LoopbackHTTP.serve(served)
      on_exit(stop)
      %{url: url, digest: Artifact.digest(archive), cache: Path.join(dir, "cache"), stop: stop}
    end

    test "downloads, verifies and caches an archive",
         %{url: url, digest: digest, cache: cache} = c do
      assert {:ok, bytes} = Artifact.fetch("good.tar.gz", digest, url, cache)
      assert Artifact.digest(bytes) == digest
      assert File.read!(Path.join(cache, "good.tar.gz")) == bytes

      # The verified copy in the cache serves without network.
      c.stop.()
      assert {:ok, ^bytes} = Artifact.fetch("good.tar.gz", digest, url, cache)
    end

    test "refuses an archive of another digest and keeps nothing", %{url: url} = c do
      assert {:error, :checksum, actual} =
               Artifact.fetch("tampered.tar.gz", c.digest, url, c.cache)

      assert actual != c.digest
      refute File.exists?(Path.join(c.cache, "tampered.tar.gz"))

      # A cached copy that does not match is not used either.
      File.mkdir_p!(c.cache)
      File.write!(Path.join(c.cache, "tampered.tar.gz"), "changed on disk")

      assert {:error, :checksum, ^actual} =
               Artifact.fetch("tampered.tar.gz", c.digest, url, c.cache)
    end

    test "says what failed when the download does", %{url: url} = c do
      assert {:error, :download, message} =
               Artifact.fetch("missing.tar.gz", c.digest, url, c.cache)

      assert message =~ "#{url}/missing.tar.gz answered HTTP 404"

      c.stop.()
      assert {:error, :download, message} = Artifact.fetch("good.tar.gz", c.digest, url, c.cache)
      assert message =~ "#{url}/good.tar.gz could not be fetched: "
    end
  end

  describe "plan/1" do
    test "EXLA_BUILD and EXLA_NIF_FEATURES build from source" do
      with_envs([{"EXLA_BUILD", "true"}], fn ->
        assert {:cargo, [], "EXLA_BUILD is set"} = ExlaNative.plan(:prod)
        assert {:cargo, ["fault-injection"], _} = ExlaNative.plan(:test)
      end)

      with_envs([{"EXLA_NIF_FEATURES", "no-tracing"}], fn ->
        assert {:cargo, ["no-tracing"], "EXLA_NIF_FEATURES is set"} = ExlaNative.plan(:prod)
      end)
    end

    test "installs the archive of the host when the sources are those it was built from",
         %{tmp_dir: dir} do
      nif = List.to_string(:erlang.system_info(:nif_version))
      name = Artifact.name(Mix.Project.config()[:version], nif, Artifact.host_target())

      File.cd!(dir, fn ->
        # An empty checksum file, as in the repository: releases fill it in.
        Artifact.write_checksums!(Artifact.checksum_path(dir), %{})
        assert {:cargo, [], why} = ExlaNative.plan(:prod)
        assert why =~ "checksum-exla.exs lists no precompiled NIF"

        checksums = %{name => "sha256:aa", Artifact.sources_key() => Sources.digest(dir)}
        Artifact.write_checksums!(Artifact.checksum_path(dir), checksums)
        assert ExlaNative.plan(:prod) == {:precompiled, name, "sha256:aa"}

        with_envs([{"EXLA_NIF_TARGET", "riscv64-linux-gnu"}], fn ->
          assert {:cargo, [], why} = ExlaNative.plan(:prod)
          assert why =~ "no precompiled NIF for riscv64-linux-gnu"
        end)

        # The test environment builds its own NIF wherever cargo is found.
        if System.find_executable("cargo") do
          assert {:cargo, ["fault-injection"], _} = ExlaNative.plan(:test)
        else
          assert ExlaNative.plan(:test) == {:precompiled, name, "sha256:aa"}
        end

        File.mkdir_p!("native/x/src")
        File.write!("native/x/src/lib.rs", "// changed")
        assert {:cargo, [], why} = ExlaNative.plan(:prod)
        assert why =~ "the native sources differ from those the precompiled NIFs were built from"
      end)
    end
  end

  test "the default download location is the GitHub release of this version" do
    with_envs([{"EXLA_NIF_BASE_URL", nil}], fn ->
      version = Mix.Project.config()[:version]
      assert ExlaNative.base_url() =~ ~r"^https://github.com/.+/releases/download/v#{version}$"
    end)

    with_envs([{"EXLA_NIF_BASE_URL", "http://127.0.0.1:1/mirror"}], fn ->
      assert ExlaNative.base_url() == "http://127.0.0.1:1/mirror"
    end)
  end
end
