defmodule EXLA.IntegerLiteralsTest do
  # An integer literal in an Nx operation is a scalar tensor of the line's
  # default integer type (s32 on Nx 0.12 and later, s64 on Nx 0.7) holding
  # the number wrapped to that type, whatever the other operand's type:
  # `Nx.add(s64_tensor, 2 ** 40 + 3)` adds 3 on Nx 0.13. EXLA.jit emits the
  # literal as that wrapped value, as EXLA.Backend and the reference do (it
  # emitted the unwrapped number in the wider type).
  use EXLA.LoweringCase, async: true

  @default EXLA.NxVersion.default_integer()
  @bits elem(@default, 1)
  bits = @bits

  # Literals outside the default integer type, at its edges and far off.
  @literals [
    2 ** (bits - 1),
    -(2 ** (bits - 1)) - 1,
    2 ** bits + 7,
    -(2 ** (bits + 8)) - 3,
    9_223_372_036_854_775_000 + if(bits == 64, do: 2 ** 64, else: 0)
  ]

  defp wrapped(literal), do: literal |> Nx.tensor(type: @default) |> Nx.to_number()

  test "the literals wrap to the default integer type" do
    for literal <- @literals do
      <<expected::signed-size(@bits)>> = <<literal::size(@bits)>>
      assert wrapped(literal) == expected
      assert Nx.tensor(literal).type == @default
    end
  end

  test "with signed and float tensors: jit, eager and the reference agree" do
    for type <- [:s64, :s32, :s8, :f32, :f64], literal <- @literals do
      a = Nx.tensor([39432, -5, 100], type: type)

      fun = fn a ->
        {Nx.add(a, literal), Nx.subtract(literal, a), Nx.multiply(a, literal),
         Nx.equal(a, literal), Nx.max(a, literal), Nx.select(Nx.greater(a, 0), literal, a)}
      end

      assert_jit_and_eager(fun, [a], atol: 0.0, rtol: 0.0)

      if type in [:s64, :s32, :s8] do
        bitwise = fn a ->
          {Nx.bitwise_and(a, literal), Nx.bitwise_or(a, literal), Nx.bitwise_xor(literal, a)}
        end

        assert_jit_and_eager(bitwise, [a])
      end
    end
  end

  test "the issue's example: an s64 tensor plus a literal past s32" do
    a = Nx.tensor([39432, -5, 1000], type: :s64)
    fun = &Nx.add(&1, 9_223_372_036_854_775_000)
    got = assert_jit_and_eager(fun, [a])

    expected = if @bits == 32, do: [38624, -813, 192], else: Nx.to_flat_list(fun.(a))
    assert Nx.to_flat_list(got) == expected
  end

  # With an unsigned tensor, max and min are computed in the result's type:
  # XLA converts the wrapped literal to it first (as EXLA does), where the
  # reference takes the maximum of the signed wrapped value and wraps that
  # (Nx.max(u8 [1], 2 ** 31) is u32 1 there, the literal being s32
  # -2147483648, and 2147483648 here and in EXLA). jit and eager agree with
  # the conversion; comparisons and arithmetic agree with the reference.
  test "with unsigned tensors: max and min of the literal converted to the result type" do
    for type <- [:u8, :u32, :u64], literal <- @literals do
      a = Nx.tensor([1, 2, 200], type: type)

      assert_jit_and_eager(
        fn a -> {Nx.greater(a, literal), Nx.equal(literal, a), Nx.add(a, literal)} end,
        [a]
      )

      fun = fn a -> {Nx.max(a, literal), Nx.min(literal, a)} end
      jitted = EXLA.jit(fun).(a)
      eager = fun.(Nx.backend_copy(a, EXLA.Backend))
      result_type = elem(jitted, 0).type
      a = Nx.as_type(a, result_type)
      l = Nx.tensor(wrapped(literal), type: @default) |> Nx.as_type(result_type)

      for {e, j, g} <-
            Enum.zip([[Nx.max(a, l), Nx.min(l, a)], Tuple.to_list(jitted), Tuple.to_list(eager)]) do
        assert Nx.to_binary(j) == Nx.to_binary(g), "jit #{inspect(j)} != eager #{inspect(g)}"
        assert {j.type, Nx.to_flat_list(j)} == {e.type, Nx.to_flat_list(e)}, "#{type} #{literal}"
      end
    end
  end
end
