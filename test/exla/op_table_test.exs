defmodule EXLA.OpTableTest do
  use ExUnit.Case, async: true

  alias EXLA.Defn.OpTable

  # The Nx.Backend behaviour of the Nx this project is compiled with: its
  # required callbacks (on Nx 0.7, EXLA serves the optional ones through
  # optional/3, itself optional there).
  @all EXLA.NxVersion.backend_callbacks()
  @callbacks @all -- Nx.Backend.behaviour_info(:optional_callbacks)

  test "EXLA.Backend implements exactly the callbacks of the compiled Nx" do
    defined = EXLA.Backend.__info__(:functions)

    assert @callbacks -- defined == []

    optional_defined =
      Enum.filter(Nx.Backend.behaviour_info(:optional_callbacks), &(&1 in defined))

    # On Nx 0.7, optional/3 and the decompositions whose :optional nodes
    # Nx's evaluator sends to the backend only where it exports them
    assert Enum.sort(optional_defined) ==
             if(EXLA.NxVersion.blocks?(),
               do: [],
               else: [cholesky: 2, eigh: 3, optional: 3, qr: 3, svd: 3]
             )

    # Callbacks of another Nx line are not defined (Nx 0.7's take/4 and
    # optional/3 on later lines, block/4 on Nx 0.7).
    other_lines = [take: 4, take_along_axis: 4, map: 4, lu: 3, optional: 3, block: 4, stack: 3]

    assert Enum.filter(other_lines, &(&1 in defined)) ==
             Enum.filter(other_lines, &(&1 in @all))
  end

  test "every callback that is an op of the table runs as that op" do
    for {op, arity} <- OpTable.backend_ops() do
      assert {op, arity + 1} in @all
      assert OpTable.family(op) != nil
    end

    # The callbacks that are not ops of the table are written by hand.
    not_ops =
      (@callbacks -- Enum.map(OpTable.backend_ops(), fn {op, arity} -> {op, arity + 1} end))
      |> Keyword.keys()
      |> Enum.sort()

    expected =
      [:backend_copy, :backend_deallocate, :backend_transfer, :constant, :from_binary] ++
        [:init, :inspect, :to_batched, :to_binary] ++
        if(EXLA.NxVersion.pointers?(), do: [:from_pointer, :to_pointer], else: [])

    assert not_ops == Enum.sort(expected)
  end

  test "every family lowers the ops it lists, and only one family lowers each op" do
    for family <- OpTable.families(), op <- family.ops() do
      assert OpTable.family(op) == family
    end
  end

  test "the line's own nodes are in the table" do
    line_ops =
      %{
        v0_7: [:optional, :lu, :token, :attach_token, :map, :take, :take_along_axis],
        v0_12: [:block, :token, :attach_token, :runtime_call, :stack],
        v0_13: [:block, :hook, :runtime_call, :stack]
      }[EXLA.NxVersion.line()]

    for op <- line_ops, do: assert(OpTable.family(op), "#{op} has no family")

    gone =
      [:optional, :lu, :token, :attach_token, :map, :take, :block, :hook, :runtime_call, :stack] --
        line_ops

    for op <- gone, do: refute(OpTable.family(op), "#{op} is not a node of this Nx")
  end
end
