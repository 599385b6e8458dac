defmodule EXLA.CudaPluginLoadingTest do
  # What happens before a CUDA plugin runs, seen on a host without a GPU: a
  # fake pip layout (a virtual environment with `jax_plugins/xla_cuda13` and
  # NVIDIA packages under `nvidia/*/lib`) holds tiny shared libraries built
  # with cc under the real file names, and a fake driver `libcuda.so.1`
  # lies in a folder of its own. The fake plugin needs `libcublas.so.13`
  # (a DT_NEEDED entry, no RUNPATH), so it loads only when that library was
  # loaded first from its package; its GetPjrtApi returns no table, so
  # loading stops there with an error. Each case runs in a fresh VM, which
  # sees only the fake environment (PATH, VIRTUAL_ENV, user site) and whose
  # library path (LD_LIBRARY_PATH, read when a process starts) decides
  # whether the driver is found. Nothing here runs on a GPU.
  use ExUnit.Case, async: true

  alias EXLA.Platform

  @plugin "jax_plugins/xla_cuda13/xla_cuda_plugin.so"
  @site "lib/python3.12/site-packages"

  # /proc/self/maps shows what was loaded; cc builds the fake libraries (a
  # bundle run on a host without a compiler skips these tests).
  cond do
    :os.type() != {:unix, :linux} -> @moduletag skip: "needs Linux"
    System.find_executable("cc") == nil -> @moduletag skip: "needs cc"
    true -> :ok
  end

  setup_all do
    root = Path.join(System.tmp_dir!(), "exla-fake-cuda-#{System.unique_integer([:positive])}")
    on_exit(fn -> File.rm_rf!(root) end)
    build_layout!(System.find_executable("cc"), root)
    {:ok, root: root}
  end

  test "the NVIDIA libraries of the plugin's packages are loaded before it", %{root: root} do
    venv = Path.join(root, "complete")
    {result, loaded} = run_fresh(root, venv, Path.join(root, "driver"), load_cuda_client())

    # The plugin itself was loaded: its dependency was found.
    assert result =~ "GetPjrtApi returned no function table"
    assert Path.join([venv, @site, @plugin]) in loaded
    assert Path.join(root, "driver/libcuda.so.1") in loaded

    for {folder, file, _required?} <- Platform.cuda_libraries(13),
        File.exists?(package_library(venv, folder, file)) do
      assert package_library(venv, folder, file) in loaded
    end
  end

  @tag cpu_only:
         "stands for a host without NVIDIA's libraries; on a GPU host the loader finds " <>
           "them on the system's library path however the fake layout is arranged"
  test "without the preloading, the plugin does not load", %{root: root} do
    venv = Path.join(root, "complete")
    plugin = Path.join([venv, @site, @plugin])

    {result, _loaded} = run_fresh(root, venv, nil, "EXLA.NIF.plugin_load(#{inspect(plugin)})")

    assert result =~ "libcublas.so.13: cannot open shared object file"
  end

  @tag cpu_only:
         "stands for a host without NVIDIA's libraries; on a GPU host the loader finds " <>
           "them on the system's library path however the fake layout is arranged"
  test "missing NVIDIA libraries are named, with what to install", %{root: root} do
    venv = Path.join(root, "incomplete")
    {result, loaded} = run_fresh(root, venv, Path.join(root, "driver"), load_cuda_client())

    assert result =~ "EXLA cannot use the CUDA plugin #{Path.join([venv, @site, @plugin])}"
    assert result =~ "* libcudnn.so.9:"
    assert result =~ "* libcufft.so.12:"
    refute result =~ "* libcublas.so.13"
    # optional libraries may be missing
    refute result =~ "libnvshmem_host.so.3"
    assert result =~ ~s|pip install "jax[cuda13]"|
    refute Path.join([venv, @site, @plugin]) in loaded
  end

  # A host with an NVIDIA driver finds its libcuda.so.1 whatever the test does.
  @driver_dirs ~w(/usr/lib /usr/lib64 /lib /lib64 /usr/lib/x86_64-linux-gnu
                  /usr/lib/aarch64-linux-gnu /usr/lib/wsl/lib)
  if Enum.any?(@driver_dirs, &File.exists?(Path.join(&1, "libcuda.so.1"))),
    do: @tag(skip: "this host has an NVIDIA driver")

  test "a missing driver is named, with what to install", %{root: root} do
    venv = Path.join(root, "complete")
    {result, loaded} = run_fresh(root, venv, nil, load_cuda_client())

    assert result =~ "the NVIDIA driver's library libcuda.so.1 could not be loaded"
    assert result =~ "Install the NVIDIA driver (one that supports CUDA 13"
    refute Path.join([venv, @site, @plugin]) in loaded
  end

  test "a missing plugin says what to install", %{root: root} do
    {result, _loaded} = run_fresh(root, Path.join(root, "empty"), nil, load_cuda_client())
    assert result =~ "no PJRT plugin for :cuda was found"
    assert result =~ ~s|pip install "jax[cuda13]"|
    assert result =~ "EXLA_PJRT_PLUGIN_CUDA"
  end

  defp load_cuda_client do
    "Application.put_env(:exla, :clients, cuda: [platform: :cuda]) && EXLA.Client.fetch!(:cuda)"
  end

  # Runs `body` in a fresh VM that sees only the environment `venv` and
  # whose library path is `library_path`; returns what `body` returned or
  # raised, and the files under `root` that the process mapped.
  defp run_fresh(root, venv, library_path, body) do
    code = """
    System.put_env("PATH", #{inspect(Path.join(root, "no-python-bin"))})

    result =
      try do
        #{body}
        |> inspect()
      rescue
        e -> Exception.message(e)
      catch
        # a client that cannot be created exits the caller (EXLA.Client.fetch!/1)
        :exit, {{%_{__exception__: true} = e, _}, _} -> Exception.message(e)
      end

    loaded =
      for line <- String.split(File.read!("/proc/self/maps"), "\\n"),
          [_, _, _, _, _, path] <- [String.split(line)],
          String.starts_with?(path, #{inspect(root)}),
          uniq: true,
          do: path

    IO.puts(result <> "\\n--loaded--\\n" <> Enum.join(loaded, "\\n"))
    """

    env = [
      {"VIRTUAL_ENV", venv},
      {"CONDA_PREFIX", nil},
      {"PYTHONPATH", nil},
      {"PYTHONUSERBASE", Path.join(root, "userbase")},
      {"EXLA_PYTHON", "/nonexistent/python3"},
      {"EXLA_PJRT_PLUGIN_CUDA", nil},
      {"LD_LIBRARY_PATH", library_path}
    ]

    {output, 0} =
      EXLA.TestScript.run(code,
        env: env,
        stderr_to_stdout: true
      )

    [result, loaded] = String.split(output, "--loaded--\n")
    {result, String.split(loaded, "\n", trim: true)}
  end

  defp package_library(venv, folder, file),
    do: Path.join([venv, @site, "nvidia", folder, "lib", file])

  # complete/: the plugin and every CUDA 13 library but the optional
  # nvshmem; incomplete/: the same without cuDNN and cuFFT; empty/: an
  # environment without packages; driver/: libcuda.so.1.
  defp build_layout!(cc, root) do
    source = Path.join(root, "fake.c")
    File.mkdir_p!(root)
    File.write!(source, "int exla_fake_library(void) { return 1; }\n")

    for {folder, file, _} <- Platform.cuda_libraries(13), file != "libnvshmem_host.so.3" do
      shared_library!(cc, source, package_library(Path.join(root, "complete"), folder, file))

      unless file in ["libcudnn.so.9", "libcufft.so.12"] do
        File.mkdir_p!(Path.dirname(package_library(Path.join(root, "incomplete"), folder, file)))

        File.cp!(
          package_library(Path.join(root, "complete"), folder, file),
          package_library(Path.join(root, "incomplete"), folder, file)
        )
      end
    end

    shared_library!(cc, source, Path.join(root, "driver/libcuda.so.1"))
    File.mkdir_p!(Path.join([root, "empty", @site]))

    plugin_source = Path.join(root, "plugin.c")

    File.write!(plugin_source, """
    extern int exla_fake_library(void);
    int exla_fake_plugin_uses_cublas(void) { return exla_fake_library(); }
    void *GetPjrtApi(void) { return 0; }
    """)

    cublas = package_library(Path.join(root, "complete"), "cu13", "libcublas.so.13")

    for venv <- ["complete", "incomplete"] do
      shared_library!(cc, plugin_source, Path.join([root, venv, @site, @plugin]), [cublas])
    end
  end

  defp shared_library!(cc, source, path, needs \\ []) do
    File.mkdir_p!(Path.dirname(path))
    soname = Path.basename(path)
    args = ["-shared", "-fPIC", "-o", path, "-Wl,-soname," <> soname, source] ++ needs
    {output, status} = System.cmd(cc, args, stderr_to_stdout: true)
    if status != 0, do: raise("cc failed: #{output}")
  end
end
