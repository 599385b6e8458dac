defmodule EXLA.MLIR.Ops do
  @moduledoc false

  # One function per StableHLO (and a few CHLO) operations, emitted in the
  # generic form through `EXLA.MLIR.Builder`.
  #
  # Every function takes the builder first and returns `{value, builder}`
  # (or `{values, builder}` for multi-result operations). Shapes are not
  # inferred beyond what each op needs: callers pass result dims where the op
  # cannot compute them cheaply.

  alias EXLA.MLIR.{Builder, Type, Value}
  import Builder, only: [i64_array: 1, op1: 4, op1: 5, op: 5]

  ## Constants

  @doc """
  A constant of element type `elem` and `dims` filled with `number` (an
  integer, float, `:nan`, `:infinity`, `:neg_infinity` or `Complex`).
  """
  def constant(b, elem, dims, number) do
    type = {elem, dims}
    op1(b, "stablehlo.constant", [], type, attrs: [value: splat_literal(elem, number, type)])
  end

  @doc "A constant from the raw native-endian `binary` of a tensor."
  def constant_binary(b, elem, dims, binary) when elem != :pred do
    type = {elem, dims}
    literal = ~s(dense<"0x#{Base.encode16(binary)}"> : #{Type.to_string(type)})
    op1(b, "stablehlo.constant", [], type, attrs: [value: literal])
  end

  defp splat_literal(:pred, value, type) do
    "dense<#{if value in [0, false], do: "false", else: "true"}> : #{Type.to_string(type)}"
  end

  # An integer is written as the type holds it: Nx 0.9 and later type
  # integer constants s32 whatever their size, and wrap them as s32 does
  # (as Nx.BinaryBackend does).
  defp splat_literal({kind, _} = elem, value, type) when kind in [:s, :u] and is_integer(value) do
    "dense<#{wrap_integer(elem, value)}> : #{Type.to_string(type)}"
  end

  defp splat_literal(elem, value, type) do
    binary = Nx.to_binary(Nx.tensor(value, type: elem, backend: Nx.BinaryBackend))
    ~s(dense<"0x#{Base.encode16(binary)}"> : #{Type.to_string(type)})
  end

  @doc "The integer `value` as the integer type `elem` holds it (wrapped to its size)."
  def wrap_integer({:s, size}, value) do
    <<wrapped::signed-size(size)>> = <<value::size(size)>>
    wrapped
  end

  def wrap_integer({:u, size}, value) do
    <<wrapped::size(size)>> = <<value::size(size)>>
    wrapped
  end

  @doc "`stablehlo.iota` of `type` along `dim`."
  def iota(b, type, dim) do
    op1(b, "stablehlo.iota", [], type, attrs: [iota_dimension: "#{dim} : i64"])
  end

  ## Element-wise

  @doc "A unary element-wise op; the result type defaults to the operand's."
  def unary(b, name, %Value{type: type} = x, elem \\ nil) do
    {xe, dims} = type
    op1(b, name, [x], {elem || xe, dims})
  end

  @doc "A binary element-wise op with the type of the operands."
  def binary(b, name, %Value{type: type} = x, %Value{} = y) do
    op1(b, name, [x, y], type)
  end

  @doc """
  `stablehlo.compare`. `direction` is one of EQ NE LT LE GT GE; the
  comparison type is derived from the operand element type unless given.
  """
  def compare(b, direction, %Value{type: {elem, dims}} = x, %Value{} = y, cmp_type \\ nil) do
    cmp_type = cmp_type || comparison_type(elem)

    attrs =
      [comparison_direction: "#stablehlo<comparison_direction #{direction}>"] ++
        if cmp_type, do: [compare_type: "#stablehlo<comparison_type #{cmp_type}>"], else: []

    op1(b, "stablehlo.compare", [x, y], {:pred, dims}, attrs: attrs)
  end

  defp comparison_type(:pred), do: "UNSIGNED"
  defp comparison_type({:u, _}), do: "UNSIGNED"
  defp comparison_type({:s, _}), do: "SIGNED"
  defp comparison_type({:c, _}), do: nil
  defp comparison_type(_), do: "FLOAT"

  @doc "`stablehlo.select`."
  def select(b, pred, %Value{type: type} = on_true, on_false) do
    op1(b, "stablehlo.select", [pred, on_true, on_false], type)
  end

  @doc "`stablehlo.clamp(min, x, max)`."
  def clamp(b, min, %Value{type: type} = x, max) do
    op1(b, "stablehlo.clamp", [min, x, max], type)
  end

  @doc "`stablehlo.convert` to `elem`; a no-op when the type already matches."
  def convert(b, %Value{type: {elem, _}} = x, elem), do: {x, b}

  def convert(b, %Value{type: {_, dims}} = x, elem),
    do: op1(b, "stablehlo.convert", [x], {elem, dims})

  @doc "`stablehlo.bitcast_convert` to `elem` (same bit width)."
  def bitcast_convert(b, %Value{type: {_, dims}} = x, elem) do
    op1(b, "stablehlo.bitcast_convert", [x], {elem, dims})
  end

  @doc "`stablehlo.real` (complex to its real part)."
  def real(b, %Value{type: {elem, dims}} = x) do
    op1(b, "stablehlo.real", [x], {Type.complex_part(elem), dims})
  end

  @doc "`stablehlo.imag` (complex to its imaginary part)."
  def imag(b, %Value{type: {elem, dims}} = x) do
    op1(b, "stablehlo.imag", [x], {Type.complex_part(elem), dims})
  end

  @doc "`stablehlo.complex` from real and imaginary parts."
  def complex(b, %Value{type: {{:f, size}, dims}} = re, im) do
    op1(b, "stablehlo.complex", [re, im], {{:c, size * 2}, dims})
  end

  @doc "`stablehlo.abs`; for complex operands the result is real."
  def abs(b, %Value{type: {{:c, _} = elem, dims}} = x) do
    op1(b, "stablehlo.abs", [x], {Type.complex_part(elem), dims})
  end

  def abs(b, x), do: unary(b, "stablehlo.abs", x)

  ## Shapes

  @doc "`stablehlo.reshape` to `dims`."
  def reshape(b, %Value{type: {elem, dims}} = x, dims), do: {%{x | type: {elem, dims}}, b}

  def reshape(b, %Value{type: {elem, _}} = x, dims),
    do: op1(b, "stablehlo.reshape", [x], {elem, dims})

  @doc "`stablehlo.broadcast_in_dim` to `dims`, operand axis i going to `axes[i]`."
  def broadcast_in_dim(b, %Value{type: {elem, _}} = x, dims, axes) do
    op1(b, "stablehlo.broadcast_in_dim", [x], {elem, dims},
      attrs: [broadcast_dimensions: i64_array(axes)]
    )
  end

  @doc "`stablehlo.transpose` with `permutation`."
  def transpose(b, %Value{type: {elem, dims}} = x, permutation) do
    out = List.to_tuple(Enum.map(permutation, &elem(dims, &1)))
    op1(b, "stablehlo.transpose", [x], {elem, out}, attrs: [permutation: i64_array(permutation)])
  end

  @doc "`stablehlo.slice`."
  def slice(b, %Value{type: {elem, _}} = x, starts, limits, strides) do
    out =
      [starts, limits, strides]
      |> Enum.zip_with(fn [s, l, st] -> max(div(l - s + st - 1, st), 0) end)
      |> List.to_tuple()

    op1(b, "stablehlo.slice", [x], {elem, out},
      attrs: [
        start_indices: i64_array(starts),
        limit_indices: i64_array(limits),
        strides: i64_array(strides)
      ]
    )
  end

  @doc "`stablehlo.dynamic_slice` with scalar start values and static sizes."
  def dynamic_slice(b, %Value{type: {elem, _}} = x, starts, sizes) do
    op1(b, "stablehlo.dynamic_slice", [x | starts], {elem, List.to_tuple(sizes)},
      attrs: [slice_sizes: i64_array(sizes)]
    )
  end

  @doc "`stablehlo.dynamic_update_slice`."
  def dynamic_update_slice(b, %Value{type: type} = x, update, starts) do
    op1(b, "stablehlo.dynamic_update_slice", [x, update | starts], type)
  end

  @doc "`stablehlo.concatenate` along `dim`."
  def concatenate(b, [%Value{type: {elem, dims}} | _] = xs, dim) do
    size = Enum.reduce(xs, 0, fn %{type: {_, d}}, acc -> acc + elem(d, dim) end)
    out = put_elem(dims, dim, size)
    op1(b, "stablehlo.concatenate", xs, {elem, out}, attrs: [dimension: "#{dim} : i64"])
  end

  @doc "`stablehlo.pad` with per-axis low, high and interior padding."
  def pad(b, %Value{type: {elem, dims}} = x, value, lows, highs, interiors) do
    out =
      [Tuple.to_list(dims), lows, highs, interiors]
      |> Enum.zip_with(fn [d, lo, hi, int] -> d + lo + hi + max(d - 1, 0) * int end)
      |> List.to_tuple()

    op1(b, "stablehlo.pad", [x, value], {elem, out},
      attrs: [
        edge_padding_low: i64_array(lows),
        edge_padding_high: i64_array(highs),
        interior_padding: i64_array(interiors)
      ]
    )
  end

  @doc "`stablehlo.reverse` along `dims`."
  def reverse(b, %Value{type: type} = x, dims) do
    op1(b, "stablehlo.reverse", [x], type, attrs: [dimensions: i64_array(dims)])
  end

  ## Linear algebra and convolution

  @doc "`stablehlo.dot_general`."
  def dot_general(b, x, y, out_type, {batch_l, contract_l, batch_r, contract_r}, precision) do
    dot =
      "#stablehlo.dot<lhs_batching_dimensions = [#{Enum.join(batch_l, ", ")}], " <>
        "rhs_batching_dimensions = [#{Enum.join(batch_r, ", ")}], " <>
        "lhs_contracting_dimensions = [#{Enum.join(contract_l, ", ")}], " <>
        "rhs_contracting_dimensions = [#{Enum.join(contract_r, ", ")}]>"

    op1(b, "stablehlo.dot_general", [x, y], out_type,
      attrs: [dot_dimension_numbers: dot, precision_config: precision_config(precision)]
    )
  end

  @doc "Renders a two-operand precision config."
  def precision_config(precision) do
    p = "#stablehlo<precision #{precision_name(precision)}>"
    "[#{p}, #{p}]"
  end

  defp precision_name(:default), do: "DEFAULT"
  defp precision_name(:high), do: "HIGH"
  defp precision_name(:highest), do: "HIGHEST"

  # EXLA 0.7 accepts :packed_nibble (XLA's packed 4-bit operands) as a
  # precision, but StableHLO has no such precision (nor did EXLA 0.7's MLIR
  # compiler lower a dot with it), so only the programs without dot or
  # convolution compile with it.
  defp precision_name(:packed_nibble) do
    raise ArgumentError,
          "precision :packed_nibble has no StableHLO equivalent, so dot products and " <>
            "convolutions cannot be compiled with it; use :default, :high or :highest"
  end

  @doc """
  `stablehlo.convolution`. `layouts` is `{input, kernel, output}` where each
  is a list of dimension letters such as `["b", "f", "0", "1"]`.
  """
  def convolution(b, input, kernel, out_type, opts) do
    {in_l, k_l, out_l} = Keyword.fetch!(opts, :layouts)
    layout = fn l -> "[" <> Enum.join(l, ", ") <> "]" end

    attrs = [
      dimension_numbers: "#stablehlo.conv<#{layout.(in_l)}x#{layout.(k_l)}->#{layout.(out_l)}>",
      feature_group_count: "#{Keyword.fetch!(opts, :feature_group_count)} : i64",
      batch_group_count: "#{Keyword.fetch!(opts, :batch_group_count)} : i64",
      window_strides: i64_array(Keyword.fetch!(opts, :strides)),
      padding: Builder.i64_pairs(Keyword.fetch!(opts, :padding)),
      lhs_dilation: i64_array(Keyword.fetch!(opts, :lhs_dilation)),
      rhs_dilation: i64_array(Keyword.fetch!(opts, :rhs_dilation)),
      precision_config: precision_config(Keyword.fetch!(opts, :precision))
    ]

    op1(b, "stablehlo.convolution", [input, kernel], out_type, attrs: attrs)
  end

  @doc "`stablehlo.triangular_solve`."
  def triangular_solve(b, a, %Value{type: type} = x, opts) do
    transpose = Keyword.fetch!(opts, :transpose_a)

    op1(b, "stablehlo.triangular_solve", [a, x], type,
      attrs: [
        left_side: Builder.bool(Keyword.fetch!(opts, :left_side)),
        lower: Builder.bool(Keyword.fetch!(opts, :lower)),
        unit_diagonal: Builder.bool(Keyword.get(opts, :unit_diagonal, false)),
        transpose_a: "#stablehlo<transpose #{transpose}>"
      ]
    )
  end

  @doc "`stablehlo.fft` of `kind` (FFT, IFFT) over the trailing `lengths`."
  def fft(b, %Value{type: type} = x, kind, lengths, result_type \\ nil) do
    op1(b, "stablehlo.fft", [x], result_type || type,
      attrs: [fft_type: "#stablehlo<fft_type #{kind}>", fft_length: i64_array(lengths)]
    )
  end

  ## Ops with regions

  @doc "`stablehlo.reduce` over `dims`, with a body region."
  def reduce(b, inputs, inits, dims, result_types, region) do
    op(b, "stablehlo.reduce", inputs ++ inits, result_types,
      attrs: [dimensions: i64_array(dims)],
      regions: [region]
    )
  end

  @doc "`stablehlo.reduce_window`."
  def reduce_window(b, inputs, inits, result_types, region, opts) do
    attrs = [
      window_dimensions: i64_array(Keyword.fetch!(opts, :window_dimensions)),
      window_strides: i64_array(Keyword.fetch!(opts, :window_strides)),
      base_dilations: i64_array(Keyword.fetch!(opts, :base_dilations)),
      window_dilations: i64_array(Keyword.fetch!(opts, :window_dilations)),
      padding: Builder.i64_pairs(Keyword.fetch!(opts, :padding))
    ]

    op(b, "stablehlo.reduce_window", inputs ++ inits, result_types,
      attrs: attrs,
      regions: [region]
    )
  end

  @doc "`stablehlo.select_and_scatter`."
  def select_and_scatter(b, %Value{type: type} = x, source, init, select, scatter, opts) do
    attrs = [
      window_dimensions: i64_array(Keyword.fetch!(opts, :window_dimensions)),
      window_strides: i64_array(Keyword.fetch!(opts, :window_strides)),
      padding: Builder.i64_pairs(Keyword.fetch!(opts, :padding))
    ]

    op1(b, "stablehlo.select_and_scatter", [x, source, init], type,
      attrs: attrs,
      regions: [select, scatter]
    )
  end

  @doc "`stablehlo.sort` of several inputs along `dim` with a comparator."
  def sort(b, inputs, dim, stable?, comparator) do
    op(b, "stablehlo.sort", inputs, Enum.map(inputs, & &1.type),
      attrs: [dimension: "#{dim} : i64", is_stable: Builder.bool(stable?)],
      regions: [comparator]
    )
  end

  @doc "`stablehlo.map` over all dimensions."
  def map(b, inputs, out_type, region) do
    {_, dims} = out_type

    op1(b, "stablehlo.map", inputs, out_type,
      attrs: [dimensions: i64_array(Enum.to_list(0..(tuple_size(dims) - 1)//1))],
      regions: [region]
    )
  end

  @doc "`stablehlo.while` with cond and body regions."
  def while(b, inits, cond_region, body_region) do
    op(b, "stablehlo.while", inits, Enum.map(inits, & &1.type),
      regions: [cond_region, body_region]
    )
  end

  @doc "`stablehlo.if` on an i1 scalar."
  def if_(b, pred, result_types, then_region, else_region) do
    op(b, "stablehlo.if", [pred], result_types, regions: [then_region, else_region])
  end

  @doc """
  `stablehlo.case` on an `i32` scalar `index`: runs `branches[index]`, or
  the last branch when `index` is out of range.
  """
  def case_(b, index, result_types, branches) do
    op(b, "stablehlo.case", [index], result_types, regions: branches)
  end

  @doc """
  `stablehlo.gather`. `dims` is a keyword list with `:offset_dims`,
  `:collapsed_slice_dims`, `:start_index_map`, `:index_vector_dim` and
  `:slice_sizes`.
  """
  def gather(b, x, indices, out_type, dims) do
    attr =
      "#stablehlo.gather<offset_dims = #{list(dims[:offset_dims])}, " <>
        "collapsed_slice_dims = #{list(dims[:collapsed_slice_dims])}, " <>
        "start_index_map = #{list(dims[:start_index_map])}, " <>
        "index_vector_dim = #{dims[:index_vector_dim]}>"

    op1(b, "stablehlo.gather", [x, indices], out_type,
      attrs: [
        dimension_numbers: attr,
        slice_sizes: i64_array(dims[:slice_sizes]),
        indices_are_sorted: "false"
      ]
    )
  end

  @doc """
  `stablehlo.scatter` with an update region. `dims` has `:update_window_dims`,
  `:inserted_window_dims`, `:scatter_dims_to_operand_dims` and
  `:index_vector_dim`.
  """
  def scatter(b, %Value{type: type} = x, indices, updates, region, dims) do
    attr =
      "#stablehlo.scatter<update_window_dims = #{list(dims[:update_window_dims])}, " <>
        "inserted_window_dims = #{list(dims[:inserted_window_dims])}, " <>
        "scatter_dims_to_operand_dims = #{list(dims[:scatter_dims_to_operand_dims])}, " <>
        "index_vector_dim = #{dims[:index_vector_dim]}>"

    op1(b, "stablehlo.scatter", [x, indices, updates], type,
      attrs: [
        scatter_dimension_numbers: attr,
        indices_are_sorted: "false",
        unique_indices: "false"
      ],
      regions: [region]
    )
  end

  ## Custom calls

  @doc """
  A `stablehlo.custom_call` of `target` (API version 4, XLA's typed FFI) on
  `operands`, with results of `result_types` (a list) and the attributes
  `attrs` besides. Returns `{values, b}`.

  Operands and results are row-major, as handlers read and write them:
  without layouts, XLA may hand a call an operand in another layout (on
  CUDA, a transposed value reached a host callback as the untransposed
  bytes).

  A custom call counts as one that may run for unbounded time
  (`EXLA.MLIR.Facts`), unless `work:` in `opts` says about how many
  element operations it costs (a handler known to end, as the NIF's
  decompositions).
  """
  def custom_call(b, target, operands, result_types, attrs \\ [], opts \\ []) do
    attrs =
      [call_target_name: inspect(target), api_version: "4 : i32"] ++
        attrs ++
        [
          operand_layouts: row_major(Enum.map(operands, & &1.type)),
          result_layouts: row_major(result_types)
        ]

    op(
      b,
      "stablehlo.custom_call",
      operands,
      result_types,
      [attrs: attrs] ++ Keyword.take(opts, [:work])
    )
  end

  # The layouts attribute for `types`: each dimension's minor-to-major
  # order, the last dimension fastest.
  defp row_major(types) do
    layouts =
      Enum.map_join(types, ", ", fn {_element, dims} ->
        case tuple_size(dims) do
          0 -> "dense<> : tensor<0xindex>"
          rank -> "dense<[#{Enum.join((rank - 1)..0//-1, ", ")}]> : tensor<#{rank}xindex>"
        end
      end)

    "[" <> layouts <> "]"
  end

  defp list(l), do: "[" <> Enum.join(l, ", ") <> "]"
end
