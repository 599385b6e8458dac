defmodule EXLA.RecompilationTest do
  # Sets :check_recompilation, which every compilation reads.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  setup do
    # Counts of earlier tests start from zero (the table is EXLA's, public).
    :ets.delete_all_objects(EXLA.Recompilation)
    on_exit(fn -> Application.delete_env(:exla, :check_recompilation) end)
  end

  defp check(n), do: Application.put_env(:exla, :check_recompilation, n)

  # A closure of one code site, capturing `tensor`: a new cache key for
  # every tensor, the same function for the check.
  defp scaled(tensor), do: fn x -> Nx.multiply(x, tensor) end

  defp warnings(log), do: length(Regex.scan(~r/EXLA has compiled/, log))

  test "warns once when a closure is compiled n times with the same shapes" do
    check(3)
    x = Nx.tensor([1.0, 2.0])

    log =
      capture_log(fn ->
        for i <- 1..6 do
          assert Nx.to_flat_list(EXLA.jit(scaled(Nx.tensor(i * 1.0))).(x)) == [i * 1.0, i * 2.0]
        end
      end)

    assert warnings(log) == 1
    assert log =~ ~r/EXLA has compiled #Function<.*> 3 times with the same input shapes/
    assert log =~ "give the changing tensors to it as arguments"
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
