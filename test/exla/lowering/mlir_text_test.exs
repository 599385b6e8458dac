defmodule EXLA.Lowering.MLIRTextTest do
  use EXLA.LoweringCase, async: true

  alias EXLA.Defn.Lowering

  @x Nx.iota({2, 3}, type: :f32)
  @v Nx.tensor([1, 2, 3], type: :s64)

  test "main takes the inputs it uses in order and returns a multi-result function" do
    %{program: %{text: text, output_shapes: shapes}, used_inputs: used} =
      lower(fn a, _b, c -> {Nx.add(a, 1), Nx.multiply(c, 2)} end, [@x, @v, @v])

    assert text =~
             "func.func public @main(%arg0: tensor<2x3xf32>, " <>
               "%arg2: tensor<3xi64>) -> (tensor<2x3xf32>, tensor<3xi64>)"

    assert shapes == [
             EXLA.Shape.make_shape({:f, 32}, {2, 3}),
             EXLA.Shape.make_shape({:s, 64}, {3})
           ]

    assert used == [0, 2]
    refute text =~ "tuple"
  end

  test "containers are flattened in Composite order" do
    %{program: %{output_shapes: shapes}} =
      lower(fn a, b -> %{z: a, a: {b, Nx.sum(a)}} end, [@x, @v])

    assert Enum.map(shapes, & &1.dims) == [{3}, {}, {2, 3}]
  end

  test "output is deterministic" do
    fun = fn a, b -> Nx.dot(Nx.exp(a), Nx.as_type(b, :f32)) |> Nx.sort() end
    assert mlir(fun, [@x, @v]) == mlir(fun, [@x, @v])
  end

  test "shared subexpressions are lowered once" do
    text =
      mlir(
        fn a ->
          e = Nx.exp(a)
          Nx.add(e, e)
        end,
        [@x]
      )

    assert length(String.split(text, "stablehlo.exponential")) == 2
  end

  describe "constants" do
    @edges Nx.tensor([-0.0, 0.0, -1.5, 2.5, :nan, :infinity, :neg_infinity, 1.0e30], type: :f32)

    defp bits(tensors), do: Enum.map(tensors, &Nx.to_binary/1)

    # x + n as the lowering wrote it before: an s64 constant converted at
    # run time (which XLA folds and simplifies like any constant).
    defp converted_at_run_time(x, n) do
      type = EXLA.MLIR.Type.to_string({x.type, x.shape})
      elem = type |> String.trim_trailing(">") |> String.split("x") |> List.last()

      text = """
      module {
        func.func public @main(%x: #{type}) -> #{type} {
          %c = stablehlo.constant dense<#{n}> : tensor<i64>
          %f = stablehlo.convert %c : (tensor<i64>) -> tensor<#{elem}>
          %b = stablehlo.broadcast_in_dim %f, dims = [] : (tensor<#{elem}>) -> #{type}
          %r = stablehlo.add %x, %b : #{type}
          return %r : #{type}
        }
      }
      """

      client = EXLA.Client.fetch!(:host)
      exe = EXLA.Executable.compile(client, text)
      shape = EXLA.Shape.make_shape(x.type, x.shape)
      [[out]] = EXLA.Executable.run(exe, [[{Nx.to_binary(x), shape}]])
      EXLA.DeviceBuffer.read(out)
    end

    test "an integer constant exact in the target type is emitted in that type, same bits" do
      # Nx.max(x, 0) compares with an s64 constant: emitted as f32 0.0, no
      # convert.
      refute mlir(&Nx.max(&1, 0), [@edges]) =~ "stablehlo.convert"
      # an integer literal is of the default integer type (2^53 wraps to 0
      # in Nx 0.9 and later's s32: see integer_literals_test.exs)
      {_, bits} = EXLA.NxVersion.default_integer()

      for {type, n} <- [
            f32: 0,
            f32: 16_777_216,
            f32: -16_777_216,
            f64: 2 ** 53,
            f16: 2048,
            bf16: 256
          ],
          n < 2 ** (bits - 1) do
        x = Nx.as_type(@edges, type)
        refute mlir(&Nx.add(&1, n), [x]) =~ "stablehlo.convert"
        assert bits(run(&Nx.add(&1, n), [x])) == [converted_at_run_time(x, n)], "#{type} + #{n}"
      end
    end

    test "integer constants the target type rounds are converted at run time" do
      # Nx 0.9 and later type integer constants s32 (2^53 + 1 wraps there,
      # as on Nx.BinaryBackend), so f64's case is Nx 0.7's.
      {_, bits} = EXLA.NxVersion.default_integer()
      cases = [f32: 16_777_217, f16: 2049, bf16: 257, f64: 2 ** 53 + 1]

      for {type, n} <- cases, n < 2 ** (bits - 1) do
        x = Nx.as_type(@edges, type)
        assert mlir(&Nx.add(&1, n), [x]) =~ "stablehlo.convert", "#{type} + #{n}"
        assert bits(run(&Nx.add(&1, n), [x])) == [converted_at_run_time(x, n)], "#{type} + #{n}"
      end
    end

    test "equal constants and broadcasts are emitted once per scope; -0.0 is not 0.0" do
      fun = fn x -> {Nx.add(x, 2.0), Nx.multiply(x, 2.0), Nx.add(x, 0.0), Nx.add(x, -0.0)} end
      text = mlir(fun, [@x])

      assert length(String.split(text, "dense<2.000000e+00>")) <= 2 or
               length(Regex.scan(~r/"stablehlo.constant"/, text)) == 3

      assert bits(run(fun, [@edges])) == bits(Tuple.to_list(reference(fun, [@edges])))

      # A constant first made in a branch is not reused after it.
      fun = fn x ->
        y = if Nx.sum(x) > 0, do: Nx.add(x, 7.0), else: x
        Nx.multiply(y, 7.0)
      end

      assert_same(fun, [@x])
      assert_same(fun, [Nx.negate(@x)])
    end
  end

  test "predicates are ui8 at the boundary" do
    text = mlir(fn a, b -> Nx.less(a, b) end, [@v, @v])
    assert text =~ "-> (tensor<3xui8>)"
    assert text =~ "tensor<3xi1>"
  end

  test "precision is carried into dot_general" do
    for {precision, name} <- [default: "DEFAULT", high: "HIGH", highest: "HIGHEST"] do
      text = mlir(fn a, b -> Nx.dot(a, b) end, [@x, Nx.transpose(@x)], precision: precision)
      assert text =~ "#stablehlo<precision #{name}>"
    end
  end

  test "precision is validated" do
    assert_raise ArgumentError, fn -> lower(&Nx.exp/1, [@x], precision: :fast) end
    assert_raise ArgumentError, fn -> lower(&Nx.exp/1, [@x], bogus: 1) end
  end

  test "float constants use the expression type, as hex" do
    text = mlir(fn a -> Nx.add(a, 0.1) end, [Nx.tensor([1.0], type: :f64)])

    if EXLA.NxVersion.line?([:v0_7]) do
      # 0.1 is an f32 constant in Nx 0.7, converted to f64 afterwards
      assert text =~ ~s(dense<"0xCDCCCC3D"> : tensor<f32>)
      assert text =~ "tensor<f32>) -> tensor<f64>"
    else
      # Nx 0.10 and later give a float constant the wider float's type
      assert text =~ ~s(dense<"0x9A9999999999B93F"> : tensor<f64>)
    end
  end

  test "tensors are embedded as hex literals" do
    t = Nx.tensor([1, 2], type: :u16)
    text = mlir(fn a -> Nx.add(a, t) end, [t])
    assert text =~ ~s(dense<"0x01000200"> : tensor<2xui16>)
  end

  test "hooks compile and their value is still computed" do
    fun = fn a -> a |> Nx.exp() |> Nx.Defn.Kernel.hook(:exp, &IO.inspect/1) |> Nx.add(1) end
    %{program: %{text: text}} = lower(fun, [@x])
    assert text =~ "stablehlo.exponential"
  end

  test "unknown ops raise a clear error" do
    expr = %{
      Nx.iota({2})
      | data: %Nx.Defn.Expr{id: make_ref(), op: :frobnicate, args: [], context: nil}
    }

    assert_raise ArgumentError, ~r/frobnicate/, fn ->
      EXLA.Defn.Lowering.to_mlir(expr, [], [])
    end
  end

  test "to_mlir accepts exprs built by hand" do
    param = Nx.Defn.Expr.parameter(nil, {:f, 32}, {3}, 0)

    %{program: %{text: text}, used_inputs: [0]} =
      Lowering.to_mlir(Nx.negate(param), [EXLA.Shape.make_shape({:f, 32}, {3})], [])

    assert text =~ "stablehlo.negate"
  end
end
