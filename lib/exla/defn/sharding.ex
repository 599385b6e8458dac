defmodule EXLA.Defn.Sharding do
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
  #
  # With an `%Nx.Mesh{}` (Nx 0.12 and later, see "Meshes of Nx" below) a
  # sharding maps a tensor axis to a *list* of mesh axes, major first, and
  # the program is annotated for Shardy (`sdy.mesh`, `sdy.sharding`).
  #
  # That form expresses the tuple form too (`%{0 => 1}` of a rank-2 tensor
  # is `[[1], []]`), so both checkers return it, as one list of mesh axes
  # per tensor axis (*dim axes*), and everything after them serves both:
  # each partition's part, where it starts, the annotations of either
  # partitioner.

  @doc """
  Checks `mesh` and returns its partition count, at most `device_count`
  (`:any` for a program that is only lowered, never run).
  """
  def partitions!(mesh, device_count) do
    sizes = if is_tuple(mesh), do: Tuple.to_list(mesh), else: [:not_a_tuple]

    unless sizes != [] and Enum.all?(sizes, &(is_integer(&1) and &1 > 0)) do
      raise ArgumentError,
            "expected the mesh to be a non-empty tuple of positive integers, got: " <>
              inspect(mesh)
    end

    count = Enum.product(sizes)

    if device_count != :any and count > device_count do
      raise ArgumentError,
            "the mesh #{inspect(mesh)} has #{count} partitions, but the client has " <>
              "#{device_count} device(s)"
    end

    count
  end

  @doc """
  Checks the sharding of input `index` whose dimensions are `dims` (a
  tuple) over `mesh`, a map of tensor axes to mesh axes; returns its dim
  axes (see above).
  """
  def sharding!(sharding, dims, mesh, index) do
    map!(sharding, index, "mesh axes")

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

    sharding |> Enum.sort() |> Enum.map(&elem(&1, 1)) |> once_each!()

    for axis <- 0..(tuple_size(dims) - 1)//1, do: List.wrap(sharding[axis])
  end

  @doc """
  The start indices of partition `partition`'s part of a whole tensor of
  `dims` under `dim_axes` over the mesh of `shape`.
  """
  def part_start(dims, dim_axes, shape, partition) do
    coords = coordinates(partition, shape)
    part = part_dims(dims, dim_axes, shape)

    Enum.with_index(dim_axes, fn mesh_axes, axis ->
      tile_index(mesh_axes, coords, shape) * elem(part, axis)
    end)
  end

  # The index of a partition's tile along a tensor axis split over
  # `mesh_axes` (major first), from the partition's coordinates.
  defp tile_index(mesh_axes, coords, shape) do
    Enum.reduce(mesh_axes, 0, fn axis, index -> index * elem(shape, axis) + elem(coords, axis) end)
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
  The HLO sharding of a tensor under `dim_axes` over the mesh of `shape`,
  as `mhlo.sharding` writes it: a tile per part, listing the partitions
  that hold each tile (row-major over the tiles, then over the replicas of
  a tile).
  """
  def annotation(dim_axes, shape) do
    used = List.flatten(dim_axes)

    if used == [] do
      "{replicated}"
    else
      tiles = Enum.map(dim_axes, &parts(&1, shape))
      unused = for axis <- 0..(tuple_size(shape) - 1)//1, axis not in used, do: axis
      replicas = parts(unused, shape)

      partitions =
        0..(parts(Enum.to_list(0..(tuple_size(shape) - 1)), shape) - 1)
        |> Enum.sort_by(&tile_position(&1, dim_axes, unused, shape))
        |> Enum.join(",")

      if replicas == 1 do
        "{devices=[#{Enum.join(tiles, ",")}]#{partitions}}"
      else
        "{devices=[#{Enum.join(tiles ++ [replicas], ",")}]#{partitions} last_tile_dim_replicate}"
      end
    end
  end

  # Where a partition's tile is: its index on each tensor axis, then its
  # place among the partitions holding the same tile.
  defp tile_position(partition, dim_axes, unused, shape) do
    coords = coordinates(partition, shape)
    Enum.map(dim_axes, &tile_index(&1, coords, shape)) ++ [tile_index(unused, coords, shape)]
  end

  ## Meshes of Nx

  @doc """
  Checks an `%Nx.Mesh{}` and returns its partition count, at most
  `device_count`.
  """
  def mesh_partitions!(%{name: name, shape: shape} = mesh, device_count) do
    unless is_binary(name) and name != "" and String.valid?(name) do
      raise ArgumentError,
            "expected the mesh's name to be a non-empty string, got: #{inspect(mesh)}"
    end

    # The mesh is a symbol of the program, beside its entry function.
    if name == "main" do
      raise ArgumentError,
            "the mesh name \"main\" is taken by the program's entry function, " <>
              "give the mesh another name"
    end

    partitions!(shape, device_count)
  end

  @doc """
  Checks the sharding of input `index`, the tensor `t`, over the mesh of
  `shape`: a map from tensor axes (integers, negative integers or names)
  to lists of mesh axes. Returns one list of mesh axes per axis of `t`.
  """
  def mesh_sharding!(sharding, t, shape, index) do
    # EXLA 0.13.1's words.
    unless is_map(sharding) do
      raise ArgumentError, "expected input sharding to be a map, got: #{inspect(sharding)}"
    end

    by_axis =
      Enum.reduce(sharding, %{}, fn {axis, mesh_axes}, acc ->
        i = Nx.axis_index(t, axis)

        if Map.has_key?(acc, i) do
          raise ArgumentError,
                "tensor dimension #{inspect(axis)} (index #{i}) was specified multiple times"
        end

        Map.put(acc, i, mesh_axes!(mesh_axes, shape, sharding, index))
      end)

    dim_axes = for i <- 0..(tuple_size(t.shape) - 1)//1, do: Map.get(by_axis, i, [])
    once_each!(List.flatten(dim_axes))
    dim_axes
  end

  # A tuple mesh's sharding is a map of tensor axes to `values`.
  defp map!(sharding, _index, _values) when is_map(sharding), do: :ok

  defp map!(sharding, index, values) do
    raise ArgumentError,
          "expected the sharding of input #{index} to be a map of tensor axes to #{values}, " <>
            "got: #{inspect(sharding)}"
  end

  # A mesh axis splits at most one tensor axis of an input: the first one
  # named again, in the order of the tensor's axes, is reported (EXLA's
  # words).
  defp once_each!(mesh_axes) do
    Enum.reduce(mesh_axes, MapSet.new(), fn axis, seen ->
      if axis in seen do
        raise ArgumentError, "axis #{axis} was used twice in the same input sharding"
      end

      MapSet.put(seen, axis)
    end)
  end

  defp mesh_axes!(mesh_axes, shape, sharding, index) do
    unless is_list(mesh_axes) and Enum.all?(mesh_axes, &is_integer/1) do
      raise ArgumentError,
            "invalid sharding #{inspect(sharding)} of input #{index}: each tensor axis maps " <>
              "to a list of mesh axes, integers from 0 to #{tuple_size(shape) - 1} for a mesh " <>
              "of shape #{inspect(shape)}, got: #{inspect(mesh_axes)}"
    end

    for axis <- mesh_axes, axis < 0 or axis >= tuple_size(shape) do
      raise ArgumentError,
            "axis #{axis} is not valid for mesh with #{tuple_size(shape)} axes"
    end

    mesh_axes
  end

  @doc """
  The dimensions of the whole tensor of which `dims` are each partition's
  part, under `dim_axes` (one list of mesh axes per axis) over `shape`.
  """
  def whole_dims(dims, dim_axes, shape) do
    dim_axes
    |> Enum.with_index(fn mesh_axes, i -> elem(dims, i) * parts(mesh_axes, shape) end)
    |> List.to_tuple()
  end

  @doc """
  The dimensions of each partition's part of a whole tensor of `dims`
  under `dim_axes` over `shape`.
  """
  def part_dims(dims, dim_axes, shape) do
    dim_axes
    |> Enum.with_index(fn mesh_axes, i -> div(elem(dims, i), parts(mesh_axes, shape)) end)
    |> List.to_tuple()
  end

  defp parts(mesh_axes, shape), do: Enum.reduce(mesh_axes, 1, &(elem(shape, &1) * &2))

  @doc """
  The `sdy.mesh` operation declaring the mesh `name` of `shape`, its axes
  named `"axis_0"`, `"axis_1"`...
  """
  def sdy_mesh(name, shape) do
    axes =
      shape
      |> Tuple.to_list()
      |> Enum.with_index(fn size, i -> ~s("axis_#{i}"=#{size}) end)
      |> Enum.join(", ")

    "sdy.mesh @#{symbol(name)} = <[#{axes}]>"
  end

  @doc """
  The `#sdy.sharding` of a tensor over the mesh `name`, from one list of
  mesh axes per tensor axis. Every dimension is closed: the partitioner
  keeps each input's parts as they are given.
  """
  def sdy_sharding(name, dim_axes) do
    dims =
      Enum.map_join(dim_axes, ", ", fn mesh_axes ->
        "{" <> Enum.map_join(mesh_axes, ", ", &~s("axis_#{&1}")) <> "}"
      end)

    "#sdy.sharding<@#{symbol(name)}, [#{dims}]>"
  end

  # An MLIR symbol name: bare when it is an identifier, else quoted.
  defp symbol(name) do
    if name =~ ~r/\A[A-Za-z_][A-Za-z0-9_$.]*\z/ do
      name
    else
      escaped =
        for <<byte <- name>>, into: "" do
          cond do
            byte in [?", ?\\] -> <<?\\, byte>>
            byte >= 0x20 and byte < 0x7F -> <<byte>>
            true -> "\\" <> Base.encode16(<<byte>>)
          end
        end

      ~s("#{escaped}")
    end
  end
end
