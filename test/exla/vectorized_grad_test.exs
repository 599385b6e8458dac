defmodule EXLA.VectorizedGradTest do
  # Gradients of vectorized inputs, and the vectorized values they are made
  # of, in jit and eagerly, against Nx.Defn.Evaluator on Nx.BinaryBackend.
  # Nx builds each node's arguments (a broadcast's shape and axes, a stack's
  # axis) in the devectorized frame and vectorizes only the result's struct,
  # so a node that is an output, where it is seen vectorized, must be
  # lowered as its devectorized self: the broadcasts of these gradients,
  # shifted by the vectorized rank once more, were invalid StableHLO.
  use EXLA.LoweringCase, async: true

  import Nx, only: [vectorize: 2]

  defp grad(inputs, fun), do: Nx.Defn.grad(inputs, fun)

  # Compares with the reference. Nx 0.12.1's own grad refuses many of these
  # gradients (a vectorized one that is summed or broadcast: "expected length
  # of axes (3) to match rank of shape (2)", "number of vectorized axes must
  # not be greater than the shape size"), the reference too: there EXLA
  # must refuse them with the same error. Nx 0.7.2 and 0.13.1 compute all.
  defp assert_grad(fun, args, opts \\ []) do
    case nx_0_12_refusal(fun, args) do
      nil ->
        assert_jit_and_eager(fun, args, opts)

      message ->
        assert_raise ArgumentError, message, fn -> EXLA.jit_apply(fun, args) end
        nil
    end
  end

  defp nx_0_12_refusal(fun, args) do
    if EXLA.NxVersion.line?([:v0_12]) do
      try do
        reference(fun, args)
        nil
      rescue
        e in ArgumentError -> Exception.message(e)
      end
    end
  end

  @rows Nx.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])

  test "two inputs vectorized on the same axis" do
    x = vectorize(@rows, :x)
    y = vectorize(Nx.tensor([10.0, 20.0]), :x)

    got = assert_grad(&grad({&1, &2}, fn {a, b} -> Nx.multiply(a, b) end), [x, y])
    {dx, dy} = got
    assert Nx.to_list(Nx.devectorize(dx)) == [[10.0, 10.0, 10.0], [20.0, 20.0, 20.0]]
    assert Nx.to_list(Nx.devectorize(dy)) == [6.0, 15.0]

    assert_grad(
      &grad({&1, &2}, fn {a, b} -> Nx.sum(Nx.multiply(Nx.sin(a), Nx.exp(b))) end),
      [x, y]
    )
  end

  test "inputs vectorized on different axes" do
    x = vectorize(@rows, :x)
    y = vectorize(Nx.tensor([10.0, 20.0]), :y)

    # the gradients are vectorized on both axes; before, the first did not
    # compile and the second compiled to wrong values
    assert_grad(&grad({&1, &2}, fn {a, b} -> Nx.multiply(a, b) end), [x, y])
    assert_grad(&grad({&2, &1}, fn {a, b} -> Nx.multiply(a, Nx.sin(b)) end), [x, y])

    assert_grad(&grad({&1, &2}, fn {a, b} -> Nx.sum(Nx.multiply(a, Nx.cos(b))) end), [
      x,
      y
    ])
  end

  test "a vectorized input with a plain scalar" do
    x = vectorize(Nx.tensor([[1.0, 2.0], [3.0, 4.0]]), :x)

    for scalar <- [Nx.tensor(3.0), Nx.tensor([3.0])] do
      assert_grad(
        &grad({&1, &2}, fn {a, b} -> Nx.sum(Nx.add(Nx.multiply(a, b), Nx.multiply(b, b))) end),
        [x, scalar]
      )
    end
  end

  test "three vectorized axes" do
    x = vectorize(Nx.tensor([1.0, 2.0]), :x)
    y = vectorize(Nx.tensor([3.0, 4.0, 5.0]), :y)
    z = vectorize(Nx.tensor([[6.0, 7.0], [8.0, 9.0], [1.0, 2.0], [3.0, 4.0]]), :z)

    assert_grad(
      &grad({&1, &2, &3}, fn {a, b, c} -> Nx.multiply(Nx.multiply(a, b), c) end),
      [x, y, z]
    )

    assert_grad(&grad(&1, fn a -> Nx.sum(Nx.multiply(a, &2)) end), [z, y])
  end

  test "sum(t * argmax(t))" do
    t = vectorize(Nx.tensor([[1.0, 5.0, 2.0], [7.0, 0.0, 1.0]]), :x)
    fun = &grad(&1, fn t -> Nx.sum(Nx.multiply(t, Nx.argmax(t))) end)
    assert_grad(fun, [t])
  end

  test "integer inputs" do
    x = vectorize(Nx.tensor([[1, 2], [3, 4]]), :x)
    y = vectorize(Nx.tensor([5, 6]), :x)
    assert_grad(&grad({&1, &2}, fn {a, b} -> Nx.sum(Nx.multiply(a, b)) end), [x, y])
    assert_grad(&grad(&1, fn a -> Nx.multiply(a, a) end), [x])
  end

  test "reductions, dot and slicing of vectorized inputs" do
    x = vectorize(Nx.iota({2, 3, 4}, type: :f32) |> Nx.divide(10), :x)
    w = Nx.iota({4, 2}, type: :f32) |> Nx.subtract(3)

    fun = fn x, w ->
      grad({x, w}, fn {x, w} ->
        y = Nx.dot(x, w) |> Nx.tanh()
        Nx.add(Nx.sum(y[[.., 0]]), Nx.reduce_max(Nx.multiply(x, x)))
      end)
    end

    assert_grad(fun, [x, w])
  end

  test "vectorized outputs made by broadcast and stack" do
    x = vectorize(Nx.tensor([1.0, 2.0]), :x)
    y = vectorize(Nx.tensor([[1.0, 2.0], [3.0, 4.0]]), :x)

    assert_jit_and_eager(fn x -> Nx.broadcast(x, {2, 3}) end, [x])
    assert_jit_and_eager(fn x, y -> Nx.add(Nx.broadcast(y, {3, 2}), x) end, [x, y])

    if EXLA.NxVersion.stack?() do
      assert_jit_and_eager(fn y -> Nx.stack([y, Nx.multiply(y, 2)], axis: 1) end, [y])
    end
  end
end
