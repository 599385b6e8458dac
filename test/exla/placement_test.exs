defmodule EXLA.PlacementTest do
  use ExUnit.Case, async: true

  alias EXLA.MLIR.{Builder, Facts, Ops}

  doctest EXLA.Placement
  doctest EXLA.MLIR.Facts
  doctest EXLA.MLIR.Type

  defmodule Loop do
    import Nx.Defn

    defn count(x) do
      {x} = while {x}, x < 10, do: {x + 1}
      x
    end
  end

  defp lower(fun, args, opts \\ []) do
    expr = apply(Nx.Defn.debug_expr(fun), args)
    shapes = Enum.map(args, &EXLA.Shape.make_shape(&1.type, &1.shape))
    EXLA.Defn.Lowering.to_mlir(expr, shapes, opts)
  end

  test "one table of element types: each is a type of the compiled Nx, with one MLIR name" do
    types = EXLA.Shape.element_types()

    for {type, code, name} <- types, type != {:pred, 8} do
      assert Nx.Type.normalize!(type) == type
      assert EXLA.MLIR.Type.element(type) == name
      assert EXLA.MLIR.Type.parse_element(name) == {:ok, type}
      assert EXLA.Shape.from_spec({code, []}).dtype == type
    end

    assert EXLA.MLIR.Type.parse_element("i1") == {:ok, :pred}
    assert types |> Enum.map(&elem(&1, 2)) |> Enum.uniq() |> length() == length(types)
    assert Enum.any?(types, &(elem(&1, 0) == {:f, 8})) == EXLA.NxVersion.small_types?()
  end

  test "the builder records the facts of each op as it emits it" do
    x = Nx.iota({4, 5}, type: :f32)
    %{program: program} = lower(&Nx.sum(Nx.exp(&1)), [x])

    # exp reads and writes 20 elements; the init constant writes one; the
    # reduce reads 20 and the init, and writes one; the add of its region
    # reads two scalars and writes one.
    assert program.facts ==
             %Facts{largest_tensor: 20, total_elements: 20 + 20 + 1 + 20 + 1 + 1 + 3}
  end

  test "loops and host callbacks make a program unbounded" do
    x = Nx.tensor(1.0)
    assert lower(&Loop.count/1, [x]).program.facts.unbounded == ["stablehlo.while"]

    hook = &Nx.Defn.Kernel.hook(Nx.add(&1, 1), :seen, fn _ -> :ok end)
    assert lower(hook, [x]).program.facts.unbounded == []

    assert lower(hook, [x], hooks: %{}).program.facts.unbounded == [
             "stablehlo.custom_call"
           ]
  end

  test "the program records its shapes and donated parameters" do
    x = Nx.iota({3}, type: :f32)
    %{program: program} = lower(fn a, _b, c -> Nx.add(a, c) end, [x, x, x], donate: [2])

    assert program.input_shapes == List.duplicate(EXLA.Shape.make_shape({:f, 32}, {3}), 2)
    assert program.output_shapes == [EXLA.Shape.make_shape({:f, 32}, {3})]
    # Input 2 is the second parameter, aliased to the only result.
    assert program.donated == %{1 => 0}
  end

  test "the builder writes argument, result and module attributes" do
    type = {{:f, 32}, {2}}

    {program, _b} =
      Builder.module("main", [type, type], fn b, [x, _y] -> {[x], b} end, %{},
        donated: [0],
        kept: fn _b -> [0] end,
        arg_attrs: [[{"mhlo.sharding", ~s("{replicated}")}], [{"unused", "1"}]],
        result_attrs: [[{"mhlo.sharding", ~s("{replicated}")}]],
        module_attrs: [{"mhlo.num_partitions", "2 : i32"}]
      )

    assert program.text == """
           module attributes {mhlo.num_partitions = 2 : i32} {
             func.func public @main(%arg0: tensor<2xf32> {tf.aliasing_output = 0 : i32, mhlo.sharding = "{replicated}"}) -> (tensor<2xf32> {mhlo.sharding = "{replicated}"}) {
               "func.return"(%arg0) : (tensor<2xf32>) -> ()
             }
           }
           """

    assert program.facts == %Facts{largest_tensor: 2}
  end

  test "a while emitted through Ops is recorded" do
    {program, _b} =
      Builder.module("main", [{{:s, 32}, {}}], fn b, [x] ->
        {[a], saved, b} = Builder.begin_region(b, [x.type])
        {pred, b} = Ops.compare(b, "LT", a, a)
        {cond_region, b} = Builder.end_region(b, saved, [pred])
        {[a], saved, b} = Builder.begin_region(b, [x.type])
        {body, b} = Builder.end_region(b, saved, [a])
        Ops.while(b, [x], cond_region, body)
      end)

    assert program.facts.unbounded == ["stablehlo.while"]
  end
end
