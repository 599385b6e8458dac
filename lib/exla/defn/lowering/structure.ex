defmodule EXLA.Defn.Lowering.Structure do
  @moduledoc false
  # Shape, slicing, gather and scatter ops.

  alias EXLA.MLIR.Ops
  alias Nx.Defn.Expr
  alias Nx.Tensor, as: T
  import EXLA.Defn.Lowering

  # take and take_along_axis are ops of Nx 0.7; later lines have blocks for
  # them (lowered here too, see EXLA.Defn.Lowering.Blocks).
  @ops [:reshape, :squeeze, :broadcast, :transpose, :pad, :reverse, :slice, :put_slice] ++
         [:concatenate, :gather, :indexed_add, :indexed_put] ++
         if(EXLA.NxVersion.blocks?(), do: [], else: [:take, :take_along_axis]) ++
         if(EXLA.NxVersion.stack?(), do: [:stack], else: [])

  def ops, do: @ops

  def lower(op, %T{data: %Expr{args: [x | _]}} = t, b) when op in [:reshape, :squeeze] do
    {x, b} = lower_value(x, b)
    Ops.reshape(b, x, dims(t))
  end

  def lower(:broadcast, %T{data: %Expr{args: [x, _shape, axes]}} = t, b) do
    {x, b} = lower_as(x, t.type, b)
    Ops.broadcast_in_dim(b, x, dims(t), axes)
  end

  def lower(:transpose, %T{data: %Expr{args: [x, axes]}}, b) do
    {x, b} = lower_value(x, b)
    Ops.transpose(b, x, axes)
  end

  def lower(:pad, %T{data: %Expr{args: [x, value, config]}} = t, b) do
    {x, b} = lower_as(x, t.type, b)
    {v, b} = lower_as(value, t.type, b)
    {lows, highs, interiors} = unzip3(config)
    Ops.pad(b, x, v, lows, highs, interiors)
  end

  def lower(:reverse, %T{data: %Expr{args: [x, axes]}}, b) do
    {x, b} = lower_value(x, b)
    Ops.reverse(b, x, axes)
  end

  def lower(:slice, %T{data: %Expr{args: [x, starts, lengths, strides]}}, b) do
    {x, b} = lower_value(x, b)
    {_, in_dims} = x.type

    if Enum.all?(starts, &is_integer/1) do
      starts =
        [starts, lengths, Tuple.to_list(in_dims)]
        |> Enum.zip_with(fn [s, l, d] -> s |> max(0) |> min(d - l) end)

      limits = Enum.zip_with(starts, lengths, &(&1 + &2))
      Ops.slice(b, x, starts, limits, strides)
    else
      {starts, b} = start_values(starts, b)
      {x, b} = Ops.dynamic_slice(b, x, starts, lengths)

      if Enum.all?(strides, &(&1 == 1)) do
        {x, b}
      else
        Ops.slice(b, x, Enum.map(lengths, fn _ -> 0 end), lengths, strides)
      end
    end
  end

  def lower(:put_slice, %T{data: %Expr{args: [x, starts, slice]}} = t, b) do
    {x, b} = lower_as(x, t.type, b)
    {slice, b} = lower_as(slice, t.type, b)
    {starts, b} = start_values(starts, b)
    Ops.dynamic_update_slice(b, x, slice, starts)
  end

  def lower(:concatenate, %T{data: %Expr{args: [tensors, axis]}} = t, b) do
    {xs, b} = Enum.map_reduce(tensors, b, &lower_as(&1, t.type, &2))
    Ops.concatenate(b, xs, axis)
  end

  # Each tensor gets the new axis (of size 1), then they are concatenated.
  def lower(:stack, %T{data: %Expr{args: [tensors, axis]}} = t, b) do
    {xs, b} =
      Enum.map_reduce(tensors, b, fn tensor, b ->
        {x, b} = lower_as(tensor, t.type, b)
        {_, x_dims} = x.type
        Ops.reshape(b, x, Tuple.insert_at(x_dims, axis, 1))
      end)

    Ops.concatenate(b, xs, axis)
  end

  def lower(:gather, %T{data: %Expr{args: [x, indices, opts]}} = t, b) do
    {x, b} = lower_value(x, b)
    {idx, b} = lower_indices(indices, b)
    {_, x_dims} = x.type
    rank = tuple_size(x_dims)

    axes =
      opts[:axes] || Enum.to_list(0..(elem(indices.shape, tuple_size(indices.shape) - 1) - 1))

    batch_rank = tuple_size(dims(indices)) - 1

    Ops.gather(b, x, idx, type_of(t),
      offset_dims: Enum.to_list(batch_rank..(batch_rank + rank - length(axes) - 1)//1),
      collapsed_slice_dims: axes,
      start_index_map: axes,
      index_vector_dim: batch_rank,
      slice_sizes: slice_sizes(x_dims, axes)
    )
  end

  def lower(:take, %T{data: %Expr{args: [x, indices, axis]}} = t, b) do
    {x, b} = lower_value(x, b)
    {idx, b} = lower_indices(indices, b)
    {_, x_dims} = x.type
    idx_rank = tuple_size(dims(indices))

    offset_dims =
      for i <- 0..(tuple_size(x_dims) - 1), i != axis do
        if i < axis, do: i, else: i + idx_rank - 1
      end

    Ops.gather(b, x, idx, type_of(t),
      offset_dims: offset_dims,
      collapsed_slice_dims: [axis],
      start_index_map: [axis],
      index_vector_dim: idx_rank,
      slice_sizes: slice_sizes(x_dims, [axis])
    )
  end

  def lower(:take_along_axis, %T{data: %Expr{args: [x, indices, axis]}} = t, b) do
    {x, b} = lower_value(x, b)
    {idx, b} = lower_indices(indices, b)
    {_, idx_dims} = idx.type
    rank = tuple_size(idx_dims)
    column = List.to_tuple(Tuple.to_list(idx_dims) ++ [1])

    {columns, b} =
      Enum.map_reduce(0..(rank - 1), b, fn d, b ->
        {v, b} = if d == axis, do: {idx, b}, else: Ops.iota(b, {{:s, 64}, idx_dims}, d)
        Ops.reshape(b, v, column)
      end)

    {full, b} = Ops.concatenate(b, columns, rank)
    all = Enum.to_list(0..(rank - 1))

    Ops.gather(b, x, full, type_of(t),
      offset_dims: [],
      collapsed_slice_dims: all,
      start_index_map: all,
      index_vector_dim: rank,
      slice_sizes: List.duplicate(1, rank)
    )
  end

  def lower(op, %T{data: %Expr{args: [target, indices, updates, opts]}} = t, b)
      when op in [:indexed_add, :indexed_put] do
    {x, b} = lower_as(target, t.type, b)
    {upd, b} = lower_as(updates, t.type, b)
    {idx, b} = lower_indices(indices, b)
    {_, idx_dims} = idx.type
    {_, upd_dims} = upd.type
    idx_rank = tuple_size(idx_dims)
    depth = elem(idx_dims, idx_rank - 1)
    axes = opts[:axes] || Enum.to_list(0..(depth - 1))
    scalar = {t.type, {}}

    {region, b} =
      region(b, [scalar, scalar], :isolated, fn b, [cur, new] ->
        if op == :indexed_add do
          with {v, b} <- Ops.binary(b, "stablehlo.add", cur, new), do: {[v], b}
        else
          {[new], b}
        end
      end)

    Ops.scatter(b, x, idx, upd, region,
      update_window_dims: Enum.to_list((idx_rank - 1)..(tuple_size(upd_dims) - 1)//1),
      inserted_window_dims: axes,
      scatter_dims_to_operand_dims: axes,
      index_vector_dim: idx_rank - 1
    )
  end

  # Indices of every integer type are used as s64, so that ops combining
  # them with indices of their own (take_along_axis's iotas, dynamic slice
  # starts) see one type. u64 indices past the s64 range are out of bounds
  # anyway: they are first lowered to the s64 maximum so they clamp to the
  # end of the axis, as other out-of-bounds indices do, and do not wrap to
  # negative values.
  defp lower_indices(indices, b) do
    {idx, b} = lower_value(indices, b)
    index_value(b, idx)
  end

  defp index_value(b, %{type: {{:u, 64}, dims}} = idx) do
    {max, b} = const(b, {:u, 64}, max_value({:s, 64}), dims)
    {idx, b} = Ops.binary(b, "stablehlo.minimum", idx, max)
    Ops.convert(b, idx, {:s, 64})
  end

  defp index_value(b, idx), do: Ops.convert(b, idx, {:s, 64})

  defp slice_sizes(dims, axes) do
    dims
    |> Tuple.to_list()
    |> Enum.with_index(fn d, i -> if i in axes, do: 1, else: d end)
  end

  # Start indices of dynamic slices: all s64 scalars.
  defp start_values(starts, b) do
    Enum.map_reduce(starts, b, fn
      s, b when is_integer(s) -> const(b, {:s, 64}, s)
      s, b -> lower_indices(s, b)
    end)
  end

  defp unzip3(config) do
    {Enum.map(config, &elem(&1, 0)), Enum.map(config, &elem(&1, 1)),
     Enum.map(config, &elem(&1, 2))}
  end
end
