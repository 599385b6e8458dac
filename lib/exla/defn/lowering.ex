defmodule EXLA.Defn.Lowering do
  @moduledoc false

  # Lowers an `Nx.Defn.Expr` container to a StableHLO MLIR module, returned
  # as an `EXLA.MLIR.Program` (its text and the facts recorded as it was
  # emitted).
  #
  # The entry point is `to_mlir/3`. The module has a single public function
  # `@main` that takes the flattened inputs it uses, in order, and returns the
  # flattened outputs as a multi-result function. Predicates (`{:u, 8}` in Nx)
  # are `ui8` at the boundary; comparisons produce `i1` internally.
  #
  # This module lowers the structure of a program (parameters, constants,
  # `while`, `cond`); every other op is lowered by the family
  # `EXLA.Defn.OpTable` names for it. Ops with a default implementation
  # (`:optional` on Nx 0.7, `:block` on Nx 0.12 and later) are lowered by
  # `EXLA.Defn.Lowering.Blocks`; hooks and runtime calls by
  # `EXLA.Defn.Lowering.Hooks`: with the `:hooks` option, active hooks
  # become host callbacks (see `EXLA.Defn.Lowering.HostCalls`), threaded in
  # program order through `while` and `cond`.
  #
  # A `cond` with one predicate becomes a `stablehlo.if`; with more, one flat
  # `stablehlo.case` whose branch is that of the first true predicate (all
  # the predicates are computed first, unless one after the first has active
  # hooks), so that a `cond` of hundreds of clauses compiles.
  #
  # Like Nx, `sort`/`argsort` are stable and order NaN as the largest value,
  # `window_scatter_max`/`window_scatter_min` pick the last of equal elements
  # in a window, and `max`/`min`, `reduce_max`/`reduce_min` and
  # `window_max`/`window_min` propagate NaN on every client (the CPU plugin's
  # fast min/max would drop it; see `propagate_nan/3`).
  #
  # Floats are computed in their own type: nothing is widened to f64, so a
  # program compiles for platforms without f64 (TPUs), with one exception:
  # on the host `qr` (a Householder QR, `EXLA.Defn.Lowering.QR`) computes
  # f32 in f64 (the `:qr_in_f64` option, which the caller takes from
  # `EXLA.Platform.qr_in_f64?/1`). `EXLA.Backend`'s eager ops are lowered
  # here too, so they are the ops jit emits.
  #
  # Where compiled code differs from Nx.BinaryBackend, users read it in the
  # README ("Where results differ from Nx.BinaryBackend"): a lowering change
  # that changes such a difference updates that list.

  alias EXLA.MLIR.{Builder, Check, Ops, Value}
  alias EXLA.Defn.Lowering.{Hooks, HostCalls}
  alias Nx.Defn.{Composite, Expr}
  alias Nx.Tensor, as: T

  # The run id: see lower_checked_while/4.
  @run_id_type {{:u, 64}, {}}

  @doc """
  Lowers `output_expr` (any Nx container of expression tensors) whose
  parameters are described by `input_shapes`.

  Returns `%{program: %EXLA.MLIR.Program{}, used_inputs: [index]}`, where
  the program's shapes are those of `@main`'s parameters (the chain
  included, lazy inputs left out) and results, its facts those the
  builder recorded, and `:used_inputs` the inputs the expression reads.
  `@main`'s parameters are the inputs it reads and the donated ones, in
  order: an input neither read nor donated is not a parameter, so
  callers never transfer it (nor build it, for a lazy container or a
  template).

  Options:

    * `:precision` - `:default`, `:high`, `:highest` or, on Nx 0.7.2,
      `:packed_nibble`; used by every `dot_general` and `convolution`
      (which cannot be lowered with `:packed_nibble`: StableHLO has no
      such precision)

    * `:hooks` - a map of hook functions by name. When given and the
      expression has active hooks, the module takes a `ui64` chain as its
      last parameter and the result has `:hook_sites` (site => payload)

    * `:lazy_inputs` - when `true`, the module takes only the chain and
      requests each used input from the host where it is first needed
      (see `EXLA.Defn.Lowering.HostCalls.lower_input/3`); when a list of input indices,
      only those inputs are requested and the others stay parameters
      (before the chain). Defaults to `false`

    * `:max_tensor_bytes` - the most bytes any tensor of the program may
      take (see `EXLA.Client.max_tensor_bytes/1`); a larger one raises
      `ArgumentError` naming its operation (see `EXLA.MLIR.Check`).
      Defaults to 2^47 (128 TiB)

    * `:qr_in_f64` - whether `qr` computes f32 in f64
      (`EXLA.Platform.qr_in_f64?/1`). Defaults to `false`

    * `:native_linalg` - whether QR, eigh, SVD, Cholesky, LU, solve and
      the determinant (from 4x4) are custom calls to the NIF's host kernels
      (`EXLA.Defn.Lowering.Decompositions`, `EXLA.Platform.native_linalg?/1`).
      Defaults to `false`

    * `:client` - the `EXLA.Client` the program is for, which
      `EXLA.CustomCall.call/4` receives. Defaults to `nil`

    * `:run_checks` - whether each `while` checks, at its head, that the
      run is still wanted (see lower_checked_while/4): the module then
      takes the run id, a `ui64` scalar, as its very last parameter when
      it has a loop, and the program's facts say so (`:run_checks`).
      Defaults to `false`

    * `:donate` - positions of the inputs whose buffers the program may
      reuse for its outputs: each parameter among them is aliased to an
      output of the same type (see `EXLA.MLIR.Builder.module/5`); lazy
      inputs are not parameters and are not aliased. Defaults to `[]`

    * `:arg_attrs`, `:result_attrs`, `:module_attrs` - attributes written
      on `@main`'s parameters (one list per input), on its results (one
      list per output) and on the module (see `EXLA.MLIR.Builder.module/5`),
      such as the sharding annotations of `EXLA.shard_jit/3`. Default to
      none

    * `:module_ops` - operations of the module written before `@main`
      (see `EXLA.MLIR.Builder.module/5`), such as the `sdy.mesh` of
      `EXLA.shard_jit/3` with an `Nx.Mesh`. Defaults to none

  The result's `:chain?` tells whether the module takes a chain.
  """
  def to_mlir(output_expr, input_shapes, opts \\ []) do
    state = new_state(opts)
    outputs = Composite.flatten_list([output_expr]) |> Enum.map(&Expr.tensor/1)
    arg_types = Enum.map(input_shapes, fn shape -> {shape.dtype, shape.dims} end)
    # With active hooks, the program takes the host-callback chain last.
    hooks = opts[:hooks]
    lazy? = opts[:lazy_inputs] not in [false, nil]
    chain? = lazy? or (hooks != nil and Hooks.active?(output_expr, hooks))
    # Lazy inputs are not parameters: the parameter tuple holds their types.
    {arg_types, lazy} =
      if lazy?,
        do: HostCalls.lazy_layout(arg_types, opts[:lazy_inputs]),
        else: {arg_types, nil}

    param_count = length(arg_types)
    arg_types = if chain?, do: arg_types ++ [HostCalls.chain_type()], else: arg_types
    # With run checks, the run id comes last; it is kept if a loop checks.
    checks? = state.run_checks?
    arg_types = if checks?, do: arg_types ++ [@run_id_type], else: arg_types
    assigns = %{state | lazy: lazy}
    donated = donated_parameters(opts[:donate] || [], lazy)

    {program, b} =
      Builder.module(
        "main",
        arg_types,
        fn b, args ->
          {args, run_id} = if checks?, do: Enum.split(args, -1), else: {args, [nil]}
          {args, chain} = if chain?, do: Enum.split(args, -1), else: {args, [nil]}
          params = if lazy, do: HostCalls.lazy_inputs(lazy, args), else: List.to_tuple(args)
          b = assign(b, params: params, chain: hd(chain), run_id: hd(run_id))

          Enum.map_reduce(outputs, b, fn t, b ->
            {v, b} = lower_value(t, b)
            Ops.convert(b, v, t.type)
          end)
        end,
        assigns,
        donated: donated,
        kept: &kept_params(&1, lazy, param_count, chain?, donated),
        arg_attrs: opts[:arg_attrs] || [],
        result_attrs: opts[:result_attrs] || [],
        module_attrs: opts[:module_attrs] || [],
        module_ops: opts[:module_ops] || []
      )

    checked? = b.assigns.run_checks > 0
    program = if checked?, do: put_in(program.facts.run_checks, true), else: program

    %{
      program: program,
      used_inputs: used_inputs(b),
      hook_sites: Map.new(b.assigns.hook_sites),
      chain?: chain?
    }
  end

  # The parameter positions of the donated inputs: the same without lazy
  # inputs, else those of the inputs that stay parameters.
  defp donated_parameters(inputs, nil), do: inputs

  defp donated_parameters(inputs, layout) do
    for i <- inputs, {:parameter, position} <- [elem(layout, i)], do: position
  end

  @doc """
  The options of `to_mlir/3` that `client` decides: `:max_tensor_bytes`,
  `:qr_in_f64`, `:native_linalg` and `:client`. Every lowering for a client (jit, `EXLA.Backend`,
  streams, `EXLA.shard_jit/3`) takes them from here, so that they all emit
  the same program for the same expression.
  """
  def client_options(%EXLA.Client{} = client) do
    [
      max_tensor_bytes: EXLA.Client.max_tensor_bytes(client),
      qr_in_f64: EXLA.Platform.qr_in_f64?(client.platform),
      native_linalg: EXLA.Platform.native_linalg?(client.platform),
      client: client
    ]
  end

  @doc """
  The state a lowering starts from (the builder's assigns), for callers
  that build their own module around lowered expressions, such as
  `EXLA.Defn.Stream`. Takes the options of `to_mlir/3` (`:lazy_inputs` is
  only validated: the layout is `to_mlir/3`'s business).
  """
  def new_state(opts) do
    opts =
      Keyword.validate!(opts, [
        :hooks,
        precision: :default,
        run_checks: false,
        lazy_inputs: false,
        max_tensor_bytes: EXLA.Platform.Discovery.address_space_bytes(),
        qr_in_f64: false,
        native_linalg: false,
        client: nil,
        donate: [],
        arg_attrs: [],
        result_attrs: [],
        module_attrs: [],
        module_ops: []
      ])

    precision = opts[:precision] || :default

    unless precision in EXLA.NxVersion.precisions() do
      raise ArgumentError, "unknown precision #{inspect(precision)}"
    end

    %{
      cache: %{},
      shared: %{},
      params: {},
      used: %{},
      top: true,
      precision: precision,
      hooks: opts[:hooks] || %{},
      chain: nil,
      hook_sites: [],
      lazy: nil,
      max_tensor_bytes: opts[:max_tensor_bytes],
      qr_in_f64: opts[:qr_in_f64],
      native_linalg: opts[:native_linalg],
      client: opts[:client],
      run_checks?: opts[:run_checks],
      # the run id in scope (see lower_checked_while/4), and the checks emitted
      run_id: nil,
      run_checks: 0
    }
  end

  # The parameters @main takes: the inputs the expression reads and the
  # donated ones (a donated buffer is given up by the run, read or not), in
  # order, then the chain. With lazy inputs the parameters are the inputs
  # already on a device, all kept.
  defp kept_params(b, lazy, count, chain?, donated) do
    inputs =
      if lazy,
        do: Enum.to_list(0..(count - 1)//1),
        else: Enum.sort(Enum.uniq(used_inputs(b) ++ donated))

    inputs = if chain?, do: inputs ++ [count], else: inputs
    run_id = if chain?, do: count + 1, else: count
    if b.assigns.run_checks > 0, do: inputs ++ [run_id], else: inputs
  end

  defp used_inputs(b), do: b.assigns.used |> Map.keys() |> Enum.sort()

  @doc """
  The positions of the inputs (root parameters) `expr`, a container of
  expressions, reads, found without lowering it; for callers that build
  their own module around it, such as `EXLA.Defn.Stream`.
  """
  def read_inputs(expr) do
    {_seen, inputs} = Composite.reduce(expr, {%{}, MapSet.new()}, &read_inputs/2)
    inputs
  end

  defp read_inputs(%T{data: %Expr{id: id} = expr} = t, {seen, inputs}) do
    case seen do
      %{^id => true} ->
        {seen, inputs}

      %{} ->
        inputs =
          case expr do
            %Expr{op: :parameter, context: :root, args: [i]} -> MapSet.put(inputs, i)
            _ -> inputs
          end

        # :scope leaves out the bodies of while, fun and optional, which
        # have parameters of their own (as the lowering's isolated scopes)
        acc = {Map.put(seen, id, true), inputs}
        {_args, acc} = Nx.Defn.Tree.apply_args(t, :scope, acc, &{&1, read_inputs(&1, &2)})
        acc
    end
  end

  ## State helpers

  defp assign(b, kv), do: %{b | assigns: Enum.into(kv, b.assigns)}

  # A node is lowered in the devectorized frame: Nx builds every op's
  # arguments (shapes, axes) there, with the vectorized axes leading, and
  # vectorizes only the struct of the result, so a node seen vectorized (an
  # output, or a value a hook or a cond holds) has the same arguments as
  # its devectorized self.
  defp devectorize(%T{vectorized_axes: []} = t), do: t

  defp devectorize(%T{names: names, vectorized_axes: axes} = t),
    do: %{t | shape: dims(t), names: Keyword.keys(axes) ++ names, vectorized_axes: []}

  @doc false
  def dims(%T{shape: shape, vectorized_axes: []}), do: shape

  def dims(%T{shape: shape, vectorized_axes: axes}),
    do: List.to_tuple(Keyword.values(axes) ++ Tuple.to_list(shape))

  @doc false
  def type_of(%T{type: type} = t), do: {type, dims(t)}

  # Runs `fun` in a scope that may see the outer cache; what is lowered
  # inside does not leak out.
  defp nested_scope(b, fun) do
    saved = b.assigns
    {res, b} = fun.(b)
    {res, %{b | assigns: kept_assigns(saved, b.assigns)}}
  end

  @doc false
  # Runs `fun` in an isolated scope with its own parameters.
  def isolated_scope(b, params, fun) do
    saved = b.assigns
    b = assign(b, cache: %{}, shared: %{}, params: List.to_tuple(params), top: false)
    {res, b} = fun.(b)
    {res, %{b | assigns: kept_assigns(saved, b.assigns)}}
  end

  # What a scope leaves to the enclosing one: the inputs read, the host
  # call sites and the run checks emitted.
  defp kept_assigns(saved, assigns) do
    %{saved | used: assigns.used, hook_sites: assigns.hook_sites, run_checks: assigns.run_checks}
  end

  # Emits a region; `fun.(b, args)` returns `{results, b}`.
  @doc false
  def region(b, arg_types, scope, fun) do
    {args, saved, b} = Builder.begin_region(b, arg_types)

    {results, b} =
      case scope do
        :isolated -> isolated_scope(b, args, &fun.(&1, args))
        :nested -> nested_scope(b, &fun.(&1, args))
      end

    Builder.end_region(b, saved, results)
  end

  ## Lowering

  @doc false
  # Lowers an expression to a value, or to `{:tuple, values}` for tuples.
  def lower(%T{data: %Expr{id: id, op: op}} = t, b) do
    case b.assigns.cache do
      %{^id => res} ->
        {res, b}

      _ ->
        t = devectorize(t)
        check!(op, t, b)
        {res, b} = lower_op(op, t, b)
        {res, assign(b, cache: Map.put(b.assigns.cache, id, res))}
    end
  end

  def lower(%T{} = t, b), do: lower(Expr.tensor(t), b)
  def lower(number, b) when is_number(number), do: lower(Expr.tensor(number), b)

  # Sizes the plugin cannot handle abort it, so they are refused here,
  # naming the operation (see EXLA.MLIR.Check).
  defp check!(op, %T{type: {kind, _} = type} = t, b) when kind != :tuple do
    Check.tensor_size!(op, {type, dims(t)}, b.assigns.max_tensor_bytes)
    if op in [:fft, :ifft], do: fft_length!(t)
  end

  defp check!(_op, _t, _b), do: :ok

  defp fft_length!(%T{data: %Expr{args: [_x, opts]}, shape: shape}) do
    axis = opts[:axis] || tuple_size(shape) - 1
    Check.fft_length!(opts[:length] || elem(shape, axis))
  end

  @doc false
  def lower_value(t, b) do
    case lower(t, b) do
      {%Value{} = v, b} -> {v, b}
      {other, _} -> raise ArgumentError, "expected a tensor value, got: #{inspect(other)}"
    end
  end

  # Lowers a container and returns the list of its flattened values.
  @doc false
  def lower_container(container, b) do
    [container]
    |> Composite.flatten_list()
    |> Enum.flat_map_reduce(b, fn t, b ->
      case lower(t, b) do
        {{:tuple, values}, b} -> {values, b}
        {v, b} -> {[v], b}
      end
    end)
  end

  # Converts each of `values` to the type of its tensor in `tensors`.
  @doc false
  def convert_each(values, tensors, b) do
    values
    |> Enum.zip(tensors)
    |> Enum.map_reduce(b, fn {v, t}, b -> Ops.convert(b, v, t.type) end)
  end

  # Lowers `t` and converts it to `elem`, broadcasting to `dims` if given.
  @doc false
  def lower_as(t, elem, b, dims \\ nil) do
    {v, b} =
      case exact_constant(t, elem) do
        {:ok, number} ->
          check!(:constant, %{t | type: elem}, b)
          const(b, elem, number, dims(t))

        :error ->
          {v, b} = lower_value(t, b)
          Ops.convert(b, v, elem)
      end

    if dims, do: broadcast(b, v, dims), else: {v, b}
  end

  # An integer constant (as `Nx.max(x, 0)` or the count of `Nx.mean` make)
  # whose value `elem` represents exactly is emitted in `elem`: converting
  # it at run time gives that same value, so the bits are the same and the
  # program has one op less. Its value is the number as its own type holds
  # it: Nx 0.12 and later type an integer literal s32 whatever its size
  # (`Nx.add(x, 2 ** 40 + 3)` adds 3, as Nx.BinaryBackend and EXLA.Backend
  # do), Nx 0.7 s64.
  defp exact_constant(%T{type: {kind, _} = from, data: %Expr{op: :constant, args: [n]}}, elem)
       when kind in [:s, :u] and is_integer(n) and from != elem do
    n = Ops.wrap_integer(from, n)
    if exact?(n, elem), do: {:ok, n}, else: :error
  end

  defp exact_constant(_t, _elem), do: :error

  # The largest integers floating-point types hold exactly (2^(mantissa bits + 1)).
  @exact_integers %{
    {:bf, 16} => 2 ** 8,
    {:f, 16} => 2 ** 11,
    {:f, 32} => 2 ** 24,
    {:f, 64} => 2 ** 53
  }

  defp exact?(n, {kind, _} = elem) when kind in [:s, :u],
    do: n >= min_value(elem) and n <= max_value(elem)

  defp exact?(n, elem) do
    case @exact_integers do
      %{^elem => limit} -> abs(n) <= limit
      %{} -> false
    end
  end

  ## Basic helpers

  @doc false
  def broadcast(b, %Value{type: {_, dims}} = v, dims), do: {v, b}

  def broadcast(b, %Value{type: {_, in_dims}} = v, dims) do
    offset = tuple_size(dims) - tuple_size(in_dims)
    axes = Enum.to_list(offset..(tuple_size(dims) - 1)//1)
    shared(b, {:broadcast, v.name, dims}, &Ops.broadcast_in_dim(&1, v, dims, axes))
  end

  @doc false
  def const(b, elem, number, dims \\ {}) do
    shared(b, {:constant, elem, dims, literal_key(number)}, &Ops.constant(&1, elem, dims, number))
  end

  # -0.0 and 0.0 are distinct constants (they are equal as map keys on
  # OTP 25).
  defp literal_key(number) when is_float(number), do: <<number::float-64>>
  defp literal_key(number), do: number

  # Constants and broadcasts are emitted once per scope and reused, as
  # lower/2 does for expressions (a nested scope sees its parent's, and
  # what it adds is dropped when it ends; an isolated scope starts empty).
  # XLA would merge the copies anyway; the text is shorter.
  defp shared(b, key, emit) do
    case b.assigns.shared do
      %{^key => value} ->
        {value, b}

      shared ->
        {value, b} = emit.(b)
        {value, assign(b, shared: Map.put(shared, key, value))}
    end
  end

  @doc false
  def to_pred(b, %Value{type: {:pred, _}} = v), do: {v, b}

  def to_pred(b, %Value{type: {elem, dims}} = v) do
    {zero, b} = const(b, elem, 0, dims)
    Ops.compare(b, "NE", v, zero)
  end

  @doc false
  def from_pred(b, v, elem \\ {:u, 8}), do: Ops.convert(b, v, elem)

  @doc false
  def min_value({:s, size}), do: -Integer.pow(2, size - 1)
  def min_value({:u, _}), do: 0
  def min_value(_), do: :neg_infinity

  @doc false
  def max_value({:s, size}), do: Integer.pow(2, size - 1) - 1
  def max_value({:u, size}), do: Integer.pow(2, size) - 1
  def max_value(_), do: :infinity

  @doc false
  def is_nan(b, %Value{type: {{:c, _}, _}} = v) do
    {re, b} = Ops.real(b, v)
    {im, b} = Ops.imag(b, v)
    {a, b} = Ops.compare(b, "NE", re, re)
    {c, b} = Ops.compare(b, "NE", im, im)
    Ops.binary(b, "stablehlo.or", a, c)
  end

  def is_nan(b, v), do: Ops.compare(b, "NE", v, v)

  @doc false
  def is_inf(b, %Value{type: {{:c, _}, _}} = v) do
    {re, b} = Ops.real(b, v)
    {im, b} = Ops.imag(b, v)
    {a, b} = is_inf(b, re)
    {c, b} = is_inf(b, im)
    Ops.binary(b, "stablehlo.or", a, c)
  end

  def is_inf(b, %Value{type: {elem, dims}} = v) do
    {abs, b} = Ops.abs(b, v)
    {inf, b} = const(b, elem, :infinity, dims)
    Ops.compare(b, "EQ", abs, inf)
  end

  @doc false
  # `v` where `x` is not NaN, `x` where it is. The CPU plugin compiles
  # maximum and minimum with XLA's fast min/max, which may drop a NaN
  # operand depending on vectorization; selecting the NaN explicitly makes
  # max/min propagate NaN on every client. Integers are returned as they are.
  def propagate_nan(b, v, %Value{type: {{kind, _}, _}} = x) when kind in [:f, :bf] do
    {nan?, b} = is_nan(b, x)
    Ops.select(b, nan?, x, v)
  end

  def propagate_nan(b, v, _x), do: {v, b}

  ## Parameters, constants and structure

  defp lower_op(:parameter, %T{data: %Expr{args: [i]}}, b) do
    %{params: params, top: top} = b.assigns

    if i >= tuple_size(params) do
      raise ArgumentError, "parameter #{i} is out of range (#{tuple_size(params)} inputs)"
    end

    b = if top, do: assign(b, used: Map.put(b.assigns.used, i, true)), else: b

    if top and b.assigns.lazy do
      HostCalls.lower_input(b, i, elem(params, i))
    else
      {elem(params, i), b}
    end
  end

  defp lower_op(:constant, %T{type: type, data: %Expr{args: [number]}} = t, b) do
    const(b, type, number, dims(t))
  end

  defp lower_op(:tensor, %T{type: type, data: %Expr{args: [tensor]}} = t, b) do
    dims = dims(t)

    if Tuple.product(dims) == 0 do
      {zero, b} = const(b, type, 0)
      broadcast(b, zero, dims)
    else
      Ops.constant_binary(b, type, dims, EXLA.Shape.to_device(Nx.to_binary(tensor), type))
    end
  end

  defp lower_op(:metadata, %T{data: %Expr{args: [expr, _meta]}}, b) do
    case expr do
      %T{} -> lower(expr, b)
      container -> with {values, b} <- lower_container(container, b), do: {{:tuple, values}, b}
    end
  end

  defp lower_op(:elem, %T{data: %Expr{args: [tuple, i]}}, b) do
    {{:tuple, values}, b} = lower(tuple, b)
    {Enum.fetch!(values, i), b}
  end

  defp lower_op(:fun, _t, _b) do
    raise ArgumentError, "anonymous functions can only be lowered as arguments of other ops"
  end

  defp lower_op(:while, %T{data: %Expr{args: [initial, _arg, condition, block]}}, b) do
    {inits, b} = lower_container(initial, b)
    chain = b.assigns.chain

    {results, b} =
      cond do
        b.assigns.run_id ->
          lower_checked_while(inits, condition, block, b)

        chain && Hooks.active?(condition, b.assigns.hooks) ->
          lower_hooked_while(inits, condition, block, b)

        true ->
          lower_while(inits, condition, block, b)
      end

    case initial do
      %T{} -> {hd(results), b}
      _ -> {{:tuple, results}, b}
    end
  end

  defp lower_op(:cond, %T{data: %Expr{args: [clauses, last]}} = t, b) do
    types =
      case t.type do
        {:tuple, _} -> [last] |> Composite.flatten_list() |> Enum.map(&type_of/1)
        _ -> [type_of(t)]
      end

    chain = b.assigns.chain

    {results, b} =
      if types == [] and chain == nil do
        {[], b}
      else
        lower_cond(clauses, last, types, b)
      end

    {results, b} = take_chain(results, chain, b)

    case t.type do
      {:tuple, _} -> {{:tuple, results}, b}
      _ -> {hd(results), b}
    end
  end

  # Every other op is lowered by the family EXLA.Defn.OpTable names.
  defp lower_op(op, t, b) do
    case EXLA.Defn.OpTable.family(op) do
      nil -> raise ArgumentError, "EXLA cannot lower Nx.Defn.Expr op #{inspect(op)}"
      family -> family.lower(op, t, b)
    end
  end

  # The hook chain, if any, is carried as the last loop value.
  defp lower_while(inits, condition, block, b) do
    chain = b.assigns.chain
    inits = if chain, do: inits ++ [chain], else: inits
    types = Enum.map(inits, & &1.type)

    {cond_region, b} = condition_region(b, types, condition)

    {body_region, b} =
      region(b, types, :isolated, fn b, args ->
        b = if chain, do: assign(b, chain: List.last(args)), else: b
        {values, b} = lower_body(block, types, b)
        {with_chain(values, b), b}
      end)

    {results, b} = Ops.while(b, inits, cond_region, body_region)
    take_chain(results, chain, b)
  end

  # A condition with active hooks must take the chain and hand it on, which
  # a while's condition region cannot (it returns only the predicate). So
  # the condition is lowered once before the loop and again at the end of
  # the body, for the next iteration's values; the loop carries the chain
  # and that predicate, and its condition region just reads the predicate.
  # The condition's hooks run as often, and in the same order relative to
  # the body's, as the condition is evaluated.
  defp lower_hooked_while(inits, condition, block, b) do
    {pred, b} = lower_condition(condition, inits, b)
    state = inits ++ [b.assigns.chain, pred]
    types = Enum.map(state, & &1.type)

    {cond_region, b} = region(b, types, :isolated, fn b, args -> {[List.last(args)], b} end)

    {body_region, b} =
      region(b, types, :isolated, fn b, args ->
        b = assign(b, chain: Enum.at(args, -2))
        {values, b} = lower_body(block, types, b)
        {pred, b} = lower_condition(condition, values, b)
        {values ++ [b.assigns.chain, pred], b}
      end)

    {results, b} = Ops.while(b, state, cond_region, body_region)
    {results, [chain, _pred]} = Enum.split(results, -2)
    {results, assign(b, chain: chain)}
  end

  # A loop of a program whose runs may be stopped (the `:run_checks`
  # option): the head of each outer iteration calls the run check
  # (`exla_run_check`, see native/exla/src/cancel.rs), which fails the run
  # once nobody waits for it any more and returns how many iterations to
  # run before the next check (the stride), which an inner loop runs. A
  # check costs about 70 ns, and breaks the native loop XLA:CPU makes of a
  # small body: checking each iteration made such loops 10 times slower.
  # The handler picks strides so that checks come about 50 µs apart (each
  # iteration when one takes longer), from the time of the loop's last
  # check, which the loop carries with the stride.
  #
  # A condition with hooks, or a large one, is lowered as in
  # lower_hooked_while/4: before the loop and at the end of each
  # iteration, its predicate carried, so it is evaluated as often as
  # without checks, its hooks (if any) run as often, and the outer loop
  # knows why the inner one ended. The run id and the chain go down the
  # loops, and nested loops check with the same id.
  defp lower_checked_while(inits, condition, block, b) do
    if cheap_condition?(condition, b),
      do: lower_checked_while_cheap(inits, condition, block, b),
      else: lower_checked_while_carried(inits, condition, block, b)
  end

  # A condition without active hooks whose tensors all have at most 1,024
  # elements (a scalar comparison, as most loops have) is evaluated by the
  # loops' condition regions, as lower_while/4 does: the inner loop's is
  # `condition and count < stride`, and the outer loop's evaluates it once
  # more per stride. XLA:CPU then keeps the native loop it makes of a small
  # body (carrying the predicate instead made a scalar loop 5 times
  # slower); the extra evaluation costs a microsecond at most, once per
  # stride, which is at least 50 µs (or one iteration when longer).
  @cheap_condition_elements 1024

  defp cheap_condition?(condition, b) do
    hooked? = b.assigns.chain != nil and Hooks.active?(condition, b.assigns.hooks)
    not hooked? and small_tensors?(condition)
  end

  defp small_tensors?(expr) do
    expr |> Composite.reduce({%{}, true}, &small_tensors?/2) |> elem(1)
  end

  defp small_tensors?(_t, {_seen, false} = acc), do: acc

  defp small_tensors?(%T{data: %Expr{id: id}} = t, {seen, true} = acc) do
    cond do
      Map.has_key?(seen, id) ->
        acc

      Tuple.product(dims(t)) > @cheap_condition_elements ->
        {seen, false}

      true ->
        {_args, acc} =
          Nx.Defn.Tree.apply_args(t, :scope, {Map.put(seen, id, true), true}, fn arg, acc ->
            {arg, small_tensors?(arg, acc)}
          end)

        acc
    end
  end

  defp lower_checked_while_cheap(inits, condition, block, b) do
    {carried, chained} = with_chain_value(inits, b)
    {check, b} = check_state(b)
    state = carried ++ check
    types = Enum.map(state, & &1.type)
    {cond_region, b} = condition_region(b, types, condition)

    {body_region, b} =
      region(b, types, :isolated, fn b, args ->
        {values, [id, last, stride]} = Enum.split(args, -3)
        {[now, stride], b} = run_check(b, id, last, stride)
        stride_args = {condition, block, chained}
        {values, b} = lower_cheap_stride(values, id, stride, stride_args, b)
        {values ++ [id, now, stride], b}
      end)

    {results, b} = Ops.while(b, state, cond_region, body_region)
    {results, _check_state} = Enum.split(results, -3)
    take_chain(results, b.assigns.chain, b)
  end

  # The loop values, with the chain last when there is one, and how many
  # chains that is (0 or 1).
  defp with_chain_value(values, %{assigns: %{chain: nil}}), do: {values, 0}
  defp with_chain_value(values, %{assigns: %{chain: chain}}), do: {values ++ [chain], 1}

  # The values a checked loop carries for its checks: the run id, the time
  # of the last check (0: none yet) and the stride (1 at first).
  defp check_state(b) do
    {never, b} = Ops.constant(b, {:u, 64}, {}, 0)
    {one, b} = Ops.constant(b, {:s, 64}, {}, 1)
    {[b.assigns.run_id, never, one], b}
  end

  # A loop's condition region, the condition lowered on its arguments.
  defp condition_region(b, types, condition) do
    region(b, types, :isolated, fn b, _args ->
      {pred, b} = lower_pred(condition, b)
      {[pred], b}
    end)
  end

  # The inner loop of lower_checked_while_cheap/4: up to `stride`
  # iterations of the body while the condition holds.
  defp lower_cheap_stride(values, id, stride, {condition, block, chained}, b) do
    {zero, b} = Ops.constant(b, {:s, 64}, {}, 0)
    state = values ++ [id, zero, stride]
    types = Enum.map(state, & &1.type)
    loop_types = Enum.drop(types, -(3 + chained))

    {cond_region, b} =
      region(b, types, :isolated, fn b, args ->
        [count, stride] = Enum.take(args, -2)
        {pred, b} = lower_pred(condition, b)
        {go, b} = within_stride(b, pred, count, stride)
        {[go], b}
      end)

    {body_region, b} =
      region(b, types, :isolated, fn b, args ->
        {values, [id, count, stride]} = Enum.split(args, -3)
        {values, count, b} = stride_iteration(b, values, {id, count}, block, loop_types)
        {values ++ [id, count, stride], b}
      end)

    {results, b} = Ops.while(b, state, cond_region, body_region)
    {values, _stride_state} = Enum.split(results, -3)
    {values, b}
  end

  defp lower_checked_while_carried(inits, condition, block, b) do
    {pred, b} = lower_condition(condition, inits, b)
    {carried, chained} = with_chain_value(inits, b)
    {check, b} = check_state(b)
    state = carried ++ check ++ [pred]
    types = Enum.map(state, & &1.type)

    {cond_region, b} = region(b, types, :isolated, fn b, args -> {[List.last(args)], b} end)

    {body_region, b} =
      region(b, types, :isolated, fn b, args ->
        {values, [id, last, stride, pred]} = Enum.split(args, -4)
        {[now, stride], b} = run_check(b, id, last, stride)
        {values, b} = lower_stride(values, id, stride, pred, {condition, block, chained}, b)
        {values, [pred]} = Enum.split(values, -1)
        {values ++ [id, now, stride, pred], b}
      end)

    {results, b} = Ops.while(b, state, cond_region, body_region)
    {results, _check_state} = Enum.split(results, -4)
    take_chain(results, b.assigns.chain, b)
  end

  @run_check_types [{{:u, 64}, {}}, {{:s, 64}, {}}]

  defp run_check(b, id, last, stride) do
    attrs = [has_side_effect: "true", backend_config: "{}"]

    {results, b} =
      Ops.custom_call(b, "exla_run_check", [id, last, stride], @run_check_types, attrs)

    {results, assign(b, run_checks: b.assigns.run_checks + 1)}
  end

  # The inner loop of lower_checked_while/4: up to `stride` iterations of
  # the body while the carried predicate holds. Returns the loop's values
  # (the chain last, when there is one) and the last predicate.
  defp lower_stride(values, id, stride, pred, {condition, block, chained}, b) do
    {zero, b} = Ops.constant(b, {:s, 64}, {}, 0)
    state = values ++ [id, zero, stride, pred]
    types = Enum.map(state, & &1.type)
    loop_types = Enum.drop(types, -(4 + chained))

    {cond_region, b} =
      region(b, types, :isolated, fn b, args ->
        [count, stride, pred] = Enum.take(args, -3)
        {go, b} = within_stride(b, pred, count, stride)
        {[go], b}
      end)

    {body_region, b} =
      region(b, types, :isolated, fn b, args ->
        {values, [id, count, stride, _pred]} = Enum.split(args, -4)
        {values, count, b} = stride_iteration(b, values, {id, count}, block, loop_types)
        {loop_values, _chain} = Enum.split(values, length(loop_types))
        {pred, b} = lower_condition(condition, loop_values, b)
        {with_chain(loop_values, b) ++ [id, count, stride, pred], b}
      end)

    {results, b} = Ops.while(b, state, cond_region, body_region)
    {values, [_id, _count, _stride, pred]} = Enum.split(results, -4)
    {values ++ [pred], b}
  end

  # Whether an inner loop goes on: `pred` holds and `count` < `stride`.
  defp within_stride(b, pred, count, stride) do
    {more, b} = Ops.compare(b, "LT", count, stride)
    Ops.binary(b, "stablehlo.and", pred, more)
  end

  # One iteration of an inner loop: the body on the loop's values (the
  # chain last when there is one, as `loop_types` tells), with the run id
  # of the region's arguments; returns the new values (the chain last) and
  # the count, one more.
  defp stride_iteration(b, values, {id, count}, block, loop_types) do
    chain = if length(values) > length(loop_types), do: List.last(values)
    b = assign(b, run_id: id, chain: chain)
    {values, b} = lower_body(block, loop_types, b)
    {one, b} = Ops.constant(b, {:s, 64}, {}, 1)
    {count, b} = Ops.binary(b, "stablehlo.add", count, one)
    {with_chain(values, b), count, b}
  end

  # Lowers `condition` on `values` (the loop state) to an i1 predicate,
  # keeping the chain its hooks leave.
  defp lower_condition(condition, values, b) do
    {{pred, chain}, b} =
      isolated_scope(b, values, fn b ->
        {pred, b} = lower_pred(condition, b)
        {{pred, b.assigns.chain}, b}
      end)

    {pred, assign(b, chain: chain)}
  end

  defp lower_pred(condition, b) do
    {v, b} = lower_value(condition, b)
    to_pred(b, v)
  end

  # Lowers a loop body, converting each value to its loop type.
  defp lower_body(block, types, b) do
    {values, b} = lower_container(block, b)

    Enum.zip(values, types)
    |> Enum.map_reduce(b, fn {v, {elem, _}}, b -> Ops.convert(b, v, elem) end)
  end

  # The hook chain is carried as the last result of while and cond.
  defp with_chain(values, %{assigns: %{chain: nil}}), do: values
  defp with_chain(values, %{assigns: %{chain: chain}}), do: values ++ [chain]

  defp take_chain(results, nil, b), do: {results, b}

  defp take_chain(results, _chain, b) do
    {results, [chain]} = Enum.split(results, -1)
    {results, assign(b, chain: chain)}
  end

  # One predicate becomes a stablehlo.if. More become one flat
  # stablehlo.case that takes the branch of the first true predicate (the
  # last branch when none is): nested ifs, one level per clause, overflow
  # the compiler's stack from about 28 clauses. All the predicates are then
  # computed before a branch is taken, so when a predicate after the first
  # has active hooks (which must run only when it is reached), ifs are
  # nested as before.
  defp lower_cond([_, _ | _] = clauses, last, types, b) do
    if hooked_predicates?(tl(clauses), b),
      do: lower_nested_if(clauses, last, types, b),
      else: lower_case(clauses, last, types, b)
  end

  defp lower_cond(clauses, last, types, b), do: lower_nested_if(clauses, last, types, b)

  defp hooked_predicates?(clauses, b) do
    b.assigns.chain != nil and
      Enum.any?(clauses, fn {pred, _} -> Hooks.active?(pred, b.assigns.hooks) end)
  end

  defp lower_case(clauses, last, types, b) do
    {index, b} = first_true(Enum.map(clauses, &elem(&1, 0)), b)

    {branches, b} =
      Enum.map_reduce(Enum.map(clauses, &elem(&1, 1)) ++ [last], b, fn body, b ->
        region(b, [], :nested, fn b, [] -> lower_branch(body, types, b) end)
      end)

    chain_types = if b.assigns.chain, do: [HostCalls.chain_type()], else: []
    Ops.case_(b, index, types ++ chain_types, branches)
  end

  # The index of the first true predicate, or their count when none is: the
  # predicates side by side, their positions where true and the count
  # elsewhere, and the minimum of those.
  defp first_true(preds, b) do
    count = length(preds)
    index_type = {{:s, 32}, {}}

    {flags, b} =
      Enum.map_reduce(preds, b, fn pred, b ->
        {p, b} = lower_pred(pred, b)
        Ops.reshape(b, p, {1})
      end)

    {flags, b} = Ops.concatenate(b, flags, 0)
    {positions, b} = Ops.iota(b, {{:s, 32}, {count}}, 0)
    {none, b} = const(b, {:s, 32}, count, {count})
    {candidates, b} = Ops.select(b, flags, positions, none)
    {init, b} = const(b, {:s, 32}, count)

    {min, b} =
      region(b, [index_type, index_type], :isolated, fn b, [x, y] ->
        {v, b} = Ops.binary(b, "stablehlo.minimum", x, y)
        {[v], b}
      end)

    {[index], b} = Ops.reduce(b, [candidates], [init], [0], [index_type], min)
    {index, b}
  end

  defp lower_nested_if([], last, types, b), do: lower_branch(last, types, b)

  defp lower_nested_if([{pred, body} | rest], last, types, b) do
    {p, b} = lower_value(pred, b)
    {p, b} = to_pred(b, p)
    {then_region, b} = region(b, [], :nested, fn b, [] -> lower_branch(body, types, b) end)

    {else_region, b} =
      region(b, [], :nested, fn b, [] -> lower_nested_if(rest, last, types, b) end)

    chain_types = if b.assigns.chain, do: [HostCalls.chain_type()], else: []
    Ops.if_(b, p, types ++ chain_types, then_region, else_region)
  end

  defp lower_branch(body, types, b) do
    {values, b} = lower_container(body, b)

    {values, b} =
      Enum.zip(values, types)
      |> Enum.map_reduce(b, fn {v, {elem, dims}}, b ->
        {v, b} = Ops.convert(b, v, elem)
        broadcast(b, v, dims)
      end)

    {with_chain(values, b), b}
  end
end
