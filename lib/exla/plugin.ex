defmodule EXLA.Plugin do
  @moduledoc """
  Finds, and for the CPU installs, the PJRT plugins that EXLA runs on.

  A PJRT plugin is a shared library (`.so`) that implements XLA's PJRT C API
  for one kind of device. Each `EXLA.Client` loads the plugin of its platform.

  ## Where a plugin comes from

  A client of the `:pjrt_plugin` platform (any other PJRT plugin, see
  `EXLA.Client`) uses the library its `:plugin_path` option names, and
  nothing else. For a client of another platform, the first of these that
  applies wins:

    1. the client's `:plugin` option, a path to the library (see `EXLA.Client`);

    2. for `:host` clients, the client's `:cpu_plugin` option, the name of
       one of the CPU plugins EXLA knows (see "CPU plugins" below);

    3. the environment variable `EXLA_PJRT_PLUGIN_<PLATFORM>`, for example
       `EXLA_PJRT_PLUGIN_HOST=/opt/xla/xla_cpu_pjrt.so` or
       `EXLA_PJRT_PLUGIN_CUDA=/opt/xla/xla_cuda_plugin.so`;

    4. the platform's default:

       * `:host` - the CPU plugin named by the application setting
         `config :exla, :cpu_plugin, name`, else `#{EXLA.Plugin.Install.default_cpu_plugin()}`,
         kept in EXLA's cache directory (see `cache_dir/1`). EXLA installs
         it there by itself the first time it is needed (a download of
         about 60 MB, done once per machine, user and plugin);

       * `:cuda` - the plugin of the Python package `jax-cuda13-pjrt` or
         `jax-cuda12-pjrt` (`jax_plugins/xla_cuda13/xla_cuda_plugin.so`,
         the newest CUDA version first) in a Python environment EXLA sees
         (see below). EXLA never installs CUDA by itself: run
         `pip install "jax[cuda13]"`, which brings the plugin and the
         NVIDIA libraries it needs (or `jax[cuda12]` for a driver that
         supports CUDA 12 only);

       * `:rocm` - the plugin of a `jax-rocm*-pjrt` package
         (`jax_plugins/xla_rocm*/xla_rocm_plugin.so`), when installed;

       * `:tpu` - the file named by `TPU_LIBRARY_PATH`, or `libtpu.so` from
         the Python package `libtpu`, when installed.

  The Python environments EXLA sees, without starting Python, are those of
  `PYTHONPATH`, of the active virtual or conda environment (`VIRTUAL_ENV`,
  `CONDA_PREFIX`), of every Python on the `PATH` (its `lib/python3.*`
  `site-packages` or `dist-packages` folders, and `/usr/local`'s for
  `/usr/bin`), and the user's (`PYTHONUSERBASE`, else `~/.local`). When
  none has the plugin, the interpreter named by `EXLA_PYTHON` (default:
  `python3` on the `PATH`) is asked where its packages are, once per VM.

  ## CPU plugins

  EXLA knows these CPU plugins, each a Python package on PyPI that EXLA
  installs by its pinned version and hashes (`cpu_plugins/0` lists them):

  | name | version | XLA | architectures |
  | --- | --- | --- | --- |
  | `xla-cpu-pjrt` (the default) | 0.0.1 | November 2025, by the OpenXLA authors | x86_64, aarch64 |
  | `lammps-jax-pjrt-cpu` | 0.11.2 | JAX 0.11.2's | x86_64 |
  | `fastatomstruct-xla-cpu` | 2026.6.23 | June 2026, zml's build | x86_64 |

  They compute the same results to rounding; their speed differs by
  workload (the README has a table and `bench/PERFORMANCE.md` the
  measurements). Name one for a client, or for all `:host` clients:

      config :exla, :clients,
        host: [platform: :host, cpu_plugin: "lammps-jax-pjrt-cpu"]

      config :exla, :cpu_plugin, "lammps-jax-pjrt-cpu"

  An unknown name raises `ArgumentError`, and a plugin with no wheel for
  this machine's architecture raises when its client is created; both
  messages list the plugins EXLA knows.

  ## CUDA libraries

  A CUDA plugin needs the NVIDIA driver (`libcuda.so.1`) and NVIDIA's
  libraries (cuBLAS, cuDNN, cuFFT, cuSOLVER, cuSPARSE, the CUDA runtime,
  ...). As JAX does, EXLA loads those libraries before the plugin: from the
  NVIDIA Python packages (`nvidia/*/lib` in a site-packages folder, the
  plugin's own first), else by name from the system's library path. No
  environment variable needs to be set. When the driver or a library is
  missing, creating the client raises an error that names it and says what
  to install.

  ## Installing the CPU plugin

  A CPU plugin is installed with pip's ordinary client, so it honours the
  package index, proxy and certificates that pip is configured with:

      python3 -m pip download --no-deps --only-binary=:all: --require-hashes ...

  The wheel is pinned by its sha256 (pip checks it, and EXLA checks it again),
  only the library is extracted from it, and it is renamed into place
  atomically, so several programs may install it at the same time.

  Where this is not possible (no `python3` or pip, or no network), download
  the wheel (for the default, `xla-cpu-pjrt==0.0.1`) yourself and either
  install it with `install_from_wheel!/2`, or extract its library (for
  the default, `xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so`) from it and
  configure its path:

      config :exla, :clients,
        host: [platform: :host, plugin: "/path/to/xla_cpu_pjrt.so"]

  ## Environment variables

    * `EXLA_CACHE_DIR` - where the CPU plugins are installed. Defaults to
      the user cache directory, `:filename.basedir(:user_cache, "exla")`
      (usually `~/.cache/exla`)

    * `EXLA_PJRT_PLUGIN_HOST`, `EXLA_PJRT_PLUGIN_CUDA`, `EXLA_PJRT_PLUGIN_ROCM`,
      `EXLA_PJRT_PLUGIN_TPU` - the plugin library to use for that platform

    * `EXLA_PYTHON` - the Python interpreter used to install the CPU plugin
      and to look for installed plugin packages. Defaults to `python3`

    * `EXLA_DOWNLOAD_TIMEOUT` - how many seconds (a positive integer) the
      CPU plugin's download waits for a network that does not answer before
      it gives up (it tries twice); another value raises `ArgumentError`.
      Defaults to 30

    * `TPU_LIBRARY_PATH` - the TPU plugin (`libtpu.so`), as JAX reads it

    * `TF_CPP_MIN_LOG_LEVEL`, `TF_CPP_MAX_VLOG_LEVEL`, `TF_CPP_VMODULE` -
      the levels of the lines a plugin logs to stderr itself (see "Plugin
      logs" in `EXLA.NativeLog`)

  A variable set to the empty string counts as unset.

  ## Options

  The functions of this module accept:

    * `:plugin` - a path to the plugin library; when given, it is used as is
      (it must exist)

    * `:cpu_plugin` - for `:host`, the name of the CPU plugin to find or
      install (see "CPU plugins"), overriding `EXLA_PJRT_PLUGIN_HOST` and
      the `:cpu_plugin` application setting. It cannot be given with
      `:plugin`

    * `:cache_dir` - overrides `EXLA_CACHE_DIR` and the default cache directory

    * `:python` - the Python interpreter to use, overriding `EXLA_PYTHON`

    * `:install` - whether `path!/2` may install the CPU plugin when it is
      missing. Defaults to `true`
  """

  alias EXLA.Platform
  alias EXLA.Plugin.{Install, PythonEnv}

  @option_keys [:plugin, :cpu_plugin, :cache_dir, :python, install: true]

  @typedoc "A platform EXLA knows how to find a plugin for."
  @type platform :: :host | :cuda | :rocm | :tpu | :pjrt_plugin

  @doc """
  Lists the platforms this module finds plugins for.

      iex> EXLA.Plugin.platforms()
      [:host, :cuda, :rocm, :tpu, :pjrt_plugin]

  """
  @spec platforms() :: [platform()]
  def platforms, do: Platform.all()

  @doc """
  Lists the names of the CPU plugins EXLA knows, the default first.

      iex> EXLA.Plugin.cpu_plugins()
      ["xla-cpu-pjrt", "lammps-jax-pjrt-cpu", "fastatomstruct-xla-cpu"]

  """
  @spec cpu_plugins() :: [String.t()]
  def cpu_plugins, do: Install.cpu_plugins()

  @doc """
  Returns the path of the plugin library for `platform`, or raises.

  For `:host`, the CPU plugin is installed into the cache directory when it
  is missing (unless `install: false` is given). See the module
  documentation for the search order and the options.
  """
  @spec path!(platform(), keyword()) :: Path.t()
  def path!(platform, opts \\ []) do
    opts = validate!(platform, opts)
    installs = installs?(platform, opts)

    case locate(platform, opts) do
      {:ok, path} -> path
      {:error, _} when installs -> Install.install!(cpu_pin(opts), opts)
      {:error, message} -> raise RuntimeError, message
    end
  end

  @doc """
  Looks for the plugin library of `platform` without installing anything.

  Returns `{:ok, path}` or `{:error, message}`, where the message says what
  was looked for and how to provide the plugin.
  """
  @spec find(platform(), keyword()) :: {:ok, Path.t()} | {:error, String.t()}
  def find(platform, opts \\ []) do
    locate(platform, validate!(platform, opts))
  end

  @doc """
  Returns whether a plugin for `platform` is there or, for `:host`, can be
  installed (the machine's architecture has a wheel and a Python
  interpreter is found).

  This does not check that the plugin finds a device: a CUDA plugin may be
  installed on a machine without a GPU.
  """
  @spec available?(platform(), keyword()) :: boolean()
  def available?(platform, opts \\ []) do
    opts = validate!(platform, opts)

    case locate(platform, opts) do
      {:ok, _} -> true
      {:error, _} -> installs?(platform, opts) and installable?(opts)
    end
  end

  @doc false
  # Whether looking for `platform`'s plugin can find one that finds
  # devices: true when the plugin is given (by an option or the
  # environment), on systems other than Linux, and on Linux when the
  # platform's driver created its device files (`EXLA.Platform`). Looking
  # without a given plugin may mean asking Python, a start-up of 100 to
  # 400 ms that a machine without the hardware need not pay.
  @spec may_have_devices?(platform(), keyword()) :: boolean()
  def may_have_devices?(platform, opts \\ []) do
    opts = validate!(platform, opts)

    cond do
      platform == :host -> true
      given(platform, opts) != nil -> true
      platform == :tpu and EXLA.Env.get("TPU_LIBRARY_PATH") != nil -> true
      :os.type() != {:unix, :linux} -> true
      true -> Enum.any?(Platform.device_files(platform), &(Path.wildcard(&1) != []))
    end
  end

  @doc """
  Returns the directory where EXLA keeps the plugins it installs.

  It is the `:cache_dir` option, else the environment variable
  `EXLA_CACHE_DIR`, else `:filename.basedir(:user_cache, "exla")`.
  """
  @spec cache_dir(keyword()) :: Path.t()
  def cache_dir(opts \\ []), do: Install.cache_dir(opts)

  @doc """
  Returns where the CPU plugin is (or would be) installed in the cache
  directory: the one named by the `:cpu_plugin` option, else by the
  `:cpu_plugin` application setting, else the default.
  """
  @spec cpu_plugin_path(keyword()) :: Path.t()
  def cpu_plugin_path(opts \\ []) do
    opts = validate!(:host, opts)
    Install.cpu_plugin_path(cpu_pin(opts), opts)
  end

  @doc """
  Installs a CPU plugin into the cache directory, unless it is already
  there, and returns its path: the one named by the `:cpu_plugin` option,
  else by the `:cpu_plugin` application setting, else the default
  (`#{Install.default_cpu_plugin()}` #{Install.cpu_version()}).

  It downloads the wheel with `python3 -m pip download`, checks its sha256,
  extracts the library, checks its sha256 and renames it into place. It
  raises with instructions when that is not possible.
  """
  @spec install!(keyword()) :: Path.t()
  def install!(opts \\ []) do
    opts = validate!(:host, opts)
    Install.install!(cpu_pin(opts), opts)
  end

  @doc """
  Installs a CPU plugin from a wheel file that you downloaded yourself,
  and returns the installed path. The plugin is chosen as in `install!/1`.

  The file's sha256 must be the pinned one of that plugin for this
  machine's architecture. Accepts the `:cpu_plugin` and `:cache_dir`
  options.
  """
  @spec install_from_wheel!(Path.t(), keyword()) :: Path.t()
  def install_from_wheel!(wheel_path, opts \\ []) do
    opts = validate!(:host, opts)
    Install.install_from_wheel!(cpu_pin(opts), wheel_path, opts)
  end

  @doc false
  # Loads the plugin of `platform` at `path` (as `path!/2` returns it) and
  # returns the NIF's handle, or raises. A CUDA plugin's driver and NVIDIA
  # libraries are loaded first, once per plugin and VM (see "CUDA
  # libraries" above).
  @spec load!(platform(), Path.t(), keyword()) :: reference()
  def load!(platform, path, opts \\ []) do
    opts = validate!(platform, opts)
    if platform == :cuda, do: prepare_cuda!(path, opts)
    # The plugin reads its log levels once, as it is loaded.
    EXLA.NativeLog.prepare_plugin_env()
    path |> EXLA.NIF.plugin_load() |> EXLA.NIF.unwrap!()
  end

  defp prepare_cuda!(path, opts) do
    EXLA.Memo.get({__MODULE__, :prepared, path}, fn ->
      more = fn -> PythonEnv.asked_site_dirs(Install.python(opts)) end
      EXLA.Plugin.Cuda.prepare!(path, PythonEnv.site_dirs(), more)
    end)
  end

  @doc """
  Computes the sha256 of a file, reading it in chunks, as lowercase hex.
  """
  @spec sha256_file(Path.t()) :: String.t()
  defdelegate sha256_file(path), to: Install

  @doc """
  The sha256 (lowercase hex) of the plugin file at `path`: the identity of
  a plugin in serialized and cached executables.

  Hashing a plugin reads all of it (the CPU plugin is 259 MB), so the
  answer is remembered in the cache directory, per file and for as long as
  the file is unchanged (same inode, size, modification and change times,
  and same first and last 64 KiB), and in memory for the life of the VM.
  """
  @spec fingerprint(Path.t()) :: String.t()
  defdelegate fingerprint(path), to: EXLA.Plugin.Fingerprint, as: :get

  ## Locating

  defp validate!(platform, opts) do
    if platform not in Platform.all() do
      raise ArgumentError,
            "unknown EXLA platform #{inspect(platform)}, expected one of #{inspect(Platform.all())}"
    end

    opts = Keyword.validate!(opts, @option_keys)

    case opts[:plugin] do
      nil -> :ok
      path when is_binary(path) -> :ok
      other -> raise ArgumentError, "expected :plugin to be a path, got: #{inspect(other)}"
    end

    cond do
      opts[:cpu_plugin] == nil ->
        :ok

      platform != :host ->
        raise ArgumentError,
              "the :cpu_plugin option is only for the :host platform, got: #{inspect(platform)}"

      opts[:plugin] != nil ->
        raise ArgumentError, "give either a :plugin path or a :cpu_plugin name, not both"

      true ->
        check_cpu_plugin!(opts[:cpu_plugin], ":cpu_plugin option")
    end

    opts
  end

  @doc false
  # Raises ArgumentError unless `name` is a CPU plugin EXLA knows.
  def check_cpu_plugin!(name, source) do
    with {:error, message} <- Install.check_name(name) do
      raise ArgumentError, "invalid #{source}: " <> message
    end
  end

  # The pin of the CPU plugin that is named (by the option, else the
  # application setting) or the default.
  defp cpu_pin(opts) do
    name =
      opts[:cpu_plugin] ||
        case Application.fetch_env(:exla, :cpu_plugin) do
          {:ok, nil} -> Install.default_cpu_plugin()
          {:ok, name} -> tap(name, &check_cpu_plugin!(&1, "config :exla, :cpu_plugin"))
          :error -> Install.default_cpu_plugin()
        end

    Install.pin(name)
  end

  # Installable here: a wheel for this machine and a Python. A plugin that
  # was named but has no wheel for this machine is a configuration that
  # cannot work, so it raises rather than leave the CPU unsupported.
  defp installable?(opts) do
    pin = cpu_pin(opts)
    named? = pin.name != Install.default_cpu_plugin()

    case Install.cpu_wheel(pin, Install.arch()) do
      {:error, message} when named? -> raise RuntimeError, message
      {:error, _} -> false
      {:ok, _} -> Install.installable?(pin, opts)
    end
  end

  defp locate(platform, opts) do
    case given(platform, opts) do
      {path, source} -> existing(path, source)
      nil -> default(platform, opts)
    end
  end

  # Only a CPU plugin EXLA knows is installed, never one given by a path.
  defp installs?(platform, opts) do
    platform == :host and opts[:install] == true and given(platform, opts) == nil
  end

  # A plugin given by a path: the client's option (:plugin, or :plugin_path
  # for :pjrt_plugin, given here as :plugin), else the environment unless
  # the :cpu_plugin option names one.
  defp given(platform, opts) do
    env = Platform.env_var(platform)

    cond do
      path = opts[:plugin] -> {path, "the #{inspect(Platform.plugin_option(platform))} option"}
      opts[:cpu_plugin] -> nil
      path = env && EXLA.Env.get(env) -> {path, "the environment variable #{env}"}
      true -> nil
    end
  end

  defp existing(path, source) do
    if File.regular?(path) do
      {:ok, Path.expand(path)}
    else
      {:error, "the PJRT plugin #{inspect(path)} given by #{source} does not exist"}
    end
  end

  defp default(:host, opts) do
    pin = cpu_pin(opts)
    path = Install.cpu_plugin_path(pin, opts)

    if File.regular?(path) do
      {:ok, path}
    else
      {:error,
       "the CPU plugin #{pin.name} is not installed at #{path}. " <>
         "Call EXLA.Plugin.install!/1, or set #{Platform.env_var(:host)} or the client's " <>
         ":plugin option"}
    end
  end

  defp default(:pjrt_plugin, _opts) do
    {:error, "a client of the :pjrt_plugin platform needs the path of its plugin as :plugin_path"}
  end

  defp default(:tpu, opts) do
    case EXLA.Env.get("TPU_LIBRARY_PATH") do
      nil -> python_plugin(:tpu, opts)
      path -> existing(path, "the environment variable TPU_LIBRARY_PATH")
    end
  end

  defp default(platform, opts), do: python_plugin(platform, opts)

  # The newest plugin of the environments seen without Python, else of
  # those the interpreter reports.
  defp python_plugin(platform, opts) do
    scanned = PythonEnv.site_dirs()

    with [] <- plugins_in(platform, scanned),
         asked = PythonEnv.asked_site_dirs(Install.python(opts)),
         [] <- plugins_in(platform, asked) do
      {:error,
       "no PJRT plugin for #{inspect(platform)} was found in the Python environments " <>
         "EXLA sees (#{seen(scanned ++ asked)}; see EXLA.Plugin). Install " <>
         "#{Platform.install_hint(platform)}, or set " <>
         "#{Platform.env_var(platform)}=/path/to/plugin.so, or give the client a :plugin option"}
    else
      [path | _] -> {:ok, path}
    end
  end

  defp plugins_in(platform, site_dirs) do
    site_dirs
    |> Enum.flat_map(&Path.wildcard(Path.join(&1, Platform.plugin_glob(platform))))
    |> Enum.filter(&File.regular?/1)
    # Stable: among plugins of one version, the first environment's wins.
    |> Enum.sort_by(&Platform.plugin_rank/1, :desc)
  end

  defp seen([]), do: "none were found"
  defp seen(site_dirs), do: "looked in " <> Enum.join(Enum.uniq(site_dirs), ", ")
end
