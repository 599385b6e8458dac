defmodule EXLA.Client.Builder do
  @moduledoc false
  # How a client is made from its validated options (internal): the
  # plugin's path, the checks of XLA's options and flags against it, the
  # PJRT client, the C heap of a CPU client, and the checks of what the
  # plugin found. `EXLA.Client` calls it one caller at a time.

  require Logger

  alias EXLA.Client.Options
  alias EXLA.Platform

  @doc """
  The client `name` of validated `options`: its plugin found (or
  installed), its XLA options checked against the plugin, and the PJRT
  client created, with at least one device and its default device among
  them.
  """
  def build!(name, options) do
    platform = options[:platform]
    path = EXLA.Plugin.path!(platform, Keyword.take(options, [:plugin, :cpu_plugin]))
    EXLA.XLAOptions.check_options!(options[:xla_options] || [], path, name)
    xla_options = Options.xla_compile_options(options)
    {ref, info} = create!(platform, path, Options.create_options(options), xla_options)
    device_count = length(info.devices)

    if device_count == 0 do
      raise RuntimeError,
            "the PJRT plugin #{path} of EXLA client #{inspect(name)} found no devices" <>
              if(options[:device_type],
                do: " of type #{inspect(options[:device_type])}",
                else: ""
              )
    end

    default_device_id = options[:default_device_id]

    if default_device_id >= device_count do
      raise ArgumentError,
            ":default_device_id of EXLA client #{inspect(name)} must be a number between " <>
              "0 and #{device_count - 1} (it has #{device_count} device(s)), " <>
              "got: #{default_device_id}"
    end

    warn_platform_mismatch(name, platform, info.platform_name, path)

    %EXLA.Client{
      ref: ref,
      name: name,
      platform: platform,
      device_count: device_count,
      default_device_id: default_device_id,
      platform_name: info.platform_name,
      platform_version: info[:platform_version],
      plugin_path: path,
      device_type: options[:device_type],
      xla_options: xla_options,
      automatic_transfers: options[:automatic_transfers],
      run_checks: info.run_checks
    }
  end

  @doc """
  Creates a client of `platform` on the plugin at `path` and returns its
  reference and the plugin's information about it (also how
  `EXLA.Platform.Discovery` counts a platform's devices). `XLA_FLAGS` is
  checked first, and a CPU client's C heap tuned (see "Host memory" in
  `EXLA.Client`).
  """
  def create!(platform, path, create_options, xla_options) do
    EXLA.XLAOptions.check_flags!(EXLA.NIF.xla_flags_env(), path)
    plugin = EXLA.Plugin.load!(platform, path)
    ref = plugin |> EXLA.NIF.client_create(create_options, xla_options) |> EXLA.NIF.unwrap!()
    info = ref |> EXLA.NIF.client_info() |> EXLA.NIF.unwrap!()

    if Platform.cpu_name?(info.platform_name) and Options.host_malloc_tuning?() do
      EXLA.NIF.host_heap_keep_freed_memory()
    end

    {ref, info}
  end

  defp warn_platform_mismatch(name, platform, platform_name, path) do
    expected = Platform.plugin_names(platform)

    if expected && String.downcase(platform_name || "") not in expected do
      Logger.warning(
        "EXLA client #{inspect(name)} has platform #{inspect(platform)} but its plugin " <>
          "#{path} reports platform #{inspect(platform_name)}"
      )
    end
  end
end
