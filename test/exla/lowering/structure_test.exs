defmodule EXLA.Lowering.StructureTest do
  use EXLA.LoweringCase, async: true

  @t Nx.iota({2, 3, 4}, type: :f32)

  test "creation ops" do
    fun = fn x ->
      %{
        iota: Nx.add(x, Nx.iota({2, 3, 4}, axis: 1)),
        iota_flat: Nx.iota({2, 3}),
        iota_f: Nx.iota({5}, type: :f16),
        iota_u8: Nx.iota({2, 3}, type: :u8, axis: 0),
        eye: Nx.eye(3),
        eye_batched: Nx.eye({2, 3, 4}, type: :u8),
        constant: Nx.broadcast(Nx.tensor(2.5, type: :f64), {2, 2}),
        tensor: Nx.add(x, Nx.tensor([1.0, 2.0, 3.0, 4.0])),
        complex_tensor: Nx.tensor([Complex.new(1, 2), Complex.new(0, -1)]),
        bf16_tensor: Nx.tensor([1.5, -2.25], type: :bf16),
        nan_constant: Nx.broadcast(Nx.Constants.nan(), {2})
      }
    end

    assert_same(fun, [@t])
  end

  test "a large tensor constant" do
    big = Nx.iota({64, 64}, type: :s32)
    assert_same(fn x -> Nx.add(x, big) end, [big])
  end

  test "reshape, squeeze, broadcast, transpose, reverse" do
    fun = fn x ->
      %{
        reshape: Nx.reshape(x, {4, 6}),
        squeeze: Nx.squeeze(Nx.reshape(x, {1, 2, 1, 12})),
        new_axis: Nx.new_axis(x, 1),
        broadcast: Nx.broadcast(Nx.tensor([1, 2, 3]), {2, 3}),
        broadcast_axes: Nx.broadcast(Nx.tensor([1, 2]), {2, 3}, axes: [0]),
        broadcast_expand: Nx.broadcast(Nx.slice(x, [0, 0, 0], [1, 3, 1]), {2, 3, 4}),
        transpose: Nx.transpose(x, axes: [2, 0, 1]),
        reverse: Nx.reverse(x, axes: [0, 2])
      }
    end

    assert_same(fun, [@t])
  end

  test "pad with negative and interior padding" do
    fun = fn x ->
      {Nx.pad(x, 0.5, [{1, 0, 0}, {0, 2, 1}, {-1, -1, 0}]),
       Nx.pad(x, Nx.tensor(-1.0), [{0, 0, 2}, {-2, 1, 0}, {2, -3, 1}])}
    end

    assert_same(fun, [@t])
  end

  test "static slices, strided and clamped" do
    fun = fn x ->
      {Nx.slice(x, [0, 1, 1], [2, 2, 3]), Nx.slice(x, [0, 0, 0], [2, 3, 4], strides: [1, 2, 3]),
       x[[1, 0..1, -1]], Nx.slice_along_axis(x, 1, 2, axis: 2)}
    end

    assert_same(fun, [@t])
  end

  test "dynamic slices clamp their starts" do
    fun = fn x, i, j ->
      {Nx.slice(x, [i, j, 0], [1, 2, 4]), Nx.slice(x, [0, i, j], [2, 2, 2], strides: [1, 1, 2]),
       Nx.slice_along_axis(x, j, 2, axis: 2)}
    end

    for {i, j} <- [{1, 1}, {0, 2}] do
      assert_same(fun, [@t, Nx.tensor(i), Nx.tensor(j, type: :u8)])
    end

    # out of range starts are clamped like Nx does
    [a, _, _] = run(fun, [@t, Nx.tensor(5), Nx.tensor(-3, type: :s8)])
    assert a == Nx.slice(@t, [1, 0, 0], [1, 2, 4])
  end

  test "put_slice" do
    fun = fn x, i ->
      {Nx.put_slice(x, [0, 1, 1], Nx.broadcast(-1.0, {2, 2, 2})),
       Nx.put_slice(x, [i, i, 3], Nx.tensor([[[7, 8], [9, 10]]])),
       Nx.put_slice(x, [1, 2, 0], Nx.iota({1, 1, 4}))}
    end

    assert_same(fun, [@t, Nx.tensor(1)])
    assert_same(fun, [@t, Nx.tensor(0)])
  end

  test "concatenate and stack" do
    fun = fn x, y ->
      {Nx.concatenate([x, y, x], axis: 1), Nx.stack([x, x], axis: 1),
       Nx.concatenate([Nx.as_type(x, :s32), y], axis: 0)}
    end

    assert_same(fun, [Nx.iota({2, 3}), Nx.iota({2, 3}, type: :f64)])
  end

  test "gather, take and take_along_axis" do
    idx = Nx.tensor([[0, 1, 2], [1, 0, 3], [1, 2, 0]])

    fun = fn x, idx ->
      %{
        gather: Nx.gather(x, idx),
        gather_axes: Nx.gather(x, Nx.slice(idx, [0, 0], [3, 2]), axes: [0, 2]),
        gather_one: Nx.gather(x, Nx.slice(idx, [0, 0], [3, 1])),
        take: Nx.take(x, Nx.tensor([2, 0, 0, 1]), axis: 1),
        take_2d: Nx.take(x, Nx.tensor([[3, 0], [1, 2]]), axis: 2),
        take_u8: Nx.take(x, Nx.tensor([1, 0], type: :u8)),
        along:
          Nx.take_along_axis(x, Nx.tensor([[[0, 3], [1, 1], [2, 0]]]) |> Nx.tile([2, 1, 1]),
            axis: 2
          ),
        along0: Nx.take_along_axis(x, Nx.broadcast(Nx.tensor([1, 0, 1, 0]), {1, 3, 4}), axis: 0)
      }
    end

    assert_same(fun, [@t, idx])
  end

  test "indexed_add and indexed_put" do
    fun = fn x, idx, upd ->
      %{
        add: Nx.indexed_add(x, idx, upd),
        put: Nx.indexed_put(x, idx, upd),
        add_dup:
          Nx.indexed_add(x, Nx.tensor([[0, 0], [0, 0], [1, 2]]), Nx.tensor([1.0, 2.0, 3.0])),
        add_axes:
          Nx.indexed_add(x, Nx.tensor([[1], [0]]), Nx.tensor([[1.0, 2.0], [4.0, 5.0]]), axes: [1]),
        put_rows: Nx.indexed_put(x, Nx.tensor([[1]]), Nx.tensor([[9.0, 8.0, 7.0]])),
        mixed: Nx.indexed_add(Nx.as_type(x, :s32), idx, Nx.tensor([1, 2]))
      }
    end

    x = Nx.iota({2, 3}, type: :f32)
    assert_same(fun, [x, Nx.tensor([[0, 1], [1, 2]]), Nx.tensor([10.0, 20.0])])
  end
end
