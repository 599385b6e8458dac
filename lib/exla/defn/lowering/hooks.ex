defmodule EXLA.Defn.Lowering.Hooks do
  @moduledoc false
  # The nodes that call the host (the host-calls family): hooks, carried by
  # tokens on Nx 0.7 and 0.12 (`:token`, `:attach_token`) and by `:hook`
  # nodes on Nx 0.13, and `Nx.runtime_call/4` (`:runtime_call`, Nx 0.12
  # and later). `EXLA.Defn.Lowering.HostCalls` emits their MLIR.
  #
  # A hook hands its values to its function on the host and lets them flow
  # on unchanged; it is inactive (the values only flow on) when neither the
  # `:hooks` option nor the hook gives it a function. On Nx 0.13 a hook runs
  # when its result is needed by the outputs, as in Nx.Defn.Evaluator. A
  # runtime call hands its input to its function on the host and the
  # program goes on with the function's result, which must match the
  # call's output template.

  alias EXLA.Defn.Lowering.HostCalls
  alias Nx.Defn.{Composite, Expr}
  alias Nx.Tensor, as: T
  import EXLA.Defn.Lowering

  @ops if(EXLA.NxVersion.tokens?(), do: [:token, :attach_token], else: []) ++
         if(EXLA.NxVersion.hook_nodes?(), do: [:hook], else: []) ++
         if(EXLA.NxVersion.runtime_calls?(), do: [:runtime_call], else: [])

  def ops, do: @ops

  def lower(:token, %T{data: %Expr{args: [token]}}, b) do
    b = token.hooks |> Enum.reverse() |> Enum.reduce(b, &lower_token_hook/2)
    {{:tuple, []}, b}
  end

  def lower(:attach_token, %T{data: %Expr{args: [token, expr]}}, b) do
    {_, b} = lower(token, b)
    lower(expr, b)
  end

  def lower(:hook, %T{data: %Expr{args: [expr, spec, _template, _ref]}}, b) do
    {values, b} = lower_container(expr, b)

    b =
      case spec do
        # Deprecated tokens (Nx 0.13): the hook sees its own expression.
        {:token_hook, hooked, inner} ->
          {hooked_values, b} = lower_container(hooked, b)
          call_hook(inner, hooked, hooked_values, b)

        spec ->
          call_hook(spec, expr, values, b)
      end

    result(expr, values, b)
  end

  def lower(:runtime_call, %T{data: %Expr{args: [expr, fun, out, opts]}}, b) do
    {values, b} = lower_container(expr, b)
    types = [out] |> Composite.flatten_list() |> Enum.map(&type_of/1)
    out_template = Composite.traverse(out, &Nx.to_template/1)
    payload = &{:runtime_call, fun, &1, out_template, opts}
    {[], b} = HostCalls.emit_container(b, expr, values, payload)
    {[_flag | results], b} = HostCalls.emit_recv(b, types)
    result(out, results, b)
  end

  defp result(%T{}, [value], b), do: {value, b}
  defp result(_container, values, b), do: {{:tuple, values}, b}

  # A token's hook: its expression is lowered (and dropped by XLA when the
  # hook is inactive) and handed to its function when active.
  defp lower_token_hook(%{expr: expr, name: name} = hook, b) do
    {values, b} = lower_container(expr, b)
    fun = HostCalls.token_hook_function(hook, b.assigns.hooks)
    emit_active(b, name, fun, expr, values)
  end

  defp call_hook(spec, expr, values, b) do
    fun = HostCalls.hook_spec_function(spec, b.assigns.hooks)
    emit_active(b, spec_name(spec), fun, expr, values)
  end

  # A hook calls the host where the program has a host-callback chain and
  # the hook a function.
  defp emit_active(b, name, fun, expr, values) do
    if HostCalls.chain(b) && is_function(fun),
      do: HostCalls.emit_hook(b, name, fun, expr, values),
      else: b
  end

  defp spec_name({:named, name, _fun}), do: name
  defp spec_name(_spec), do: nil
end
