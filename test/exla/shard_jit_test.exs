defmodule EXLA.ShardJitTest do
  # EXLA.shard_jit/3: SPMD programs over the devices of a host client,
  # checked against the same function on Nx.Defn.Evaluator.
  use ExUnit.Case, async: true

  @client :shard_jit_test_client

  setup_all do
    EXLA.TestClients.add(@client, platform: :host, device_count: 4)
    :ok
  end

  defp evaluate(fun, args), do: Nx.Defn.jit_apply(fun, args, compiler: Nx.Defn.Evaluator)

  # The same tensors, whatever their backend.
  defp assert_same(left, right),
    do:
      assert(Nx.backend_copy(left, Nx.BinaryBackend) == Nx.backend_copy(right, Nx.BinaryBackend))

  defp shard_jit(fun, mesh, shardings, opts \\ []),
    do: EXLA.shard_jit(fun, mesh, [client: @client, input_shardings: shardings] ++ opts)

  test "splits inputs over the mesh and returns whole results" do
    x = Nx.iota({4, 3}, type: :f32)
    y = Nx.multiply(Nx.iota({4, 3}, type: :f32), 0.5)
    fun = fn a, b -> Nx.add(Nx.multiply(a, b), 1) end

    result = shard_jit(fun, {2}, [%{0 => 0}, %{0 => 0}]).(x, y)
    assert_same(result, evaluate(fun, [x, y]))
    assert %EXLA.Backend{buffer: %{client_name: @client, device_id: 0}} = result.data
  end

  test "reductions over a split axis gather the partial results" do
    x = Nx.iota({4, 8}, type: :f32)

    for {mesh, sharding} <- [{{2}, %{0 => 0}}, {{4}, %{1 => 0}}, {{2, 2}, %{0 => 0, 1 => 1}}] do
      fun = &Nx.sum(&1, axes: [1])
      assert_same(shard_jit(fun, mesh, [sharding]).(x), evaluate(fun, [x]))
      assert_same(shard_jit(&Nx.sum/1, mesh, [sharding]).(x), evaluate(&Nx.sum/1, [x]))
    end
  end

  test "a dot with its weights split along the contracted axis" do
    x = Nx.iota({2, 8}, type: :f32) |> Nx.divide(7)
    w = Nx.iota({8, 3}, type: :f32) |> Nx.divide(5)
    fun = &Nx.dot/2
    result = shard_jit(fun, {2, 2}, [%{1 => 0}, %{0 => 0}]).(x, w)
    assert Nx.to_number(Nx.all_close(result, evaluate(fun, [x, w]), atol: 1.0e-5)) == 1
  end

  test "replicated inputs, containers and partial replication" do
    fun = fn {a, b}, c -> {Nx.subtract(a, c), Nx.reduce_max(b)} end
    a = Nx.iota({4, 2}, type: :s64)
    b = Nx.iota({2, 4}, type: :f32)
    c = Nx.tensor(3, type: :s64)
    args = [{a, b}, c]
    # a split over mesh axis 1 only: replicated along mesh axis 0.
    sharded = shard_jit(fun, {2, 2}, [%{0 => 1}, %{1 => 0}, %{}])
    assert_same(sharded.({a, b}, c), evaluate(fun, args))

    # Without shardings every input is replicated.
    assert_same(EXLA.shard_jit(fun, {2}, client: @client).({a, b}, c), evaluate(fun, args))
  end

  test "inputs the program does not read are neither cut nor sent" do
    fun = fn a, _unused, c -> Nx.add(Nx.sum(a, axes: [0]), c) end
    a = Nx.iota({4, 2}, type: :f32)
    c = Nx.tensor([10.0, 20.0])
    unused = Nx.iota({4})
    sharded = shard_jit(fun, {2}, [%{0 => 0}, %{0 => 0}, %{}])
    assert_same(sharded.(a, unused, c), evaluate(fun, [a, unused, c]))
  end

  test "compiles once per shape and caches the program" do
    fun = fn a -> Nx.multiply(a, 2) end
    sharded = shard_jit(fun, {2}, [%{0 => 0}])
    x = Nx.iota({4}, type: :f32)
    assert_same(sharded.(x), evaluate(fun, [x]))

    ref = make_ref()
    parent = self()

    :telemetry.attach(
      {__MODULE__, ref},
      [:exla, :compilation],
      # Other tests compile at the same time: count this process's compiles.
      fn _, _, _, _ -> if self() == parent, do: send(parent, {ref, :compiled}) end,
      nil
    )

    try do
      assert_same(sharded.(Nx.add(x, 1)), evaluate(fun, [Nx.add(x, 1)]))
      refute_received {^ref, :compiled}

      y = Nx.iota({6}, type: :f32)
      assert_same(sharded.(y), evaluate(fun, [y]))
      assert_received {^ref, :compiled}
    after
      :telemetry.detach({__MODULE__, ref})
    end
  end

  test "refuses meshes and shardings that do not fit" do
    x = Nx.iota({4, 3})
    fun = &Nx.negate/1

    assert_raise ArgumentError, ~r/has 8 partitions, but the client has 4/, fn ->
      shard_jit(fun, {2, 4}, [%{}]).(x)
    end

    assert_raise ArgumentError, ~r/non-empty tuple of positive integers/, fn ->
      shard_jit(fun, {0}, [%{}]).(x)
    end

    assert_raise ArgumentError, ~r/cannot be split in 2 equal parts along axis 1/, fn ->
      shard_jit(fun, {2}, [%{1 => 0}]).(x)
    end

    assert_raise ArgumentError, ~r/invalid sharding/, fn ->
      shard_jit(fun, {2}, [%{2 => 0}]).(x)
    end

    assert_raise ArgumentError, "axis 0 was used twice in the same input sharding", fn ->
      shard_jit(fun, {2}, [%{0 => 0, 1 => 0}]).(Nx.iota({4, 4}))
    end

    assert_raise ArgumentError, ~r/one sharding per input tensor/, fn ->
      shard_jit(fun, {2}, [%{}, %{}]).(x)
    end
  end

  test "host callbacks in the sharded function raise instead of being dropped" do
    parent = self()
    fun = fn x -> x |> Nx.add(1) |> Nx.Defn.Kernel.hook(&send(parent, {:hooked, &1})) end

    assert_raise ArgumentError, ~r/shard_jit does not support host callbacks/, fn ->
      shard_jit(fun, {2}, [%{0 => 0}]).(Nx.iota({4}))
    end

    refute_received {:hooked, _}
    # A hook without a function calls nothing: the program runs.
    quiet = fn x -> x |> Nx.add(1) |> Nx.Defn.Kernel.hook(:unused) end
    assert_same(shard_jit(quiet, {2}, [%{0 => 0}]).(Nx.iota({4})), Nx.add(Nx.iota({4}), 1))
  end

  test "the Shardy annotations of an Nx.Mesh" do
    assert EXLA.Defn.Sharding.sdy_mesh("mesh", {2, 1}) ==
             ~s(sdy.mesh @mesh = <["axis_0"=2, "axis_1"=1]>)

    assert EXLA.Defn.Sharding.sdy_mesh("3d mesh", {2}) == ~s(sdy.mesh @"3d mesh" = <["axis_0"=2]>)
    assert EXLA.Defn.Sharding.sdy_mesh(~s(a"b\\c\n), {2}) =~ ~S(@"a\"b\\c\0A")

    assert EXLA.Defn.Sharding.sdy_sharding("m", [[1, 0], [], [2]]) ==
             ~s(#sdy.sharding<@m, [{"axis_1", "axis_0"}, {}, {"axis_2"}]>)
  end

  test "the annotations of a mesh" do
    # A tuple mesh's sharding as dim axes (EXLA.Defn.Sharding.sharding!/4).
    annotation = fn sharding, dims, mesh ->
      sharding
      |> EXLA.Defn.Sharding.sharding!(dims, mesh, 0)
      |> EXLA.Defn.Sharding.annotation(mesh)
    end

    assert annotation.(%{}, {2, 2}, {2}) == "{replicated}"
    assert annotation.(%{0 => 0}, {2, 2}, {2}) == "{devices=[2,1]0,1}"
    assert annotation.(%{1 => 0}, {4, 4}, {4}) == "{devices=[1,4]0,1,2,3}"
    assert annotation.(%{0 => 1, 1 => 0}, {2, 2}, {2, 2}) == "{devices=[2,2]0,2,1,3}"
    assert annotation.(%{0 => 1}, {2}, {2, 2}) == "{devices=[2,2]0,2,1,3 last_tile_dim_replicate}"

    # An Nx.Mesh's: a tensor axis over several mesh axes, major first.
    assert EXLA.Defn.Sharding.annotation([[0, 1], []], {2, 2}) == "{devices=[4,1]0,1,2,3}"
    assert EXLA.Defn.Sharding.annotation([[1, 0], []], {2, 2}) == "{devices=[4,1]0,2,1,3}"
  end

  describe "EXLA.Executable on several devices" do
    @sharded_add """
    module attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
      func.func public @main(%a: tensor<4xf32> {mhlo.sharding = "{devices=[2]0,1}"}) -> (tensor<4xf32> {mhlo.sharding = "{devices=[2]0,1}"}) {
        %0 = stablehlo.add %a, %a : tensor<4xf32>
        return %0 : tensor<4xf32>
      }
    }
    """

    @add """
    module {
      func.func public @main(%a: tensor<2xf32>) -> tensor<2xf32> {
        %0 = stablehlo.add %a, %a : tensor<2xf32>
        return %0 : tensor<2xf32>
      }
    }
    """

    defp f32(values), do: for(v <- values, into: <<>>, do: <<v::float-32-native>>)
    defp part(values), do: {f32(values), EXLA.Shape.make_shape({:f, 32}, {2})}

    defp read_all(outputs),
      do: for(device <- outputs, do: Enum.map(device, &EXLA.DeviceBuffer.read/1))

    test "takes one list of arguments per device and returns one list of outputs each" do
      client = EXLA.Client.fetch!(@client)
      shapes = [EXLA.Shape.make_shape({:f, 32}, {2})]

      exe = EXLA.Executable.compile(client, @sharded_add, num_partitions: 2, input_shapes: shapes)

      assert exe.devices == [0, 1]
      outputs = EXLA.Executable.run(exe, [[part([1.0, 2.0])], [part([3.0, 4.0])]])
      assert [[%{device_id: 0}], [%{device_id: 1}]] = outputs
      assert read_all(outputs) == [[f32([2.0, 4.0])], [f32([6.0, 8.0])]]

      assert_raise ArgumentError, ~r/expected 2 list\(s\) of arguments/, fn ->
        EXLA.Executable.run(exe, [[part([1.0, 2.0])]])
      end

      # Replicas run the whole program on their own arguments.
      exe = EXLA.Executable.compile(client, @add, num_replicas: 3)
      assert exe.devices == [0, 1, 2]

      outputs =
        EXLA.Executable.run(exe, [[part([1.0, 2.0])], [part([0.5, 0.0])], [part([3.0, 3.0])]])

      assert read_all(outputs) == [[f32([2.0, 4.0])], [f32([1.0, 0.0])], [f32([6.0, 6.0])]]
    end

    @shardy_add """
    module {
      sdy.mesh @mesh = <["axis_0"=2]>
      func.func public @main(%a: tensor<4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"axis_0"}]>}) -> tensor<4xf32> {
        %0 = stablehlo.add %a, %a : tensor<4xf32>
        return %0 : tensor<4xf32>
      }
    }
    """

    test "Shardy propagates shardings to open results, GSPMD replicates them" do
      client = EXLA.Client.fetch!(@client)
      shapes = [EXLA.Shape.make_shape({:f, 32}, {2})]
      args = [[part([1.0, 2.0])], [part([3.0, 4.0])]]

      exe =
        EXLA.Executable.compile(client, @shardy_add,
          num_partitions: 2,
          input_shapes: shapes,
          partitioner: :shardy
        )

      assert read_all(EXLA.Executable.run(exe, args)) == [[f32([2.0, 4.0])], [f32([6.0, 8.0])]]

      # Without Shardy the result is not split: each device has it whole.
      exe = EXLA.Executable.compile(client, @shardy_add, num_partitions: 2, input_shapes: shapes)
      whole = f32([2.0, 4.0, 6.0, 8.0])
      assert read_all(EXLA.Executable.run(exe, args)) == [[whole], [whole]]

      assert_raise ArgumentError,
                   ~r/expected :partitioner to be :gspmd or :shardy, got: :auto/,
                   fn ->
                     EXLA.Executable.compile(client, @shardy_add,
                       num_partitions: 2,
                       partitioner: :auto
                     )
                   end
    end

    test "replicas times partitions may not exceed the client's devices" do
      client = EXLA.Client.fetch!(@client)

      assert_raise ArgumentError, ~r/exceeds the 4 device\(s\)/, fn ->
        EXLA.Executable.compile(client, @add, num_replicas: 5)
      end

      assert_raise ArgumentError, ~r/exceeds the 4 device\(s\)/, fn ->
        EXLA.Executable.compile(client, @sharded_add, num_replicas: 2, num_partitions: 4)
      end
    end
  end
end
