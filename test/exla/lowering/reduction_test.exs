defmodule EXLA.Lowering.ReductionTest do
  use EXLA.LoweringCase, async: true

  # Nx.map/2 exists on Nx 0.7 only; the test that calls it is excluded on
  # the other lines, where it is undefined.
  @compile {:no_warn_undefined, [{Nx, :map, 2}]}

  @t Nx.tensor([
       [[3.0, -1.0, 2.5, 0.0], [1.0, 7.0, -2.0, 4.0], [2.0, 2.0, -5.0, 6.0]],
       [[0.5, 1.5, 3.0, -1.0], [8.0, 0.0, 1.0, 1.0], [-3.0, 2.0, 2.0, 9.0]]
     ])

  test "aggregates with axes and keep_axes" do
    fun = fn x ->
      %{
        sum: Nx.sum(x),
        sum_axes: Nx.sum(x, axes: [0, 2]),
        sum_keep: Nx.sum(x, axes: [1], keep_axes: true),
        product: Nx.product(x, axes: [2]),
        max: Nx.reduce_max(x, axes: [1]),
        min: Nx.reduce_min(x),
        all: Nx.all(Nx.greater(x, -5)),
        all_axes: Nx.all(x, axes: [2]),
        any: Nx.any(Nx.greater(x, 8), axes: [0, 1], keep_axes: true),
        sum_int: Nx.sum(Nx.as_type(x, :s8), axes: [1]),
        sum_u8: Nx.sum(Nx.as_type(Nx.abs(x), :u8)),
        max_int: Nx.reduce_max(Nx.as_type(x, :s32), axes: [2]),
        min_u: Nx.reduce_min(Nx.as_type(Nx.abs(x), :u16), axes: [0]),
        mean: Nx.mean(x, axes: [2])
      }
    end

    assert_same(fun, [@t])
    assert_same(fun, [Nx.as_type(@t, :f64)])
  end

  test "argmax and argmin with tie breaks" do
    fun = fn x ->
      %{
        argmax: Nx.argmax(x),
        argmax_axis: Nx.argmax(x, axis: 2),
        argmax_high: Nx.argmax(x, axis: 1, tie_break: :high),
        argmin_keep: Nx.argmin(x, axis: 0, keep_axis: true),
        argmin_high: Nx.argmin(x, axis: 2, tie_break: :high),
        argmax_type: Nx.argmax(x, axis: 1, type: :u8),
        argmax_int: Nx.argmax(Nx.as_type(x, :s16), axis: 2),
        argmin_int: Nx.argmin(Nx.as_type(Nx.abs(x), :u8), axis: 1, tie_break: :high)
      }
    end

    assert_same(fun, [@t])
  end

  test "argmax returns the first NaN" do
    x = Nx.tensor([[1.0, :nan, 3.0, :nan], [:nan, 1.0, 0.0, 2.0]])
    [max, min] = run(fn x -> {Nx.argmax(x, axis: 1), Nx.argmin(x, axis: 1)} end, [x])
    assert Nx.to_flat_list(max) == [1, 0]
    assert Nx.to_flat_list(min) == [1, 0]
  end

  describe "NaN propagates through max and min" do
    # Long enough for XLA:CPU's vectorized loops, where fast min/max (the
    # CPU plugin's default) would drop the NaN.
    defp with_nan(type, at) do
      Nx.iota({4096}, type: type)
      |> Nx.divide(512)
      |> Nx.put_slice([at], Nx.tensor([:nan], type: type))
    end

    defp nan_ops(x) do
      {Nx.reduce_max(x), Nx.reduce_min(x), Nx.max(x, 2.0), Nx.min(2.0, x),
       Nx.window_max(x, {8}, strides: [8]), Nx.window_min(x, {4}, padding: :same),
       Nx.reduce_max(Nx.reshape(x, {64, 64}), axes: [1])}
    end

    test "in compiled code in every float type, and eagerly" do
      jitted = EXLA.jit(&nan_ops/1)

      for type <- [:f32, :f64, :f16, :bf16], at <- [0, 1000, 4095] do
        x = with_nan(type, at)
        results = Tuple.to_list(jitted.(x))

        if type == :f32 do
          eager = x |> Nx.backend_copy(EXLA.Backend) |> nan_ops() |> Tuple.to_list()
          for {r, e} <- Enum.zip(results, eager), do: assert(Nx.to_binary(e) == Nx.to_binary(r))
        end

        [max, min, max2, min2, wmax, wmin, rows] =
          Enum.map(results, fn t -> t |> Nx.is_nan() |> Nx.to_flat_list() end)

        assert {max, min} == {[1], [1]}, "#{inspect(type)} at #{at}"
        assert Enum.at(max2, at) == 1 and Enum.at(min2, at) == 1 and Enum.sum(max2) == 1
        assert Enum.at(wmax, div(at, 8)) == 1 and Enum.sum(wmax) == 1
        # with padding: :same, window i covers i - 1..i + 2
        assert Enum.sum(wmin) == Enum.count(max(at - 2, 0)..min(at + 1, 4095))
        assert Enum.at(rows, div(at, 64)) == 1 and Enum.sum(rows) == 1
      end
    end

    # Up to 4,096 elements, the max/min and the NaN flags are one variadic
    # reduction (one kernel); beyond, two reductions (both vectorized).
    test "small and large reductions agree with the reference, with and without NaN" do
      reduces = fn mlir -> length(Regex.scan(~r/"stablehlo.reduce"/, mlir)) end
      mlir = fn x -> EXLA.to_mlir_module(&Nx.reduce_max/1, [x]).mlir_module end

      assert reduces.(mlir.(Nx.iota({4096}, type: :f32))) == 1
      assert reduces.(mlir.(Nx.iota({4097}, type: :f32))) == 2

      for n <- [10, 4096, 4097, 65_536], type <- [:f32, :bf16] do
        x = Nx.iota({n}, type: type) |> Nx.multiply(7) |> Nx.remainder(1001) |> Nx.subtract(500)
        rows = Nx.reshape(x, if(rem(n, 16) == 0, do: {16, :auto}, else: {1, n}))
        fun = &{Nx.reduce_max(&1), Nx.reduce_min(&1), Nx.reduce_max(&2, axes: [1])}

        for {r, e} <- Enum.zip(run(fun, [x, rows]), Tuple.to_list(fun.(x, rows))) do
          assert Nx.to_binary(r) == Nx.to_binary(e), "#{n} #{inspect(type)}"
        end

        with_nan = Nx.put_slice(x, [n - 1], Nx.tensor([:nan], type: type))
        [max, min, _] = run(fun, [with_nan, rows])
        assert {Nx.to_number(max), Nx.to_number(min)} == {:nan, :nan}, "#{n} #{inspect(type)}"
      end
    end

    test "all-NaN reductions and windows give NaN, not the initial value" do
      nans = Nx.broadcast(Nx.tensor(:nan), {3, 1000})

      [max, min, wmax, wmin] =
        run(
          fn x ->
            {Nx.reduce_max(x, axes: [1]), Nx.reduce_min(x), Nx.window_max(x, {1, 10}),
             Nx.window_min(x, {3, 3}, padding: :same)}
          end,
          [nans]
        )

      for t <- [max, min, wmax, wmin], do: assert(Nx.to_number(Nx.all(Nx.is_nan(t))) == 1)
    end

    test "the issue's examples under EXLA.jit" do
      assert EXLA.jit(&Nx.reduce_max/1).(Nx.tensor([1.0, :nan, 3.0])) |> Nx.to_number() == :nan
      assert EXLA.jit(&Nx.reduce_min/1).(Nx.tensor([:nan, :nan])) |> Nx.to_number() == :nan

      assert EXLA.jit(&Nx.window_max(&1, {2})).(Nx.tensor([:nan, :nan, :nan]))
             |> Nx.to_flat_list() == [:nan, :nan]
    end

    test "the reference agrees" do
      x = Nx.tensor([[1.0, :nan, 3.0], [-1.0, 0.5, 2.0]])

      fun = fn x ->
        {Nx.reduce_max(x, axes: [1]), Nx.reduce_min(x), Nx.max(x, 2.0), Nx.window_max(x, {1, 2}),
         Nx.window_min(x, {2, 2})}
      end

      # assert_same compares NaN as equal to NaN
      [max | _] = assert_same(fun, [x])
      assert Nx.to_flat_list(max) == [:nan, 2.0]
    end

    test "integers and NaN-free floats are unchanged" do
      x = Nx.tensor([[3, -1, 7], [2, 9, -4]])

      assert_same(
        fn x ->
          {Nx.reduce_max(x, axes: [1]), Nx.window_min(x, {1, 2}), Nx.max(x, 1),
           Nx.reduce_min(Nx.as_type(x, :f32))}
        end,
        [x]
      )
    end
  end

  test "custom reduce" do
    fun = fn x ->
      {Nx.reduce(x, 0, [axes: [2]], &Nx.add/2), Nx.reduce(x, 1, &Nx.multiply/2),
       Nx.reduce(x, Nx.Constants.neg_infinity(), [axes: [0], keep_axes: true], &Nx.max/2),
       Nx.reduce(Nx.as_type(x, :s32), 0, [axes: [1]], &Nx.bitwise_or/2)}
    end

    assert_same(fun, [@t])
  end

  test "window reductions" do
    fun = fn x ->
      %{
        sum: Nx.window_sum(x, {1, 2, 2}),
        sum_same: Nx.window_sum(x, {2, 2, 1}, padding: :same),
        product: Nx.window_product(x, {1, 3, 1}, strides: [1, 1, 2]),
        max: Nx.window_max(x, {1, 2, 3}, padding: [{0, 0}, {1, 1}, {0, 2}]),
        min: Nx.window_min(x, {2, 1, 2}, strides: [2, 1, 1], window_dilations: [1, 1, 2]),
        max_int: Nx.window_max(Nx.as_type(x, :s32), {1, 2, 2}, padding: :same),
        reduce: Nx.window_reduce(x, 0.0, {1, 2, 2}, [strides: [1, 1, 2]], &Nx.add/2),
        mean: Nx.window_mean(x, {1, 2, 2})
      }
    end

    assert_same(fun, [@t])
  end

  test "window_scatter_max and window_scatter_min" do
    x =
      Nx.tensor([
        [7.0, 2.0, 5.0, 3.0, 10.0, 2.0],
        [3.0, 8.0, 9.0, 3.0, 4.0, 2.0],
        [1.0, 5.0, 7.0, 5.0, 6.0, 1.0],
        [0.0, 6.0, 2.0, 7.0, 2.0, 8.0]
      ])

    source = Nx.tensor([[2.0, 6.0], [3.0, 1.0]])

    fun = fn x, s ->
      {Nx.window_scatter_max(x, s, 0.0, {2, 3}, strides: [2, 3]),
       Nx.window_scatter_min(x, s, 1.0, {2, 3}, strides: [2, 3])}
    end

    assert_same(fun, [x, source])

    # padding (the reference crashes on it): check by hand
    [res] =
      run(
        fn x, s ->
          Nx.window_scatter_max(x, s, 0.0, {2, 2}, padding: [{1, 0}, {0, 0}], strides: [2, 3])
        end,
        [x, Nx.broadcast(1.5, {2, 2})]
      )

    assert Nx.to_number(Nx.sum(res)) == 6.0
  end

  test "sort and argsort, both directions, stable" do
    x = Nx.tensor([[3, 1, 2, 1, 3, 0], [5, 5, -1, 5, 2, -1]])

    fun = fn x ->
      %{
        asc: Nx.sort(x, axis: 1),
        desc: Nx.sort(x, axis: 1, direction: :desc),
        axis0: Nx.sort(x, axis: 0, direction: :desc),
        argsort: Nx.argsort(x, axis: 1),
        argsort_desc: Nx.argsort(x, axis: 1, direction: :desc),
        argsort_u8: Nx.argsort(Nx.as_type(x, :u8), axis: 1, type: :u32),
        float: Nx.sort(Nx.as_type(x, :f32), axis: 1, direction: :desc),
        float_arg: Nx.argsort(Nx.divide(x, 3), axis: 1)
      }
    end

    assert_same(fun, [x])
  end

  test "sort puts NaN last ascending and first descending" do
    x = Nx.tensor([2.0, :nan, -1.0, :infinity, :neg_infinity, 0.0])

    [asc, desc, arg] =
      run(fn x -> {Nx.sort(x), Nx.sort(x, direction: :desc), Nx.argsort(x)} end, [x])

    assert Nx.to_flat_list(asc) == [:neg_infinity, -1.0, 0.0, 2.0, :infinity, :nan]
    assert Nx.to_flat_list(desc) == [:nan, :infinity, 2.0, 0.0, -1.0, :neg_infinity]
    assert Nx.to_flat_list(arg) == [4, 2, 5, 0, 3, 1]
  end

  test "top_k" do
    x = Nx.tensor([[3.0, 1.0, 4.0, 1.5, 9.0], [2.0, 7.0, 1.0, 8.0, 2.5]])
    assert_same(fn x -> Nx.top_k(x, k: 3) end, [x])
  end

  test "cumulative ops" do
    x = Nx.tensor([[1, 2, 3, 4], [5, -1, 2, 0]])

    fun = fn x ->
      %{
        sum: Nx.cumulative_sum(x, axis: 1),
        sum_rev: Nx.cumulative_sum(x, axis: 1, reverse: true),
        product: Nx.cumulative_product(x, axis: 0),
        min: Nx.cumulative_min(x, axis: 1),
        max: Nx.cumulative_max(x, axis: 1, reverse: true),
        float: Nx.cumulative_sum(Nx.divide(x, 2), axis: 1)
      }
    end

    assert_same(fun, [x])
  end

  @tag nx: :maps?
  test "map" do
    x = Nx.tensor([1.0, 2.0, 3.0])
    assert_same(fn x -> Nx.map(x, fn y -> Nx.add(Nx.multiply(y, y), 1) end) end, [x])
  end
end
