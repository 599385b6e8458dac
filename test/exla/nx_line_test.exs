defmodule EXLA.NxLineTest do
  # What Nx 0.12 and 0.13 add for a backend and a compiler: blocks (EXLA's
  # native lowerings, EXLA.CustomCall, the default for other structs),
  # stack, runtime calls, hooks without tokens (0.13) and the new types
  # (Nx.Defn.shard_jit/3 is in shard_jit_mesh_test.exs). Results are checked against Nx.BinaryBackend and
  # Nx.Defn.Evaluator.
  use ExUnit.Case, async: true

  @moduletag nx: :blocks?

  # Nx 0.7 has none of these structs and functions.
  if EXLA.NxVersion.blocks?() do
    defp evaluator(fun, args), do: Nx.Defn.jit_apply(fun, args, compiler: Nx.Defn.Evaluator)
    defp exla(fun, args), do: EXLA.jit_apply(fun, args)

    defp close!(a, b, tol \\ 1.0e-5) do
      for {x, y} <- Enum.zip(List.wrap(flat(a)), List.wrap(flat(b))) do
        assert x.type == y.type and x.shape == y.shape
        x = Nx.backend_copy(x, Nx.BinaryBackend)

        assert Nx.to_number(Nx.all_close(x, y, atol: tol, rtol: tol)) == 1,
               "#{inspect(x)} #{inspect(y)}"
      end
    end

    defp flat(t) when is_tuple(t), do: Tuple.to_list(t)
    defp flat(t), do: t

    describe "blocks EXLA lowers natively" do
      test "take, take_along_axis and top_k, in jit and eagerly" do
        t = Nx.iota({3, 4}, type: :f32)
        i = Nx.tensor([2, 0])
        j = Nx.tensor([[3, 0], [1, 1], [0, 2]])

        fun = fn t, i, j ->
          {Nx.take(t, i, axis: 1), Nx.take_along_axis(t, j, axis: 1), Nx.top_k(t, k: 2)}
        end

        {a, b, {v, ix}} = exla(fun, [t, i, j])
        {ea, eb, {ev, eix}} = evaluator(fun, [t, i, j])
        close!({a, b, v}, {ea, eb, ev})
        assert Nx.to_flat_list(ix) == Nx.to_flat_list(eix)
        assert ix.type == {:s, 32}

        eager = Nx.take(Nx.backend_copy(t, EXLA.Backend), i, axis: 1)
        assert %EXLA.Backend{} = eager.data
        close!(eager, ea)
      end

      test "top_k keeps the first of equal elements first" do
        t = Nx.tensor([1.0, 3.0, 3.0, 2.0, 3.0])
        {v, i} = exla(&Nx.top_k(&1, k: 3), [t])
        assert Nx.to_flat_list(v) == [3.0, 3.0, 3.0]
        assert Nx.to_flat_list(i) == [1, 2, 4]
      end

      test "qr and lu, in jit and eagerly" do
        a = Nx.tensor([[4.0, 1.0, 2.0], [1.0, 3.0, 0.5], [2.0, 0.5, 5.0]])
        {q, r} = exla(&Nx.LinAlg.qr/1, [a])

        close!(
          Nx.dot(Nx.backend_copy(q, Nx.BinaryBackend), Nx.backend_copy(r, Nx.BinaryBackend)),
          a
        )

        {p, l, u} = Nx.LinAlg.lu(Nx.backend_copy(a, EXLA.Backend))
        [p, l, u] = Enum.map([p, l, u], &Nx.backend_copy(&1, Nx.BinaryBackend))
        close!(Nx.dot(p, Nx.dot(l, u)), a)
      end

      test "rfft is one real-input FFT, as Nx's default" do
        t = Nx.tensor([[1.0, 2.0, 0.5, -1.0, 3.0], [0.0, 1.0, 0.0, 1.0, 0.0]])

        for opts <- [[], [length: 4], [length: 8], [axis: 0]] do
          close!(exla(&Nx.rfft(&1, opts), [t]), evaluator(&Nx.rfft(&1, opts), [t]), 1.0e-5)
        end

        assert exla(&Nx.LinAlg.qr/1, [Nx.eye(2)]) |> elem(0) |> Nx.type() == {:f, 32}
        assert EXLA.to_mlir_module(&Nx.rfft/1, [t]).mlir_module =~ "RFFT"
      end

      test "fft2 and ifft2 are one two-dimensional FFT, in jit and eagerly" do
        re = Nx.tensor([[[1.0, 2.0, 0.5, -1.0, 3.0], [0.0, 1.0, 0.0, 1.0, 0.0]]])
        re = Nx.concatenate([re, Nx.multiply(re, -0.5), Nx.add(re, 2.0)], axis: 0)
        real = Nx.backend_copy(re, Nx.BinaryBackend)
        complex = Nx.complex(real, Nx.reverse(real, axes: [2]))

        # {3, 2, 5}: padded, cut, both on one axis each, axes in any order
        options = [
          [],
          [lengths: [4, 8]],
          [lengths: [1, 3]],
          [lengths: [3, 6], axes: [0, 2]],
          [lengths: [2, 4], axes: [2, 0]],
          [axes: [1, 0]],
          [lengths: [4, 2], axes: [0, 1]]
        ]

        # Nx.BinaryBackend's fft along an axis before the last two of a
        # rank-3 tensor puts its results in the wrong places (it moves the
        # axis last, then swaps it back), so the reference transforms the
        # last two axes of a transposed copy and transposes back.
        reference = fn fun, t, opts ->
          perm = (Enum.to_list(0..2) -- (opts[:axes] || [1, 2])) ++ (opts[:axes] || [1, 2])
          back = Enum.map(0..2, fn i -> Enum.find_index(perm, &(&1 == i)) end)
          moved = fun.(Nx.transpose(t, axes: perm), Keyword.put(opts, :axes, [1, 2]))
          Nx.transpose(moved, axes: back)
        end

        for fun <- [&Nx.fft2/2, &Nx.ifft2/2], t <- [real, complex], opts <- options do
          expected = reference.(fun, t, opts)
          close!(exla(&fun.(&1, opts), [t]), expected, 1.0e-4)
          eager = fun.(Nx.backend_copy(t, EXLA.Backend), opts)
          assert %EXLA.Backend{} = eager.data
          close!(eager, expected, 1.0e-4)
        end

        f64 = Nx.as_type(real, :f64)
        assert exla(&Nx.fft2/1, [f64]).type == {:c, 128}
        close!(exla(&Nx.fft2/1, [f64]), Nx.fft2(f64), 1.0e-10)

        for {fun, kind} <- [{&Nx.fft2/2, "FFT"}, {&Nx.ifft2/2, "IFFT"}] do
          opts = [lengths: [4, 3], axes: [2, 0]]
          %{mlir_module: mlir} = EXLA.to_mlir_module(&fun.(&1, opts), [real])
          assert length(String.split(mlir, "stablehlo.fft")) == 2
          assert mlir =~ "fft_type #{kind}>"
          assert mlir =~ "fft_length = array<i64: 4, 3>"
        end
      end

      test "irfft is one complex-to-real FFT, in jit and eagerly" do
        signal = Nx.tensor([[1.0, 2.0, 0.5, -1.0, 3.0, 0.25], [0.0, 1.0, 0.0, 1.0, 0.0, -2.0]])
        spectrum = Nx.rfft(signal)
        # imaginary parts on the DC and Nyquist terms too, which both ignore
        noisy = Nx.add(spectrum, Nx.complex(0.0, 0.5))

        # {2, 4}: the default length (6), odd lengths, the spectrum cut
        # (length 4 reads 3 terms) and padded (length 10 reads 6). Nx's
        # default raises for lengths 1 and 2, which mirror no term.
        options = [[], [length: 6], [length: 7], [length: 4], [length: 10]]
        options = options ++ [[axis: 0, length: 3], [axis: 0, length: 5]]

        for t <- [spectrum, noisy], opts <- options do
          expected = Nx.irfft(t, opts)
          close!(exla(&Nx.irfft(&1, opts), [t]), expected, 1.0e-4)
          eager = Nx.irfft(Nx.backend_copy(t, EXLA.Backend), opts)
          assert %EXLA.Backend{} = eager.data
          close!(eager, expected, 1.0e-4)
        end

        close!(exla(&Nx.irfft(&1, length: 6), [spectrum]), signal, 1.0e-5)

        # a real input and a c128 one keep Nx's output types
        real = Nx.tensor([5.0, 1.0, -1.0, 1.0])
        close!(exla(&Nx.irfft/1, [real]), Nx.irfft(real), 1.0e-5)
        c128 = Nx.as_type(noisy, :c128)
        assert exla(&Nx.irfft/1, [c128]).type == {:f, 64}
        close!(exla(&Nx.irfft(&1, length: 7), [c128]), Nx.irfft(c128, length: 7), 1.0e-10)

        %{mlir_module: mlir} = EXLA.to_mlir_module(&Nx.irfft(&1, length: 5, axis: 0), [noisy])
        assert length(String.split(mlir, "stablehlo.fft")) == 2
        assert mlir =~ "fft_type IRFFT>"
        assert mlir =~ "fft_length = array<i64: 5>"
        refute mlir =~ "stablehlo.reverse"
        refute mlir =~ "stablehlo.real"
      end
    end

    describe "other blocks" do
      defmodule Twice do
        defstruct [:factor]
      end

      test "a struct without an EXLA.CustomCall implementation runs its default" do
        block = fn t ->
          Nx.block(%Twice{factor: 2}, [t], t, fn s, t -> Nx.multiply(t, s.factor) end)
        end

        t = Nx.tensor([1.0, 2.0])
        assert Nx.to_flat_list(exla(block, [t])) == [2.0, 4.0]
        assert Nx.to_flat_list(block.(Nx.backend_copy(t, EXLA.Backend))) == [2.0, 4.0]
        assert EXLA.CustomCall.call(%Twice{}, t, [t], nil) == :skip
      end

      test "an EXLA.CustomCall implementation gets a custom call, or the default on :skip" do
        block = fn x, target ->
          Nx.block(%EXLA.Test.CustomCallBlock{target: target}, [x], x, fn _, x -> Nx.negate(x) end)
        end

        x = Nx.tensor([1.0, 2.0])
        %{mlir_module: mlir} = EXLA.to_mlir_module(&block.(&1, "my_target"), [x])
        assert mlir =~ ~s(stablehlo.custom_call)
        assert mlir =~ ~s(call_target_name = "my_target")
        assert mlir =~ ~s(backend_config = {scale = 2 : i64})
        # row-major operands and results, as a handler reads and writes them
        assert mlir =~ ~s(operand_layouts = [dense<[0]> : tensor<1xindex>])
        assert mlir =~ ~s(result_layouts = [dense<[0]> : tensor<1xindex>])
        # the operand is converted to the type the spec asks for
        assert mlir =~ ~r/stablehlo.convert.*tensor<2xf64>/

        assert Nx.to_flat_list(exla(&block.(&1, nil), [x])) == [-1.0, -2.0]
      end

      test "Nx's other blocks give the evaluator's results" do
        t = Nx.tensor([[1.0, -2.0, 3.0], [4.0, 5.0, -6.0]])

        fun = fn t ->
          {Nx.cumulative_sum(t, axis: 1), Nx.cumulative_max(t, reverse: true), Nx.all_close(t, t),
           Nx.logical_not(t)}
        end

        close!(exla(fun, [t]), evaluator(fun, [t]), 1.0e-4)
      end

      # Cumulative ops, all_close and eigh run Nx's default implementation
      # (EXLA.Defn.Lowering.Blocks says why). Compiled, it must give what
      # Nx.BinaryBackend gives, and EXLA.Backend's eager op the same bits as
      # jit (one program, lowered the same way).
      test "cumulative ops give Nx's results, in jit and eagerly" do
        ops = [
          &Nx.cumulative_sum/2,
          &Nx.cumulative_product/2,
          &Nx.cumulative_min/2,
          &Nx.cumulative_max/2
        ]

        # small values, so that products stay exact in f16 and wrap in s8/u8
        base = Nx.iota({2, 3, 4}) |> Nx.remainder(5) |> Nx.subtract(1)
        size_one = Nx.tensor([[[2], [-1], [3]]])

        cases =
          for fun <- ops,
              axis <- [0, 1, 2, -1],
              reverse <- [false, true],
              do: {fun, axis, reverse}

        # One program per type and tensor computes every case (a program each
        # took over a minute on two cores).
        all = fn t ->
          cases
          |> Enum.map(fn {fun, axis, reverse} -> fun.(t, axis: axis, reverse: reverse) end)
          |> List.to_tuple()
        end

        for type <- [:s8, :u8, :s32, :s64, :u32, :f32, :f64, :f16, :bf16],
            t <- [base, size_one] do
          t = Nx.as_type(t, type)

          jits = Tuple.to_list(exla(all, [t]))
          expecteds = Tuple.to_list(all.(t))

          for {jit, expected, c} <- Enum.zip([jits, expecteds, cases]) do
            assert jit.type == expected.type and jit.shape == expected.shape

            if Nx.Type.integer?(jit.type) do
              assert Nx.backend_copy(jit) == expected, "#{inspect(type)} #{inspect(c)}"
            else
              close!(jit, expected, 1.0e-2)
            end
          end
        end

        # An eager op is the program of that op alone: the same bits.
        for type <- [:s8, :f32], {fun, axis, reverse} <- cases, axis in [0, 2] do
          t = Nx.as_type(base, type)
          opts = [axis: axis, reverse: reverse]
          eager = fun.(Nx.backend_copy(t, EXLA.Backend), opts)
          assert %EXLA.Backend{} = eager.data
          assert Nx.backend_copy(eager) == Nx.backend_copy(exla(&fun.(&1, opts), [t]))
        end
      end

      test "integer cumulative products and sums wrap as in Nx" do
        t = Nx.tensor([3, 5, 7, 11, -13], type: :s8)

        for fun <- [&Nx.cumulative_product/2, &Nx.cumulative_sum/2], reverse <- [false, true] do
          got = exla(&fun.(Nx.multiply(&1, 9), reverse: reverse), [t])
          assert Nx.backend_copy(got) == fun.(Nx.multiply(t, 9), reverse: reverse)
        end
      end

      test "cumulative min and max give NaN from the first NaN on, and keep infinities" do
        t = Nx.tensor([[1.0, :nan, 3.0, :neg_infinity], [:infinity, 2.0, :nan, -1.0]])

        for type <- [:f32, :f64, :f16, :bf16],
            fun <- [&Nx.cumulative_min/2, &Nx.cumulative_max/2, &Nx.cumulative_sum/2],
            axis <- [0, 1],
            reverse <- [false, true] do
          t = Nx.as_type(t, type)
          opts = [axis: axis, reverse: reverse]
          expected = fun.(t, opts)
          jit = Nx.backend_copy(exla(&fun.(&1, opts), [t]))
          assert Nx.to_flat_list(jit) == Nx.to_flat_list(expected), "#{inspect(opts)}"
          eager = fun.(Nx.backend_copy(t, EXLA.Backend), opts)
          assert Nx.to_flat_list(eager) == Nx.to_flat_list(expected)
        end
      end

      test "complex cumulative sums and products" do
        re = Nx.tensor([[1.0, 2.0, -0.5], [0.5, 1.5, 3.0]])
        t = Nx.complex(re, Nx.reverse(re, axes: [1]))

        for fun <- [&Nx.cumulative_sum/2, &Nx.cumulative_product/2],
            type <- [:c64, :c128],
            opts <- [[], [axis: 1], [axis: 1, reverse: true]] do
          t = Nx.as_type(t, type)
          close!(exla(&fun.(&1, opts), [t]), fun.(t, opts), 1.0e-5)
          close!(fun.(Nx.backend_copy(t, EXLA.Backend), opts), fun.(t, opts), 1.0e-5)
        end
      end

      test "vectorized cumulative ops run along the inner axes" do
        t = Nx.iota({2, 3, 4}, type: :f32) |> Nx.subtract(7) |> Nx.vectorize(:batch)

        for fun <- [&Nx.cumulative_sum/2, &Nx.cumulative_max/2],
            opts <- [[], [axis: 1, reverse: true]] do
          expected = fun.(t, opts)
          jit = exla(&fun.(&1, opts), [t])
          assert jit.vectorized_axes == [batch: 2]
          assert Nx.backend_copy(jit) == expected
          assert Nx.backend_copy(fun.(Nx.backend_copy(t, EXLA.Backend), opts)) == expected
        end
      end

      test "all_close gives Nx's results, in jit and eagerly" do
        s8 = &Nx.tensor(&1, type: :s8)
        f32 = &Nx.tensor/1
        inf = :infinity
        ninf = :neg_infinity

        cases = [
          # |-128 - 127| wraps in s8; Nx widens |b| to f64 before rtol * |b|
          {s8.([-128, 0]), s8.([127, 0]), []},
          {s8.([127, -128]), s8.([127, -128]), []},
          {s8.([-128]), s8.([-128]), [rtol: 0.0, atol: 0.0]},
          # 0.7 * 90 is just below 63 in f64 (in f32 it would round to 63)
          {s8.([-27]), s8.([-90]), [rtol: 0.7, atol: 0]},
          {s8.([-27]), s8.([-90]), [rtol: 0.71, atol: 0]},
          {Nx.tensor([2_000_000_000], type: :s32), Nx.tensor([-2_000_000_000], type: :s32), []},
          {Nx.tensor([255, 0], type: :u8), Nx.tensor([0, 255], type: :u8), [atol: 255]},
          {f32.([1.0, inf, ninf]), f32.([1.0, inf, ninf]), []},
          {f32.([1.0, inf]), f32.([1.0, ninf]), []},
          {f32.([inf]), f32.([1.0e38]), [atol: 1.0e39]},
          {f32.([1.0, :nan]), f32.([1.0, :nan]), []},
          {f32.([1.0, :nan]), f32.([1.0, :nan]), [equal_nan: true]},
          {f32.([:nan, 1.0]), f32.([1.0, :nan]), [equal_nan: true]},
          {f32.([1.0, 2.0]), f32.([1.0, 2.00001]), []},
          {f32.([1.0, 2.0]), f32.([1.0, 2.1]), []},
          {f32.([1.0, 2.0]), f32.([1.0, 2.1]), [atol: 0.5]},
          {Nx.tensor([2.0], type: :f16), Nx.tensor([2.002], type: :f16), [rtol: 1.0e-2]},
          {Nx.tensor([1, 2]), f32.([1.0, 2.0]), []},
          {Nx.tensor([3, 2]), Nx.tensor([1.0, :nan], type: :f64), [equal_nan: true]},
          {Nx.complex(f32.([1.0]), f32.([2.0])), Nx.complex(f32.([1.0]), f32.([2.0])), []}
        ]

        for {a, b, opts} <- cases do
          expected = Nx.all_close(a, b, opts)
          eager = Nx.all_close(Nx.backend_copy(a, EXLA.Backend), b, opts)
          assert %EXLA.Backend{} = eager.data

          for got <- [exla(&Nx.all_close(&1, &2, opts), [a, b]), eager] do
            assert Nx.backend_copy(got) == expected,
                   "#{inspect(a)} #{inspect(b)} #{inspect(opts)}"
          end
        end
      end
    end

    test "stack, in jit and eagerly" do
      a = Nx.tensor([1, 2, 3])
      b = Nx.tensor([4, 5, 6])
      expected = Nx.stack([a, b], axis: 1)
      assert exla(&Nx.stack([&1, &2], axis: 1), [a, b]) |> Nx.backend_copy() == expected

      eager =
        Nx.stack([Nx.backend_copy(a, EXLA.Backend), Nx.backend_copy(b, EXLA.Backend)], axis: 1)

      assert %EXLA.Backend{} = eager.data
      assert Nx.backend_copy(eager) == expected
    end

    describe "runtime calls" do
      def tenfold(t, opts), do: Nx.multiply(t, opts[:by])

      test "run their function on the host and go on with its result" do
        fun = fn x ->
          y = Nx.runtime_call(x, Nx.add(x, 1), [by: 10], &__MODULE__.tenfold/2)
          Nx.subtract(y, 1)
        end

        assert Nx.to_flat_list(exla(fun, [Nx.tensor([1.0, 2.0])])) == [19.0, 29.0]
      end

      test "a result that does not match the template raises" do
        fun = fn x -> Nx.runtime_call(x, x, [], fn t, _ -> Nx.as_type(t, :f64) end) end

        message =
          ~r/^expected the runtime_call function to match the given output template #Nx.Tensor<\n  f32\[1\].*, got: #Nx.Tensor<\n  f64\[1\]/s

        assert_raise ArgumentError, message, fn ->
          exla(fun, [Nx.tensor([1.0])])
        end
      end
    end

    @tag nx: :hook_nodes?
    test "hooks run when their value is used, with the :hooks option too" do
      parent = self()

      fun = fn x ->
        y = Nx.Defn.Kernel.hook(Nx.add(x, 1), :plus, &send(parent, {:plus, &1}))
        Nx.multiply(y, 2)
      end

      assert Nx.to_flat_list(exla(fun, [Nx.tensor([1.0])])) == [4.0]
      assert_received {:plus, t}
      assert Nx.to_flat_list(t) == [2.0]

      EXLA.jit(fun, hooks: %{plus: &send(parent, {:other, &1})}).(Nx.tensor([2.0]))
      assert_received {:other, t}
      assert Nx.to_flat_list(t) == [3.0]
    end

    test "local pointers: a tensor's address, and a copy of the memory at one" do
      t = Nx.tensor([1.0, 2.0, 3.0], backend: EXLA.Backend)
      pointer = Nx.to_pointer(t)
      assert %Nx.Pointer{kind: :local, data_size: 12} = pointer
      assert is_integer(pointer.address) and pointer.address > 0

      copy = Nx.from_pointer(EXLA.Backend, pointer, :f32, {3}, names: [:x])
      assert %EXLA.Backend{} = copy.data
      assert copy.names == [:x]
      assert Nx.to_flat_list(copy) == [1.0, 2.0, 3.0]

      # :ipc pointers: test/exla/pointer_test.exs.
      assert_raise ArgumentError, ~r/expected :mode to be one of/, fn ->
        Nx.to_pointer(t, mode: :remote)
      end

      assert_raise ArgumentError, ~r/holds 12 bytes/, fn ->
        Nx.from_pointer(EXLA.Backend, pointer, :f64, {3})
      end
    end

    test "integers are s32 by default" do
      assert EXLA.NxVersion.default_integer() == {:s, 32}
      assert Nx.type(exla(&Nx.argmax/1, [Nx.tensor([1.0, 3.0, 2.0])])) == {:s, 32}
      assert Nx.type(Nx.iota({3}, backend: EXLA.Backend)) == {:s, 32}
    end

    describe "new types" do
      test "sub-byte integers round-trip packed and compute per element" do
        for type <- [:s2, :s4, :u2, :u4] do
          values = if elem(Nx.Type.normalize!(type), 0) == :s, do: [-1, 0, 1], else: [0, 1, 2]
          t = Nx.tensor(values, type: type, backend: EXLA.Backend)
          assert Nx.to_flat_list(t) == values
          assert Nx.to_binary(t) == Nx.to_binary(Nx.tensor(values, type: type))
          assert Nx.to_flat_list(Nx.as_type(t, :s32)) == values

          assert Nx.to_flat_list(exla(&Nx.add(&1, &1), [Nx.tensor(values, type: type)])) ==
                   Nx.to_flat_list(
                     Nx.add(Nx.tensor(values, type: type), Nx.tensor(values, type: type))
                   )
        end
      end

      test "f8 types round-trip and convert" do
        for type <- [:f8, :f8_e4m3fn] do
          t = Nx.tensor([1.0, -2.0, 0.5], type: type, backend: EXLA.Backend)
          assert Nx.to_flat_list(t) == [1.0, -2.0, 0.5]
          assert Nx.to_flat_list(Nx.as_type(t, :f32)) == [1.0, -2.0, 0.5]

          assert exla(&Nx.multiply(&1, 2), [Nx.tensor([1.0, 0.5], type: type)])
                 |> Nx.backend_copy()
                 |> Nx.to_flat_list() == [2.0, 1.0]
        end
      end

      @tag nx: :runtime_calls?
      test "f8 types pass through host callbacks" do
        parent = self()

        for type <- [:f8, :f8_e4m3fn] do
          x = Nx.tensor([1.0, -2.5, 0.125], type: type)

          fun = fn x ->
            x = Nx.Defn.Kernel.hook(x, &send(parent, {:hooked, &1}))
            Nx.runtime_call(x, x, [], fn t, _ -> Nx.negate(t) end)
          end

          expected = Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator).(x)
          assert_receive {:hooked, hooked}
          assert Nx.type(expected) == Nx.Type.normalize!(type)
          assert exla(fun, [x]) |> Nx.backend_copy() == expected
          assert_receive {:hooked, ^hooked}
        end
      end
    end
  end
end
