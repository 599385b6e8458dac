defmodule EXLA.DonationTest do
  # Uses a client of its own, with two devices (changes :clients).
  use ExUnit.Case, async: false

  # Streams exist on Nx 0.7 only (Nx 0.10 removed them); the test that
  # streams is excluded on the other lines, where EXLA.stream is undefined.
  @compile {:no_warn_undefined, [{EXLA, :stream, 2}, {EXLA, :stream, 3}, Nx.Stream]}

  import Nx.Defn

  @client :donation_test

  setup_all do
    EXLA.TestClients.add(@client, platform: :host, device_count: 2)
  end

  # One SGD step of a linear model: returns the new parameters and the loss.
  defn step({w, b}, x, y) do
    {loss, {gw, gb}} =
      value_and_grad({w, b}, fn {w, b} -> Nx.mean((Nx.dot(x, w) + b - y) ** 2) end)

    {{w - 0.1 * gw, b - 0.1 * gb}, loss}
  end

  defn scale_and_sum(a, b), do: {a * 2, Nx.sum(b)}

  defp on(device_id \\ 0), do: {EXLA.Backend, client: @client, device_id: device_id}
  defp exla(fun, opts), do: EXLA.jit(fun, [client: @client] ++ opts)

  defp params do
    {Nx.tensor([[0.5], [-0.25], [1.0]], backend: on()), Nx.tensor([0.1], backend: on())}
  end

  defp data do
    x = Nx.tensor([[1.0, 2.0, 3.0], [0.0, -1.0, 2.0]], backend: on())
    {x, Nx.tensor([[1.0], [2.0]], backend: on())}
  end

  defp evaluator(fun, args), do: apply(Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator), args)

  defp assert_donated(tensor) do
    error = assert_raise RuntimeError, fn -> Nx.to_binary(tensor) end
    assert Exception.message(error) =~ "called on deleted or donated buffer"
  end

  defp flat(container), do: Nx.Defn.Composite.flatten_list([container])

  defp same_bits(left, right),
    do: Enum.map(flat(left), &Nx.to_binary/1) == Enum.map(flat(right), &Nx.to_binary/1)

  test "a donated container's tensors read as deallocated; the results do not change" do
    {x, y} = data()
    binary = &Nx.backend_copy(&1, Nx.BinaryBackend)
    reference = evaluator(&step/3, Enum.map([params(), x, y], binary))
    expected = exla(&step/3, []).(params(), x, y)
    {w, b} = donated = params()
    result = exla(&step/3, donate: [0]).(donated, x, y)
    assert same_bits(result, expected)

    for {got, want} <- Enum.zip(flat(result), flat(reference)) do
      assert Nx.all_close(binary.(got), want, atol: 1.0e-6) |> Nx.to_number() == 1
    end

    assert_donated(w)
    assert_donated(b)
    # Arguments not donated stay.
    assert Nx.to_binary(x) == Nx.to_binary(Nx.backend_copy(x))
    assert Nx.backend_deallocate(w) == :already_deallocated
  end

  test "a training loop updates its parameters in place" do
    {x, y} = data()
    step = exla(&step/3, donate: [0])
    reference = Enum.reduce(1..5, params(), fn _, p -> elem(exla(&step/3, []).(p, x, y), 0) end)
    trained = Enum.reduce(1..5, params(), fn _, p -> elem(step.(p, x, y), 0) end)
    assert same_bits(trained, reference)
  end

  test "donated parameters are aliased to outputs of the same type in the program" do
    {x, y} = data()
    %{mlir_module: mlir} = EXLA.to_mlir_module(&step/3, [params(), x, y], donate: [0])
    assert mlir =~ "%arg0: tensor<3x1xf32> {tf.aliasing_output = 0 : i32}"
    assert mlir =~ "%arg1: tensor<1xf32> {tf.aliasing_output = 1 : i32}"
    assert mlir =~ ~r/%arg2: tensor<2x3xf32>[,)]/

    # b (f32[3]) matches no output: it is not aliased, but still donated.
    a = Nx.tensor([1.0, 2.0], backend: on())
    b = Nx.tensor([1.0, 2.0, 3.0], backend: on())
    %{mlir_module: mlir} = EXLA.to_mlir_module(&scale_and_sum/2, [a, b], donate: [0, 1])
    refute mlir =~ "%arg1: tensor<3xf32> {"
    assert mlir =~ "%arg0: tensor<2xf32> {tf.aliasing_output = 0 : i32}"
    {doubled, sum} = exla(&scale_and_sum/2, donate: [0, 1]).(a, b)
    assert Nx.to_flat_list(doubled) == [2.0, 4.0] and Nx.to_number(sum) == 6.0
    assert_donated(a)
    assert_donated(b)
  end

  test "without :donate nothing is donated and the program has no aliases" do
    {x, y} = data()
    {w, b} = p = params()
    %{mlir_module: mlir} = EXLA.to_mlir_module(&step/3, [p, x, y])
    refute mlir =~ "aliasing_output"
    exla(&step/3, []).(p, x, y)
    assert Nx.to_binary(w) != <<>> and Nx.to_binary(b) != <<>>
  end

  test "the option is part of the cache key" do
    {x, y} = data()
    # A function no other test compiles.
    fun = fn p, x, y -> step(p, x, y) end
    EXLA.jit(fun, client: @client).(params(), x, y)
    assert EXLA.cached?(fun, [params(), x, y], client: @client)
    refute EXLA.cached?(fun, [params(), x, y], client: @client, donate: [0])
    EXLA.jit(fun, client: @client, donate: [0]).(params(), x, y)
    assert EXLA.cached?(fun, [params(), x, y], client: @client, donate: [0])
    refute EXLA.cached?(fun, [params(), x, y], client: @client, donate: [1])
  end

  test "tensors on another device or backend are copied and the copies donated" do
    {x, y} = data()
    expected = exla(&step/3, []).(params(), x, y)
    {w1, b1} = other_device = Nx.backend_copy(params(), on(1))
    assert same_bits(exla(&step/3, donate: [0]).(other_device, x, y), expected)
    assert Nx.to_binary(w1) == Nx.to_binary(Nx.backend_copy(elem(params(), 0)))
    assert Nx.to_binary(b1) != <<>>

    {wb, _} = binary = Nx.backend_copy(params(), Nx.BinaryBackend)
    assert same_bits(exla(&step/3, donate: [0]).(binary, x, y), expected)
    assert Nx.to_binary(wb) == Nx.to_binary(elem(params(), 0))

    # Numbers are arguments too.
    assert Nx.to_number(exla(&Nx.add/2, donate: [0, 1]).(1.0, 2.0)) == 3.0
  end

  test "EXLA.compile and hooks donate too" do
    {x, y} = data()
    expected = exla(&step/3, []).(params(), x, y)

    compiled = EXLA.compile(&step/3, [params(), x, y], client: @client, donate: [0])
    {w, _} = p = params()
    assert same_bits(compiled.(p, x, y), expected)
    assert_donated(w)

    test = self()

    hooked = fn p, x, y ->
      {p, loss} = step(p, x, y)
      {p, Nx.Defn.Kernel.hook(loss, :loss, &send(test, {:loss, &1}))}
    end

    {w, _} = p = params()
    assert same_bits(exla(hooked, donate: [0]).(p, x, y), expected)
    assert_received {:loss, _}
    assert_donated(w)
  end

  test "lazy transfers donate the inputs already on the device" do
    {x, y} = data()
    expected = exla(&step/3, []).(params(), x, y)
    {w, b} = p = params()
    lazy = exla(&step/3, donate: [0], lazy_transfers: :always)
    assert same_bits(lazy.(p, Nx.backend_copy(x, Nx.BinaryBackend), y), expected)
    assert_donated(w)
    assert_donated(b)
  end

  test "a tensor passed twice, once donated, raises and is kept" do
    a = Nx.tensor([1.0, 2.0], backend: on())

    assert_raise ArgumentError, ~r/donated in the same call/, fn ->
      exla(&Nx.add/2, donate: [0]).(a, a)
    end

    assert Nx.to_flat_list(a) == [1.0, 2.0]
  end

  test "an already deallocated tensor cannot be donated" do
    a = Nx.tensor([1.0, 2.0], backend: on())
    Nx.backend_deallocate(a)

    assert_raise RuntimeError, ~r/called on deleted or donated buffer/, fn ->
      exla(&Nx.negate/1, donate: [0]).(a)
    end
  end

  test "validates the option" do
    a = Nx.tensor([1.0], backend: on())

    for bad <- [0, [:a], [-1], nil] do
      assert_raise ArgumentError, ~r/expected :donate to be a list of argument positions/, fn ->
        exla(&Nx.negate/1, donate: bad).(a)
      end
    end

    assert_raise ArgumentError,
                 ~r/:donate refers to argument 1, .* takes 1 tensor argument/,
                 fn ->
                   exla(&Nx.negate/1, donate: [1]).(a)
                 end
  end

  @tag nx: :streams?
  test "streams refuse the option" do
    assert_raise ArgumentError, ~r/EXLA.stream\/3 does not support the :donate option/, fn ->
      EXLA.stream(fn x, acc -> {x, acc} end, [0, 0], donate: [1])
    end
  end
end
