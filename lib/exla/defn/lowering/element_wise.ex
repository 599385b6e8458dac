defmodule EXLA.Defn.Lowering.ElementWise do
  @moduledoc false
  # Element-wise ops, conversions and creation ops (iota, eye).

  alias EXLA.MLIR.{Ops, Value}
  alias Nx.Defn.Expr
  alias Nx.Tensor, as: T
  import EXLA.Defn.Lowering

  @arith %{
    add: "stablehlo.add",
    subtract: "stablehlo.subtract",
    multiply: "stablehlo.multiply",
    divide: "stablehlo.divide",
    quotient: "stablehlo.divide",
    pow: "stablehlo.power",
    remainder: "stablehlo.remainder",
    atan2: "stablehlo.atan2",
    bitwise_and: "stablehlo.and",
    bitwise_or: "stablehlo.or",
    bitwise_xor: "stablehlo.xor",
    left_shift: "stablehlo.shift_left"
  }

  @extrema %{max: "stablehlo.maximum", min: "stablehlo.minimum"}

  @compare %{
    equal: "EQ",
    not_equal: "NE",
    greater: "GT",
    less: "LT",
    greater_equal: "GE",
    less_equal: "LE"
  }

  @logical %{
    logical_and: "stablehlo.and",
    logical_or: "stablehlo.or",
    logical_xor: "stablehlo.xor"
  }

  @float_unary %{
    exp: "stablehlo.exponential",
    expm1: "stablehlo.exponential_minus_one",
    log: "stablehlo.log",
    log1p: "stablehlo.log_plus_one",
    sigmoid: "stablehlo.logistic",
    cos: "stablehlo.cosine",
    sin: "stablehlo.sine",
    tan: "stablehlo.tan",
    tanh: "stablehlo.tanh",
    sqrt: "stablehlo.sqrt",
    rsqrt: "stablehlo.rsqrt",
    cbrt: "stablehlo.cbrt",
    cosh: "chlo.cosh",
    sinh: "chlo.sinh",
    acosh: "chlo.acosh",
    asinh: "chlo.asinh",
    atanh: "chlo.atanh",
    acos: "chlo.acos",
    asin: "chlo.asin",
    atan: "chlo.atan",
    erf: "chlo.erf",
    erfc: "chlo.erfc",
    erf_inv: "chlo.erf_inv"
  }

  @same_type_unary %{
    negate: "stablehlo.negate",
    bitwise_not: "stablehlo.not",
    population_count: "stablehlo.popcnt",
    count_leading_zeros: "stablehlo.count_leading_zeros"
  }

  @rounding %{
    floor: "stablehlo.floor",
    ceil: "stablehlo.ceil",
    round: "stablehlo.round_nearest_afz"
  }

  @other [:right_shift, :sign, :abs, :is_nan, :is_infinity, :real, :imag, :conjugate] ++
           [:bitcast, :as_type, :iota, :eye, :select, :clip]

  @ops Map.keys(@arith) ++
         Map.keys(@extrema) ++
         Map.keys(@compare) ++
         Map.keys(@logical) ++
         Map.keys(@float_unary) ++
         Map.keys(@same_type_unary) ++ Map.keys(@rounding) ++ @other

  def ops, do: @ops

  def lower(op, %T{data: %Expr{args: [x, y]}} = t, b) when is_map_key(@arith, op) do
    {x, y, b} = binary_args(x, y, t.type, dims(t), b)
    Ops.binary(b, @arith[op], x, y)
  end

  # A NaN operand gives NaN, as in Nx and StableHLO, whatever the compiler's
  # min/max mode (see EXLA.Defn.Lowering.propagate_nan/3).
  def lower(op, %T{data: %Expr{args: [x, y]}} = t, b) when is_map_key(@extrema, op) do
    {x, y, b} = binary_args(x, y, t.type, dims(t), b)
    {v, b} = Ops.binary(b, @extrema[op], x, y)
    {v, b} = propagate_nan(b, v, y)
    propagate_nan(b, v, x)
  end

  def lower(:right_shift, %T{data: %Expr{args: [x, y]}} = t, b) do
    {x, y, b} = binary_args(x, y, t.type, dims(t), b)

    name =
      case t.type do
        {:s, _} -> "stablehlo.shift_right_arithmetic"
        _ -> "stablehlo.shift_right_logical"
      end

    Ops.binary(b, name, x, y)
  end

  def lower(op, %T{data: %Expr{args: [x, y]}} = t, b) when is_map_key(@compare, op) do
    type = Nx.Type.merge(x.type, y.type)
    {x, y, b} = binary_args(x, y, type, dims(t), b)
    {p, b} = Ops.compare(b, @compare[op], x, y)
    from_pred(b, p, t.type)
  end

  def lower(op, %T{data: %Expr{args: [x, y]}} = t, b) when is_map_key(@logical, op) do
    {x, b} = lower_value(x, b)
    {y, b} = lower_value(y, b)
    {x, b} = to_pred(b, x)
    {y, b} = to_pred(b, y)
    {x, b} = broadcast(b, x, dims(t))
    {y, b} = broadcast(b, y, dims(t))
    {p, b} = Ops.binary(b, @logical[op], x, y)
    from_pred(b, p, t.type)
  end

  def lower(:cbrt, %T{data: %Expr{args: [x]}, type: {:c, _} = type} = t, b) do
    # XLA's cbrt is real only: use the principal root z ** (1/3)
    {x, b} = lower_as(x, type, b)
    {third, b} = const(b, type, 1 / 3, dims(t))
    Ops.binary(b, "stablehlo.power", x, third)
  end

  def lower(op, %T{data: %Expr{args: [x]}} = t, b) when is_map_key(@float_unary, op) do
    {x, b} = lower_as(x, t.type, b)
    Ops.unary(b, @float_unary[op], x)
  end

  def lower(op, %T{data: %Expr{args: [x]}} = t, b) when is_map_key(@same_type_unary, op) do
    {x, b} = lower_as(x, t.type, b)
    Ops.unary(b, @same_type_unary[op], x)
  end

  def lower(op, %T{data: %Expr{args: [x]}} = t, b) when is_map_key(@rounding, op) do
    {x, b} = lower_as(x, t.type, b)

    case t.type do
      {kind, _} when kind in [:s, :u] ->
        {x, b}

      _ ->
        Ops.unary(b, @rounding[op], x)
    end
  end

  def lower(:sign, %T{data: %Expr{args: [x]}, type: type} = t, b) do
    {x, b} = lower_as(x, type, b)

    case type do
      {:u, _} ->
        {zero, b} = const(b, type, 0, dims(t))
        {one, b} = const(b, type, 1, dims(t))
        {p, b} = Ops.compare(b, "NE", x, zero)
        Ops.select(b, p, one, zero)

      _ ->
        Ops.unary(b, "stablehlo.sign", x)
    end
  end

  def lower(:abs, %T{data: %Expr{args: [x]}, type: type}, b) do
    {x, b} = lower_value(x, b)

    case x.type do
      {{:u, _}, _} -> {x, b}
      {{:c, _}, _} -> Ops.abs(b, x)
      _ -> with {x, b} <- Ops.convert(b, x, type), do: Ops.abs(b, x)
    end
  end

  def lower(op, %T{data: %Expr{args: [x]}} = t, b) when op in [:is_nan, :is_infinity] do
    {x, b} = lower_value(x, b)

    case x.type do
      {{kind, _}, _} when kind in [:s, :u] ->
        const(b, t.type, 0, dims(t))

      _ ->
        {p, b} = if op == :is_nan, do: is_nan(b, x), else: is_inf(b, x)
        from_pred(b, p, t.type)
    end
  end

  def lower(:real, %T{data: %Expr{args: [x]}} = t, b) do
    {x, b} = lower_value(x, b)

    case x.type do
      {{:c, _}, _} -> Ops.real(b, x)
      _ -> Ops.convert(b, x, t.type)
    end
  end

  def lower(:imag, %T{data: %Expr{args: [x]}} = t, b) do
    {x, b} = lower_value(x, b)

    case x.type do
      {{:c, _}, _} -> Ops.imag(b, x)
      _ -> const(b, t.type, 0, dims(t))
    end
  end

  def lower(:conjugate, %T{data: %Expr{args: [x]}} = t, b) do
    {x, b} = lower_as(x, t.type, b)
    conjugate(b, x)
  end

  def lower(:bitcast, %T{data: %Expr{args: [x]}} = t, b) do
    {x, b} = lower_value(x, b)
    Ops.bitcast_convert(b, x, t.type)
  end

  def lower(:as_type, %T{data: %Expr{args: [x]}} = t, b) do
    {x, b} = lower_value(x, b)
    as_type(b, x, t.type)
  end

  def lower(:iota, %T{data: %Expr{args: [axis]}} = t, b) do
    dims = dims(t)
    index_type = if match?({k, _} when k in [:s, :u], t.type), do: t.type, else: {:s, 64}

    {v, b} =
      case axis do
        nil ->
          {v, b} = Ops.iota(b, {index_type, {Tuple.product(dims)}}, 0)
          Ops.reshape(b, v, dims)

        axis ->
          Ops.iota(b, {index_type, dims}, axis)
      end

    Ops.convert(b, v, t.type)
  end

  def lower(:eye, t, b) do
    dims = dims(t)
    rank = tuple_size(dims)
    {rows, b} = Ops.iota(b, {{:s, 64}, dims}, rank - 2)
    {cols, b} = Ops.iota(b, {{:s, 64}, dims}, rank - 1)
    {p, b} = Ops.compare(b, "EQ", rows, cols)
    Ops.convert(b, p, t.type)
  end

  def lower(:select, %T{data: %Expr{args: [pred, on_true, on_false]}} = t, b) do
    dims = dims(t)
    {p, b} = lower_value(pred, b)
    {p, b} = to_pred(b, p)
    {p, b} = broadcast(b, p, dims)
    {x, b} = lower_as(on_true, t.type, b, dims)
    {y, b} = lower_as(on_false, t.type, b, dims)
    Ops.select(b, p, x, y)
  end

  def lower(:clip, %T{data: %Expr{args: [x, min, max]}} = t, b) do
    dims = dims(t)
    {x, b} = lower_as(x, t.type, b, dims)
    {min, b} = lower_as(min, t.type, b, dims)
    {max, b} = lower_as(max, t.type, b, dims)
    Ops.clamp(b, min, x, max)
  end

  defp binary_args(x, y, type, dims, b) do
    {x, b} = lower_as(x, type, b, dims)
    {y, b} = lower_as(y, type, b, dims)
    {x, y, b}
  end

  @doc false
  # Nx's as_type: float to integer maps NaN to 0 and ±inf to the limits.
  def as_type(b, %Value{type: {elem, _}} = x, elem), do: {x, b}

  def as_type(b, %Value{type: {{:c, _}, _}} = x, {kind, _} = type) when kind != :c do
    {re, b} = Ops.real(b, x)
    as_type(b, re, type)
  end

  def as_type(b, %Value{type: {{kind, _}, dims}} = x, {int, _} = type)
      when kind in [:f, :bf] and int in [:s, :u] do
    {converted, b} = Ops.convert(b, x, type)
    {nan, b} = is_nan(b, x)
    {zero, b} = const(b, type, 0, dims)
    {res, b} = Ops.select(b, nan, zero, converted)
    {src_elem, _} = x.type
    {inf, b} = const(b, src_elem, :infinity, dims)
    {neg_inf, b} = const(b, src_elem, :neg_infinity, dims)
    {is_pos, b} = Ops.compare(b, "EQ", x, inf)
    {is_neg, b} = Ops.compare(b, "EQ", x, neg_inf)
    {max, b} = const(b, type, max_value(type), dims)
    {min, b} = const(b, type, min_value(type), dims)
    {res, b} = Ops.select(b, is_pos, max, res)
    Ops.select(b, is_neg, min, res)
  end

  def as_type(b, x, type), do: Ops.convert(b, x, type)

  @doc false
  # The complex conjugate of `x` (a complex value): StableHLO has no op.
  def conjugate(b, %Value{type: {{:c, _}, _}} = x) do
    {re, b} = Ops.real(b, x)
    {im, b} = Ops.imag(b, x)
    {im, b} = Ops.unary(b, "stablehlo.negate", im)
    Ops.complex(b, re, im)
  end
end
