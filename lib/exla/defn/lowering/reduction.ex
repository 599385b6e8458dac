defmodule EXLA.Defn.Lowering.Reduction do
  @moduledoc false
  # Reductions, window reductions, sorting and map (ops with regions).

  alias EXLA.MLIR.Ops
  alias Nx.Defn.Expr
  alias Nx.Tensor, as: T
  import EXLA.Defn.Lowering

  @aggregates %{
    sum: {"stablehlo.add", 0},
    product: {"stablehlo.multiply", 1},
    reduce_max: {"stablehlo.maximum", :min},
    reduce_min: {"stablehlo.minimum", :max}
  }

  @windows %{
    window_sum: {"stablehlo.add", 0},
    window_product: {"stablehlo.multiply", 1},
    window_max: {"stablehlo.maximum", :min},
    window_min: {"stablehlo.minimum", :max}
  }

  @ops Map.keys(@aggregates) ++
         Map.keys(@windows) ++
         [:all, :any, :argmax, :argmin, :reduce, :window_reduce] ++
         [:window_scatter_max, :window_scatter_min, :sort, :argsort] ++
         if(EXLA.NxVersion.maps?(), do: [:map], else: [])

  def ops, do: @ops

  def lower(op, %T{data: %Expr{args: [x, opts]}} = t, b) when is_map_key(@aggregates, op) do
    {name, init} = @aggregates[op]
    {x, b} = lower_as(x, t.type, b)
    {init, b} = const(b, t.type, init_value(init, t.type))
    axes = reduce_axes(x, opts[:axes])

    {v, b} =
      cond do
        op not in [:reduce_max, :reduce_min] ->
          reduce_simple(b, x, init, name, axes)

        small_float?(x) ->
          extremum_and_nan_flags(b, x, init, name, axes)

        true ->
          {v, b} = reduce_simple(b, x, init, name, axes)
          nan_where_any(b, v, x, &reduce_simple(&1, &2, &3, "stablehlo.or", axes))
      end

    Ops.reshape(b, v, dims(t))
  end

  def lower(op, %T{data: %Expr{args: [x, opts]}} = t, b) when op in [:all, :any] do
    {x, b} = lower_value(x, b)
    {x, b} = to_pred(b, x)
    {init, b} = const(b, :pred, if(op == :all, do: 1, else: 0))
    name = if op == :all, do: "stablehlo.and", else: "stablehlo.or"
    {v, b} = reduce_simple(b, x, init, name, reduce_axes(x, opts[:axes]))
    {v, b} = from_pred(b, v, t.type)
    Ops.reshape(b, v, dims(t))
  end

  def lower(op, %T{data: %Expr{args: [x, opts]}} = t, b) when op in [:argmax, :argmin] do
    {x, b} = lower_value(x, b)
    {elem, in_dims} = x.type

    {x, axis, b} =
      case opts[:axis] do
        nil ->
          {x, b} = Ops.reshape(b, x, {Tuple.product(in_dims)})
          {x, 0, b}

        axis ->
          {x, axis, b}
      end

    {_, x_dims} = x.type
    {idx, b} = Ops.iota(b, {t.type, x_dims}, axis)
    bound = if op == :argmax, do: min_value(elem), else: max_value(elem)
    {init_v, b} = const(b, elem, bound)
    {init_i, b} = const(b, t.type, 0)
    tie = opts[:tie_break] || :low
    scalars = [{elem, {}}, {t.type, {}}, {elem, {}}, {t.type, {}}]

    {region, b} =
      region(b, scalars, :isolated, fn b, [av, ai, bv, bi] ->
        arg_select(b, op, tie, av, ai, bv, bi)
      end)

    out_dims = Tuple.delete_at(x_dims, axis)
    types = [{elem, out_dims}, {t.type, out_dims}]
    {[_, i], b} = Ops.reduce(b, [x, idx], [init_v, init_i], [axis], types, region)
    Ops.reshape(b, i, dims(t))
  end

  def lower(:reduce, %T{data: %Expr{args: [x, acc, opts, fun]}} = t, b) do
    {x, b} = lower_as(x, t.type, b)
    {acc, b} = lower_as(acc, t.type, b)
    {region, b} = fun_region(fun, t.type, 2, b)
    axes = reduce_axes(x, opts[:axes])
    {_, x_dims} = x.type
    out = {t.type, delete_axes(x_dims, axes)}
    {[v], b} = Ops.reduce(b, [x], [acc], axes, [out], region)
    Ops.reshape(b, v, dims(t))
  end

  def lower(op, %T{data: %Expr{args: [x, window, opts]}} = t, b) when is_map_key(@windows, op) do
    {name, init} = @windows[op]
    {x, b} = lower_as(x, t.type, b)
    {init, b} = const(b, t.type, init_value(init, t.type))
    {region, b} = binary_region(b, t.type, name)
    {v, b} = reduce_window(b, x, init, window, opts, type_of(t), region)

    if op in [:window_max, :window_min] do
      nan_where_any(b, v, x, fn b, flags, no ->
        {region, b} = binary_region(b, :pred, "stablehlo.or")
        reduce_window(b, flags, no, window, opts, {:pred, dims(t)}, region)
      end)
    else
      {v, b}
    end
  end

  def lower(:window_reduce, %T{data: %Expr{args: [x, acc, window, opts, fun]}} = t, b) do
    {x, b} = lower_as(x, t.type, b)
    {acc, b} = lower_as(acc, t.type, b)
    {region, b} = fun_region(fun, t.type, 2, b)
    reduce_window(b, x, acc, window, opts, type_of(t), region)
  end

  def lower(op, %T{data: %Expr{args: [x, source, init, window, opts]}} = t, b)
      when op in [:window_scatter_max, :window_scatter_min] do
    {x, b} = lower_as(x, t.type, b)
    {source, b} = lower_as(source, t.type, b)
    {init, b} = lower_as(init, t.type, b)
    scalar = {t.type, {}}
    # Strict comparisons: on ties the later element of the window wins, as in Nx.
    direction = if op == :window_scatter_max, do: "GT", else: "LT"

    {select, b} =
      region(b, [scalar, scalar], :isolated, fn b, [l, r] ->
        with {p, b} <- Ops.compare(b, direction, l, r), do: {[p], b}
      end)

    {scatter, b} = binary_region(b, t.type, "stablehlo.add")
    rank = tuple_size(window)

    Ops.select_and_scatter(b, x, source, init, select, scatter,
      window_dimensions: Tuple.to_list(window),
      window_strides: opts[:strides] || List.duplicate(1, rank),
      padding: opts[:padding] || List.duplicate({0, 0}, rank)
    )
  end

  def lower(:sort, %T{data: %Expr{args: [x, opts]}} = t, b) do
    {x, b} = lower_as(x, t.type, b)
    {comparator, b} = comparator(b, x, nil, opts[:direction] || :asc)
    {[v], b} = Ops.sort(b, [x], opts[:axis] || 0, true, comparator)
    {v, b}
  end

  def lower(:argsort, %T{data: %Expr{args: [x, opts]}} = t, b) do
    {x, b} = lower_value(x, b)
    {_, x_dims} = x.type
    axis = opts[:axis] || 0
    {idx, b} = Ops.iota(b, {t.type, x_dims}, axis)
    {comparator, b} = comparator(b, x, t.type, opts[:direction] || :asc)
    {[_, i], b} = Ops.sort(b, [x, idx], axis, true, comparator)
    {i, b}
  end

  def lower(:map, %T{data: %Expr{args: [x, _opts, fun]}} = t, b) do
    {x, b} = lower_as(x, t.type, b)
    {region, b} = fun_region(fun, t.type, 1, b)
    Ops.map(b, [x], type_of(t), region)
  end

  ## Helpers

  # Max/min reductions give NaN where a reduced element is NaN, as in Nx.
  # XLA:CPU's fast min/max (the CPU plugin's default) drops NaN in its
  # vectorized reductions, and turning it off makes them serial (about 25x
  # slower on 4M f32). So the reduction stays as it is, and a second cheap
  # reduction of the NaN flags (an "or", `reduce_flags`) selects NaN where
  # one was found. XLA:CPU compiles the two reductions to two kernels (it
  # does not fuse sibling reductions); see `extremum_and_nan_flags/5` for
  # small inputs.
  defp nan_where_any(b, v, x, reduce_flags) do
    case x.type do
      {{kind, _}, _} when kind in [:f, :bf] ->
        {flags, b} = is_nan(b, x)
        {no, b} = const(b, :pred, 0)
        {any, b} = reduce_flags.(b, flags, no)
        {elem, dims} = v.type
        {nan, b} = const(b, elem, :nan, dims)
        Ops.select(b, any, nan, v)

      _ ->
        {v, b}
    end
  end

  # The float inputs of at most this many elements whose max/min and NaN
  # flags are reduced together. Measured on the CPU plugin, one reduction
  # of a pair compiles to one kernel instead of two (20-30 ms less compile
  # time per reduction), but XLA does not vectorize it: up to about 4,096
  # elements it runs as fast as the two (1,280 or 4,096 elements: within a
  # few microseconds), at 65,536 it is 40-50% slower and at 4M three times.
  # XLA:CPU fuses a reduction into a consumer of its own size, but not one
  # with two results: where the max/min is only used at its own size
  # (`reduce_max(x, axes: [1]) * 2`), the pair costs a kernel instead. Where
  # it is broadcast back over the reduced axes, as in softmax and logsumexp
  # (and their gradients, and the MLP training step: 22 kernels instead of
  # 23), it saves one.
  @paired_max_elements 4096

  defp small_float?(%{type: {{kind, _}, dims}}),
    do: kind in [:f, :bf] and Tuple.product(dims) <= @paired_max_elements

  # The max/min of `x` and whether a reduced element was NaN, in one
  # variadic reduction, then NaN where one was. The max/min is the same
  # reduction as without the flags: the results are the same bits.
  defp extremum_and_nan_flags(b, %{type: {elem, dims}} = x, init, name, axes) do
    {flags, b} = is_nan(b, x)
    {no, b} = const(b, :pred, 0)
    [scalar, flag] = [{elem, {}}, {:pred, {}}]

    {region, b} =
      region(b, [scalar, flag, scalar, flag], :isolated, fn b, [v1, nan1, v2, nan2] ->
        {v, b} = Ops.binary(b, name, v1, v2)
        {nan, b} = Ops.binary(b, "stablehlo.or", nan1, nan2)
        {[v, nan], b}
      end)

    out = delete_axes(dims, axes)
    types = [{elem, out}, {:pred, out}]
    {[v, any], b} = Ops.reduce(b, [x, flags], [init, no], axes, types, region)
    {nan, b} = const(b, elem, :nan, out)
    Ops.select(b, any, nan, v)
  end

  defp init_value(:min, type), do: min_value(type)
  defp init_value(:max, type), do: max_value(type)
  defp init_value(n, _type), do: n

  defp reduce_axes(%{type: {_, dims}}, nil), do: Enum.to_list(0..(tuple_size(dims) - 1)//1)
  defp reduce_axes(_x, axes), do: Enum.sort(axes)

  defp delete_axes(dims, axes) do
    dims
    |> Tuple.to_list()
    |> Enum.with_index()
    |> Enum.reject(fn {_, i} -> i in axes end)
    |> Enum.map(&elem(&1, 0))
    |> List.to_tuple()
  end

  defp binary_region(b, elem, name) do
    scalar = {elem, {}}

    region(b, [scalar, scalar], :isolated, fn b, [l, r] ->
      with {v, b} <- Ops.binary(b, name, l, r), do: {[v], b}
    end)
  end

  defp reduce_simple(b, %{type: {elem, dims}} = x, init, name, axes) do
    {region, b} = binary_region(b, elem, name)
    {[v], b} = Ops.reduce(b, [x], [init], axes, [{elem, delete_axes(dims, axes)}], region)
    {v, b}
  end

  # A region from a `:fun` expression whose parameters are scalars of `elem`.
  defp fun_region(%T{data: %Expr{op: :fun, args: [_params, body, _mfa]}}, elem, arity, b) do
    scalars = List.duplicate({elem, {}}, arity)

    region(b, scalars, :isolated, fn b, _args ->
      {v, b} = lower_as(body, elem, b)
      {[v], b}
    end)
  end

  defp reduce_window(b, x, init, window, opts, out_type, region) do
    rank = tuple_size(window)
    ones = List.duplicate(1, rank)

    {[v], b} =
      Ops.reduce_window(b, [x], [init], [out_type], region,
        window_dimensions: Tuple.to_list(window),
        window_strides: opts[:strides] || ones,
        base_dilations: ones,
        window_dilations: opts[:window_dilations] || ones,
        padding: opts[:padding] || List.duplicate({0, 0}, rank)
      )

    {v, b}
  end

  # Selects between (av, ai) and (bv, bi); NaN wins; ties by index.
  defp arg_select(b, op, tie, av, ai, bv, bi) do
    direction = if op == :argmax, do: "GT", else: "LT"
    {better, b} = Ops.compare(b, direction, av, bv)
    {eq, b} = Ops.compare(b, "EQ", av, bv)

    {better, eq, b} =
      case av.type do
        {{kind, _}, _} when kind in [:f, :bf] ->
          {a_nan, b} = is_nan(b, av)
          {b_nan, b} = is_nan(b, bv)
          {not_b_nan, b} = Ops.unary(b, "stablehlo.not", b_nan)
          {a_only, b} = Ops.binary(b, "stablehlo.and", a_nan, not_b_nan)
          {better, b} = Ops.binary(b, "stablehlo.or", better, a_only)
          {both, b} = Ops.binary(b, "stablehlo.and", a_nan, b_nan)
          {eq, b} = Ops.binary(b, "stablehlo.or", eq, both)
          {better, eq, b}

        _ ->
          {better, eq, b}
      end

    {idx_pref, b} = Ops.compare(b, if(tie == :low, do: "LT", else: "GT"), ai, bi)
    {tie_ok, b} = Ops.binary(b, "stablehlo.and", eq, idx_pref)
    {pick_a, b} = Ops.binary(b, "stablehlo.or", better, tie_ok)
    {v, b} = Ops.select(b, pick_a, av, bv)
    {i, b} = Ops.select(b, pick_a, ai, bi)
    {[v, i], b}
  end

  # A stable sort comparator on the first operand; NaN is the largest value.
  defp comparator(b, %{type: {elem, _}}, index_type, direction) do
    scalar = {elem, {}}

    types =
      if index_type,
        do: [scalar, scalar, {index_type, {}}, {index_type, {}}],
        else: [scalar, scalar]

    region(b, types, :isolated, fn b, [l, r | _] ->
      {first, second} = if direction == :asc, do: {l, r}, else: {r, l}
      {lt, b} = Ops.compare(b, "LT", first, second)

      case elem do
        {kind, _} when kind in [:f, :bf] ->
          {first_nan, b} = is_nan(b, first)
          {second_nan, b} = is_nan(b, second)
          {not_first_nan, b} = Ops.unary(b, "stablehlo.not", first_nan)
          {nan_last, b} = Ops.binary(b, "stablehlo.and", second_nan, not_first_nan)
          with {p, b} <- Ops.binary(b, "stablehlo.or", lt, nan_last), do: {[p], b}

        _ ->
          {[lt], b}
      end
    end)
  end
end
