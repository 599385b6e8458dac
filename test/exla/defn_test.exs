defmodule EXLA.DefnTest do
  use ExUnit.Case, async: true

  import Nx.Defn

  defn add_two(a, b), do: a + b
  defn softmax(t), do: Nx.exp(t) / Nx.sum(Nx.exp(t))
  defn pair({a, b}), do: {a * b, a - b}
  defn scale(t, opts \\ []), do: t * opts[:factor]
  defn grad_of_square(t), do: grad(t, &Nx.sum(&1 * &1))

  defn count_up(n) do
    {_, acc, _} =
      while {i = 0, acc = 0, n}, i < n do
        {i + 1, acc + i, n}
      end

    acc
  end

  defn clamp_sign(x) do
    if x > 0 do
      1
    else
      -1
    end
  end

  defp flat(t), do: Nx.to_flat_list(t)

  describe "defn with EXLA" do
    test "jit of a defn function" do
      result = EXLA.jit(&add_two/2).(Nx.tensor([1, 2]), Nx.tensor([3, 4]))
      assert %EXLA.Backend{} = result.data
      assert flat(result) == [4, 6]
    end

    test "mixes argument types" do
      result = EXLA.jit(&add_two/2).(Nx.tensor([1, 2], type: {:s, 32}), Nx.tensor(0.5))
      assert result.type == {:f, 32}
      assert flat(result) == [1.5, 2.5]
    end

    test "softmax" do
      result = EXLA.jit(&softmax/1).(Nx.tensor([1.0, 2.0, 3.0]))
      expected = softmax(Nx.tensor([1.0, 2.0, 3.0]))
      assert Nx.all_close(Nx.backend_transfer(result), expected) |> Nx.to_number() == 1
    end

    test "tuples in and out" do
      {prod, diff} = EXLA.jit(&pair/1).({Nx.tensor(3), Nx.tensor(2)})
      assert Nx.to_number(prod) == 6
      assert Nx.to_number(diff) == 1
    end

    test "static options" do
      assert flat(EXLA.jit(&scale/2).(Nx.tensor([1, 2]), factor: 3)) == [3, 6]
      assert flat(EXLA.jit(&scale/2).(Nx.tensor([1, 2]), factor: 4)) == [4, 8]
    end

    test "grad" do
      assert flat(EXLA.jit(&grad_of_square/1).(Nx.tensor([1.0, 2.0]))) == [2.0, 4.0]
    end

    test "while" do
      assert Nx.to_number(EXLA.jit(&count_up/1).(5)) == 10
    end

    test "cond" do
      assert Nx.to_number(EXLA.jit(&clamp_sign/1).(3)) == 1
      assert Nx.to_number(EXLA.jit(&clamp_sign/1).(-3)) == -1
    end

    test "as the default compiler" do
      Nx.Defn.default_options(compiler: EXLA)
      assert %EXLA.Backend{} = add_two(1, 2).data
      assert Nx.to_number(add_two(1, 2)) == 3
    after
      Nx.Defn.default_options([])
    end

    test "compiled functions" do
      fun = EXLA.compile(&add_two/2, [Nx.template({2}, {:s, 64}), Nx.template({2}, {:s, 64})])
      assert flat(fun.(Nx.tensor([1, 2], type: :s64), Nx.tensor([3, 4], type: :s64))) == [4, 6]
    end

    test "to_mlir_module of a defn function" do
      %{mlir_module: mlir, used_inputs: %MapSet{} = used} =
        EXLA.to_mlir_module(&add_two/2, [Nx.template({2}, {:f, 32}), Nx.template({2}, {:f, 32})])

      assert mlir =~ "stablehlo.add"
      assert used == MapSet.new([0, 1])
    end

    test "raises inside a JIT" do
      assert_raise RuntimeError, ~r/cannot invoke JITed function when there is a JIT/, fn ->
        EXLA.jit(fn x -> EXLA.jit(&Nx.negate/1).(x) end).(Nx.tensor(1))
      end
    end
  end

  describe "Nx.Defn compiler callbacks" do
    test "__compile__ returns a function of argument lists" do
      vars = [Nx.Defn.Expr.parameter(Nx.template({2}, {:f, 32}), :root, 0)]
      runtime = fn [x] -> Nx.Defn.Expr.tensor(Nx.negate(x)) end
      compiled = EXLA.__compile__(make_ref(), vars, runtime, [])
      [r1, r2] = compiled.([[Nx.tensor([1.0, 2.0])], [fn -> Nx.tensor([3.0, 4.0]) end]])
      assert flat(r1) == [-1.0, -2.0]
      assert flat(r2) == [-3.0, -4.0]
    end

    test "__jit__ runs every argument list" do
      vars = [Nx.Defn.Expr.parameter(Nx.template({}, {:s, 64}), :root, 0)]
      runtime = fn [x] -> Nx.Defn.Expr.tensor(Nx.multiply(x, 2)) end

      [a, b] =
        EXLA.__jit__(
          make_ref(),
          vars,
          runtime,
          [[fn -> Nx.tensor(1, type: :s64) end], [fn -> Nx.tensor(2, type: :s64) end]],
          []
        )

      assert Nx.to_number(a) == 2
      assert Nx.to_number(b) == 4
    end
  end
end
