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
  alias EXLA.MLIR.Ops
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
    inputs = Composite.flatten_list([expr])

    {values, b} =
      Enum.zip(values, inputs)
      |> Enum.map_reduce(b, fn {v, t}, b -> Ops.convert(b, v, t.type) end)

    outputs = Composite.flatten_list([out])
    types = Enum.map(outputs, &type_of/1)
    template = Composite.traverse(expr, &Nx.to_template/1)
    payload = {:runtime_call, fun, template, Composite.traverse(out, &Nx.to_template/1), opts}
    {[], b} = HostCalls.emit(b, payload, values)
    {[_flag | results], b} = HostCalls.emit_recv(b, types)
    result(out, results, b)
  end

  defp result(%T{}, [value], b), do: {value, b}
  defp result(_container, values, b), do: {{:tuple, values}, b}

  # A token's hook: its expression is lowered (and dropped by XLA when the
  # hook is inactive) and handed to its function when active.
  defp lower_token_hook(%{expr: expr, name: name, callback: callback}, b) do
    {values, b} = lower_container(expr, b)

    case HostCalls.chain(b) && (b.assigns.hooks[name] || callback) do
      fun when is_function(fun) -> HostCalls.emit_hook(b, name, fun, expr, values)
      _ -> b
    end
  end

  defp call_hook(spec, expr, values, b) do
    case HostCalls.chain(b) && HostCalls.hook_spec_function(spec, b.assigns.hooks) do
      fun when is_function(fun) -> HostCalls.emit_hook(b, spec_name(spec), fun, expr, values)
      _ -> b
    end
  end

  defp spec_name({:named, name, _fun}), do: name
  defp spec_name(_spec), do: nil
end
