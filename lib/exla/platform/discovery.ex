defmodule EXLA.Platform.Discovery do
  @moduledoc false
  # Which platforms this machine can run programs on, and how many devices
  # each has (internal; `EXLA.Client.get_supported_platforms/0` documents
  # the answer). A platform is supported when its plugin is found and
  # finds devices: the host's plugin needs only to be installable, a GPU's
  # or TPU's is looked for only where its driver's device files exist (see
  # `EXLA.Platform.device_files/1`), and counting devices creates a client.

  require Logger

  alias EXLA.Client
  alias EXLA.Client.Options
  alias EXLA.Platform

  @doc "The answer of `supported/0` when it has been computed, else nil."
  def peek, do: EXLA.Memo.peek({__MODULE__, :supported_platforms})

  @doc """
  The platforms this machine can run programs on, with their device counts
  (see `EXLA.Client.get_supported_platforms/0`), computed the first time.
  `EXLA.Client` calls it one caller at a time: it may create clients.
  """
  def supported do
    EXLA.Memo.get({__MODULE__, :supported_platforms}, fn ->
      clients = Application.fetch_env!(:exla, :clients)

      Enum.reduce(Platform.all(), %{}, fn platform, acc ->
        case platform_device_count(platform, clients) do
          nil -> acc
          count -> Map.put(acc, platform, count)
        end
      end)
    end)
  end

  defp platform_device_count(:host, clients) do
    # The first :host client that gives its plugin, by path or by name.
    plugin =
      clients
      |> clients_on(:host)
      |> Enum.find_value([], fn {_, opts} ->
        if opts[:plugin] || opts[:cpu_plugin], do: Keyword.take(opts, [:plugin, :cpu_plugin])
      end)

    if EXLA.Plugin.available?(:host, plugin) do
      Options.host_device_count([])
    end
  end

  # When the platform's plugin is found, a configured client of the platform
  # is created (it is the one that will be used); without one, a client with
  # default options is created only to count the devices.
  defp platform_device_count(platform, clients) do
    configured = clients_on(clients, platform)
    plugin = configured_plugin(configured, platform)

    with true <- EXLA.Plugin.may_have_devices?(platform, plugin: plugin),
         {:ok, path} <- EXLA.Plugin.find(platform, plugin: plugin) do
      case configured do
        [{name, options} | _] -> Client.fetch_serialized(name, options).device_count
        [] -> probe_device_count(platform, path)
      end
    else
      false -> nil
      {:error, _} -> nil
    end
  rescue
    e ->
      Logger.warning(
        "EXLA found a PJRT plugin for #{inspect(platform)} but cannot use it: " <>
          Exception.message(e)
      )

      nil
  end

  defp probe_device_count(platform, path) do
    options = Options.validate!(platform, platform: platform, preallocate: false)

    {_ref, info} =
      EXLA.Client.Builder.create!(platform, path, Options.create_options(options), [])

    if info.devices != [], do: length(info.devices)
  end

  # The plugin that the first of `configured` clients naming one names.
  defp configured_plugin(configured, platform) do
    option = Platform.plugin_option(platform)
    Enum.find_value(configured, fn {_, opts} -> opts[option] end)
  end

  defp clients_on(clients, platform) do
    for {name, options} <- clients,
        Keyword.keyword?(options),
        Keyword.get(options, :platform, :host) == platform,
        do: {name, options}
  end

  @doc """
  The default client among `preferred`, the names of `clients` (the
  `:clients` configuration), given the `supported` platforms: the first
  whose platform is supported (see `EXLA.Client.default_name/0`).
  """
  def choose_default(clients, preferred, supported) do
    Enum.find(preferred, fn name ->
      options =
        case List.keyfind(clients, name, 0) do
          {^name, options} ->
            options

          nil ->
            raise ArgumentError, "unknown client #{inspect(name)} given as :preferred_clients"
        end

      Map.has_key?(supported, Keyword.get(options, :platform, :host))
    end) ||
      raise RuntimeError,
            "could not find a default client for EXLA: none of the :preferred_clients " <>
              "#{inspect(preferred)} runs on a supported platform " <>
              "(supported: #{inspect(Map.keys(supported))}). The configured EXLA clients " <>
              "are: #{inspect(clients)}. The :host platform needs the CPU plugin, which " <>
              "EXLA installs with python3 and pip, or which you point " <>
              "EXLA_PJRT_PLUGIN_HOST at; a GPU needs its plugin (for CUDA: " <>
              ~s|`pip install "jax[cuda13]"`, or point EXLA_PJRT_PLUGIN_CUDA at it). | <>
              "See EXLA.Plugin"
  end

  # 128 TiB: the user address space of 64-bit hosts (47 bits).
  @address_space_bytes 2 ** 47

  @doc """
  The limit on a tensor's bytes where nothing smaller is known (also
  EXLA.Defn.Lowering's default).
  """
  def address_space_bytes, do: @address_space_bytes

  @doc """
  The most bytes one tensor may take on a client of `platform` (see
  `EXLA.Client.max_tensor_bytes/1`): the host's physical memory for
  `:host`, else the address space.
  """
  def max_tensor_bytes(:host) do
    EXLA.Memo.get({__MODULE__, :host_memory}, &host_memory/0)
  end

  def max_tensor_bytes(_platform), do: @address_space_bytes

  defp host_memory do
    with {:ok, info} <- File.read("/proc/meminfo"),
         [_, kib] <- Regex.run(~r/^MemTotal:\s+(\d+) kB/m, info) do
      String.to_integer(kib) * 1024
    else
      _ -> @address_space_bytes
    end
  end
end
