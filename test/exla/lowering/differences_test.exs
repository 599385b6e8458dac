defmodule EXLA.Lowering.DifferencesTest do
  # Where compiled code follows XLA and the reference raises or differs
  # (see "Differences from Nx.BinaryBackend" in EXLA.Defn.Lowering).
  use EXLA.LoweringCase, async: true

  test "float division by zero and out-of-domain functions give IEEE values" do
    x = Nx.tensor([1.0, -1.0, 0.0])

    [div, sqrt, log, acos, floor, tanh, sign, clip] =
      run(
        fn x ->
          {Nx.divide(x, 0.0), Nx.sqrt(Nx.negate(x)), Nx.log(x), Nx.acos(Nx.multiply(x, 2)),
           Nx.floor(Nx.divide(x, 0.0)), Nx.tanh(Nx.divide(x, 0.0)), Nx.sign(Nx.divide(x, 0.0)),
           Nx.clip(Nx.divide(x, 0.0), -1, 1)}
        end,
        [x]
      )

    assert Nx.to_flat_list(div) == [:infinity, :neg_infinity, :nan]
    assert Nx.to_flat_list(sqrt) |> Enum.at(0) == :nan
    assert Nx.to_flat_list(log) == [0.0, :nan, :neg_infinity]
    assert Nx.to_flat_list(acos) |> Enum.at(0) == :nan
    assert Nx.to_flat_list(floor) == [:infinity, :neg_infinity, :nan]
    assert Nx.to_flat_list(tanh) |> Enum.take(2) == [1.0, -1.0]
    assert Nx.to_flat_list(sign) |> Enum.at(2) == :nan
    assert Nx.to_flat_list(clip) == [1.0, -1.0, :nan]
  end

  test "integer division and remainder by zero" do
    a = Nx.tensor([7, -7, 0], type: :s32)
    z = Nx.tensor([0, 0, 0], type: :s32)
    [q, r] = run(fn a, z -> {Nx.quotient(a, z), Nx.remainder(a, z)} end, [a, z])
    assert Nx.to_flat_list(q) == [-1, -1, -1]
    assert Nx.to_flat_list(r) == [7, -7, 0]

    u = Nx.tensor([7, 0], type: :u8)
    [q] = run(fn a -> Nx.quotient(a, Nx.tensor(0, type: :u8)) end, [u])
    assert Nx.to_flat_list(q) == [255, 255]
  end

  test "finite floats out of integer range saturate" do
    x = Nx.tensor([300.0, -1.5, 1.0e10, -1.0e10])
    [u8, s32] = run(fn x -> {Nx.as_type(x, :u8), Nx.as_type(x, :s32)} end, [x])
    assert Nx.to_flat_list(u8) == [255, 0, 255, 0]
    assert Nx.to_flat_list(s32) == [300, -1, 2_147_483_647, -2_147_483_648]
  end

  test "integer pow with negative exponents and shifts by negative amounts" do
    b = Nx.tensor([2, 1, -1, -1], type: :s32)
    e = Nx.tensor([-1, -3, -3, -2], type: :s32)
    [p] = run(&Nx.pow/2, [b, e])
    assert Nx.to_flat_list(p) == [0, 1, -1, 1]

    a = Nx.tensor([5, -5], type: :s32)
    s = Nx.tensor([-1, -1], type: :s32)
    [l, r] = run(fn a, s -> {Nx.left_shift(a, s), Nx.right_shift(a, s)} end, [a, s])
    assert Nx.to_flat_list(l) == [0, 0]
    assert Nx.to_flat_list(r) == [0, -1]
  end

  test "out-of-bounds indices are clamped (gather) or dropped (scatter)" do
    x = Nx.tensor([10, 20, 30])

    [t, g, a] =
      run(
        fn x ->
          {Nx.take(x, Nx.tensor([5, -1])), Nx.gather(x, Nx.tensor([[7]])),
           Nx.indexed_add(x, Nx.tensor([[3], [1]]), Nx.tensor([1, 1]))}
        end,
        [x]
      )

    assert Nx.to_flat_list(t) == [30, 10]
    assert Nx.to_flat_list(g) == [30]
    assert Nx.to_flat_list(a) == [10, 21, 30]
  end

  test "complex sign, acos and acosh follow the principal definitions" do
    z = Nx.tensor([Complex.new(-0.3, 0.6), Complex.new(3.0, -4.0)])
    [sign, acos, acosh] = run(fn z -> {Nx.sign(z), Nx.acos(z), Nx.acosh(z)} end, [z])
    assert_tensor(Nx.divide(z, Nx.abs(z)), sign)
    # principal acos has its real part in [0, pi]
    assert Nx.to_number(Nx.all(Nx.greater_equal(Nx.real(acos), 0))) == 1
    # principal acosh has a non-negative real part
    assert Nx.to_number(Nx.all(Nx.greater_equal(Nx.real(acosh), 0))) == 1
  end
end
