defmodule EXLA.ExecutableTest do
  use ExUnit.Case, async: true

  alias EXLA.{DeviceBuffer, Executable, Shape}
  alias EXLA.Executable.Sealed

  doctest EXLA.Executable

  @add """
  module {
    func.func public @main(%a: tensor<3xf32>, %b: tensor<3xf32>) -> tensor<3xf32> {
      %0 = stablehlo.add %a, %b : tensor<3xf32>
      return %0 : tensor<3xf32>
    }
  }
  """

  @donating """
  module {
    func.func public @main(%a: tensor<3xf32> {tf.aliasing_output = 0 : i32}, %b: tensor<3xf32>) -> tensor<3xf32> {
      %0 = stablehlo.add %a, %b : tensor<3xf32>
      return %0 : tensor<3xf32>
    }
  }
  """

  @two_results """
  module {
    func.func public @main(%a: tensor<2x2xi64>, %b: tensor<complex<f32>>) -> (tensor<2x2xi64>, tensor<complex<f32>>) {
      %0 = stablehlo.multiply %a, %a : tensor<2x2xi64>
      %1 = stablehlo.multiply %b, %b : tensor<complex<f32>>
      return %0, %1 : tensor<2x2xi64>, tensor<complex<f32>>
    }
  }
  """

  setup do
    {:ok, client: EXLA.Client.fetch!(:host)}
  end

  defp f32(values), do: for(v <- values, into: <<>>, do: <<v::float-32-native>>)
  defp vec3, do: Shape.make_shape({:f, 32}, {3})

  test "compiles and runs with buffers and binaries", %{client: client} do
    exe = Executable.compile(client, @add)
    assert exe.input_shapes == [vec3(), vec3()]
    assert exe.output_shapes == [vec3()]

    a = DeviceBuffer.place_on_device(f32([1.0, 2.0, 3.0]), vec3(), client, 0)
    assert [[out]] = Executable.run(exe, [[a, {f32([10.0, 20.0, 30.0]), vec3()}]])
    assert %DeviceBuffer{shape: shape} = out
    assert shape == vec3()
    assert DeviceBuffer.read(out) == f32([11.0, 22.0, 33.0])
  end

  test "runs programs with several results", %{client: client} do
    exe = Executable.compile(client, @two_results)
    ints = for i <- [1, -2, 3, 4], into: <<>>, do: <<i::64-native-signed>>
    {:ok, c} = {:ok, f32([1.0, 2.0])}

    [[squares, complex]] =
      Executable.run(exe, [
        [{ints, Shape.make_shape({:s, 64}, {2, 2})}, {c, Shape.make_shape({:c, 64}, {})}]
      ])

    assert DeviceBuffer.read(squares) == for(i <- [1, 4, 9, 16], into: <<>>, do: <<i::64-native>>)
    # (1 + 2i)^2 = -3 + 4i
    assert DeviceBuffer.read(complex) == f32([-3.0, 4.0])
  end

  test "checks argument count, type and shape", %{client: client} do
    exe = Executable.compile(client, @add)
    a = DeviceBuffer.place_on_device(f32([1.0, 2.0, 3.0]), vec3(), client, 0)
    ints = DeviceBuffer.place_on_device(<<0::96>>, Shape.make_shape({:s, 32}, {3}), client, 0)
    row = DeviceBuffer.place_on_device(<<0::96>>, Shape.make_shape({:f, 32}, {1, 3}), client, 0)

    assert_raise ArgumentError, ~r/argument 1 has type S32/, fn ->
      Executable.run(exe, [[a, ints]])
    end

    assert_raise ArgumentError, ~r/argument 1 has type F32 and shape \[1, 3\]/, fn ->
      Executable.run(exe, [[a, row]])
    end

    assert_raise ArgumentError, ~r/expects 2 argument/, fn -> Executable.run(exe, [[a]]) end

    assert_raise ArgumentError, ~r/expected an EXLA.DeviceBuffer/, fn ->
      Executable.run(exe, [[a, 1]])
    end
  end

  test "deleted and donated buffers raise", %{client: client} do
    exe = Executable.compile(client, @donating)
    a = DeviceBuffer.place_on_device(f32([1.0, 2.0, 3.0]), vec3(), client, 0)
    b = DeviceBuffer.place_on_device(f32([1.0, 1.0, 1.0]), vec3(), client, 0)

    [[kept]] = Executable.run(exe, [[a, b]])
    assert DeviceBuffer.read(kept) == f32([2.0, 3.0, 4.0])
    assert DeviceBuffer.read(a) == f32([1.0, 2.0, 3.0])

    [[donated]] = Executable.run(exe, [[a, b]], donate: [0])
    assert DeviceBuffer.read(donated) == f32([2.0, 3.0, 4.0])

    assert_raise RuntimeError, ~r/called on deleted or donated buffer/, fn ->
      Executable.run(exe, [[a, b]])
    end

    assert DeviceBuffer.deallocate(a) == :already_deallocated
    DeviceBuffer.deallocate(b)

    assert_raise RuntimeError, ~r/called on deleted or donated buffer/, fn ->
      Executable.run(exe, [[kept, b]])
    end
  end

  test "invalid MLIR raises with the plugin's message", %{client: client} do
    assert_raise RuntimeError, ~r/expected SSA operand|error/, fn ->
      Executable.compile(client, String.replace(@add, "%a, %b", "%a, "))
    end

    assert_raise ArgumentError, ~r/no @main/, fn -> Executable.compile(client, "module {}") end

    assert_raise RuntimeError, fn ->
      Executable.compile(client, "garbage @main(%a: tensor<f32>)")
    end
  end

  test "validates options", %{client: client} do
    assert_raise ArgumentError, ~r/:num_replicas must be a positive integer/, fn ->
      Executable.compile(client, @add, num_replicas: 0)
    end

    assert_raise ArgumentError, ~r/:num_partitions must be a positive integer/, fn ->
      Executable.compile(client, @add, num_partitions: -1)
    end

    assert_raise ArgumentError, ~r/invalid device id 3/, fn ->
      Executable.compile(client, @add, device_id: 3)
    end

    assert_raise ArgumentError, ~r/unknown keys/, fn ->
      Executable.compile(client, @add, bogus: 1)
    end
  end

  describe "dump/1 and load/2" do
    # Damaged data logs an integrity warning, kept off the console.
    @tag :capture_log
    test "round-trip through term_to_binary and give the same results", %{client: client} do
      exe = Executable.compile(client, @add)
      dumped = Executable.dump(exe)

      assert %{serialized: serialized, device_id: 0, num_replicas: 1, num_partitions: 1} = dumped

      assert is_binary(serialized)

      loaded = Executable.load(client, :erlang.binary_to_term(:erlang.term_to_binary(dumped)))
      assert loaded.input_shapes == exe.input_shapes
      assert loaded.output_shapes == exe.output_shapes
      args = [{f32([1.5, 2.0, -3.0]), vec3()}, {f32([0.25, 1.0, 1.0]), vec3()}]
      [[got]] = Executable.run(loaded, [args])
      assert DeviceBuffer.read(got) == f32([1.75, 3.0, -2.0])

      # serialize/1's binary loads the same way.
      [[again]] = Executable.run(Executable.load(client, serialized), [args])
      assert DeviceBuffer.read(again) == f32([1.75, 3.0, -2.0])

      assert_raise ArgumentError, ~r/expected the map of EXLA.Executable.dump\/1/, fn ->
        Executable.load(client, %{output_typespecs: []})
      end

      <<head::binary-size(40), byte, rest::binary>> = serialized

      assert_raise ArgumentError, ~r/checksum/, fn ->
        Executable.load(client, %{dumped | serialized: <<head::binary, byte + 1, rest::binary>>})
      end
    end

    test "a jitted function's executable, dumped and loaded, computes the same" do
      x = Nx.iota({3, 4}, type: :f32)
      fun = fn x -> Nx.sum(Nx.multiply(Nx.sin(x), 2), axes: [1]) end
      %{mlir_module: mlir} = EXLA.to_mlir_module(fun, [x])
      client = EXLA.Client.fetch!(:host)
      data = client |> Executable.compile(mlir) |> Executable.dump() |> :erlang.term_to_binary()
      loaded = Executable.load(client, :erlang.binary_to_term(data))
      [[out]] = Executable.run(loaded, [[{Nx.to_binary(x), Shape.make_shape({:f, 32}, {3, 4})}]])
      got = Nx.from_binary(DeviceBuffer.read(out), :f32)
      expected = Nx.Defn.jit_apply(fun, [x], compiler: Nx.Defn.Evaluator)
      assert Nx.to_number(Nx.all_close(got, expected, atol: 1.0e-6)) == 1
    end
  end

  # The CPU plugin serialized a loaded executable without its compiled
  # code: the bytes loaded, and the run failed ("Function ... not found").
  # This is the path of a program from the disk cache sent to another node.
  test "a loaded executable serializes to what it was loaded from, and that runs",
       %{client: client} do
    fun = fn x -> x |> Nx.multiply(2.0) |> Nx.add(1.0) |> Nx.tanh() |> Nx.sum(axes: [1]) end
    x = Nx.iota({3, 4}, type: :f32) |> Nx.divide(12)
    %{mlir_module: mlir} = EXLA.to_mlir_module(fun, [x])
    binary = Executable.serialize(Executable.compile(client, mlir))

    again = Executable.serialize(Executable.deserialize(client, binary))
    assert again == binary

    [[out]] =
      Executable.run(Executable.deserialize(client, again), [
        [{Nx.to_binary(x), Shape.make_shape({:f, 32}, {3, 4})}]
      ])

    expected = Nx.Defn.jit_apply(fun, [x], compiler: Nx.Defn.Evaluator)
    got = Nx.from_binary(DeviceBuffer.read(out), :f32)
    assert Nx.to_number(Nx.all_close(got, expected, atol: 1.0e-6)) == 1
  end

  # The foreign binary logs an integrity warning, kept off the console.
  @tag :capture_log
  test "serializes and deserializes", %{client: client} do
    exe = Executable.compile(client, @add)
    binary = Executable.serialize(exe)
    loaded = Executable.deserialize(client, binary)
    assert loaded.input_shapes == exe.input_shapes

    [[out]] =
      Executable.run(loaded, [[{f32([1.0, 2.0, 3.0]), vec3()}, {f32([1.0, 1.0, 1.0]), vec3()}]])

    assert DeviceBuffer.read(out) == f32([2.0, 3.0, 4.0])

    assert loaded.output_shapes == exe.output_shapes

    assert_raise ArgumentError, ~r/not an executable serialized/, fn ->
      Executable.deserialize(client, "garbage")
    end

    {:ok, meta, blob} = Sealed.open(binary)

    # Made for another plugin, device kind or CPU: refused before the
    # plugin sees it.
    for change <- [
          plugin: String.duplicate("0", 64),
          api_version: {0, 1},
          device_kind: "gpu",
          cpu: "another cpu"
        ] do
      foreign = Sealed.seal(%{meta | target: Map.merge(meta.target, Map.new([change]))}, blob)

      assert_raise ArgumentError, ~r/by another PJRT plugin or for another target/, fn ->
        Executable.deserialize(client, foreign)
      end

      assert {:error, _} = Executable.load_binary(client, foreign)
    end

    assert_raise ArgumentError, ~r/compiled for device 7/, fn ->
      Executable.deserialize(client, Sealed.seal(%{meta | device_id: 7}, blob))
    end

    # The format of earlier versions (a bare term) is refused.
    old = :erlang.term_to_binary(Map.merge(meta, %{version: 1, blob: blob}))

    assert_raise ArgumentError, ~r/not an executable serialized/, fn ->
      Executable.deserialize(client, old)
    end
  end

  @sin_sum """
  module {
    func.func public @main(%x: tensor<16xf32>) -> tensor<f32> {
      %0 = stablehlo.sine %x : tensor<16xf32>
      %1 = stablehlo.constant dense<2.0> : tensor<16xf32>
      %2 = stablehlo.multiply %0, %1 : tensor<16xf32>
      %3 = stablehlo.constant dense<0.0> : tensor<f32>
      %4 = stablehlo.reduce(%2 init: %3) applies stablehlo.add across dimensions = [0] : (tensor<16xf32>, tensor<f32>) -> tensor<f32>
      return %4 : tensor<f32>
    }
  }
  """

  # Each refused binary also logs an integrity warning (EXLA.NativeLog),
  # kept off the console.
  @tag :capture_log
  test "a damaged serialized executable raises and nothing runs; the VM survives",
       %{client: client} do
    exe = Executable.compile(client, @sin_sum)
    binary = Executable.serialize(exe)
    arg = {f32(Enum.map(0..15, &(&1 * 1.0))), Shape.make_shape({:f, 32}, {16})}
    [[out]] = Executable.run(exe, [[arg]])
    expected = DeviceBuffer.read(out)

    # Every byte of the header (magic, version, sizes, metadata), 400 random
    # positions and the checksum's bytes.
    {:ok, meta, _blob} = Sealed.open(binary)
    header = 8 + 2 + 4 + byte_size(:erlang.term_to_binary(meta)) + 8
    :rand.seed(:exsss, {9, 9, 9})
    random = for _ <- 1..400, do: :rand.uniform(byte_size(binary)) - 1
    checksum = Enum.to_list((byte_size(binary) - 32)..(byte_size(binary) - 1))
    positions = Enum.to_list(0..(header - 1)) ++ random ++ checksum

    outcomes =
      for pos <- positions do
        <<before::binary-size(pos), byte, rest::binary>> = binary
        flipped = <<before::binary, Bitwise.bxor(byte, 0xFF), rest::binary>>

        try do
          loaded = Executable.deserialize(client, flipped)
          [[out]] = Executable.run(loaded, [[arg]])
          if DeviceBuffer.read(out) == expected, do: :same, else: {:different, pos}
        rescue
          ArgumentError -> :raised
        end
      end

    assert Enum.all?(outcomes, &(&1 == :raised)), inspect(Enum.reject(outcomes, &(&1 == :raised)))

    # Truncated or extended binaries raise too.
    for size <- [0, 10, 50, byte_size(binary) - 1] do
      assert_raise ArgumentError, fn ->
        Executable.deserialize(client, binary_part(binary, 0, size))
      end
    end

    assert_raise ArgumentError, fn -> Executable.deserialize(client, binary <> <<0>>) end

    # The untouched binary still loads and runs.
    [[out]] = Executable.run(Executable.deserialize(client, binary), [[arg]])
    assert DeviceBuffer.read(out) == expected
  end

  test "the program of the lowering is compiled with its shapes", %{client: client} do
    fun = fn x, y -> {Nx.add(x, y), Nx.sum(x)} end

    %{program: program} =
      EXLA.Defn.Lowering.to_mlir(Nx.Defn.debug_expr(fun).(vec(), vec()), [vec3(), vec3()])

    assert program.input_shapes == [vec3(), vec3()]
    assert program.output_shapes == [vec3(), Shape.make_shape({:f, 32}, {})]

    exe = Executable.compile(client, program)
    assert exe.input_shapes == program.input_shapes
    assert exe.output_shapes == program.output_shapes
    x = {f32([1.0, 2.0, 3.0]), vec3()}
    [[sum, total]] = Executable.run(exe, [[x, x]])
    assert DeviceBuffer.read(sum) == f32([2.0, 4.0, 6.0])
    assert DeviceBuffer.read(total) == f32([6.0])

    # Given as text, it is read (and checked): the same shapes.
    read = Executable.compile(client, program.text)
    assert {read.input_shapes, read.output_shapes} == {exe.input_shapes, exe.output_shapes}
  end

  defp vec, do: Nx.template({3}, :f32)

  test "reads parameter shapes from the signature" do
    shapes = fn signature ->
      EXLA.MLIR.Check.read!(signature, 2 ** 40).input_shapes
    end

    text =
      "func.func public @main(%x: tensor<2x3xbf16> {jax.buffer_donor = true}, %y: tensor<ui8>, %z: tensor<4xcomplex<f64>>, %p: tensor<i1>) -> ()"

    assert shapes.(text) == [
             Shape.make_shape({:bf, 16}, {2, 3}),
             Shape.make_shape({:u, 8}, {}),
             Shape.make_shape({:c, 128}, {4}),
             Shape.make_shape({:pred, 8}, {})
           ]

    assert shapes.("func.func @main() -> ()") == []

    assert_raise ArgumentError, ~r/unsupported MLIR element type/, fn ->
      shapes.("func.func @main(%x: tensor<2xf8E4M3B11FNUZ>) -> ()")
    end

    assert_raise ArgumentError, ~r/no @main function/, fn -> shapes.("func.func @f() -> ()") end
  end
end
