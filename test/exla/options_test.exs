defmodule EXLA.OptionsTest do
  # Compiler options as libraries and EXLA 0.7 users pass them.
  use ExUnit.Case, async: false

  # Streams exist on Nx 0.7 only (Nx 0.10 removed them); these tests are
  # excluded on the other lines, where the calls below are undefined.
  @compile {:no_warn_undefined, [{EXLA, :stream, 2}, {EXLA, :stream, 3}, Nx.Stream]}

  import ExUnit.CaptureLog

  defp x, do: Nx.tensor([1.0, 2.0], backend: EXLA.Backend)

  # A fresh function (and so a fresh cache key) for each call site.
  defp adder(n), do: fn x -> Nx.add(x, n) end

  describe "options EXLA does not know" do
    test "pass through jit, jit_apply, compile and Nx.Defn" do
      # Nx.Serving gives :batch_keys, Axon's dropout :mode
      opts = [batch_keys: [:default], mode: :train]

      assert Nx.to_flat_list(EXLA.jit(adder(1), opts).(x())) == [2.0, 3.0]
      assert Nx.to_flat_list(EXLA.jit_apply(adder(2), [x()], opts)) == [3.0, 4.0]

      compiled = EXLA.compile(adder(3), [Nx.template({2}, :f32)], opts)
      assert Nx.to_flat_list(compiled.(x())) == [4.0, 5.0]

      result = Nx.Defn.jit(adder(4), [compiler: EXLA] ++ opts).(x())
      assert %EXLA.Backend{} = result.data
      assert Nx.to_flat_list(result) == [5.0, 6.0]
    end

    @tag nx: :streams?
    test "pass through stream" do
      stream = EXLA.stream(fn input, acc -> {acc, Nx.add(input, acc)} end, [0, 0], mode: :train)
      assert Nx.Stream.send(stream, 5) == :ok
      assert Nx.to_number(Nx.Stream.recv(stream)) == 0
      assert Nx.to_number(Nx.Stream.done(stream)) == 5
    end

    test "are part of the cache key, as in EXLA 0.7" do
      fun = adder(5)
      EXLA.jit_apply(fun, [x()], batch_keys: [:a])
      assert EXLA.cached?(fun, [x()], batch_keys: [:a])
      refute EXLA.cached?(fun, [x()], batch_keys: [:b])
      refute EXLA.cached?(fun, [x()])
    end
  end

  describe "options EXLA knows" do
    # EXLA 0.13.1's words on Nx 0.12 and 0.13, where :packed_nibble is
    # refused too; EXLA 0.7.2 takes :packed_nibble, and its message lists it.
    {listed, refused} =
      if EXLA.NxVersion.line() == :v0_7 do
        {":default, :high, :highest, or :packed_nibble", [:bad]}
      else
        {":default, :high, or :highest", [:bad, :packed_nibble]}
      end

    @listed listed
    @refused refused

    test "a bad precision raises EXLA's message" do
      for precision <- @refused do
        message =
          "expected precision configuration to be one of #{@listed}, got: #{inspect(precision)}"

        assert_raise ArgumentError, message, fn ->
          EXLA.jit(adder(6), precision: precision).(x())
        end

        assert_raise ArgumentError, message, fn ->
          EXLA.compile(&Nx.dot/2, [x(), x()], precision: precision, batch_keys: [:a])
        end
      end
    end

    test "values are validated even beside unknown options" do
      assert_raise ArgumentError, ~r/:cache/, fn ->
        EXLA.jit(adder(7), cache: :yes, mode: :train).(x())
      end

      assert_raise ArgumentError, ~r/:lazy_transfers/, fn ->
        EXLA.jit(adder(7), lazy_transfers: :sometimes, mode: :train).(x())
      end

      assert_raise ArgumentError, ~r/expected the compiler options to be a keyword list/, fn ->
        EXLA.Defn.Compilation.validate_options!([:mode])
      end
    end

    @tag nx: :v0_7
    test ":packed_nibble is accepted, but a dot cannot be compiled with it" do
      assert Nx.to_flat_list(EXLA.jit(adder(8), precision: :packed_nibble).(x())) == [9.0, 10.0]

      assert_raise ArgumentError, ~r/precision :packed_nibble has no StableHLO equivalent/, fn ->
        EXLA.jit(&Nx.dot/2, precision: :packed_nibble).(x(), x())
      end
    end

    test "compiler_mode: :mlir is accepted and :xla raises" do
      assert Nx.to_flat_list(EXLA.jit(adder(9), compiler_mode: :mlir).(x())) == [10.0, 11.0]

      assert_raise ArgumentError, ~r/compiler_mode: :xla is not supported.*MLIR/, fn ->
        EXLA.jit(adder(9), compiler_mode: :xla).(x())
      end

      assert_raise ArgumentError, ~r/expected :compiler_mode to be :mlir, got: :other/, fn ->
        EXLA.jit(adder(9), compiler_mode: :other).(x())
      end
    end

    test "compiler_mode falls back to the :exla application's setting" do
      Application.put_env(:exla, :compiler_mode, :xla)
      on_exit(fn -> Application.delete_env(:exla, :compiler_mode) end)

      assert_raise ArgumentError, ~r/compiler_mode: :xla is not supported/, fn ->
        EXLA.jit(adder(10)).(x())
      end

      assert Nx.to_flat_list(EXLA.jit(adder(10), compiler_mode: :mlir).(x())) == [11.0, 12.0]
    end
  end

  describe "debug: true" do
    setup do
      level = Logger.level()
      Logger.configure(level: :debug)
      on_exit(fn -> Logger.configure(level: level) end)
    end

    test "logs the device lock wait before each run, as EXLA 0.7 does" do
      logs = capture_log([level: :debug], fn -> EXLA.jit(adder(11), debug: true).(x()) end)
      assert logs =~ ~r"EXLA device 0 lock in \d+\.\dms"
      assert logs =~ ~r"EXLA execution on device 0 in \d+\.\dms"

      compile = fn -> send(self(), {:compiled, EXLA.compile(adder(12), [x()], debug: true)}) end
      capture_log([level: :debug], compile)
      assert_received {:compiled, compiled}
      logs = capture_log([level: :debug], fn -> compiled.(x()) end)
      assert logs =~ ~r"EXLA device 0 lock in \d+\.\dms"
    end

    @tag nx: :streams?
    test "logs the device lock wait and the start of a stream" do
      start = fn ->
        stream = EXLA.stream(fn x, acc -> {acc, Nx.add(x, acc)} end, [0, 0], debug: true)
        Nx.Stream.done(stream)
      end

      logs = capture_log([level: :debug], start)
      assert logs =~ ~r"EXLA device 0 lock in \d+\.\dms"
      assert logs =~ ~r"EXLA stream start on device 0 in \d+\.\dms"
    end
  end
end
