defmodule EXLA.Client.Options do
  @moduledoc false
  # The options of a client (internal): their defaults and checks, and
  # what they become for the plugin (PJRT create options, XLA compile
  # options, the host device count) and for the C heap. `EXLA.Client`
  # documents every option; this module is where each one is checked.

  alias EXLA.Platform

  @option_defaults [
    platform: :host,
    default_device_id: 0,
    preallocate: true,
    memory_fraction: 0.9,
    plugin: nil,
    device_count: nil,
    warm_up: true
  ]

  # Allowed without a default: absent means the platform's defaults alone
  # (:device_type and :plugin_path are required by :pjrt_plugin alone).
  # (:automatic_transfers defaults by platform, see validate!/2.)
  @optional_options [:xla_options, :cpu_plugin, :device_type, :plugin_path, :automatic_transfers]

  @doc "Validates a client's options, returning them with the defaults filled in."
  def validate!(name, options) do
    unless Keyword.keyword?(options) do
      raise ArgumentError,
            "expected the options of EXLA client #{inspect(name)} to be a keyword list, " <>
              "got: #{inspect(options)}"
    end

    options =
      try do
        Keyword.validate!(options, @optional_options ++ @option_defaults)
      rescue
        e in ArgumentError ->
          reraise ArgumentError,
                  "invalid options for EXLA client #{inspect(name)}: " <> Exception.message(e),
                  __STACKTRACE__
      end

    Enum.each(options, &check_option!(name, options[:platform], &1))

    if options[:plugin] && options[:cpu_plugin] do
      raise ArgumentError,
            "EXLA client #{inspect(name)} gives both :plugin and :cpu_plugin: give one"
    end

    options
    |> Keyword.update!(:memory_fraction, &(&1 * 1.0))
    |> Keyword.put_new(:automatic_transfers, options[:platform] == :host)
    |> plugin_options!(name)
  end

  # A :pjrt_plugin client needs its plugin's path and device type (EXLA
  # 0.13 raises without them too); its path is then its :plugin.
  defp plugin_options!(options, name) do
    if options[:platform] == :pjrt_plugin do
      for key <- [:device_type, :plugin_path], options[key] == nil do
        raise ArgumentError,
              "EXLA client #{inspect(name)} of the :pjrt_plugin platform requires " <>
                "#{inspect(key)}: " <> pjrt_plugin_hint(key)
      end

      if options[:plugin] do
        raise ArgumentError,
              "EXLA client #{inspect(name)} of the :pjrt_plugin platform takes its " <>
                "plugin's path as :plugin_path, not :plugin"
      end

      options
      |> Keyword.update!(:device_type, &to_string/1)
      |> Keyword.put(:plugin, options[:plugin_path])
    else
      options
    end
  end

  defp pjrt_plugin_hint(:device_type),
    do: ~s|the device type of its PJRT plugin, such as "tt"|

  defp pjrt_plugin_hint(:plugin_path),
    do: "the path of its PJRT plugin library, such as \"/opt/tt/pjrt_plugin_tt.so\""

  defp check_option!(name, _platform, {:platform, platform}) do
    if platform not in Platform.all() do
      raise ArgumentError,
            "unknown EXLA platform #{inspect(platform)} for client #{inspect(name)}, " <>
              "expected one of #{inspect(Platform.all())}"
    end
  end

  defp check_option!(_name, _platform, {:default_device_id, id})
       when is_integer(id) and id >= 0,
       do: :ok

  defp check_option!(_name, _platform, {:preallocate, value}) when is_boolean(value), do: :ok

  defp check_option!(_name, _platform, {:automatic_transfers, value}) when is_boolean(value),
    do: :ok

  defp check_option!(_name, _platform, {:warm_up, value}) when is_boolean(value), do: :ok

  defp check_option!(_name, _platform, {:memory_fraction, value})
       when is_number(value) and value > 0 and value <= 1,
       do: :ok

  defp check_option!(_name, _platform, {:plugin, path}) when is_nil(path) or is_binary(path),
    do: :ok

  defp check_option!(_name, _platform, {:device_count, nil}), do: :ok
  defp check_option!(_name, _platform, {:cpu_plugin, nil}), do: :ok

  defp check_option!(name, :host, {:cpu_plugin, plugin}) do
    EXLA.Plugin.check_cpu_plugin!(plugin, ":cpu_plugin for EXLA client #{inspect(name)}")
  end

  defp check_option!(name, platform, {:cpu_plugin, _plugin}) do
    raise ArgumentError,
          "the :cpu_plugin option of EXLA client #{inspect(name)} is only supported " <>
            "by :host clients, but its platform is #{inspect(platform)}"
  end

  # The same limit as the XLA flag that sets the count: the plugin creates
  # as many devices as it is asked for.
  defp check_option!(name, :host, {:device_count, count}) when is_integer(count) and count > 0 do
    with {:error, reason} <- EXLA.XLAOptions.check_device_count(count) do
      raise ArgumentError, "invalid :device_count for EXLA client #{inspect(name)}: #{reason}"
    end
  end

  defp check_option!(name, platform, {:device_count, _count}) when platform != :host do
    raise ArgumentError,
          "the :device_count option of EXLA client #{inspect(name)} is only supported " <>
            "by :host clients, but its platform is #{inspect(platform)}"
  end

  defp check_option!(_name, _platform, {key, nil}) when key in [:device_type, :plugin_path],
    do: :ok

  defp check_option!(name, platform, {key, _value})
       when key in [:device_type, :plugin_path] and platform != :pjrt_plugin do
    raise ArgumentError,
          "the #{inspect(key)} option of EXLA client #{inspect(name)} is only supported " <>
            "by :pjrt_plugin clients, but its platform is #{inspect(platform)}"
  end

  defp check_option!(_name, _platform, {:device_type, type})
       when (is_binary(type) and type != "") or (is_atom(type) and type not in [true, false]),
       do: :ok

  defp check_option!(_name, _platform, {:plugin_path, path}) when is_binary(path) and path != "",
    do: :ok

  defp check_option!(name, _platform, {:xla_options, options}) do
    unless (is_list(options) or is_map(options)) and Enum.all?(options, &xla_option?/1) do
      raise ArgumentError,
            "invalid :xla_options for EXLA client #{inspect(name)}: expected a keyword " <>
              "list or map of XLA option names to booleans, integers, floats or strings, " <>
              "got: #{inspect(options)}"
    end

    EXLA.XLAOptions.check_ranges!(options, name)
  end

  defp check_option!(name, _platform, {key, value}) do
    raise ArgumentError,
          "invalid #{inspect(key)} for EXLA client #{inspect(name)}: expected " <>
            expected(key) <> ", got: #{inspect(value)}"
  end

  defp xla_option?({key, value}) when is_atom(key) or is_binary(key),
    do: is_boolean(value) or is_number(value) or is_binary(value)

  defp xla_option?(_), do: false

  defp expected(:default_device_id), do: "a non-negative integer"
  defp expected(:preallocate), do: "a boolean"
  defp expected(:warm_up), do: "a boolean"
  defp expected(:automatic_transfers), do: "a boolean"
  defp expected(:memory_fraction), do: "a number greater than 0 and at most 1"
  defp expected(:plugin), do: "a path (string)"
  defp expected(:device_count), do: "a positive integer"
  defp expected(:device_type), do: ~s|a non-empty string or an atom, such as "tt"|
  defp expected(:plugin_path), do: "the path of a PJRT plugin library (a non-empty string)"

  @doc """
  The PJRT create options for validated client options (see
  `EXLA.Platform.create_options/2`).
  """
  def create_options(options) do
    Platform.create_options(options, host_device_count(options))
  end

  @doc """
  The client's XLA options over the platform's defaults, as typed values
  sorted by name: the NIF keeps them with the client and every
  compilation on it overrides XLA's debug options with them.
  """
  def xla_compile_options(options) do
    defaults = Platform.default_xla_options(Keyword.fetch!(options, :platform))

    defaults
    |> Map.new(fn {key, value} -> {to_string(key), value} end)
    |> Map.merge(
      Map.new(options[:xla_options] || [], fn {key, value} -> {to_string(key), value} end)
    )
    |> Enum.sort()
    |> Enum.map(fn {name, value} -> {name, xla_option_value(value)} end)
  end

  defp xla_option_value(value) when is_boolean(value), do: {:bool, value}
  defp xla_option_value(value) when is_integer(value), do: {:int64, value}
  defp xla_option_value(value) when is_float(value), do: {:float, value}
  defp xla_option_value(value) when is_binary(value), do: {:string, value}

  @doc """
  The device count of a :host client with validated `options`: its
  :device_count, else the count XLA_FLAGS sets, else 1. XLA_FLAGS is read
  where the plugin reads it and `EXLA.Client` checks it (the process
  environment, see "XLA options and XLA_FLAGS" in `EXLA.Client`), and
  parsed as that check parses it, so the count is never taken from a value
  the check did not see.
  """
  def host_device_count(options, flags \\ EXLA.NIF.xla_flags_env()) do
    options[:device_count] || EXLA.XLAOptions.flags_device_count(flags) || 1
  end

  @doc """
  Whether creating a CPU client tunes the C heap (see "Host memory" in
  `EXLA.Client`): unless `EXLA_HOST_MALLOC_TUNING` says no.
  """
  def host_malloc_tuning? do
    EXLA.Env.parse!(
      "EXLA_HOST_MALLOC_TUNING",
      true,
      &{:ok, host_malloc_tuning?(&1)},
      "a boolean"
    )
  end

  @doc """
  Whether a value of `EXLA_HOST_MALLOC_TUNING` leaves the tuning on:
  anything but an explicit no.
  """
  def host_malloc_tuning?(value) when is_binary(value) do
    String.downcase(String.trim(value)) not in ["false", "0", "no", "off"]
  end
end
