defmodule EXLA.Defn.OpTable do
  @moduledoc false

  # The one table of the `Nx.Defn.Expr` ops EXLA lowers, for the compiled
  # Nx line: which lowering family lowers each op (the lowering's dispatch,
  # `EXLA.Defn.Lowering`), and, from it and the compiled Nx's
  # `Nx.Backend` behaviour, which callbacks `EXLA.Backend` implements as
  # that op compiled (`backend_ops/0`). Each family lists its ops for the
  # compiled line (`ops/0`), so that a new Nx line adds or changes
  # families, not this table's users.
  #
  # The program's structure (parameters, constants, `while`, `cond`, ...)
  # is lowered by `EXLA.Defn.Lowering` itself and is not in the table.

  alias EXLA.Defn.Lowering

  @families [
    Lowering.ElementWise,
    Lowering.Structure,
    Lowering.Reduction,
    Lowering.LinAlg,
    Lowering.Blocks,
    Lowering.Hooks
  ]

  @table Enum.reduce(@families, %{}, fn family, table ->
           Enum.reduce(family.ops(), table, fn op, table ->
             if Map.has_key?(table, op),
               do:
                 raise(
                   "#{inspect(op)} is lowered by #{inspect(table[op])} and #{inspect(family)}"
                 )

             Map.put(table, op, family)
           end)
         end)

  @backend_ops for(
                 {name, arity} <- EXLA.NxVersion.backend_callbacks(),
                 Map.has_key?(@table, name),
                 do: {name, arity - 1}
               )
               |> Enum.sort()

  @doc "The lowering families."
  def families, do: @families

  @doc "The family that lowers `op`, or `nil`."
  def family(op), do: Map.get(@table, op)

  @doc """
  The `Nx.Backend` callbacks of the compiled Nx that are ops of the table,
  as `{op, arity}` without the output argument: `EXLA.Backend` runs each as
  the op compiled. The callbacks that are not (creation, transfers,
  `optional`/`block`, pointers, ...) are written by hand.
  """
  def backend_ops, do: @backend_ops
end
