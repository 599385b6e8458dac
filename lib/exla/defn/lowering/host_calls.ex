defmodule EXLA.Defn.Lowering.HostCalls do
  @moduledoc false

  # The MLIR of host callbacks: defn hooks (`hook/2,3`, `print_value/2`),
  # lazy inputs and stream data (internal). `EXLA.HostCallback` runs the
  # programs and serves the calls.
  #
  # A program with callbacks takes one extra, last parameter: a `ui64`
  # scalar, the *chain*, holding the id of the host-callback session of the
  # run. Each call becomes a `stablehlo.custom_call @exla_host_callback`
  # whose operands are the chain, a `ui32` constant naming its *site* and the
  # values handed to the host, and whose results are the chain again and the
  # values the host writes back (if any). Every call takes the chain returned
  # by the previous one, and `while` and `cond` carry it through their
  # results, so calls run in program order, also inside loops and branches.
  # Each site is recorded with a payload (`{:hook, name, fun, template}`,
  # `{:runtime_call, fun, template, out, opts}`, `{:input, index}`,
  # `:recv`, `:send`) in the state's `:hook_sites`; see
  # `EXLA.HostCallback` for what each one does at run time.
  #
  # ## Hooks
  #
  # A hook is active when the `:hooks` option or the hook itself gives it a
  # function; inactive hooks emit nothing. A `while` whose condition has
  # active hooks computes the condition before the loop and at the end of
  # its body, carrying the predicate with the chain, so the condition's hooks
  # are chained too and run each time the condition is evaluated (once more
  # than the body). Hooked values are sent in their own type, and a hook
  # receives them as they are in the program, as in EXLA 0.7.2: a vectorized
  # value arrives vectorized (`vectorized[x: 3]`), also inside a vectorized
  # `cond`. (`Nx.Defn.Evaluator` of Nx 0.7.2 differs: it hands vectorized
  # inputs over devectorized, the vectorized axes becoming named axes, and
  # raises on other vectorized values it has not computed yet.)
  #
  # ## Lazy inputs
  #
  # With `lazy_transfers: :always`, the inputs that are not on a device when
  # the function is called are not parameters: each one that is used is
  # lowered by `lower_input/3` where it is first needed: a site
  # `{:input, index}` tells the caller which input to send, and a receiving
  # site waits for it. Inputs already on a device are parameters, before the
  # chain (see `lazy_layout/2`); `EXLA.Defn` compiles a program for each set
  # of device inputs a function is called with.
  #
  # This module only emits MLIR, and knows no node of Nx: which nodes call
  # the host, on each Nx line, is `EXLA.Defn.Lowering.Hooks`'s business, and
  # the lowering of the hooked expressions stays in `EXLA.Defn.Lowering`,
  # which calls this module and is never called by it.

  alias EXLA.MLIR.Ops
  alias Nx.Defn.Composite

  @chain_type {EXLA.HostCallback.chain_type(), {}}
  @flag_type {{:u, 8}, {}}
  @target "exla_host_callback"

  @doc "The MLIR type of the chain."
  def chain_type, do: @chain_type

  @doc "The chain at this point of the program, or `nil` when it has none."
  def chain(b), do: b.assigns.chain

  @doc "Continues the program from `chain`."
  def put_chain(b, chain), do: %{b | assigns: %{b.assigns | chain: chain}}

  @doc """
  Emits a host-callback custom call with `values` at a new site, recording
  `{site, payload}` in the builder's `:hook_sites`. Returns `{results, b}`
  where results are the custom call's results after the chain.
  """
  def emit(b, payload, values, result_types \\ []) do
    %{chain: chain, hook_sites: sites} = b.assigns
    site = length(sites)
    {site_value, b} = Ops.constant(b, {:u, 32}, {}, site)
    operands = [chain, site_value | values]
    result_types = [@chain_type | result_types]

    attrs = [has_side_effect: "true", backend_config: "{}"]
    {[chain | results], b} = Ops.custom_call(b, @target, operands, result_types, attrs)

    assigns = %{b.assigns | chain: chain, hook_sites: [{site, payload} | sites]}
    {results, %{b | assigns: assigns}}
  end

  @doc """
  Emits the call of hook `name` running `fun` on `expr` (a container),
  whose flattened values the lowering gives as `values`.
  """
  def emit_hook(b, name, fun, expr, values) do
    {[], b} = emit_container(b, expr, values, &{:hook, name, fun, &1})
    b
  end

  @doc """
  Emits a host call (see `emit/4`) whose operands are the flattened
  `values` of `expr` (a container), each in its tensor's type, and whose
  payload is `payload` given `expr`'s template.
  """
  def emit_container(b, expr, values, payload, result_types \\ []) do
    {values, b} = EXLA.Defn.Lowering.convert_each(values, Composite.flatten_list([expr]), b)

    # The values are laid out devectorized, which is how a vectorized
    # template is filled back on the host.
    template = Composite.traverse(expr, &Nx.to_template/1)
    emit(b, payload.(template), values, result_types)
  end

  @doc """
  Emits a receiving site for values of `types` (MLIR types). Returns
  `{[flag | values], b}`: `flag` is a `ui8`, 1 when the host sent values,
  0 when it sent the done marker (the values are then zeros).
  """
  def emit_recv(b, types), do: emit(b, :recv, [], [@flag_type | types])

  @doc "Emits a site handing `values` to the caller as one output."
  def emit_send(b, values) do
    {[], b} = emit(b, :send, values)
    b
  end

  @doc """
  The parameter layout of a program with lazy inputs. `types` has one MLIR
  type per input and `lazy` is `true` (every input is lazy) or the list of
  the indices of the lazy inputs; the other inputs stay parameters.

  Returns `{parameter_types, layout}`: the types of the parameters (before
  the chain) and a tuple with, per input, its type when it is lazy or
  `{:parameter, position}` when it is a parameter.
  """
  def lazy_layout(types, true), do: lazy_layout(types, Enum.to_list(0..(length(types) - 1)//1))

  def lazy_layout(types, lazy) when is_list(lazy) do
    lazy = MapSet.new(lazy)

    {layout, params} =
      types
      |> Enum.with_index()
      |> Enum.map_reduce([], fn {type, i}, params ->
        if i in lazy,
          do: {type, params},
          else: {{:parameter, length(params)}, [type | params]}
      end)

    {Enum.reverse(params), List.to_tuple(layout)}
  end

  @doc """
  The inputs of a lowering with lazy inputs: `layout` from `lazy_layout/2`
  with each parameter's position replaced by its value in `args`.
  """
  def lazy_inputs(layout, args) do
    args = List.to_tuple(args)

    layout
    |> Tuple.to_list()
    |> Enum.map(fn
      {:parameter, position} -> elem(args, position)
      type -> type
    end)
    |> List.to_tuple()
  end

  @doc """
  Lowers input `index` of a program with lazy inputs. `input` is its entry
  in `lazy_inputs/2`: the parameter's value, returned as is, or the type of
  a lazy input, whose value is requested from the host at this point of the
  program. Two chained calls: a site `{:input, index}` that tells the
  caller which input is needed, then a receiving site that waits for the
  caller's answer. Returns `{value, b}`.
  """
  def lower_input(b, _index, %EXLA.MLIR.Value{} = input), do: {input, b}

  def lower_input(b, index, type) do
    {[], b} = emit(b, {:input, index}, [])
    {[_flag, value], b} = emit_recv(b, [type])
    {value, b}
  end
end
