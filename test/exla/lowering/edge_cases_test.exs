defmodule EXLA.Lowering.EdgeCasesTest do
  use EXLA.LoweringCase, async: true
  import Nx.Defn

  defn vectorized_cond(x) do
    x = Nx.vectorize(x, :rows)

    if Nx.sum(x) > 2 do
      x * 10
    else
      x - 1
    end
  end

  defn vectorized_while(x) do
    x = Nx.vectorize(x, :rows)

    {r, _} =
      while {x, i = 0}, Nx.sum(x) < 10 and i < 10 do
        {x + 1, i + 1}
      end

    r
  end

  defn hook_in_cond(x) do
    if x[0] > 0 do
      hook(x + 1, :positive)
    else
      x
    end
  end

  test "scalars" do
    fun = fn x ->
      {Nx.sum(x), Nx.argmax(x), Nx.exp(x), Nx.reduce(x, 0.0, &Nx.add/2), Nx.reshape(x, {1, 1}),
       Nx.broadcast(x, {2})}
    end

    assert_same(fun, [Nx.tensor(1.5)])
  end

  test "numbers, parameters and repeated values as outputs" do
    assert_same(fn x, y -> {x, 1, 2.5, y, Nx.add(x, 1), Nx.add(x, 1)} end, [
      Nx.tensor([1, 2]),
      Nx.tensor(3.0)
    ])
  end

  test "no outputs" do
    %{program: %{text: text, output_shapes: []}} = lower(fn _x -> {} end, [Nx.tensor(1)])
    assert run(fn _x -> {} end, [Nx.tensor(1)]) == []
    assert text =~ "-> ()"
  end

  test "vectorized cond and while" do
    x = Nx.tensor([[1, 2], [0, 1], [3, 3]])
    assert_same(&vectorized_cond/1, [x])
    assert_same(&vectorized_while/1, [x])
  end

  test "hooks inside cond branches" do
    assert_same(&hook_in_cond/1, [Nx.tensor([1.0, 2.0])])
    assert_same(&hook_in_cond/1, [Nx.tensor([-1.0, 2.0])])
  end

  test "reductions and sorts on half precision" do
    fun = fn x ->
      {Nx.sum(x, axes: [1]), Nx.reduce_max(x), Nx.argmax(x, axis: 1), Nx.sort(x, axis: 1),
       Nx.window_sum(x, {1, 2})}
    end

    x = Nx.tensor([[1.5, -2.0, 3.25], [0.5, 0.5, -1.0]])
    assert_same(fun, [Nx.as_type(x, :f16)], atol: 1.0e-2)
    assert_same(fun, [Nx.as_type(x, :bf16)], atol: 1.0e-2)
  end

  test "64-bit integer limits" do
    u = Nx.tensor([18_446_744_073_709_551_615, 0], type: :u64)
    s = Nx.tensor([-9_223_372_036_854_775_808, 9_223_372_036_854_775_807], type: :s64)

    fun = fn u, s ->
      {Nx.add(u, 1), Nx.subtract(s, 1), Nx.reduce_max(u), Nx.reduce_min(s),
       Nx.iota({3}, type: :u64), Nx.bitwise_xor(u, 18_446_744_073_709_551_615)}
    end

    assert_same(fun, [u, s])
  end

  test "concatenate of a single tensor and unused inputs" do
    %{used_inputs: [1]} =
      lower(fn _x, y -> Nx.concatenate([y]) end, [Nx.tensor(1), Nx.tensor([2])])

    assert_same(fn _x, y -> Nx.concatenate([y]) end, [Nx.tensor(1), Nx.tensor([2])])
  end

  test "all_close and complex dot" do
    a = Nx.tensor([[1.0, 2.0], [3.0, 4.0]])
    c = Nx.multiply(a, Complex.new(1, -1))

    assert_same(
      fn a, c -> {Nx.all_close(a, Nx.add(a, 1.0e-9)), Nx.all_close(a, c), Nx.dot(c, c)} end,
      [a, c]
    )
  end

  test "a deep chain lowers quickly" do
    fun = fn x -> Enum.reduce(1..300, x, fn i, acc -> Nx.add(Nx.multiply(acc, 0.5), i) end) end
    {time, _} = :timer.tc(fn -> mlir(fun, [Nx.tensor([1.0])]) end)
    assert time < 1_000_000
    assert_same(fun, [Nx.tensor([1.0])])
  end
end
