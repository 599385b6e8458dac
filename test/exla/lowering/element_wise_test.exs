defmodule EXLA.Lowering.ElementWiseTest do
  use EXLA.LoweringCase, async: true

  @float_types [{:f, 32}, {:f, 64}, {:f, 16}, {:bf, 16}]
  @int_types [{:s, 8}, {:s, 16}, {:s, 32}, {:s, 64}, {:u, 8}, {:u, 16}, {:u, 32}, {:u, 64}]

  defp tol({:f, 64}), do: [atol: 1.0e-12, rtol: 1.0e-10]
  defp tol({:f, 32}), do: [atol: 1.0e-5, rtol: 1.0e-5]
  defp tol({:c, 64}), do: [atol: 1.0e-5, rtol: 1.0e-5]
  defp tol({:c, 128}), do: [atol: 1.0e-12, rtol: 1.0e-10]
  defp tol(_), do: [atol: 1.0e-2, rtol: 2.0e-2]

  describe "float unary ops" do
    for type <- @float_types do
      @type_ type
      test "on #{inspect(type)}" do
        type = @type_
        # inside (-1, 1) so that every op is defined
        x = Nx.tensor([-0.9, -0.5, -0.1, 0.0, 0.2, 0.45, 0.7, 0.95], type: type)
        pos = Nx.tensor([0.1, 0.5, 1.0, 1.5, 2.0, 3.25, 10.0, 100.0], type: type)
        big = Nx.tensor([1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0], type: type)
        r = Nx.tensor([-2.5, -1.75, -0.5, 0.0, 0.5, 1.25, 2.5, 3.75], type: type)

        fun = fn x, pos, big, r ->
          %{
            exp: Nx.exp(x),
            expm1: Nx.expm1(x),
            log: Nx.log(pos),
            log1p: Nx.log1p(x),
            sigmoid: Nx.sigmoid(x),
            cos: Nx.cos(x),
            sin: Nx.sin(x),
            tan: Nx.tan(x),
            cosh: Nx.cosh(x),
            sinh: Nx.sinh(x),
            tanh: Nx.tanh(x),
            acosh: Nx.acosh(big),
            asinh: Nx.asinh(x),
            atanh: Nx.atanh(x),
            acos: Nx.acos(x),
            asin: Nx.asin(x),
            atan: Nx.atan(x),
            sqrt: Nx.sqrt(pos),
            rsqrt: Nx.rsqrt(pos),
            cbrt: Nx.cbrt(x),
            erf: Nx.erf(x),
            erfc: Nx.erfc(x),
            negate: Nx.negate(x),
            sign: Nx.sign(x),
            abs: Nx.abs(x),
            floor: Nx.floor(r),
            ceil: Nx.ceil(r),
            round: Nx.round(r)
          }
        end

        assert_same(fun, [x, pos, big, r], tol(type))
      end
    end

    test "erf_inv" do
      x = Nx.tensor([-0.9, -0.5, -0.1, 0.0, 0.2, 0.45, 0.7, 0.95])
      # the reference is single-precision accurate (see the quirks list)
      assert_same(&Nx.erf_inv/1, [x], atol: 1.0e-5, rtol: 1.0e-5)
      assert_same(&Nx.erf_inv/1, [Nx.as_type(x, :f64)], atol: 1.0e-6, rtol: 1.0e-6)
      assert_same(&Nx.erf_inv/1, [Nx.as_type(x, :f16)], atol: 1.0e-2, rtol: 1.0e-2)
      assert_same(&Nx.erf_inv/1, [Nx.as_type(x, :bf16)], atol: 2.0e-2, rtol: 2.0e-2)
    end

    test "round is half away from zero" do
      x = Nx.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5])
      assert_same(&Nx.round/1, [x])
    end

    test "integer inputs are converted for float ops" do
      assert_same(fn x -> {Nx.exp(x), Nx.sqrt(x), Nx.sigmoid(x)} end, [Nx.tensor([0, 1, 4])])
    end
  end

  describe "non-finite values" do
    test "is_nan, is_infinity and propagation" do
      x = Nx.tensor([:nan, :infinity, :neg_infinity, 1.0, -0.0])

      fun = fn x ->
        {Nx.is_nan(x), Nx.is_infinity(x), Nx.exp(x), Nx.max(x, 0.5), Nx.min(x, 0.5), Nx.abs(x),
         Nx.negate(x), Nx.equal(x, x), Nx.not_equal(x, x), Nx.greater(x, 0)}
      end

      assert_same(fun, [x])
      assert_same(fun, [Nx.as_type(x, :f64)])
    end

    test "integer is_nan/is_infinity are zero" do
      assert_same(fn x -> {Nx.is_nan(x), Nx.is_infinity(x)} end, [Nx.tensor([1, 2])])
    end

    test "as_type of non-finite floats to integers follows Nx's table" do
      x = Nx.tensor([:nan, :infinity, :neg_infinity, 1.9, -1.9, 100.0])

      for type <- [{:s, 8}, {:s, 32}, {:s, 64}, {:u, 32}, {:u, 16}] do
        [res] = run(&Nx.as_type(&1, type), [x])
        {min, max} = limits(type)
        values = Nx.to_flat_list(res)
        assert Enum.take(values, 3) == [0, max, min], inspect({type, values})
        assert Enum.at(values, 3) == 1
      end
    end

    test "as_type from f64 and bf16" do
      x = Nx.tensor([:nan, :infinity, :neg_infinity, 3.0], type: :f64)
      assert [res] = run(&Nx.as_type(&1, :s16), [x])
      assert Nx.to_flat_list(res) == [0, 32767, -32768, 3]
      y = Nx.tensor([:nan, 2.0], type: :bf16)
      assert [res] = run(&Nx.as_type(&1, :u8), [y])
      assert Nx.to_flat_list(res) == [0, 2]
    end
  end

  defp limits({:s, n}), do: {-Integer.pow(2, n - 1), Integer.pow(2, n - 1) - 1}
  defp limits({:u, n}), do: {0, Integer.pow(2, n) - 1}

  describe "binary ops" do
    for type <- @float_types do
      @type_ type
      test "float arithmetic on #{inspect(type)}" do
        type = @type_
        a = Nx.tensor([[-3.5, -1.0, 0.0, 0.25], [1.5, 2.0, 7.0, 12.5]], type: type)
        b = Nx.tensor([2.0, -0.5, 3.0, 4.0], type: type)

        fun = fn a, b ->
          %{
            add: Nx.add(a, b),
            subtract: Nx.subtract(a, b),
            multiply: Nx.multiply(a, b),
            divide: Nx.divide(a, b),
            pow: Nx.pow(Nx.abs(a), b),
            remainder: Nx.remainder(a, b),
            atan2: Nx.atan2(a, b),
            max: Nx.max(a, b),
            min: Nx.min(a, b),
            eq: Nx.equal(a, b),
            ne: Nx.not_equal(a, b),
            gt: Nx.greater(a, b),
            ge: Nx.greater_equal(a, b),
            lt: Nx.less(a, b),
            le: Nx.less_equal(a, b),
            and: Nx.logical_and(a, b),
            or: Nx.logical_or(a, b),
            xor: Nx.logical_xor(a, b),
            not: Nx.logical_not(a),
            scalar: Nx.add(a, 0.1)
          }
        end

        assert_same(fun, [a, b], tol(type))
      end
    end

    for type <- @int_types do
      @type_ type
      test "integer arithmetic on #{inspect(type)}" do
        type = @type_
        a = Nx.tensor(int_operands(type), type: type)
        b = Nx.tensor([2, 3, 5, 1, 4, 7], type: type)
        s = Nx.tensor([0, 1, 2, 3, 1, 2], type: type)

        fun = fn a, b, s ->
          %{
            add: Nx.add(a, b),
            subtract: Nx.subtract(a, b),
            multiply: Nx.multiply(a, b),
            divide: Nx.divide(a, b),
            quotient: Nx.quotient(a, b),
            remainder: Nx.remainder(a, b),
            pow: Nx.pow(b, s),
            max: Nx.max(a, b),
            min: Nx.min(a, b),
            band: Nx.bitwise_and(a, b),
            bor: Nx.bitwise_or(a, b),
            bxor: Nx.bitwise_xor(a, b),
            bnot: Nx.bitwise_not(a),
            lshift: Nx.left_shift(a, s),
            rshift: Nx.right_shift(a, s),
            eq: Nx.equal(a, b),
            lt: Nx.less(a, b),
            ge: Nx.greater_equal(a, b),
            and: Nx.logical_and(a, s),
            popcount: Nx.population_count(a),
            clz: Nx.count_leading_zeros(a),
            abs: Nx.abs(a),
            sign: Nx.sign(a),
            negate: Nx.negate(a),
            floor: Nx.floor(a)
          }
        end

        assert_same(fun, [a, b, s])
      end
    end

    test "integer overflow wraps" do
      a = Nx.tensor([120, 127, -128], type: :s8)
      assert_same(fn a -> {Nx.add(a, a), Nx.multiply(a, 3)} end, [a])
      u = Nx.tensor([250, 255, 0], type: :u8)
      assert_same(fn a -> {Nx.add(a, 10), Nx.subtract(a, 1)} end, [u])
    end

    test "integer pow is exact" do
      a = Nx.tensor([3, 7, -5, 10], type: :s64)
      e = Nx.tensor([39, 20, 21, 18], type: :s64)
      assert_same(&Nx.pow/2, [a, e])
    end

    test "remainder follows the dividend sign" do
      assert_same(&Nx.remainder/2, [Nx.tensor([-7, 7, -7, 7]), Nx.tensor([3, -3, -3, 3])])

      assert_same(&Nx.remainder/2, [
        Nx.tensor([-7.5, 7.5, -7.5, 7.5]),
        Nx.tensor([2.0, -2.0, -2.0, 2.0])
      ])
    end

    test "shifts by the bit width or more" do
      a = Nx.tensor([-1, 5, -128, 64], type: :s8)
      s = Nx.tensor([8, 9, 7, 100], type: :s8)
      assert_same(fn a, s -> {Nx.left_shift(a, s), Nx.right_shift(a, s)} end, [a, s])
      u = Nx.tensor([255, 5, 128, 64], type: :u8)
      assert_same(fn a, s -> {Nx.left_shift(a, s), Nx.right_shift(a, s)} end, [u, u])
    end

    test "mixed types and broadcasting" do
      a = Nx.tensor([[1, 2, 3]], type: :s32)
      b = Nx.tensor([[0.5], [1.5]], type: :f64)
      c = Nx.tensor([1, 2, 3], type: :u8)

      assert_same(
        fn a, b, c -> {Nx.add(a, b), Nx.multiply(c, a), Nx.subtract(c, 1.5), Nx.less(a, b)} end,
        [
          a,
          b,
          c
        ]
      )
    end
  end

  describe "complex" do
    for type <- [{:c, 64}, {:c, 128}] do
      @type_ type
      test "math on #{inspect(type)}" do
        type = @type_

        a =
          Nx.tensor([Complex.new(1, 2), Complex.new(-0.5, 0.25), Complex.new(3, -1)], type: type)

        b = Nx.tensor([Complex.new(0.5, -1), Complex.new(2, 0), Complex.new(-1, -1)], type: type)

        fun = fn a, b ->
          %{
            add: Nx.add(a, b),
            multiply: Nx.multiply(a, b),
            divide: Nx.divide(a, b),
            exp: Nx.exp(a),
            log: Nx.log(a),
            sqrt: Nx.sqrt(a),
            abs: Nx.abs(a),
            real: Nx.real(a),
            imag: Nx.imag(a),
            conjugate: Nx.conjugate(a),
            phase: Nx.phase(a),
            eq: Nx.equal(a, b),
            ne: Nx.not_equal(a, a),
            negate: Nx.negate(a),
            sin: Nx.sin(a),
            cos: Nx.cos(a),
            pow: Nx.pow(a, b),
            tan: Nx.tan(a),
            tanh: Nx.tanh(a),
            sigmoid: Nx.sigmoid(a),
            expm1: Nx.expm1(a),
            log1p: Nx.log1p(a),
            rsqrt: Nx.rsqrt(a),
            cosh: Nx.cosh(a),
            sinh: Nx.sinh(a),
            asin: Nx.asin(a),
            atan: Nx.atan(a),
            asinh: Nx.asinh(a),
            atanh: Nx.atanh(a),
            cbrt: Nx.cbrt(a),
            from_real: Nx.add(a, 1.5),
            complex_constant: Nx.multiply(a, Complex.new(0.5, -2)),
            is_nan: Nx.is_nan(a)
          }
        end

        assert_same(fun, [a, b], tol(type))
      end
    end

    test "real, imag and conjugate of real tensors" do
      x = Nx.tensor([1.0, -2.0])
      assert_same(fn x -> {Nx.real(x), Nx.imag(x), Nx.conjugate(x)} end, [x])
    end

    test "as_type between real and complex" do
      x = Nx.tensor([1.5, -2.0])
      assert_same(fn x -> Nx.as_type(x, :c64) end, [x])
      assert_same(fn x -> Nx.as_type(Nx.as_type(x, :c64), :c128) end, [x])
    end
  end

  describe "conversions" do
    test "as_type between integer and float types" do
      x = Nx.tensor([-3, 0, 7, 100], type: :s32)

      types = [{:f, 32}, {:f, 64}, {:f, 16}, {:bf, 16}, {:s, 8}, {:s, 64}, {:u, 8}, {:u, 64}]
      assert_same(fn x -> for(t <- types, into: %{}, do: {t, Nx.as_type(x, t)}) end, [x])
    end

    test "bitcast" do
      x = Nx.tensor([1.0, -2.0, :infinity])
      assert_same(fn x -> Nx.bitcast(x, :u32) end, [x])
      assert_same(fn x -> x |> Nx.bitcast(:s32) |> Nx.bitcast(:f32) end, [x])
      assert_same(fn x -> Nx.bitcast(x, :s16) end, [Nx.tensor([65535, 1], type: :u16)])
    end
  end

  describe "select and clip" do
    test "select with broadcasting and types" do
      p = Nx.tensor([[1, 0, 1], [0, 0, 2]], type: :u8)
      a = Nx.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])

      assert_same(
        fn p, a ->
          {Nx.select(p, a, 0), Nx.select(1, a, -1), Nx.select(Nx.greater(a, 2), a, 10)}
        end,
        [p, a]
      )
    end

    test "clip" do
      a = Nx.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
      assert_same(fn a -> {Nx.clip(a, 2, 4.5), Nx.clip(Nx.as_type(a, :s32), 2, 4)} end, [a])
    end
  end

  # Negative operands only where the type has them.
  defp int_operands({:s, _}), do: [-7, -3, 0, 5, 9, 100]
  defp int_operands({:u, _}), do: [7, 3, 0, 5, 9, 100]
end
