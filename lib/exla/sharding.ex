defmodule EXLA.Sharding do
  @moduledoc false

  # How `EXLA.shard_jit/3` lays tensors out over a mesh of devices
  # (internal): checking meshes and shardings, the `mhlo.sharding`
  # annotations XLA's SPMD partitioner reads, and each device's part.
  #
  # A *mesh* is a tuple of positive sizes, the logical shape of a grid of
  # partitions numbered in row-major order: `{2, 3}` has six, and partition
  # `p` sits at the coordinates `p` has in that grid. A *sharding* maps
  # some axes of a tensor to axes of the mesh, `%{tensor_axis =>
  # mesh_axis}`: the tensor is cut into equal parts along each such axis, as
  # many as the mesh axis's size, and the partition at coordinate `i` on
  # that mesh axis gets the `i`-th part; along mesh axes the tensor does not
  # use, it is replicated. `%{}` replicates the whole tensor.

  @doc """
  Checks `mesh` and returns its partition count, at most `device_count`.
  """
  def partitions!(mesh, device_count) do
    sizes = if is_tuple(mesh), do: Tuple.to_list(mesh), else: [:not_a_tuple]

    unless sizes != [] and Enum.all?(sizes, &(is_integer(&1) and &1 > 0)) do
      raise ArgumentError,
            "expected the mesh to be a non-empty tuple of positive integers, got: " <>
              inspect(mesh)
    end

    count = Enum.product(sizes)

    if count > device_count do
      raise ArgumentError,
            "the mesh #{inspect(mesh)} has #{count} partitions, but the client has " <>
              "#{device_count} device(s)"
    end

    count
  end

  @doc """
  Checks the sharding of input `index` whose dimensions are `dims` (a
  tuple) over `mesh`; returns it as a map.
  """
  def sharding!(sharding, dims, mesh, index) do
    unless is_map(sharding) do
      raise ArgumentError,
            "expected the sharding of input #{index} to be a map of tensor axes to mesh " <>
              "axes, got: #{inspect(sharding)}"
    end

    Enum.each(sharding, fn {axis, mesh_axis} ->
      valid? =
        is_integer(axis) and axis >= 0 and axis < tuple_size(dims) and
          is_integer(mesh_axis) and mesh_axis >= 0 and mesh_axis < tuple_size(mesh)

      unless valid? do
        raise ArgumentError,
              "invalid sharding #{inspect(sharding)} of input #{index}: it has shape " <>
                "#{inspect(dims)} and the mesh is #{inspect(mesh)}"
      end

      parts = elem(mesh, mesh_axis)

      if rem(elem(dims, axis), parts) != 0 do
        raise ArgumentError,
              "input #{index} cannot be split in #{parts} equal parts along axis #{axis} " <>
                "(its shape is #{inspect(dims)})"
      end
    end)

    mesh_axes = Map.values(sharding)

    if length(Enum.uniq(mesh_axes)) != length(mesh_axes) do
      raise ArgumentError,
            "the sharding #{inspect(sharding)} of input #{index} uses a mesh axis twice"
    end

    sharding
  end

  @doc """
  The dimensions of each partition's part of a tensor of `dims`.
  """
  def part_dims(dims, sharding, mesh) do
    Enum.reduce(sharding, dims, fn {axis, mesh_axis}, dims ->
      put_elem(dims, axis, div(elem(dims, axis), elem(mesh, mesh_axis)))
    end)
  end

  @doc """
  The start indices of partition `partition`'s part of a tensor of `dims`.
  """
  def part_start(dims, sharding, mesh, partition) do
    coords = coordinates(partition, mesh)
    part = part_dims(dims, sharding, mesh)

    for axis <- 0..(tuple_size(dims) - 1)//1 do
      case sharding do
        %{^axis => mesh_axis} -> elem(coords, mesh_axis) * elem(part, axis)
        %{} -> 0
      end
    end
  end

  # The row-major coordinates of a partition in the mesh.
  defp coordinates(partition, mesh) do
    mesh
    |> Tuple.to_list()
    |> Enum.reverse()
    |> Enum.map_reduce(partition, fn size, rest -> {rem(rest, size), div(rest, size)} end)
    |> elem(0)
    |> Enum.reverse()
    |> List.to_tuple()
  end

  @doc """
  The HLO sharding of a tensor of `rank` dimensions, as `mhlo.sharding`
  writes it: a tile per part, listing the partitions that hold each tile
  (row-major over the tiles, then over the replicas of a tile).
  """
  def annotation(sharding, _rank, _mesh) when map_size(sharding) == 0, do: "{replicated}"

  def annotation(sharding, rank, mesh) do
    tiles = for axis <- 0..(rank - 1)//1, do: tile_count(sharding, axis, mesh)
    used = Map.values(sharding)
    unused = for axis <- 0..(tuple_size(mesh) - 1)//1, axis not in used, do: elem(mesh, axis)
    replicas = Enum.product(unused)

    partitions =
      0..(Enum.product(Tuple.to_list(mesh)) - 1)
      |> Enum.sort_by(&tile_position(&1, sharding, rank, mesh))
      |> Enum.join(",")

    if replicas == 1 do
      "{devices=[#{Enum.join(tiles, ",")}]#{partitions}}"
    else
      "{devices=[#{Enum.join(tiles ++ [replicas], ",")}]#{partitions} last_tile_dim_replicate}"
    end
  end

  defp tile_count(sharding, axis, mesh) do
    case sharding do
      %{^axis => mesh_axis} -> elem(mesh, mesh_axis)
      %{} -> 1
    end
  end

  # Where a partition's tile is: its coordinate on each tensor axis, then
  # its place among the partitions holding the same tile.
  defp tile_position(partition, sharding, rank, mesh) do
    coords = coordinates(partition, mesh)
    used = Map.values(sharding)

    tile =
      for axis <- 0..(rank - 1)//1 do
        case sharding do
          %{^axis => mesh_axis} -> elem(coords, mesh_axis)
          %{} -> 0
        end
      end

    replica = for axis <- 0..(tuple_size(mesh) - 1)//1, axis not in used, do: elem(coords, axis)
    tile ++ replica
  end

  @doc """
  Adds the annotations of an SPMD program to the module text of EXLA's
  lowering: the partition count on the module, `mhlo.sharding` on each
  parameter of `@main` (`annotations`, one per parameter) and
  `{replicated}` on each result, so that every partition returns the
  whole results.
  """
  def annotate!(mlir, annotations, partitions) do
    attributes = "mhlo.num_partitions = #{partitions} : i32, mhlo.num_replicas = 1 : i32"

    signature = ~r/^  func\.func public @main\((.*)\) -> \((.*)\) \{$/m

    case String.starts_with?(mlir, "module {") &&
           Regex.run(signature, mlir, return: :index, capture: :all_but_first) do
      [{args_at, args_len}, {results_at, results_len}] ->
        args = binary_part(mlir, args_at, args_len)
        results = binary_part(mlir, results_at, results_len)

        IO.iodata_to_binary([
          "module attributes {#{attributes}} {",
          binary_part(mlir, 8, args_at - 8),
          annotate_arguments(args, annotations),
          binary_part(mlir, args_at + args_len, results_at - args_at - args_len),
          annotate_results(results),
          binary_part(mlir, results_at + results_len, byte_size(mlir) - results_at - results_len)
        ])

      _ ->
        raise ArgumentError, "could not find the signature of @main to annotate"
    end
  end

  defp annotate_arguments("", []), do: ""

  defp annotate_arguments(args, annotations) do
    args = String.split(args, ", %")

    if length(args) != length(annotations) do
      raise ArgumentError, "expected one sharding per parameter of @main"
    end

    args
    |> Enum.zip_with(annotations, &~s(#{&1} {mhlo.sharding = "#{&2}"}))
    |> Enum.join(", %")
  end

  defp annotate_results(results) do
    results
    |> String.split(", ")
    |> Enum.map_join(", ", &~s(#{&1} {mhlo.sharding = "{replicated}"}))
  end
end
