defmodule EXLA.Executable.Serialized do
  @moduledoc false
  # Executables as binaries (internal): `serialize/1` and `seal/2` write
  # the plugin's serialized executable sealed with what it was compiled for
  # (`EXLA.Executable.Sealed`), and every loader (`deserialize/2`, `load/2`,
  # `load_binary/3`, `load_sealed/2`) goes through `open/3`, which checks
  # the seal, the expected metadata and the target before the plugin sees
  # a byte. `EXLA.Executable` documents the public functions and delegates
  # them here.

  require EXLA.Remote, as: Remote
  alias EXLA.{Executable, NIF, Shape}
  alias EXLA.Executable.Sealed
  alias EXLA.MLIR.Facts

  # serialize/1, deserialize/2, dump/1, load/2 and load_binary/3 are
  # EXLA.Executable's, documented there.

  def serialize(%Executable{} = executable), do: seal(executable, %{})

  @doc false
  # The sealed form of `executable`, with `extra` metadata (the compile
  # cache records its key there). Another node's executable is sealed by
  # its owner.
  def seal(%Executable{ref: ref} = executable, extra) when not Remote.local?(ref),
    do: Remote.call!(node(ref), __MODULE__, :__on_owner__, [:seal, [executable, extra]])

  def seal(%Executable{} = executable, extra) when is_map(extra) do
    blob = NIF.async!(&NIF.executable_serialize(executable.ref, &1))

    metadata = %{
      target: target(executable.client, executable.device_id),
      input_shapes: executable.input_shapes,
      output_shapes: executable.output_shapes,
      num_replicas: executable.num_replicas,
      num_partitions: executable.num_partitions,
      device_id: executable.device_id,
      facts: executable.facts
    }

    Sealed.seal(Map.merge(extra, metadata), blob)
  end

  def deserialize(client, binary) when is_binary(binary) do
    case open(client, binary, %{}) do
      {:ok, executable, _metadata} ->
        executable

      {:error, :other_target, message} ->
        EXLA.NativeLog.integrity_failure(
          "serialized executable",
          "it was made by another PJRT plugin or for another target",
          plugin: client.plugin_path
        )

        raise ArgumentError, message

      {:error, kind, message} ->
        raise_unloadable!(kind, message)
    end
  end

  # A binary that is damaged (reported as an integrity failure) or not one
  # of serialize/1's.
  defp raise_unloadable!(:damaged, message) do
    EXLA.NativeLog.integrity_failure("serialized executable", "its checksum does not match")
    raise ArgumentError, message
  end

  defp raise_unloadable!(:invalid, message), do: raise(ArgumentError, message)

  def dump(%Executable{} = executable) do
    %{
      serialized: serialize(executable),
      device_id: executable.device_id,
      num_replicas: executable.num_replicas,
      num_partitions: executable.num_partitions
    }
  end

  def load(client, %{serialized: binary}) when is_binary(binary), do: deserialize(client, binary)
  def load(client, binary) when is_binary(binary), do: deserialize(client, binary)

  def load(_client, other) do
    raise ArgumentError,
          "expected the map of EXLA.Executable.dump/1 (or a binary of serialize/1), " <>
            "got: #{inspect(other, limit: 5, printable_limit: 64)}"
  end

  def load_binary(client, binary, expected \\ %{}) when is_binary(binary) and is_map(expected) do
    with {:error, _reason, message} <- open(client, binary, expected) do
      {:error, message}
    end
  end

  @doc false
  # Loads a sealed executable (`serialize/1`'s binary) into `client`:
  # `{:ok, executable}`, or `{:error, :other_plugin}` when it was made by
  # another plugin or for another target (it would load and compute
  # garbage). A damaged binary raises `ArgumentError` (reported as by
  # deserialize/2).
  def load_sealed(client, binary) when is_binary(binary) do
    case open(client, binary, %{}) do
      {:ok, executable, _metadata} ->
        {:ok, executable}

      {:error, :other_target, _message} ->
        {:error, :other_plugin}

      {:error, kind, message} ->
        raise_unloadable!(kind, message)
    end
  end

  # The one place that loads sealed executables: `{:ok, executable,
  # metadata}`, or `{:error, :damaged | :invalid | :other_target, message}`.
  defp open(client, binary, expected) do
    client = EXLA.Client.local(client)

    with {:ok, meta, blob} <- Sealed.open(binary),
         :ok <- invalid(check_expected(meta, expected)),
         :ok <- check_target(client, meta) do
      deserialize_blob(client, meta, blob)
    end
  end

  defp invalid({:error, message}), do: {:error, :invalid, message}
  defp invalid(ok), do: ok

  defp check_expected(meta, expected) do
    case Enum.find(expected, fn {key, value} -> Map.get(meta, key) != value end) do
      nil ->
        :ok

      {key, _value} ->
        {:error,
         "it holds another program, or one compiled with other options " <>
           "(its #{inspect(key)} differs)"}
    end
  end

  defp check_target(client, %{target: target, device_id: device_id, facts: %Facts{}})
       when is_integer(device_id) and device_id >= 0 do
    cond do
      device_id >= client.device_count ->
        {:error, :invalid,
         "the executable was compiled for device #{device_id}, but client " <>
           "#{inspect(client.name)} has #{client.device_count} device(s)"}

      target != target(client, device_id) ->
        {:error, :other_target,
         "the executable was serialized by another PJRT plugin or for another target " <>
           "(platform, device kind or CPU features) than client #{inspect(client.name)}'s; " <>
           "compile it again"}

      true ->
        :ok
    end
  end

  defp check_target(_client, _meta),
    do:
      {:error, :invalid,
       "the serialized executable does not say what it was compiled for and what it does"}

  defp deserialize_blob(client, meta, blob) do
    %{input_shapes: input_shapes, device_id: device_id, facts: facts} = meta
    specs = Enum.map(input_shapes, &Shape.to_spec/1)
    ref = NIF.async!(&NIF.executable_deserialize(client.ref, blob, specs, device_id, &1))

    executable =
      Executable.place(%Executable{
        ref: ref,
        client: client,
        device_id: device_id,
        input_shapes: input_shapes,
        output_shapes: meta.output_shapes,
        facts: Facts.upgrade(facts),
        num_replicas: meta.num_replicas,
        num_partitions: meta.num_partitions
      })

    {:ok, executable, meta}
  rescue
    e in [ArgumentError, RuntimeError] ->
      {:error, :invalid, "the plugin could not load the executable: " <> Exception.message(e)}
  end

  @doc false
  # What an executable depends on besides its program: the plugin file and
  # its API version, the platform and the kind of device it runs on, and on
  # the CPU, the CPU's features (XLA:CPU generates code for the features of
  # the machine that compiles). Computed once per client and device.
  def target(%EXLA.Client{} = client, device_id) do
    EXLA.Memo.get({__MODULE__, :target, client.name, device_id}, fn ->
      info = NIF.unwrap!(NIF.client_info(client.ref))
      %{kind: kind} = Enum.at(info.devices, device_id)
      platform = String.downcase(info.platform_name)

      %{
        plugin: EXLA.Plugin.fingerprint(client.plugin_path),
        api_version: {info.api_major, info.api_minor},
        platform: {platform, info.platform_version},
        device_kind: kind,
        cpu: if(EXLA.Client.cpu_platform?(platform), do: cpu_features())
      }
    end)
  end

  # The CPU's feature flags as Linux reports them (x86 "flags", Arm
  # "Features"), hashed; elsewhere the system architecture.
  defp cpu_features do
    features =
      with {:ok, info} <- File.read("/proc/cpuinfo"),
           [_, flags] <- Regex.run(~r/^(?:flags|Features)\s*:\s*(.*)$/m, info) do
        flags |> String.split() |> Enum.sort() |> Enum.join(" ")
      else
        _ -> List.to_string(:erlang.system_info(:system_architecture))
      end

    Base.encode16(:crypto.hash(:sha256, features), case: :lower)
  end

  @doc false
  # The owner's side of a call from another node (see EXLA.Remote).
  def __on_owner__(:seal, [%Executable{ref: ref} = executable, extra]) do
    Remote.alive!(ref, :executable)
    seal(executable, extra)
  end
end
