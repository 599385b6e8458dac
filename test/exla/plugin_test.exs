defmodule EXLA.PluginTest do
  # Some tests set environment variables, so this module runs alone.
  use ExUnit.Case, async: false

  import EXLA.TestEnv, only: [with_env: 3]

  alias EXLA.Plugin

  doctest EXLA.Plugin

  @member "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"
  @wheels [
    "xla_cpu_pjrt-0.0.1-py3-none-manylinux_2_27_x86_64.whl",
    "xla_cpu_pjrt-0.0.1-py3-none-manylinux_2_27_aarch64.whl"
  ]

  defp sha256(data), do: :crypto.hash(:sha256, data) |> Base.encode16(case: :lower)

  defp fake_wheel(dir, files) do
    path = Path.join(dir, "fake.whl")
    entries = for {name, data} <- files, do: {String.to_charlist(name), data}
    {:ok, _} = :zip.create(String.to_charlist(path), entries)
    path
  end

  defp script(dir, name, body) do
    path = Path.join(dir, name)
    File.write!(path, "#!/bin/sh\n" <> body)
    File.chmod!(path, 0o755)
    path
  end

  defp leftovers(dir) do
    dir |> Path.join("**/.tmp-*") |> Path.wildcard(match_dot: true)
  end

  describe "find/2 and path!/2" do
    @describetag :tmp_dir

    test "use the :plugin option as is", %{tmp_dir: dir} do
      plugin = Path.join(dir, "my_plugin.so")
      File.write!(plugin, "not really a plugin")

      for platform <- Plugin.platforms() do
        assert Plugin.find(platform, plugin: plugin) == {:ok, plugin}
        assert Plugin.path!(platform, plugin: plugin, cache_dir: dir) == plugin
      end
    end

    test "raise when the :plugin option names a missing file", %{tmp_dir: dir} do
      missing = Path.join(dir, "missing.so")
      assert {:error, message} = Plugin.find(:cuda, plugin: missing)
      assert message =~ "#{inspect(missing)} given by the :plugin option does not exist"

      assert_raise RuntimeError, ~r/missing.so" given by the :plugin option/, fn ->
        Plugin.path!(:host, plugin: missing, cache_dir: dir)
      end
    end

    test "use EXLA_PJRT_PLUGIN_<PLATFORM>", %{tmp_dir: dir} do
      plugin = Path.join(dir, "cuda_plugin.so")
      File.write!(plugin, "")

      with_env("EXLA_PJRT_PLUGIN_CUDA", plugin, fn ->
        assert Plugin.find(:cuda) == {:ok, plugin}
        assert Plugin.available?(:cuda)
        # the :plugin option wins over the environment
        other = Path.join(dir, "other.so")
        File.write!(other, "")
        assert Plugin.find(:cuda, plugin: other) == {:ok, other}
      end)

      with_env("EXLA_PJRT_PLUGIN_TPU", Path.join(dir, "nope.so"), fn ->
        assert {:error, message} = Plugin.find(:tpu)
        assert message =~ "given by the environment variable EXLA_PJRT_PLUGIN_TPU does not exist"
      end)
    end

    test "reject unknown platforms and options" do
      assert_raise ArgumentError, ~r/unknown EXLA platform :gpu/, fn -> Plugin.find(:gpu) end

      assert_raise ArgumentError, ~r/unknown keys \[:bogus\]/, fn ->
        Plugin.find(:host, bogus: 1)
      end

      assert_raise ArgumentError, ~r/expected :plugin to be a path/, fn ->
        Plugin.find(:host, plugin: :nope)
      end
    end

    test "find the installed CPU plugin in the cache", %{tmp_dir: dir} do
      path = Plugin.cpu_plugin_path(cache_dir: dir)
      assert String.starts_with?(path, Path.join(dir, "plugins"))
      assert Path.basename(path) == "xla_cpu_pjrt.so"

      assert {:error, message} = Plugin.find(:host, cache_dir: dir)
      assert message =~ "not installed at #{path}"

      assert_raise RuntimeError, ~r/not installed/, fn ->
        Plugin.path!(:host, cache_dir: dir, install: false)
      end

      File.mkdir_p!(Path.dirname(path))
      File.write!(path, "installed")
      assert Plugin.find(:host, cache_dir: dir) == {:ok, path}
      # installed: nothing is run, not even python
      assert Plugin.path!(:host, cache_dir: dir, python: "/nonexistent/python3") == path
      assert Plugin.install!(cache_dir: dir, python: "/nonexistent/python3") == path
    end

    test "find the CUDA and ROCm plugins of installed Python packages", %{tmp_dir: dir} do
      site = Path.join(dir, "site/jax_plugins")

      for file <- ~w(xla_cuda12/xla_cuda_plugin.so xla_cuda13/xla_cuda_plugin.so
                     xla_rocm60/xla_rocm_plugin.so xla_cuda12/__init__.py) do
        File.mkdir_p!(Path.dirname(Path.join(site, file)))
        File.write!(Path.join(site, file), "")
      end

      libtpu = Path.join(dir, "site/libtpu")
      File.mkdir_p!(libtpu)
      File.write!(Path.join(libtpu, "libtpu.so"), "")

      python =
        script(dir, "python", """
        printf 'jax_plugins\\t#{site}\\n'
        printf 'libtpu\\t#{libtpu}\\n'
        """)

      assert Plugin.find(:cuda, python: python) ==
               {:ok, Path.join(site, "xla_cuda13/xla_cuda_plugin.so")}

      assert Plugin.find(:rocm, python: python) ==
               {:ok, Path.join(site, "xla_rocm60/xla_rocm_plugin.so")}

      with_env("TPU_LIBRARY_PATH", nil, fn ->
        assert Plugin.find(:tpu, python: python) == {:ok, Path.join(libtpu, "libtpu.so")}
      end)
    end

    test "explain how to get a missing GPU or TPU plugin", %{tmp_dir: dir} do
      python = script(dir, "python", "exit 0\n")

      assert {:error, message} = Plugin.find(:cuda, python: python)
      assert message =~ "no PJRT plugin for :cuda was found"
      assert message =~ "jax-cuda12-pjrt"
      assert message =~ "EXLA_PJRT_PLUGIN_CUDA"
      refute Plugin.available?(:cuda, python: python)

      # a failing or missing interpreter is the same as no package
      failing = script(dir, "failing", "exit 3\n")
      assert {:error, _} = Plugin.find(:rocm, python: failing)
      assert {:error, _} = Plugin.find(:rocm, python: "/nonexistent/python3")

      assert_raise RuntimeError, ~r/no PJRT plugin for :rocm/, fn ->
        Plugin.path!(:rocm, python: python)
      end
    end

    test "use TPU_LIBRARY_PATH for :tpu", %{tmp_dir: dir} do
      libtpu = Path.join(dir, "libtpu.so")
      File.write!(libtpu, "")

      with_env("TPU_LIBRARY_PATH", libtpu, fn ->
        assert Plugin.find(:tpu, python: "/nonexistent/python3") == {:ok, libtpu}
      end)
    end
  end

  describe "may_have_devices?/2" do
    test "is true for the host and for plugins that are given" do
      assert Plugin.may_have_devices?(:host)
      assert Plugin.may_have_devices?(:cuda, plugin: "/opt/cuda_plugin.so")

      with_env("EXLA_PJRT_PLUGIN_ROCM", "/opt/rocm_plugin.so", fn ->
        assert Plugin.may_have_devices?(:rocm)
      end)

      with_env("TPU_LIBRARY_PATH", "/opt/libtpu.so", fn ->
        assert Plugin.may_have_devices?(:tpu)
      end)
    end

    # On a Linux machine without GPUs or TPUs, nothing is looked for.
    test "is false on Linux without the platform's device files" do
      files = ~w(/dev/nvidiactl /dev/nvidia0 /dev/dxg /dev/kfd /dev/accel0 /dev/vfio/0)

      if :os.type() == {:unix, :linux} and not Enum.any?(files, &File.exists?/1) do
        for {platform, env} <- [cuda: "CUDA", rocm: "ROCM", tpu: "TPU"] do
          with_env("EXLA_PJRT_PLUGIN_" <> env, nil, fn ->
            with_env("TPU_LIBRARY_PATH", nil, fn -> refute Plugin.may_have_devices?(platform) end)
          end)
        end
      end
    end
  end

  describe "cache_dir/1" do
    @describetag :tmp_dir

    test "prefers the option, then EXLA_CACHE_DIR, then the user cache", %{tmp_dir: dir} do
      with_env("EXLA_CACHE_DIR", nil, fn ->
        assert Plugin.cache_dir() == List.to_string(:filename.basedir(:user_cache, ~c"exla"))
      end)

      with_env("EXLA_CACHE_DIR", dir, fn ->
        assert Plugin.cache_dir() == dir
        assert Plugin.cache_dir(cache_dir: "/elsewhere") == "/elsewhere"
        assert String.starts_with?(Plugin.cpu_plugin_path(), dir)
      end)
    end
  end

  describe "available?/2 for :host" do
    @describetag :tmp_dir

    test "is true when installed or installable", %{tmp_dir: dir} do
      python = script(dir, "python", "exit 0\n")
      refute Plugin.available?(:host, cache_dir: dir, python: "/nonexistent/python3")
      refute Plugin.available?(:host, cache_dir: dir, python: python, install: false)

      if supported_arch?() do
        assert Plugin.available?(:host, cache_dir: dir, python: python)
      end

      path = Plugin.cpu_plugin_path(cache_dir: dir)
      File.mkdir_p!(Path.dirname(path))
      File.write!(path, "")
      assert Plugin.available?(:host, cache_dir: dir, python: "/nonexistent/python3")
    end
  end

  describe "sha256_file/1" do
    @describetag :tmp_dir

    test "hashes in chunks", %{tmp_dir: dir} do
      data = :binary.copy(<<1, 2, 3, 4, 5, 6, 7>>, 400_000)
      path = Path.join(dir, "data")
      File.write!(path, data)
      assert Plugin.sha256_file(path) == sha256(data)

      File.write!(path, "")
      assert Plugin.sha256_file(path) == sha256("")
    end
  end

  describe "install_wheel!/4" do
    @describetag :tmp_dir

    setup %{tmp_dir: dir} do
      library = :crypto.strong_rand_bytes(3_000_000)
      wheel = fake_wheel(dir, [{"other/file.txt", "x"}, {@member, library}])
      dest = Path.join([dir, "cache", "plugins", "cpu", "xla_cpu_pjrt.so"])
      %{library: library, wheel: wheel, dest: dest}
    end

    test "verifies and installs the library", %{wheel: wheel, dest: dest, library: library} do
      wheel_sha = Plugin.sha256_file(wheel)
      assert Plugin.install_wheel!(wheel, dest, wheel_sha, sha256(library)) == dest
      assert File.read!(dest) == library
      assert File.stat!(dest).mode |> Bitwise.band(0o777) == 0o755
      # only the library was extracted, and the temporary directory is gone
      assert File.ls!(Path.dirname(dest)) == ["xla_cpu_pjrt.so"]
      assert leftovers(Path.dirname(Path.dirname(dest))) == []

      # without a pinned library hash (aarch64)
      File.rm!(dest)
      assert Plugin.install_wheel!(wheel, dest, String.upcase(wheel_sha), nil) == dest
      assert File.read!(dest) == library
    end

    test "refuses a wheel with another hash", %{wheel: wheel, dest: dest, library: library} do
      bad = String.duplicate("0", 64)

      assert_raise RuntimeError, ~r/has sha256 [0-9a-f]{64} but 0{64} was expected/, fn ->
        Plugin.install_wheel!(wheel, dest, bad, sha256(library))
      end

      refute File.exists?(dest)
    end

    test "refuses a library with another hash", %{wheel: wheel, dest: dest} do
      bad = String.duplicate("a", 64)

      assert_raise RuntimeError, ~r/xla_cpu_pjrt.so has sha256 .* but a{64} was expected/, fn ->
        Plugin.install_wheel!(wheel, dest, Plugin.sha256_file(wheel), bad)
      end

      refute File.exists?(dest)
      assert leftovers(Path.dirname(Path.dirname(dest))) == []
    end

    test "refuses a wheel without the library", %{tmp_dir: dir, dest: dest} do
      wheel = fake_wheel(dir, [{"xla_plugins/readme.txt", "nothing here"}])

      assert_raise RuntimeError, ~r/does not contain #{@member}/, fn ->
        Plugin.install_wheel!(wheel, dest, Plugin.sha256_file(wheel), nil)
      end

      refute File.exists?(dest)
    end

    test "refuses a file that is not a zip", %{tmp_dir: dir, dest: dest} do
      wheel = Path.join(dir, "broken.whl")
      File.write!(wheel, "not a zip")

      assert_raise RuntimeError, ~r/could not read .*broken.whl/, fn ->
        Plugin.install_wheel!(wheel, dest, Plugin.sha256_file(wheel), nil)
      end
    end

    test "is safe when run concurrently", %{wheel: wheel, dest: dest, library: library} do
      wheel_sha = Plugin.sha256_file(wheel)

      results =
        1..6
        |> Task.async_stream(fn _ -> Plugin.install_wheel!(wheel, dest, wheel_sha, nil) end,
          timeout: 60_000
        )
        |> Enum.to_list()

      assert Enum.all?(results, &(&1 == {:ok, dest}))
      assert File.read!(dest) == library
      assert leftovers(Path.dirname(Path.dirname(dest))) == []
    end
  end

  describe "install!/1" do
    @describetag :tmp_dir

    test "explains what to do when python3 is missing", %{tmp_dir: dir} do
      if supported_arch?() do
        error =
          assert_raise RuntimeError, fn ->
            Plugin.install!(cache_dir: dir, python: "/nonexistent/python3")
          end

        message = Exception.message(error)
        assert message =~ "the Python interpreter /nonexistent/python3 was not found"
        assert_instructions(message)
      end
    end

    test "explains what to do when pip fails", %{tmp_dir: dir} do
      if supported_arch?() do
        python =
          script(dir, "python", """
          echo "/usr/bin/python3: No module named pip" >&2
          exit 1
          """)

        error =
          assert_raise RuntimeError, fn -> Plugin.install!(cache_dir: dir, python: python) end

        message = Exception.message(error)
        assert message =~ "failed with exit status 1"
        assert message =~ "No module named pip"
        assert_instructions(message)
        refute File.exists?(Plugin.cpu_plugin_path(cache_dir: dir))
        assert leftovers(dir) == []
      end
    end

    test "passes pinned hashes to pip and checks the download again", %{tmp_dir: dir} do
      if supported_arch?() do
        fake = fake_wheel(dir, [{@member, "a fake library"}])
        args_file = Path.join(dir, "args")

        python =
          script(dir, "python", """
          echo "$@" > #{args_file}
          while [ $# -gt 0 ]; do
            case "$1" in
              -r) cat "$2" >> #{args_file} ;;
              -d) out="$2" ;;
            esac
            shift
          done
          mkdir -p "$out"
          for wheel in #{Enum.join(@wheels, " ")}; do cp #{fake} "$out/$wheel"; done
          """)

        error =
          assert_raise RuntimeError, fn -> Plugin.install!(cache_dir: dir, python: python) end

        assert Exception.message(error) =~
                 ~r/has sha256 [0-9a-f]{64} but [0-9a-f]{64} was expected/

        args = File.read!(args_file)

        assert args =~
                 "-m pip download --no-deps --only-binary=:all: --require-hashes"

        assert args =~ "xla-cpu-pjrt==0.0.1"

        assert args =~
                 "--hash=sha256:55837b6b7b47daa717f2d9a5a03563ea0ceaa338d06a81a1e2d3f060d960decc"

        assert args =~
                 "--hash=sha256:8f613be6e891858f40d64f9799319502fff42689661944fc18a6ffd8210b30c9"

        refute File.exists?(Plugin.cpu_plugin_path(cache_dir: dir))
        assert leftovers(dir) == []
      end
    end

    test "explains what to do when the cache is not writable", %{tmp_dir: dir} do
      if supported_arch?() do
        python = script(dir, "python", "exit 0\n")
        # a file where the cache directory should be
        cache = Path.join(dir, "cache")
        File.write!(cache, "")

        error =
          assert_raise RuntimeError, fn -> Plugin.install!(cache_dir: cache, python: python) end

        assert Exception.message(error) =~ "Set EXLA_CACHE_DIR to a directory you can write to"
        assert_instructions(Exception.message(error))
      end
    end

    test "install_from_wheel!/2 checks the pinned hash", %{tmp_dir: dir} do
      if supported_arch?() do
        fake = fake_wheel(dir, [{@member, "a fake library"}])

        assert_raise RuntimeError, ~r/EXLA refuses to use it/, fn ->
          Plugin.install_from_wheel!(fake, cache_dir: dir)
        end

        refute File.exists?(Plugin.cpu_plugin_path(cache_dir: dir))
      end
    end

    # Downloads 60 MB: run with EXLA_TEST_DOWNLOAD=1.
    if System.get_env("EXLA_TEST_DOWNLOAD") in ["1", "true"] do
      @tag timeout: 300_000
      test "downloads and installs the real plugin", %{tmp_dir: dir} do
        path = Plugin.install!(cache_dir: dir)
        assert path == Plugin.cpu_plugin_path(cache_dir: dir)
        assert File.stat!(path).size > 100_000_000

        if arch() == "x86_64" do
          assert Plugin.sha256_file(path) ==
                   "88c3f28c5900f48ad4a82cab9e79bba9537809743395e341485f8794268820dc"
        end

        assert Plugin.path!(:host, cache_dir: dir) == path
        assert leftovers(dir) == []
      end
    end
  end

  defp assert_instructions(message) do
    assert message =~ "xla-cpu-pjrt==0.0.1"
    assert message =~ "python3-pip"
    assert message =~ ~s|host: [platform: :host, plugin: "/path/to/xla_cpu_pjrt.so"]|
    assert message =~ "EXLA_PJRT_PLUGIN_HOST"
  end

  defp arch do
    :erlang.system_info(:system_architecture) |> List.to_string() |> String.split("-") |> hd()
  end

  defp supported_arch? do
    :os.type() == {:unix, :linux} and arch() in ["x86_64", "aarch64"]
  end
end
