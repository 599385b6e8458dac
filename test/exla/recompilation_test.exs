defmodule EXLA.RecompilationTest do
  # Sets :check_recompilation, which every compilation reads.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  setup do
    # Counts of earlier tests start from zero (the table is EXLA's, public).
    :ets.delete_all_objects(EXLA.Defn.Recompilation)
    on_exit(fn -> Application.delete_env(:exla, :check_recompilation) end)
  end

  defp check(n), do: Application.put_env(:exla, :check_recompilation, n)

  # A closure of one code site, capturing `tensor`: a new cache key for
  # every tensor, the same function for the check. (Its program, with the
  # final subtraction, is no other test's: a program with the same text
  # would share its executable, see EXLA.CompileCache.)
  defp scaled(tensor), do: fn x -> x |> Nx.multiply(tensor) |> Nx.subtract(0.125) end

  defp warnings(log), do: length(Regex.scan(~r/EXLA has compiled/, log))

  test "warns once when a closure is compiled n times with the same shapes" do
    check(3)
    x = Nx.tensor([1.0, 2.0])

    log =
      capture_log(fn ->
        for i <- 1..6 do
          result = EXLA.jit(scaled(Nx.tensor(i * 1.0))).(x)
          assert Nx.to_flat_list(result) == [i - 0.125, i * 2 - 0.125]
        end
      end)

    assert warnings(log) == 1
    assert log =~ ~r/EXLA has compiled #Function<.*> 3 times with the same input shapes/
    # EXLA 0.13.1's last sentence.
    assert log =~ ~r/ Pass changing tensors as explicit function arguments instead\.\n/
  end

  test "counts each shape apart, and cached calls not at all" do
    check(2)
    fun = scaled(Nx.tensor(2.0))

    log =
      capture_log(fn ->
        # The same function: compiled once per shape, then served from the cache.
        for _ <- 1..3, n <- [1, 2, 3], do: EXLA.jit(fun).(Nx.iota({n}, type: :f32))
        # Closures capturing tensors of other shapes are other functions.
        EXLA.jit(scaled(Nx.tensor([1.0]))).(Nx.tensor([1.0]))
        EXLA.jit(scaled(Nx.tensor([1.0, 2.0]))).(Nx.tensor([1.0]))
      end)

    assert warnings(log) == 0

    log = capture_log(fn -> EXLA.jit(scaled(Nx.tensor([3.0]))).(Nx.tensor([1.0])) end)
    assert warnings(log) == 1
  end

  test "counts compiles with cache: false not at all" do
    check(1)
    fun = scaled(Nx.tensor(5.0))
    log = capture_log(fn -> for _ <- 1..3, do: EXLA.jit(fun, cache: false).(1.0) end)
    assert warnings(log) == 0
  end

  test "is off by default and with :infinity" do
    x = Nx.tensor([1.0])

    for setting <- [nil, :infinity] do
      if setting, do: check(setting)
      log = capture_log(fn -> for i <- 1..4, do: EXLA.jit(scaled(Nx.tensor(i + 0.5))).(x) end)
      assert warnings(log) == 0
    end
  end

  test "counts a closure that Nx wraps (non-tensor arguments) as its function" do
    check(2)
    fun = fn tensor -> fn x, opts -> Nx.multiply(x, tensor) |> Nx.add(opts[:shift]) end end

    log =
      capture_log(fn ->
        for i <- 1..3, do: EXLA.jit(fun.(Nx.tensor(i * 1.0))).(Nx.tensor(1.0), shift: 1)
      end)

    assert warnings(log) == 1
  end

  test "counts closures made by evaluated code (IEx, Livebook) by their code and bindings" do
    check(3)
    x = Nx.tensor([1.0, 2.0])
    code = "fn x -> x |> Nx.add(t) |> Nx.subtract(0.125) end"
    other = "fn x -> x |> Nx.subtract(t) |> Nx.subtract(0.125) end"
    eval = fn code, t -> code |> Code.eval_string(t: Nx.tensor(t)) |> elem(0) end

    log =
      capture_log(fn ->
        # Two closures of other code: counted apart.
        for t <- [1.0, 2.0], do: EXLA.jit(eval.(other, t)).(x)
        for t <- [1.0, 2.0], do: EXLA.jit(eval.(code, t)).(x)
      end)

    assert warnings(log) == 0

    log =
      capture_log(fn ->
        assert Nx.to_flat_list(EXLA.jit(eval.(code, 3.0)).(x)) == [3.875, 4.875]
      end)

    assert warnings(log) == 1
  end

  test "refuses other settings with a clear error" do
    for bad <- [0, -1, "5", 2.5, :never] do
      check(bad)

      assert_raise ArgumentError,
                   ~r/expected :check_recompilation of :exla to be a positive/,
                   fn ->
                     EXLA.jit(scaled(Nx.tensor(1.0))).(Nx.tensor(2.0))
                   end
    end
  end
end
