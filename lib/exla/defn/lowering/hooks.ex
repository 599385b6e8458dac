defmodule EXLA.Defn.Lowering.Hooks do
  @moduledoc false
  # The hooks family: the nodes that call the host, which this module alone
  # knows, on each Nx line as `EXLA.NxVersion` says (`@ops`): hooks, carried
  # by tokens on Nx 0.7 and 0.12 (`:token`, `:attach_token`) and by `:hook`
  # nodes on Nx 0.13, and `Nx.runtime_call/4` (`:runtime_call`, Nx 0.12
  # and later). It lowers them, and says whether an expression has one
  # that calls the host (`active?/2`); `EXLA.Defn.Lowering.HostCalls`
  # emits the MLIR of the calls, knowing no node.
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

  @doc """
  Whether `expr` calls the host: it has a hook that `hooks` or its own
  callback activates (on a token, or a `:hook` node of Nx 0.13), or a
  runtime call (Nx 0.12 and later).
  """
  def active?(expr, hooks) do
    Composite.reduce(expr, %{}, &detect(&1, &2, hooks))
    false
  catch
    :throw, {__MODULE__, :active} -> true
  end

  defp detect(%T{data: %Expr{id: id} = expr} = t, seen, hooks) do
    case seen do
      %{^id => _} ->
        seen

      %{} ->
        if calls_host?(expr, hooks), do: throw({__MODULE__, :active})
        {_, seen} = Nx.Defn.Tree.apply_args(t, seen, &{&1, detect(&1, &2, hooks)})
        Map.put(seen, id, true)
    end
  end

  # Only the nodes of this family on the compiled Nx (@ops) call the host;
  # an :attach_token's token is a node of its own.
  defp calls_host?(%Expr{op: op, args: args}, hooks) when op in @ops,
    do: host_call?(op, args, hooks)

  defp calls_host?(%Expr{}, _hooks), do: false

  defp host_call?(:token, [token], hooks),
    do: Enum.any?(token.hooks, &token_hook_function(&1, hooks))

  defp host_call?(:attach_token, _args, _hooks), do: false
  defp host_call?(:hook, [_expr, spec | _], hooks), do: hook_spec_function(spec, hooks) != nil
  defp host_call?(:runtime_call, _args, _hooks), do: true

  # The function of a `:hook` node's callback spec (Nx 0.13), given the
  # `:hooks` option, or `nil` when the hook is inactive.
  defp hook_spec_function({:named, name, fun}, hooks), do: hooks[name] || fun
  defp hook_spec_function({:fn, fun}, _hooks), do: fun

  defp hook_spec_function({:token_hook, _expr, inner}, hooks),
    do: hook_spec_function(inner, hooks)

  # The function of a token's hook (Nx 0.7 and 0.12), given the `:hooks`
  # option, or `nil` when the hook is inactive.
  defp token_hook_function(%{name: name, callback: callback}, hooks), do: hooks[name] || callback

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
    fun = token_hook_function(hook, b.assigns.hooks)
    emit_active(b, name, fun, expr, values)
  end

  defp call_hook(spec, expr, values, b) do
    fun = hook_spec_function(spec, b.assigns.hooks)
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
