defmodule EXLA.IndexTypesTest do
  # Every op that takes indices accepts them in every integer type, in jit
  # and eager, with the results of Nx.BinaryBackend.
  use ExUnit.Case, async: true

  @index_types [{:s, 8}, {:s, 16}, {:s, 32}, {:s, 64}, {:u, 8}, {:u, 16}, {:u, 32}, {:u, 64}]

  # Nx 0.13.1 takes only expressions as the tensors of a block inside
  # defn (Nx.take/3 and Nx.take_along_axis/3 are blocks there; Nx after
  # 0.13.1 takes constants too, elixir-nx/nx#1807): inside jit the indices
  # are made the program's constants explicitly, on every Nx line.
  defp idx(list, type) do
    t = Nx.tensor(list, type: type, backend: Nx.BinaryBackend)
    if Nx.Defn.Compiler.current(), do: Nx.Defn.Expr.tensor(t), else: t
  end

  # Each case takes the operand and the index type.
  @cases [
    take: &__MODULE__.take/2,
    take_leading_axis: &__MODULE__.take_leading_axis/2,
    take_along_axis: &__MODULE__.take_along_axis/2,
    take_along_last_axis: &__MODULE__.take_along_last_axis/2,
    gather: &__MODULE__.gather/2,
    gather_axes: &__MODULE__.gather_axes/2,
    indexed_add: &__MODULE__.indexed_add/2,
    indexed_put: &__MODULE__.indexed_put/2,
    indexed_add_axes: &__MODULE__.indexed_add_axes/2,
    slice: &__MODULE__.slice/2,
    slice_mixed_types: &__MODULE__.slice_mixed_types/2,
    slice_along_axis: &__MODULE__.slice_along_axis/2,
    put_slice: &__MODULE__.put_slice/2,
    argsort_fed_back: &__MODULE__.argsort_fed_back/2,
    argmax_fed_back: &__MODULE__.argmax_fed_back/2,
    integer_operand: &__MODULE__.integer_operand/2
  ]

  def take(t, type), do: Nx.take(t, idx([2, 0, 1], type), axis: 2)
  def take_leading_axis(t, type), do: Nx.take(t, idx([[1, 0]], type))

  def take_along_axis(t, type) do
    i = idx([[[0, 1, 0, 1], [1, 0, 2, 0]], [[2, 2, 2, 2], [0, 0, 0, 1]]], type)
    Nx.take_along_axis(t, i, axis: 1)
  end

  def take_along_last_axis(t, type),
    do: Nx.take_along_axis(t, Nx.broadcast(idx([3, 0], type), {2, 3, 2}), axis: 2)

  def gather(t, type), do: Nx.gather(t, idx([[1, 2, 3], [0, 1, 0]], type))
  def gather_axes(t, type), do: Nx.gather(t, idx([[1, 2], [0, 3]], type), axes: [0, 2])

  def indexed_add(t, type),
    do: Nx.indexed_add(t, idx([[1, 2, 3], [0, 1, 0]], type), Nx.tensor([10.0, 20.0]))

  def indexed_put(t, type),
    do: Nx.indexed_put(t, idx([[1, 2, 3], [0, 1, 0]], type), Nx.tensor([10.0, 20.0]))

  def indexed_add_axes(t, type) do
    updates = Nx.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    Nx.indexed_add(t, idx([[1, 2], [0, 3]], type), updates, axes: [0, 2])
  end

  def slice(t, type), do: Nx.slice(t, [idx(1, type), 1, idx(2, type)], [1, 2, 2])

  def slice_mixed_types(t, type),
    do: Nx.slice(t, [idx(1, type), idx(1, {:s, 64}), idx(0, {:u, 8})], [1, 2, 2])

  def slice_along_axis(t, type), do: Nx.slice_along_axis(t, idx(1, type), 2, axis: 2)

  def put_slice(t, type),
    do: Nx.put_slice(t, [idx(1, type), 0, idx(1, type)], Nx.broadcast(-1.0, {1, 2, 2}))

  def argsort_fed_back(t, type),
    do: Nx.take_along_axis(t, Nx.argsort(Nx.negate(t), axis: 2, type: type), axis: 2)

  def argmax_fed_back(t, type),
    do: Nx.take(t, Nx.flatten(Nx.argmax(t, axis: 0, type: type)), axis: 1)

  def integer_operand(_t, type) do
    x = Nx.iota({5}, type: type)
    {Nx.take(x, idx([4, 0], type)), Nx.indexed_add(x, idx([[4], [0]], type), idx([1, 2], type))}
  end

  defp operand, do: Nx.iota({2, 3, 4}, type: :f32, backend: Nx.BinaryBackend)

  defp assert_same(expected, actual, label) do
    expected = Nx.Defn.Composite.flatten_list([expected])
    actual = Nx.Defn.Composite.flatten_list([actual])

    for {e, a} <- Enum.zip(expected, actual) do
      assert {a.type, a.shape} == {e.type, e.shape}, label
      assert Nx.to_flat_list(a) == Nx.to_flat_list(e), label
    end
  end

  for {name, fun} <- @cases do
    test "#{name} with every integer index type" do
      fun = unquote(fun)

      for type <- @index_types do
        expected = fun.(operand(), type)
        label = "#{unquote(name)} with #{inspect(type)}"
        assert_same(expected, EXLA.jit(&fun.(&1, type)).(operand()), "jit: " <> label)
        eager = fun.(Nx.backend_transfer(operand(), EXLA.Backend), type)
        assert_same(expected, eager, "eager: " <> label)
      end
    end
  end

  test "u64 indices past the s64 range clamp to the end of the axis" do
    huge = fn -> idx([18_446_744_073_709_551_615, 0, 9_223_372_036_854_775_808], {:u, 64}) end
    result = EXLA.jit(&Nx.take(&1, huge.(), axis: 2)).(operand())
    assert Nx.to_flat_list(result[0][0]) == [3.0, 0.0, 3.0]

    start = idx(18_446_744_073_709_551_615, {:u, 64})
    result = EXLA.jit(&Nx.slice(&1, [start, 0, 0], [1, 1, 1])).(operand())
    assert Nx.to_flat_list(result) == [12.0]
  end
end
