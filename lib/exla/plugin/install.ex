defmodule EXLA.Plugin.Install do
  @moduledoc false
  # Installs the CPU plugin into EXLA's cache directory (see `EXLA.Plugin`):
  # pip downloads the pinned wheel, whose sha256 is checked again here, the
  # library is extracted from it (`EXLA.Plugin.Zip`) and renamed into place.
  # The functions take options already validated by `EXLA.Plugin`.

  require Logger

  # The pin of the CPU plugin, written once in cpu_plugin.pin (which
  # .ci/run reads too).
  @pin_file Path.join(__DIR__, "cpu_plugin.pin")
  @external_resource @pin_file

  pin =
    for line <- File.read!(@pin_file) |> String.split("\n", trim: true),
        not String.starts_with?(line, "#"),
        do: String.split(line)

  @cpu_package for(["package", name] <- pin, do: name) |> hd()
  @cpu_version for(["version", version] <- pin, do: version) |> hd()
  @cpu_member for(["member", member] <- pin, do: member) |> hd()
  @cpu_library Path.basename(@cpu_member)

  # arch => {wheel file, wheel sha256, library sha256 (nil when not pinned)}
  @cpu_wheels Map.new(
                for ["wheel", arch, file, sha256, library] <- pin,
                    do: {arch, {file, sha256, if(library != "-", do: library)}}
              )

  @doc "The version of `xla-cpu-pjrt` EXLA installs."
  def cpu_version, do: @cpu_version

  @doc "The cache directory (see `EXLA.Plugin.cache_dir/1`)."
  def cache_dir(opts) do
    opts[:cache_dir] || EXLA.Env.get("EXLA_CACHE_DIR") ||
      List.to_string(:filename.basedir(:user_cache, ~c"exla"))
  end

  @doc "Where the CPU plugin is (or would be) installed."
  def cpu_plugin_path(opts) do
    dir = "#{@cpu_package}-#{@cpu_version}-#{arch()}"
    Path.join([cache_dir(opts), "plugins", dir, @cpu_library])
  end

  @doc "Installs the CPU plugin unless it is there (see `EXLA.Plugin.install!/1`)."
  def install!(opts) do
    dest = cpu_plugin_path(opts)

    if File.regular?(dest) do
      dest
    else
      {wheel, _, _} = cpu_wheel!()
      python = python!(opts)
      timeout = download_timeout()

      Logger.info(
        "EXLA is installing its CPU plugin (#{@cpu_package} #{@cpu_version}, " <>
          "a download of about 60 MB, done once) into #{Path.dirname(dest)}"
      )

      with_tmp_dir(Path.dirname(Path.dirname(dest)), fn tmp ->
        download_dir = Path.join(tmp, "download")
        pip_download!(python, tmp, download_dir, timeout)
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

  @doc "Installs the CPU plugin from a wheel (see `EXLA.Plugin.install_from_wheel!/2`)."
  def install_from_wheel!(wheel_path, opts) do
    {_, wheel_sha256, library_sha256} = cpu_wheel!()

    install_wheel!(
      wheel_path,
      cpu_plugin_path(opts),
      wheel_sha256,
      library_sha256,
      cache_dir(opts)
    )
  end

  @doc """
  Checks `wheel` against `wheel_sha256`, extracts the CPU library from it
  (checking `library_sha256` unless nil) and renames it to `dest`.
  """
  def install_wheel!(wheel, dest, wheel_sha256, library_sha256, cache_dir \\ nil) do
    verify_sha256!(wheel, wheel_sha256)
    dest_dir = Path.dirname(dest)
    File.mkdir_p!(dest_dir)

    with_tmp_dir(Path.dirname(dest_dir), fn tmp ->
      library = EXLA.Plugin.Zip.extract_member!(wheel, @cpu_member, tmp)
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

  @doc "Whether this machine has a wheel to install and a Python to install it."
  def installable?(opts) do
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
                "#{@cpu_version} is published for Linux on " <>
                Enum.join(Enum.sort(Map.keys(@cpu_wheels)), " and ") <>
                " only. " <>
                manual_instructions()
    end
  end

  defp pip_download!(python, tmp, download_dir, timeout) do
    hashes = for {_, {_, sha256, _}} <- Enum.sort(@cpu_wheels), do: " --hash=sha256:" <> sha256
    requirements = Path.join(tmp, "requirements.txt")
    File.write!(requirements, "#{@cpu_package}==#{@cpu_version}#{hashes}\n")

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
                install_error("pip is not installed for #{python} (#{String.trim(output)})")
        end

        if output =~ ~r/timed out|TimeoutError/i do
          raise RuntimeError,
                install_error(
                  "the package index did not answer within #{timeout} seconds " <>
                    "(EXLA_DOWNLOAD_TIMEOUT); pip said:\n\n#{tail(output)}"
                )
        end

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

  defp python!(opts) do
    python(opts) ||
      raise RuntimeError,
            install_error("the Python interpreter #{python_name(opts)} was not found")
  end

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
      "(or set EXLA_PJRT_PLUGIN_HOST=/path/to/xla_cpu_pjrt.so)"
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
