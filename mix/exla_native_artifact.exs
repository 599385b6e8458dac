defmodule Mix.ExlaNative.Artifact do
  @moduledoc false
  # Precompiled NIF archives: their names, the checksum file that ships in
  # the package, and their download, verification and unpacking.
  #
  # An archive holds one file, `libexla.so`, built for one target (such as
  # `x86_64-linux-gnu`) and one NIF API version (such as `2.16`, which
  # every VM whose NIF version is 2.16 or newer loads).

  @checksum_file "checksum-exla.exs"
  # The checksum file's entry for the native sources the archives were
  # built from (see Mix.ExlaNative.Sources): a tree whose sources differ
  # builds from source instead of installing an archive made from others.
  @sources_key "native sources"

  @doc "The file name of the archive for `version`, `nif_version` and `target`."
  def name(version, nif_version, target),
    do: "libexla-v#{version}-nif-#{nif_version}-#{target}.so.tar.gz"

  @doc "The path of the checksum file of the project in `root`."
  def checksum_path(root), do: Path.join(root, @checksum_file)

  def checksum_file, do: @checksum_file
  def sources_key, do: @sources_key

  @doc """
  Reads a checksum file: a map of archive names (and `#{inspect(@sources_key)}`)
  to `"sha256:<hex>"`. A missing file reads as an empty map.
  """
  def read_checksums(path) do
    case File.read(path) do
      {:ok, text} ->
        {map, _binding} = Code.eval_string(text, [], file: path)
        map

      {:error, :enoent} ->
        %{}
    end
  end

  @doc "Writes `checksums` to `path`, sorted, with a comment saying what it is."
  def write_checksums!(path, checksums) do
    entries =
      Enum.map_join(Enum.sort(checksums), ",\n", fn {k, v} ->
        "  #{inspect(k)} => #{inspect(v)}"
      end)

    text = """
    # SHA-256 of the precompiled NIF archives of this version, and of the
    # native sources they were built from. Written by `mix exla.checksum`;
    # `mix compile` refuses an archive whose digest differs.
    %{
    #{entries}
    }
    """

    File.write!(path, Code.format_string!(text) |> IO.iodata_to_binary() |> Kernel.<>("\n"))
  end

  @doc "`\"sha256:<hex>\"` of `data`."
  def digest(data), do: "sha256:" <> Base.encode16(:crypto.hash(:sha256, data), case: :lower)

  @doc """
  The target of the VM running this code, as archives name it
  (`x86_64-linux-gnu`, `aarch64-apple-darwin`...). `EXLA_NIF_TARGET`
  overrides it.
  """
  def host_target do
    case System.get_env("EXLA_NIF_TARGET", "") do
      "" -> target_of(List.to_string(:erlang.system_info(:system_architecture)))
      target -> target
    end
  end

  @doc """
  The archive target for a system architecture string (as
  `:erlang.system_info(:system_architecture)` gives it, a GNU triple such
  as `x86_64-pc-linux-gnu` or `aarch64-apple-darwin23.4.0`).
  """
  def target_of(architecture) do
    [arch | rest] = String.split(architecture, "-")
    arch = normalize_arch(arch)
    os = Enum.join(rest, "-")

    cond do
      os =~ "darwin" ->
        "#{arch}-apple-darwin"

      os =~ ~r/linux-(\w+)/ ->
        "#{arch}-linux-#{List.last(Regex.run(~r/linux-(\w+)/, os))}"

      os =~ "linux" ->
        "#{arch}-linux-gnu"

      true ->
        "#{arch}-#{os |> String.split("-") |> List.last() |> String.replace(~r/[\d.]+$/, "")}"
    end
  end

  defp normalize_arch("amd64"), do: "x86_64"
  defp normalize_arch("arm64"), do: "aarch64"
  defp normalize_arch(arch), do: arch

  @doc """
  The Rust target triple of an archive target: `x86_64-linux-gnu` is
  `x86_64-unknown-linux-gnu`; Apple targets are named alike.
  """
  def rust_triple(target) do
    case String.split(target, "-", parts: 2) do
      [arch, "linux-" <> _ = os] -> "#{arch}-unknown-#{os}"
      _ -> target
    end
  end

  @doc "The archive target of a Rust target triple (the inverse of `rust_triple/1`)."
  def target_of_triple(triple), do: String.replace(triple, "-unknown-linux-", "-linux-")

  @doc """
  Picks the archive for `target` from `checksums`: the one of the newest NIF
  version the VM loads (`host_nif`, such as `"2.16"`: same major version,
  minor version not above the VM's). Returns `{:ok, name, digest}` or
  `{:error, reason}`.
  """
  def select(checksums, version, target, host_nif) do
    [major, minor] = host_nif |> String.split(".") |> Enum.map(&String.to_integer/1)

    found =
      Enum.find_value(minor..0//-1, fn m ->
        name = name(version, "#{major}.#{m}", target)
        if digest = checksums[name], do: {:ok, name, digest}
      end)

    found ||
      {:error,
       "no precompiled NIF for #{target} (NIF #{host_nif}) in #{@checksum_file}" <>
         available(checksums)}
  end

  defp available(checksums) do
    case Enum.sort(Map.keys(checksums) -- [@sources_key]) do
      [] -> ""
      names -> "; it lists: " <> Enum.join(names, ", ")
    end
  end

  @doc """
  The archive's bytes, from `cache_dir` if a copy there has the right
  digest, else downloaded from `base_url` (and cached). Returns
  `{:ok, bytes}`, `{:error, :checksum, actual}` for bytes with another
  digest (nothing is cached then), or `{:error, :download, reason}`.
  """
  def fetch(name, digest, base_url, cache_dir) do
    cached = Path.join(cache_dir, name)

    with {:ok, bytes} <- File.read(cached), ^digest <- digest(bytes) do
      {:ok, bytes}
    else
      _ ->
        url = String.trim_trailing(base_url, "/") <> "/" <> name

        with {:ok, bytes} <- download(url) do
          case digest(bytes) do
            ^digest ->
              cache(cached, bytes)
              {:ok, bytes}

            actual ->
              {:error, :checksum, actual}
          end
        end
    end
  end

  # A cache that cannot be written costs a download next time, nothing more.
  defp cache(path, bytes) do
    with :ok <- File.mkdir_p(Path.dirname(path)) do
      tmp = path <> ".#{System.unique_integer([:positive])}.tmp"
      with :ok <- File.write(tmp, bytes), do: File.rename(tmp, path)
    end
  end

  @doc """
  Downloads `url` with `:httpc`. HTTPS peers are verified against the
  operating system's certificate store. Returns `{:ok, bytes}` or `{:error, :download, reason}`.
  """
  def download(url) do
    uri = URI.parse(url)

    with :ok <- start_app(:inets),
         :ok <- start_app(:ssl),
         {:ok, ssl} <- ssl_options(uri) do
      http = [ssl: ssl, connect_timeout: 15_000, timeout: 300_000, autoredirect: true]

      case :httpc.request(:get, {String.to_charlist(url), []}, http, body_format: :binary) do
        {:ok, {{_, 200, _}, _headers, body}} ->
          {:ok, body}

        {:ok, {{_, status, reason}, _headers, _body}} ->
          {:error, :download, "#{url} answered HTTP #{status} #{reason}"}

        {:error, reason} ->
          {:error, :download, "#{url} could not be fetched: #{inspect(reason)}"}
      end
    end
  end

  # Since Elixir 1.15, Mix leaves out of the code path every OTP application
  # the project being built does not declare, and a user's project declares
  # neither inets nor ssl: Mix.ensure_application!/1 (1.15 and later) puts
  # an application of this Erlang installation, and those it needs, back.
  # Elixir 1.14 prunes nothing. Only an application the installation lacks
  # (Debian, for one, ships inets and ssl in packages of their own) is
  # reported as missing.
  @doc "Starts the OTP application `app`: `:ok` or `{:error, :download, reason}`."
  def start_app(app) do
    with :ok <- add_to_code_path(app) do
      case Application.ensure_all_started(app) do
        {:ok, _} -> :ok
        {:error, reason} -> {:error, :download, not_started(app, reason)}
      end
    end
  end

  defp add_to_code_path(app) do
    if function_exported?(Mix, :ensure_application!, 1) do
      try do
        # apply/3: Elixir 1.14's Mix has no such function to check against.
        apply(Mix, :ensure_application!, [app])
      rescue
        Mix.Error -> {:error, :download, not_installed(app)}
      end
    else
      :ok
    end
  end

  defp not_started(app, reason) do
    if installed?(app),
      do: "Erlang's #{app} application could not start: #{inspect(reason)}",
      else: not_installed(app)
  end

  defp not_installed(app) do
    "this Erlang installation (#{:code.root_dir()}) has no #{app} application; " <>
      "install it (Debian and Ubuntu: apt-get install erlang-#{app})"
  end

  # Whether the Erlang installation holds `app`, on the code path or not.
  defp installed?(app) do
    is_list(:code.lib_dir(app)) or
      Path.wildcard(
        Path.join([List.to_string(:code.root_dir()), "lib", "#{app}-*", "ebin", "#{app}.app"])
      ) != []
  end

  defp ssl_options(%URI{scheme: "https", host: host}) do
    cacerts = :public_key.cacerts_get()

    {:ok,
     [
       verify: :verify_peer,
       cacerts: cacerts,
       depth: 4,
       server_name_indication: String.to_charlist(host),
       customize_hostname_check: [match_fun: :public_key.pkix_verify_hostname_match_fun(:https)]
     ]}
  rescue
    error ->
      {:error, :download,
       "no certificate authorities were found in the operating system's store " <>
         "(#{Exception.message(error)}); install them (the ca-certificates package)"}
  end

  defp ssl_options(_uri), do: {:ok, []}

  @doc "The library in an archive's bytes: `{:ok, binary}` or `{:error, reason}`."
  def unpack(bytes) do
    case :erl_tar.extract({:binary, bytes}, [:memory, :compressed]) do
      {:ok, [{~c"libexla.so", library}]} ->
        {:ok, library}

      {:ok, files} ->
        {:error,
         "expected only libexla.so in the archive, found #{inspect(files |> Enum.map(&elem(&1, 0)))}"}

      {:error, reason} ->
        {:error, "not a .tar.gz archive: #{inspect(reason)}"}
    end
  end

  @doc "Packs `library` (the bytes of a NIF) into an archive's bytes."
  def pack(library) do
    dir = Path.join(System.tmp_dir!(), "exla-pack-#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    tar = Path.join(dir, "archive.tar.gz")

    try do
      :ok = :erl_tar.create(String.to_charlist(tar), [{~c"libexla.so", library}], [:compressed])
      File.read!(tar)
    after
      File.rm_rf!(dir)
    end
  end
end
