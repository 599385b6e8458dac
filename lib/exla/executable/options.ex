defmodule EXLA.Executable.Options do
  @moduledoc false
  # The options of `EXLA.Executable.compile/3`, checked (internal): the
  # public ones it documents, and the internal `:input_shapes` and
  # `:run_on`.

  alias EXLA.MLIR.Facts

  @doc """
  The checked compile options of `program` on `client`: a map of
  `:device_id`, `:num_replicas`, `:num_partitions`, `:shardy?` (the
  partitioner), `:input_shapes` (each device's parameters) and `:facts`
  (the program's, with `run_on: :thread` recorded). Raises
  `ArgumentError` on an unknown option or a bad value.
  """
  def compile!(client, program, opts) do
    {internal, opts} = Keyword.split(opts, [:input_shapes, :run_on])

    opts =
      Keyword.validate!(opts,
        device_id: client.default_device_id,
        num_replicas: 1,
        num_partitions: 1,
        partitioner: :gspmd
      )

    # One by one, so that the first bad value is the one reported.
    replicas = positive!(opts, :num_replicas)
    partitions = positive!(opts, :num_partitions)
    shardy? = partitioner!(opts[:partitioner]) == :shardy
    device_id = device_id!(client, opts[:device_id])

    facts =
      if internal[:run_on] == :thread,
        do: Facts.add_unbounded(program.facts, "declared"),
        else: program.facts

    %{
      device_id: device_id,
      num_replicas: replicas,
      num_partitions: partitions,
      shardy?: shardy?,
      input_shapes: internal[:input_shapes] || program.input_shapes,
      facts: facts
    }
  end

  defp partitioner!(partitioner) when partitioner in [:gspmd, :shardy], do: partitioner

  defp partitioner!(other) do
    raise ArgumentError,
          "expected :partitioner to be :gspmd or :shardy, got: #{inspect(other)}"
  end

  defp positive!(opts, key) do
    case opts[key] do
      n when is_integer(n) and n >= 1 ->
        n

      other ->
        raise ArgumentError, "#{inspect(key)} must be a positive integer, got: #{inspect(other)}"
    end
  end

  defp device_id!(client, id) when is_integer(id) and id >= 0 and id < client.device_count,
    do: id

  defp device_id!(client, id) do
    raise ArgumentError,
          "invalid device id #{inspect(id)} for client #{inspect(client.name)} " <>
            "with #{client.device_count} device(s)"
  end
end
