defmodule EXLA.ShardJitMeshTest do
  # EXLA.shard_jit/3 and Nx.Defn.shard_jit/3 with an %Nx.Mesh{} (Nx 0.12 and
  # later): each partition gets its part of the inputs and returns its part
  # of the results, on its device. Each part is checked against the same
  # function run whole on Nx.Defn.Evaluator, cut as the mesh cuts it.
  use ExUnit.Case, async: true

  @moduletag nx: :meshes?

  # Nx 0.7 has no Nx.Mesh.
  if EXLA.NxVersion.meshes?() do
    @client :shard_jit_mesh_client

    setup_all do
      EXLA.TestClients.add(@client, platform: :host, device_count: 4)
      :ok
    end

    defp mesh(shape, name \\ "mesh"), do: %Nx.Mesh{name: name, shape: shape}

    defp shard_jit(fun, mesh, shardings, opts \\ []),
      do: EXLA.shard_jit(fun, mesh, [input_shardings: shardings, client: @client] ++ opts)

    defp evaluate(fun, args), do: Nx.Defn.jit_apply(fun, args, compiler: Nx.Defn.Evaluator)

    # The row-major coordinates of each partition of a mesh of `shape`.
    defp coordinates(shape) do
      shape
      |> Tuple.to_list()
      |> Enum.reduce([[]], fn size, acc -> for c <- acc, i <- 0..(size - 1), do: c ++ [i] end)
    end

    # Cuts `t` as a sharding (one list of mesh axes per axis, major first)
    # cuts it over a mesh of `shape`: one part per partition.
    defp cut(t, dim_axes, shape) do
      for coords <- coordinates(shape) do
        {starts, lengths} =
          dim_axes
          |> Enum.with_index()
          |> Enum.map(fn {axes, d} ->
            {index, count} =
              Enum.reduce(axes, {0, 1}, fn a, {index, count} ->
                {index * elem(shape, a) + Enum.at(coords, a), count * elem(shape, a)}
              end)

            length = div(elem(t.shape, d), count)
            {index * length, length}
          end)
          |> Enum.unzip()

        Nx.slice(t, starts, lengths)
      end
    end

    defp host(t), do: Nx.backend_copy(t, Nx.BinaryBackend)

    # Every partition's result is its part of `expected`, on its device.
    defp assert_parts(results, expected, dim_axes, shape) do
      parts = cut(expected, dim_axes, shape)
      assert length(results) == length(parts)

      Enum.zip_with([results, parts, 0..(length(parts) - 1)], fn [result, part, partition] ->
        assert host(result) == part
        assert %EXLA.Backend{buffer: %{client_name: @client, device_id: ^partition}} = result.data
      end)
    end

    test "elementwise results are split as their inputs" do
      x = Nx.iota({8, 2}, type: :s32)
      y = Nx.iota({8, 1}, type: :s32) |> Nx.add(100)
      shape = {2, 2}
      x_axes = [[0], [1]]
      y_axes = [[0], []]
      args = Enum.zip_with(cut(x, x_axes, shape), cut(y, y_axes, shape), &[&1, &2])

      results = shard_jit(&Nx.add/2, mesh(shape), [%{0 => [0], 1 => [1]}, %{0 => [0]}]).(args)

      assert [{4, 1}] = Enum.uniq(Enum.map(results, & &1.shape))
      assert_parts(results, evaluate(&Nx.add/2, [x, y]), x_axes, shape)

      # The parts, put back together, are the whole result.
      [r0, r1, r2, r3] = Enum.map(results, &host/1)

      whole =
        Nx.concatenate([Nx.concatenate([r0, r1], axis: 1), Nx.concatenate([r2, r3], axis: 1)])

      assert whole == evaluate(&Nx.add/2, [x, y])
    end

    test "parts on the devices, from another call or elsewhere, give the same results" do
      x = Nx.iota({8, 2}, type: :f32)
      shape = {2, 2}
      axes = [[0], [1]]
      sharding = [%{0 => [0], 1 => [1]}]
      double = shard_jit(&Nx.multiply(&1, 2), mesh(shape), sharding)

      # The results are each partition's part, on its device: they go in
      # again as they are.
      once = double.(Enum.map(cut(x, axes, shape), &[&1]))
      twice = double.(Enum.map(once, &[&1]))
      assert_parts(twice, Nx.multiply(x, 4), axes, shape)

      # Parts on other devices of the client, or of the default client, are
      # copied to theirs.
      moved =
        once
        |> Enum.reverse()
        |> Enum.map(&[Nx.backend_copy(&1, {EXLA.Backend, client: @client, device_id: 0})])

      assert_parts(double.(Enum.reverse(moved)), Nx.multiply(x, 4), axes, shape)
      on_default = Enum.map(once, &[Nx.backend_copy(&1, EXLA.Backend)])
      assert_parts(double.(on_default), Nx.multiply(x, 4), axes, shape)

      # Parts used as they are stay as they were.
      assert_parts(once, Nx.multiply(x, 2), axes, shape)
    end

    test "containers of results, each with the sharding it propagates to" do
      fun = fn x, y -> {Nx.add(x, y), Nx.multiply(y, 2)} end
      x = Nx.iota({8, 2}, type: :f32)
      y = Nx.iota({8, 1}, type: :f32) |> Nx.subtract(3)
      shape = {2, 2}
      args = Enum.zip_with(cut(x, [[0], [1]], shape), cut(y, [[0], []], shape), &[&1, &2])

      results = shard_jit(fun, mesh(shape), [%{0 => [0], 1 => [1]}, %{0 => [0]}]).(args)
      {sum, double} = evaluate(fun, [x, y])
      assert_parts(Enum.map(results, &elem(&1, 0)), sum, [[0], [1]], shape)
      # y is replicated along mesh axis 1, and so is twice y.
      assert_parts(Enum.map(results, &elem(&1, 1)), double, [[0], []], shape)
    end

    test "an axis split over several mesh axes, major first" do
      x = Nx.iota({4, 4})
      shape = {2, 2}
      args = for part <- cut(x, [[0, 1], []], shape), do: [part]

      results = shard_jit(&Nx.transpose/1, mesh(shape), [%{0 => [0, 1]}]).(args)
      assert_parts(results, Nx.transpose(x), [[], [0, 1]], shape)
      assert Enum.map(results, &Nx.to_flat_list/1) == Enum.chunk_every(Nx.to_flat_list(x), 4)
    end

    test "a three-axis mesh, named and negative axes" do
      x = Nx.iota({4, 2, 4}, names: [:batch, :rows, :cols], type: :f64)
      shape = {2, 1, 2}
      dim_axes = [[0], [1], [2]]
      args = for part <- cut(x, dim_axes, shape), do: [part]
      fun = &Nx.multiply(&1, 2)
      expected = evaluate(fun, [x])

      for sharding <- [%{0 => [0], 1 => [1], 2 => [2]}, %{:batch => [0], -2 => [1], -1 => [2]}] do
        results = shard_jit(fun, mesh(shape, "3d mesh"), [sharding]).(args)
        assert_parts(results, expected, dim_axes, shape)
        assert hd(results).names == [:batch, :rows, :cols]
      end
    end

    test "reductions over a split axis give every partition the whole result" do
      x = Nx.iota({8, 3}, type: :f32)
      shape = {4}
      args = for part <- cut(x, [[0], []], shape), do: [part]

      for {fun, replicated} <- [{&Nx.sum(&1, axes: [0]), [[]]}, {&Nx.reduce_max/1, []}] do
        results = shard_jit(fun, mesh(shape), [%{0 => [0]}]).(args)
        assert_parts(results, evaluate(fun, [x]), replicated, shape)
      end
    end

    test "a dot with its weights split along the contracted axis" do
      x = Nx.iota({2, 8}, type: :f32) |> Nx.divide(7)
      w = Nx.iota({8, 3}, type: :f32) |> Nx.divide(5)
      shape = {2, 2}
      args = Enum.zip_with(cut(x, [[], [0]], shape), cut(w, [[0], []], shape), &[&1, &2])
      results = shard_jit(&Nx.dot/2, mesh(shape), [%{1 => [0]}, %{0 => [0]}]).(args)
      expected = evaluate(&Nx.dot/2, [x, w])

      for result <- results do
        assert result.shape == {2, 3}
        assert Nx.to_number(Nx.all_close(host(result), expected, atol: 1.0e-4)) == 1
      end
    end

    test "windows across parts, and results that do not split evenly" do
      x = Nx.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
      shape = {2, 2}
      args = for part <- cut(x, [[0], [1]], shape), do: [part]

      # A {1, 2} result: one row, whose columns are split as the input's.
      for {opts, dim_axes} <- [{[strides: [2, 2]], [[], [1]]}, {[padding: :same], [[0], [1]]}] do
        fun = &Nx.window_sum(&1, {2, 2}, opts)
        results = shard_jit(fun, mesh(shape), [%{0 => [0], 1 => [1]}]).(args)
        assert_parts(results, evaluate(fun, [x]), dim_axes, shape)
      end

      # {1, 3} cannot be cut in two along either axis: it stays whole.
      fun = &Nx.window_sum(&1, {2, 2})
      results = shard_jit(fun, mesh(shape), [%{0 => [0], 1 => [1]}]).(args)
      assert_parts(results, evaluate(fun, [x]), [[], []], shape)
    end

    test "replicated and scalar inputs, and inputs the program does not read" do
      fun = fn x, _unused, s -> Nx.subtract(x, s) end
      x = Nx.iota({4, 2}, type: :s64)
      s = Nx.tensor(3, type: :s64)
      shape = {2}
      args = for part <- cut(x, [[], [0]], shape), do: [part, Nx.iota({3}), s]

      results = shard_jit(fun, mesh(shape), [%{1 => [0]}, %{}, %{}]).(args)
      assert_parts(results, evaluate(fun, [x, Nx.iota({3}), s]), [[], [0]], shape)
    end

    test "every type round-trips" do
      shape = {4}

      for type <- [:u8, :s16, :s32, :u64, :f16, :bf16, :f32, :c64] do
        x = Nx.iota({8}, type: type)
        args = for part <- cut(x, [[0]], shape), do: [part]
        results = shard_jit(&Nx.add(&1, &1), mesh(shape), [%{0 => [0]}]).(args)
        assert_parts(results, evaluate(&Nx.add(&1, &1), [x]), [[0]], shape)
      end
    end

    test "Nx.Defn.shard_jit/3 with the compiler, compiled once per shape" do
      fun = &Nx.multiply(&1, 3)
      shape = {2}

      sharded =
        Nx.Defn.shard_jit(fun, mesh(shape),
          compiler: EXLA,
          client: @client,
          input_shardings: [%{0 => [0]}]
        )

      x = Nx.iota({4}, type: :f32)

      assert_parts(
        sharded.(for p <- cut(x, [[0]], shape), do: [p]),
        evaluate(fun, [x]),
        [[0]],
        shape
      )

      ref = make_ref()
      parent = self()

      :telemetry.attach(
        {__MODULE__, ref},
        [:exla, :compilation],
        # Other tests compile at the same time: count this process's compiles.
        fn _, _, meta, _ -> if self() == parent, do: send(parent, {ref, meta}) end,
        nil
      )

      try do
        y = Nx.add(x, 10)

        assert_parts(
          sharded.(for p <- cut(y, [[0]], shape), do: [p]),
          evaluate(fun, [y]),
          [[0]],
          shape
        )

        refute_received {^ref, _}

        z = Nx.iota({6}, type: :f32)

        assert_parts(
          sharded.(for p <- cut(z, [[0]], shape), do: [p]),
          evaluate(fun, [z]),
          [[0]],
          shape
        )

        assert_received {^ref, %{key: _}}
      after
        :telemetry.detach({__MODULE__, ref})
      end
    end

    test "EXLA.shard_jit/3's example on four devices" do
      mesh = mesh({2, 2})
      add = shard_jit(&Nx.add/2, mesh, [%{0 => [0], 1 => [1]}, %{}])
      x = Nx.iota({4, 2})
      parts = for r <- [0, 2], c <- [0, 1], do: [x[[r..(r + 1), c..c]], 10]

      assert Enum.map(add.(parts), &Nx.to_list/1) ==
               [[[10], [12]], [[11], [13]], [[14], [16]], [[15], [17]]]
    end

    describe "refuses" do
      defp two_by_two(sharding, args \\ List.duplicate([Nx.iota({4, 2})], 4)),
        do: shard_jit(&Nx.negate/1, mesh({2, 2}), sharding).(args)

      test "missing or miscounted input shardings" do
        for shardings <- [nil, %{0 => [0]}] do
          assert_raise ArgumentError, ~r/input_shardings are required for sharding in EXLA/, fn ->
            two_by_two(shardings)
          end
        end

        assert_raise ArgumentError, ~r/expected 2 input sharding configuration\(s\).*got 1/, fn ->
          shard_jit(&Nx.add/2, mesh({2}), [%{}]).(List.duplicate([1, 2], 2))
        end

        assert_raise ArgumentError, "expected input sharding to be a map, got: [0]", fn ->
          two_by_two([[0]])
        end
      end

      test "tensor axes that do not exist or repeat" do
        assert_raise ArgumentError, ~r/given axis \(2\) invalid for shape with rank 2/, fn ->
          two_by_two([%{2 => [0]}])
        end

        assert_raise ArgumentError, ~r/given axis \(-3\) invalid for shape with rank 2/, fn ->
          two_by_two([%{-3 => [0]}])
        end

        assert_raise ArgumentError, ~r/:batch not found/, fn ->
          two_by_two([%{batch: [0]}])
        end

        # EXLA 0.13.1's words, naming the axis as given.
        assert_raise ArgumentError,
                     ~r/^tensor dimension (0|-2) \(index 0\) was specified multiple times$/,
                     fn ->
                       two_by_two([%{0 => [0], -2 => [1]}])
                     end
      end

      test "mesh axes that do not exist or repeat" do
        # EXLA 0.13.1's words where it has a message for the case.
        assert_raise ArgumentError, "axis 2 is not valid for mesh with 2 axes", fn ->
          two_by_two([%{0 => [2]}])
        end

        assert_raise ArgumentError, "axis -1 is not valid for mesh with 2 axes", fn ->
          two_by_two([%{0 => [-1]}])
        end

        assert_raise ArgumentError,
                     ~r/integers from 0 to 1 for a mesh of shape \{2, 2\}, got: 0/,
                     fn ->
                       two_by_two([%{0 => 0}])
                     end

        assert_raise ArgumentError, "axis 0 was used twice in the same input sharding", fn ->
          two_by_two([%{0 => [0], 1 => [0]}])
        end

        assert_raise ArgumentError, "axis 1 was used twice in the same input sharding", fn ->
          two_by_two([%{0 => [1, 1]}])
        end

        assert_raise ArgumentError, "axis 1 was used twice in the same input sharding", fn ->
          two_by_two([%{1 => [1], 0 => [0, 1]}])
        end
      end

      test "meshes the client cannot hold" do
        assert_raise ArgumentError,
                     ~r/the mesh \{2, 4\} has 8 partitions, but the client has 4/,
                     fn ->
                       shard_jit(&Nx.negate/1, mesh({2, 4}), [%{}]).(List.duplicate([1], 8))
                     end

        assert_raise ArgumentError, ~r/non-empty tuple of positive integers/, fn ->
          shard_jit(&Nx.negate/1, mesh({2, 0}), [%{}]).([[1]])
        end

        assert_raise ArgumentError, ~r/mesh's name to be a non-empty string/, fn ->
          shard_jit(&Nx.negate/1, mesh({2}, :mesh), [%{}]).([[1], [1]])
        end

        assert_raise ArgumentError, ~r/"main" is taken/, fn ->
          shard_jit(&Nx.negate/1, mesh({2}, "main"), [%{}]).([[1], [1]])
        end
      end

      test "argument lists that do not fit the mesh" do
        assert_raise ArgumentError, ~r/one list of arguments per partition .* \(4\), got 2/, fn ->
          two_by_two([%{}], List.duplicate([Nx.iota({4, 2})], 2))
        end

        args = [[Nx.iota({2})], [Nx.iota({3})]]

        assert_raise ArgumentError,
                     ~r/input 0 of partition 1 is a tensor s32\{3\}, but the first partition's is s32\{2\}/,
                     fn -> shard_jit(&Nx.negate/1, mesh({2}), [%{0 => [0]}]).(args) end
      end
    end

    describe "host callbacks" do
      test "a hook in the sharded function raises" do
        fun = fn x -> Nx.Defn.Kernel.hook(Nx.add(x, 1), &IO.inspect/1) end

        assert_raise ArgumentError, ~r/shard_jit does not support host callbacks/, fn ->
          shard_jit(fun, mesh({2}), [%{0 => [0]}]).([[Nx.iota({2})], [Nx.iota({2})]])
        end
      end

      @tag nx: :runtime_calls?
      test "a runtime call in the sharded function raises" do
        fun = fn x -> Nx.runtime_call(x, x, [], fn t, _ -> Nx.negate(t) end) end

        assert_raise ArgumentError, ~r/shard_jit does not support host callbacks/, fn ->
          shard_jit(fun, mesh({2}), [%{0 => [0]}]).([[Nx.iota({2})], [Nx.iota({2})]])
        end
      end
    end

    describe "EXLA.to_mlir_module/3 with :mesh" do
      test "gives the annotated module of the whole inputs, needing no devices" do
        # 8 partitions where the default client has fewer devices: nothing runs.
        mesh = mesh({2, 4})
        args = List.duplicate([Nx.template({4, 1}, :s32), Nx.template({4, 1}, :f32)], 8)
        fun = fn x, y -> Nx.add(x, y) end
        shardings = [%{0 => [0], 1 => [1]}, %{0 => [0]}]

        %{mlir_module: mlir, used_inputs: used, output_container: out} =
          EXLA.to_mlir_module(fun, args, mesh: mesh, input_shardings: shardings)

        assert mlir =~ ~s(sdy.mesh @mesh = <["axis_0"=2, "axis_1"=4]>)

        assert mlir =~
                 ~s(%arg0: tensor<8x4xi32> {sdy.sharding = #sdy.sharding<@mesh, [{"axis_0"}, {"axis_1"}]>})

        assert mlir =~
                 ~s(%arg1: tensor<8x1xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"axis_0"}, {}]>})

        assert used == MapSet.new([0, 1])
        assert %Nx.Tensor{type: {:f, 32}, shape: {8, 4}} = out
      end

      test "input shardings without a mesh, and a mesh that is not an Nx.Mesh, raise" do
        assert_raise ArgumentError, ~r/no device mesh was provided/, fn ->
          EXLA.to_mlir_module(&Nx.negate/1, [Nx.iota({2})], input_shardings: [%{0 => [0]}])
        end

        assert_raise ArgumentError, ~r/expected :mesh to be an %Nx.Mesh\{\}, got: \{2\}/, fn ->
          EXLA.to_mlir_module(&Nx.negate/1, [Nx.iota({2})], mesh: {2})
        end

        assert_raise ArgumentError, ~r/one list of arguments per partition/, fn ->
          EXLA.to_mlir_module(&Nx.negate/1, [[Nx.iota({2})]],
            mesh: mesh({2}),
            input_shardings: [%{0 => [0]}]
          )
        end
      end
    end
  end
end
