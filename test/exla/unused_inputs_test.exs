defmodule EXLA.UnusedInputsTest do
  # Arguments a program does not use are not parameters: they are never
  # transferred, and templates or lazy containers among them never built.
  use ExUnit.Case, async: true

  # Streams exist on Nx 0.7 only (Nx 0.10 removed them); these tests are
  # excluded on the other lines, where the calls below are undefined.
  @compile {:no_warn_undefined, [{EXLA, :stream, 2}, {EXLA, :stream, 3}, Nx.Stream]}

  import Nx.Defn

  alias EXLA.Test.LazyLoader

  defp loader(tensor), do: %LazyLoader{notify: self(), tensor: tensor}

  defn add_first(a, _b), do: a + 1

  test "a template argument the program does not use" do
    fun = Nx.Defn.jit(fn a, _b -> Nx.add(a, 1) end, compiler: EXLA)
    assert Nx.to_flat_list(fun.(Nx.tensor([1]), Nx.template({2}, :f32))) == [2]
    assert Nx.to_flat_list(EXLA.jit(&add_first/2).(Nx.tensor([3]), Nx.template({}, :s8))) == [4]
  end

  test "an unused lazy container is not built, a used one is" do
    fun = EXLA.jit(fn a, _b, c -> Nx.add(a, c) end)
    result = fun.(Nx.tensor([1, 2]), loader(Nx.tensor([5, 6])), Nx.tensor(10))
    assert Nx.to_flat_list(result) == [11, 12]
    refute_received :loaded

    result = EXLA.jit(fn a, b -> Nx.add(a, b) end).(Nx.tensor([1, 2]), loader(Nx.tensor([5, 6])))
    assert Nx.to_flat_list(result) == [6, 8]
    assert_received :loaded
  end

  test "unused entries of containers" do
    fun = EXLA.jit(fn {a, _b}, %{c: c, d: _d} -> Nx.multiply(a, c) end)

    args = [
      {Nx.tensor(2.0), Nx.template({3}, :f32)},
      %{c: Nx.tensor(4.0), d: loader(Nx.tensor(1))}
    ]

    assert Nx.to_number(apply(fun, args)) == 8.0
    refute_received :loaded
  end

  test "EXLA.compile: templates and lazy containers in unused positions" do
    templates = [Nx.template({2}, :f32), Nx.template({4}, :s64), Nx.template({2}, :f32)]
    fun = EXLA.compile(fn a, _b, c -> Nx.subtract(a, c) end, templates)

    assert Nx.to_flat_list(
             fun.(Nx.tensor([5.0, 6.0]), Nx.template({4}, :s64), Nx.tensor([1.0, 1.0]))
           ) ==
             [4.0, 5.0]

    result = fun.(Nx.tensor([5.0, 6.0]), loader(Nx.iota({4}, type: :s64)), Nx.tensor([1.0, 2.0]))
    assert Nx.to_flat_list(result) == [4.0, 4.0]
    refute_received :loaded
  end

  test "a program with no used input" do
    fun = EXLA.jit(fn _a -> Nx.tensor([1, 2, 3]) end)
    assert Nx.to_flat_list(fun.(Nx.template({1000}, :f32))) == [1, 2, 3]
  end

  test "with hooks, unused inputs are not transferred either" do
    parent = self()

    fun =
      EXLA.jit(fn a, _b -> Nx.Defn.Kernel.hook(Nx.add(a, 1), :seen) end,
        hooks: %{seen: &send(parent, &1)}
      )

    assert Nx.to_flat_list(fun.(Nx.tensor([1]), Nx.template({2}, :f32))) == [2]
    assert_received %Nx.Tensor{} = seen
    assert Nx.to_flat_list(seen) == [2]
  end

  test "a donated input is given up even when the program does not read it" do
    a = Nx.tensor([1.0, 2.0], backend: EXLA.Backend)
    b = Nx.tensor([3.0, 4.0], backend: EXLA.Backend)
    fun = EXLA.jit(fn a, _b -> Nx.multiply(a, 2) end, donate: [1])
    assert Nx.to_flat_list(fun.(a, b)) == [2.0, 4.0]
    assert Nx.to_flat_list(a) == [1.0, 2.0]

    error = assert_raise RuntimeError, fn -> Nx.to_binary(b) end
    assert Exception.message(error) =~ "called on deleted or donated buffer"

    # after an input left out, donated positions still name the right ones
    [a, b, c] = for x <- [1.0, 2.0, 3.0], do: Nx.tensor([x], backend: EXLA.Backend)
    fun = EXLA.jit(fn a, _b, c -> Nx.add(a, c) end, donate: [2])
    assert Nx.to_flat_list(fun.(a, b, c)) == [4.0]
    assert Nx.to_flat_list(a) ++ Nx.to_flat_list(b) == [1.0, 2.0]
    assert_raise RuntimeError, fn -> Nx.to_binary(c) end
  end

  test "an initializer called with templates, as Axon's init_fn is" do
    init = EXLA.jit(fn _input, params -> Map.put(params, :w, Nx.iota({2, 2}, type: :f32)) end)
    assert %{w: w} = init.(Nx.template({1, 2}, :f32), %{})
    assert Nx.to_flat_list(w) == [0.0, 1.0, 2.0, 3.0]
  end

  @tag nx: :streams?
  test "streams: arguments the step does not read are not built nor transferred" do
    step = fn x, acc, scale, _unused -> {acc, Nx.add(acc, Nx.multiply(x, scale))} end
    args = [Nx.template({}, :s64), 0, Nx.tensor(10), loader(Nx.tensor([1, 2]))]
    stream = EXLA.stream(step, args)
    refute_received :loaded

    for x <- [1, 2], do: assert(Nx.Stream.send(stream, x) == :ok)
    assert Enum.map(1..2, fn _ -> Nx.to_number(Nx.Stream.recv(stream)) end) == [0, 10]
    assert Nx.to_number(Nx.Stream.done(stream)) == 30

    # an accumulator is always taken, read or not
    stream = EXLA.stream(fn x, _acc, _c -> {x, x} end, [0, 5, Nx.template({3}, :f32)])
    assert Nx.to_number(Nx.Stream.done(stream)) == 5
  end

  test "to_mlir_module: @main takes only the used inputs" do
    args = [Nx.template({2}, :f32), Nx.template({3}, :s64), Nx.template({2}, :f32)]

    %{mlir_module: mlir, used_inputs: used} =
      EXLA.to_mlir_module(fn a, b, _c -> add_first(a, b) end, args)

    assert used == MapSet.new([0])
    assert mlir =~ ~r/@main\(%arg0: tensor<2xf32>\)/
  end
end
