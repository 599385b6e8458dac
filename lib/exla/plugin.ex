defmodule EXLA.Plugin do
  @moduledoc """
  Finds, and for the CPU installs, the PJRT plugins that EXLA runs on.

  A PJRT plugin is a shared library (`.so`) that implements XLA's PJRT C API
  for one kind of device. Each `EXLA.Client` loads the plugin of its platform.

  ## Where a plugin comes from

  For a client of a given platform, the first of these that applies wins:

    1. the client's `:plugin` option, a path to the library (see `EXLA.Client`);

    2. the environment variable `EXLA_PJRT_PLUGIN_<PLATFORM>`, for example
       `EXLA_PJRT_PLUGIN_HOST=/opt/xla/xla_cpu_pjrt.so` or
       `EXLA_PJRT_PLUGIN_CUDA=/opt/xla/xla_cuda_plugin.so`;

    3. the platform's default:

       * `:host` - the CPU plugin from the Python package `xla-cpu-pjrt`
         0.0.1, kept in EXLA's cache directory (see `cache_dir/1`).
         EXLA installs it there by itself the first time it is needed
         (a download of about 60 MB, done once per machine and user);

       * `:cuda` - the plugin of the Python package `jax-cuda12-pjrt`
         (`jax_plugins/xla_cuda12/xla_cuda_plugin.so`), when it is installed
         for `python3`. EXLA never installs CUDA by itself: run
         `pip install jax-cuda12-pjrt` (and have the CUDA libraries it needs);

       * `:rocm` - the plugin of a `jax-rocm*-pjrt` package
         (`jax_plugins/xla_rocm*/xla_rocm_plugin.so`), when installed;

       * `:tpu` - the file named by `TPU_LIBRARY_PATH`, or `libtpu.so` from
         the Python package `libtpu`, when installed.

  Python packages are looked up with the interpreter named by
  `EXLA_PYTHON` (default: `python3` on the `PATH`), so a virtual
  environment's interpreter can be used. Where the packages are is asked
  once per VM.

  ## Installing the CPU plugin

  The CPU plugin is installed with pip's ordinary client, so it honours the
  package index, proxy and certificates that pip is configured with:

      python3 -m pip download --no-deps --only-binary=:all: --require-hashes ...

  The wheel is pinned by its sha256 (pip checks it, and EXLA checks it again),
  only the library is extracted from it, and it is renamed into place
  atomically, so several programs may install it at the same time.

  Where this is not possible (no `python3` or pip, or no network), download
  the wheel `xla-cpu-pjrt==0.0.1` yourself and either install it with
  `install_from_wheel!/2`, or extract `xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so`
  from it and configure its path:

      config :exla, :clients,
        host: [platform: :host, plugin: "/path/to/xla_cpu_pjrt.so"]

  ## Environment variables

    * `EXLA_CACHE_DIR` - where the CPU plugin is installed. Defaults to
      the user cache directory, `:filename.basedir(:user_cache, "exla")`
      (usually `~/.cache/exla`)

    * `EXLA_PJRT_PLUGIN_HOST`, `EXLA_PJRT_PLUGIN_CUDA`, `EXLA_PJRT_PLUGIN_ROCM`,
      `EXLA_PJRT_PLUGIN_TPU` - the plugin library to use for that platform

    * `EXLA_PYTHON` - the Python interpreter used to install the CPU plugin
      and to look for installed plugin packages. Defaults to `python3`

    * `TPU_LIBRARY_PATH` - the TPU plugin (`libtpu.so`), as JAX reads it

  ## Options

  The functions of this module accept:

    * `:plugin` - a path to the plugin library; when given, it is used as is
      (it must exist)

    * `:cache_dir` - overrides `EXLA_CACHE_DIR` and the default cache directory

    * `:python` - the Python interpreter to use, overriding `EXLA_PYTHON`

    * `:install` - whether `path!/2` may install the CPU plugin when it is
      missing. Defaults to `true`
  """

  require Logger

  @platforms [:host, :cuda, :rocm, :tpu]

  @cpu_package "xla-cpu-pjrt"
  @cpu_version "0.0.1"
  @cpu_member "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"
  @cpu_library "xla_cpu_pjrt.so"

  # arch => {wheel file, wheel sha256, library sha256 (nil when not pinned)}
  @cpu_wheels %{
    "x86_64" =>
      {"xla_cpu_pjrt-0.0.1-py3-none-manylinux_2_27_x86_64.whl",
       "55837b6b7b47daa717f2d9a5a03563ea0ceaa338d06a81a1e2d3f060d960decc",
       "88c3f28c5900f48ad4a82cab9e79bba9537809743395e341485f8794268820dc"},
    "aarch64" =>
      {"xla_cpu_pjrt-0.0.1-py3-none-manylinux_2_27_aarch64.whl",
       "8f613be6e891858f40d64f9799319502fff42689661944fc18a6ffd8210b30c9", nil}
  }

  @option_keys [:plugin, :cache_dir, :python, install: true]

  @typedoc "A platform EXLA knows how to find a plugin for."
  @type platform :: :host | :cuda | :rocm | :tpu

  @doc """
  Lists the platforms this module finds plugins for.

      iex> EXLA.Plugin.platforms()
      [:host, :cuda, :rocm, :tpu]

  """
  @spec platforms() :: [platform()]
  def platforms, do: @platforms

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
      {:error, _} when installs -> install!(opts)
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

  @doc """
  Returns the directory where EXLA keeps the plugins it installs.

  It is the `:cache_dir` option, else the environment variable
  `EXLA_CACHE_DIR`, else `:filename.basedir(:user_cache, "exla")`.
  """
  @spec cache_dir(keyword()) :: Path.t()
  def cache_dir(opts \\ []) do
    opts[:cache_dir] || non_empty_env("EXLA_CACHE_DIR") ||
      List.to_string(:filename.basedir(:user_cache, ~c"exla"))
  end

  @doc """
  Returns where the CPU plugin is (or would be) installed in the cache
  directory.
  """
  @spec cpu_plugin_path(keyword()) :: Path.t()
  def cpu_plugin_path(opts \\ []) do
    dir = "#{@cpu_package}-#{@cpu_version}-#{arch()}"
    Path.join([cache_dir(opts), "plugins", dir, @cpu_library])
  end

  @doc """
  Installs the CPU plugin (`xla-cpu-pjrt` #{@cpu_version}) into the cache
  directory, unless it is already there, and returns its path.

  It downloads the wheel with `python3 -m pip download`, checks its sha256,
  extracts the library and renames it into place. It raises with
  instructions when that is not possible.
  """
  @spec install!(keyword()) :: Path.t()
  def install!(opts \\ []) do
    opts = Keyword.validate!(opts, @option_keys)
    dest = cpu_plugin_path(opts)

    if File.regular?(dest) do
      dest
    else
      {wheel, _, _} = cpu_wheel!()
      python = python!(opts)

      Logger.info(
        "EXLA is installing its CPU plugin (#{@cpu_package} #{@cpu_version}, " <>
          "a download of about 60 MB, done once) into #{Path.dirname(dest)}"
      )

      with_tmp_dir(Path.dirname(Path.dirname(dest)), fn tmp ->
        download_dir = Path.join(tmp, "download")
        pip_download!(python, tmp, download_dir)
        install_from_wheel!(downloaded_wheel!(download_dir, wheel), opts)
      end)
    end
  rescue
    e in File.Error ->
      reraise RuntimeError,
              install_error(
                Exception.message(e) <>
                  ". Set EXLA_CACHE_DIR to a directory you can write to"
              ),
              __STACKTRACE__
  end

  @doc """
  Installs the CPU plugin from a wheel file of `xla-cpu-pjrt` #{@cpu_version}
  that you downloaded yourself, and returns the installed path.

  The file's sha256 must be the pinned one for this machine's architecture.
  Accepts the `:cache_dir` option.
  """
  @spec install_from_wheel!(Path.t(), keyword()) :: Path.t()
  def install_from_wheel!(wheel_path, opts \\ []) do
    opts = Keyword.validate!(opts, @option_keys)
    {_, wheel_sha256, library_sha256} = cpu_wheel!()
    install_wheel!(wheel_path, cpu_plugin_path(opts), wheel_sha256, library_sha256)
  end

  @doc false
  # Checks `wheel` against `wheel_sha256`, extracts the CPU library from it
  # (checking `library_sha256` unless nil) and renames it to `dest`.
  @spec install_wheel!(Path.t(), Path.t(), String.t(), String.t() | nil) :: Path.t()
  def install_wheel!(wheel, dest, wheel_sha256, library_sha256) do
    verify_sha256!(wheel, wheel_sha256)
    dest_dir = Path.dirname(dest)
    File.mkdir_p!(dest_dir)

    with_tmp_dir(Path.dirname(dest_dir), fn tmp ->
      library = extract_member!(wheel, @cpu_member, tmp)
      if library_sha256, do: verify_sha256!(library, library_sha256)
      File.chmod!(library, 0o755)
      # rename(2) replaces atomically: a reader sees no file or a whole one.
      File.rename!(library, dest)
      dest
    end)
  end

  @doc """
  Computes the sha256 of a file, reading it in chunks, as lowercase hex.
  """
  @spec sha256_file(Path.t()) :: String.t()
  def sha256_file(path) do
    path
    |> File.stream!([], 1_048_576)
    |> Enum.reduce(:crypto.hash_init(:sha256), &:crypto.hash_update(&2, &1))
    |> :crypto.hash_final()
    |> Base.encode16(case: :lower)
  end

  ## Locating

  defp validate!(platform, opts) when platform in @platforms do
    opts = Keyword.validate!(opts, @option_keys)

    case opts[:plugin] do
      nil -> opts
      path when is_binary(path) -> opts
      other -> raise ArgumentError, "expected :plugin to be a path, got: #{inspect(other)}"
    end
  end

  defp validate!(platform, _opts) do
    raise ArgumentError,
          "unknown EXLA platform #{inspect(platform)}, expected one of #{inspect(@platforms)}"
  end

  defp locate(platform, opts) do
    case given(platform, opts) do
      {path, source} -> existing(path, source)
      nil -> default(platform, opts)
    end
  end

  # Only the default CPU plugin is installed, never one that was named.
  defp installs?(platform, opts) do
    platform == :host and opts[:install] == true and given(platform, opts) == nil
  end

  # A plugin named by the :plugin option or the environment.
  defp given(platform, opts) do
    env = env_var(platform)

    cond do
      path = opts[:plugin] -> {path, "the :plugin option"}
      path = non_empty_env(env) -> {path, "the environment variable #{env}"}
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
    path = cpu_plugin_path(opts)

    if File.regular?(path) do
      {:ok, path}
    else
      {:error,
       "the CPU plugin is not installed at #{path}. " <>
         "Call EXLA.Plugin.install!/1, or set #{env_var(:host)} or the client's :plugin option"}
    end
  end

  defp default(:tpu, opts) do
    case non_empty_env("TPU_LIBRARY_PATH") do
      nil -> python_plugin(:tpu, opts)
      path -> existing(path, "the environment variable TPU_LIBRARY_PATH")
    end
  end

  defp default(platform, opts), do: python_plugin(platform, opts)

  @python_packages %{
    cuda: "jax-cuda12-pjrt",
    rocm: "jax-rocm60-pjrt (or another jax-rocm*-pjrt)",
    tpu: "libtpu"
  }

  defp python_plugin(platform, opts) do
    candidates =
      case python(opts) do
        nil -> []
        python -> python |> python_locations() |> Enum.flat_map(&plugin_candidates(platform, &1))
      end

    case candidates do
      [path | _] ->
        {:ok, path}

      [] ->
        {:error,
         "no PJRT plugin for #{inspect(platform)} was found. Install the Python package " <>
           "#{@python_packages[platform]} for #{python_name(opts)}, or set " <>
           "#{env_var(platform)}=/path/to/plugin.so, or give the client a :plugin option"}
    end
  end

  defp plugin_candidates(:cuda, {"jax_plugins", dir}),
    do: newest(Path.wildcard(Path.join(dir, "xla_cuda*/xla_cuda_plugin.so")))

  defp plugin_candidates(:rocm, {"jax_plugins", dir}),
    do: newest(Path.wildcard(Path.join(dir, "xla_rocm*/xla_rocm_plugin.so")))

  defp plugin_candidates(:tpu, {"libtpu", dir}),
    do: Enum.filter([Path.join(dir, "libtpu.so")], &File.regular?/1)

  defp plugin_candidates(_platform, _location), do: []

  defp newest(paths), do: Enum.sort(paths, :desc)

  # Asks Python where the (namespace) packages are, without importing the
  # plugin packages themselves (their __init__ needs jax).
  @locations_script """
  import importlib.util
  for name in ("jax_plugins", "libtpu"):
      try:
          spec = importlib.util.find_spec(name)
      except Exception:
          spec = None
      for path in (spec and spec.submodule_search_locations) or []:
          print(name + "\\t" + path)
  """

  # Python's answer is kept for the life of the VM: asking costs a Python
  # start-up (a few hundred milliseconds with some version managers).
  defp python_locations(python) do
    key = {__MODULE__, :python_locations, python}

    case :persistent_term.get(key, nil) do
      nil ->
        locations = ask_python_locations(python)
        :persistent_term.put(key, locations)
        locations

      locations ->
        locations
    end
  end

  defp ask_python_locations(python) do
    case System.cmd(python, ["-c", @locations_script], stderr_to_stdout: true) do
      {output, 0} ->
        for line <- String.split(output, "\n", trim: true),
            [name, dir] <- [String.split(line, "\t", parts: 2)],
            do: {name, dir}

      {_output, _status} ->
        []
    end
  rescue
    _ in ErlangError -> []
  end

  ## Installing

  defp installable?(opts) do
    match?({:ok, _}, cpu_wheel()) and python(opts) != nil
  end

  defp cpu_wheel do
    case Map.fetch(@cpu_wheels, arch()) do
      {:ok, wheel} ->
        if match?({:unix, :linux}, :os.type()), do: {:ok, wheel}, else: :error

      :error ->
        :error
    end
  end

  defp cpu_wheel! do
    case cpu_wheel() do
      {:ok, wheel} ->
        wheel

      :error ->
        raise RuntimeError,
              "EXLA has no CPU plugin to install for this machine " <>
                "(#{:erlang.system_info(:system_architecture)}): #{@cpu_package} " <>
                "#{@cpu_version} is published for Linux on x86_64 and aarch64 only. " <>
                manual_instructions()
    end
  end

  defp pip_download!(python, tmp, download_dir) do
    {_, wheel_sha256_x86, _} = @cpu_wheels["x86_64"]
    {_, wheel_sha256_arm, _} = @cpu_wheels["aarch64"]
    requirements = Path.join(tmp, "requirements.txt")

    File.write!(
      requirements,
      "#{@cpu_package}==#{@cpu_version} " <>
        "--hash=sha256:#{wheel_sha256_x86} --hash=sha256:#{wheel_sha256_arm}\n"
    )

    args =
      ~w(-m pip download --no-deps --only-binary=:all: --require-hashes) ++
        ~w(--disable-pip-version-check --no-input --progress-bar off) ++
        ["-r", requirements, "-d", download_dir]

    case System.cmd(python, args, stderr_to_stdout: true) do
      {_output, 0} ->
        :ok

      {output, status} ->
        raise RuntimeError,
              install_error(
                "`#{python} -m pip download #{@cpu_package}==#{@cpu_version}` " <>
                  "failed with exit status #{status}:\n\n#{tail(output)}"
              )
    end
  end

  defp downloaded_wheel!(download_dir, wheel) do
    path = Path.join(download_dir, wheel)

    if File.regular?(path) do
      path
    else
      raise RuntimeError, install_error("pip reported success but did not save #{wheel}")
    end
  end

  # Extracts one member of a zip file into `dir`, streaming it.
  #
  # `:zip.extract/2` of OTP 25 cannot extract the wheel's library: its local
  # header stores the sizes in a zip64 extra field, which that version does
  # not read. So the central directory is read with `:zip.list_dir/1` and the
  # member is inflated with `:zlib`, checking its CRC-32 and size.
  defp extract_member!(zip, member, dir) do
    {offset, compressed_size, size} = zip_entry!(zip, member)
    out = Path.join(dir, Path.basename(member))

    File.open!(zip, [:read, :binary, :raw], fn input ->
      {method, start, expected_crc} = local_header!(input, offset, compressed_size, zip, member)

      {crc, written} =
        File.open!(out, [:write, :binary, :raw], fn output ->
          copy_member(input, output, method, start, compressed_size)
        end)

      if crc != expected_crc or written != size do
        raise RuntimeError, "#{member} in #{zip} is corrupt (CRC-32 or size mismatch)"
      end
    end)

    out
  end

  defp zip_entry!(zip, member) do
    entries =
      case :zip.list_dir(String.to_charlist(zip)) do
        {:ok, entries} -> entries
        {:error, reason} -> raise RuntimeError, "could not read #{zip}: #{inspect(reason)}"
      end

    name = String.to_charlist(member)

    Enum.find_value(entries, fn
      {:zip_file, ^name, info, _comment, offset, compressed_size} ->
        {offset, compressed_size, elem(info, 1)}

      _ ->
        nil
    end) || raise RuntimeError, "#{zip} does not contain #{member}"
  end

  @local_header 0x04034B50
  @data_descriptor 0x08074B50

  defp local_header!(input, offset, compressed_size, zip, member) do
    case :file.pread(input, offset, 30) do
      {:ok,
       <<@local_header::little-32, _version::16, flags::little-16, method::little-16, _time::32,
         crc::little-32, _sizes::64, name_length::little-16, extra_length::little-16>>}
      when method in [0, 8] ->
        start = offset + 30 + name_length + extra_length

        # With bit 3 set the CRC follows the data, in a data descriptor.
        crc =
          if Bitwise.band(flags, 8) == 0 do
            crc
          else
            case :file.pread(input, start + compressed_size, 8) do
              {:ok, <<@data_descriptor::little-32, crc::little-32>>} -> crc
              {:ok, <<crc::little-32, _::32>>} -> crc
            end
          end

        {method, start, crc}

      _ ->
        raise RuntimeError, "could not extract #{member} from #{zip}: unsupported zip entry"
    end
  end

  @chunk 1_048_576

  defp copy_member(input, output, method, start, compressed_size) do
    z = :zlib.open()
    if method == 8, do: :ok = :zlib.inflateInit(z, -15)

    try do
      inflate = if method == 8, do: &:zlib.inflate(z, &1), else: fn data -> data end

      result =
        copy_chunks(input, output, inflate, start, compressed_size, {:erlang.crc32(<<>>), 0})

      if method == 8, do: :zlib.inflateEnd(z)
      result
    after
      :zlib.close(z)
    end
  end

  defp copy_chunks(_input, _output, _inflate, _position, 0, acc), do: acc

  defp copy_chunks(input, output, inflate, position, left, {crc, written}) do
    {:ok, chunk} = :file.pread(input, position, min(left, @chunk))
    data = inflate.(chunk)
    :ok = :file.write(output, data)
    acc = {:erlang.crc32(crc, data), written + IO.iodata_length(data)}
    copy_chunks(input, output, inflate, position + byte_size(chunk), left - byte_size(chunk), acc)
  end

  defp verify_sha256!(path, expected) do
    actual = sha256_file(path)

    if actual != String.downcase(expected) do
      raise RuntimeError,
            "the file #{path} has sha256 #{actual} but #{expected} was expected; " <>
              "EXLA refuses to use it"
    end

    :ok
  end

  defp with_tmp_dir(parent, fun) do
    unique = "#{System.os_time()}-#{:os.getpid()}-#{System.unique_integer([:positive])}"
    tmp = Path.join(parent, ".tmp-" <> unique)
    File.mkdir_p!(tmp)

    try do
      fun.(tmp)
    after
      File.rm_rf(tmp)
    end
  end

  defp python!(opts) do
    python(opts) ||
      raise RuntimeError,
            install_error("the Python interpreter #{python_name(opts)} was not found")
  end

  defp python(opts), do: System.find_executable(python_name(opts))

  defp python_name(opts), do: opts[:python] || non_empty_env("EXLA_PYTHON") || "python3"

  defp install_error(reason) do
    "could not install the PJRT CPU plugin that EXLA needs for its :host client " <>
      "(the Python package #{@cpu_package}==#{@cpu_version}): #{reason}\n\n" <>
      "EXLA installs it with `python3 -m pip download`. To fix this, either install " <>
      "python3 and pip (for example `apt-get install python3-pip`), make sure pip can " <>
      "reach your package index, and try again; or " <> manual_instructions()
  end

  defp manual_instructions do
    "download the wheel #{@cpu_package}==#{@cpu_version} yourself " <>
      "(for example `pip download --no-deps #{@cpu_package}==#{@cpu_version}` on another " <>
      "machine), then either run EXLA.Plugin.install_from_wheel!(\"/path/to/the.whl\"), or " <>
      "extract #{@cpu_member} from it and configure its path:\n\n" <>
      "    config :exla, :clients,\n" <>
      "      host: [platform: :host, plugin: \"/path/to/xla_cpu_pjrt.so\"]\n\n" <>
      "(or set #{env_var(:host)}=/path/to/xla_cpu_pjrt.so)"
  end

  defp tail(output) do
    lines = String.split(String.trim(output), "\n")
    lines |> Enum.take(-15) |> Enum.map_join("\n", &("    " <> &1))
  end

  ## Helpers

  defp env_var(platform), do: "EXLA_PJRT_PLUGIN_" <> String.upcase(Atom.to_string(platform))

  defp non_empty_env(name) do
    case System.get_env(name) do
      nil -> nil
      "" -> nil
      value -> value
    end
  end

  defp arch do
    :erlang.system_info(:system_architecture)
    |> List.to_string()
    |> String.split("-")
    |> hd()
    |> case do
      "arm64" -> "aarch64"
      "amd64" -> "x86_64"
      other -> other
    end
  end
end
