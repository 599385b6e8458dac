defmodule EXLA.LazyTransfersTest do
  use ExUnit.Case, async: false

  # Streams exist on Nx 0.7 only (Nx 0.10 removed them); these tests are
  # excluded on the other lines, where the calls below are undefined.
  @compile {:no_warn_undefined, [{EXLA, :stream, 2}, {EXLA, :stream, 3}, Nx.Stream]}

  import ExUnit.CaptureLog

  # The bytes of an integer Nx infers (s64 on Nx 0.7, s32 later).
  @int div(elem(EXLA.NxVersion.default_integer(), 1), 8)

  import Nx.Defn

  setup do
    test = self()
    handler = "lazy-transfers-#{inspect(make_ref())}"

    :telemetry.attach(
      handler,
      [:exla, :lazy_transfer],
      fn _event, %{bytes: bytes}, %{input: i}, _ -> send(test, {:transfer, i, bytes}) end,
      nil
    )

    on_exit(fn -> :telemetry.detach(handler) end)
  end

  defp transfers do
    receive do
      {:transfer, i, bytes} -> [{i, bytes} | transfers()]
    after
      0 -> []
    end
  end

  defp lazy(fun, opts \\ []), do: EXLA.jit(fun, Keyword.put(opts, :lazy_transfers, :always))

  defp eager(fun, args), do: apply(Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator), args)

  defp assert_same(left, right) do
    [l, r] = Enum.map([left, right], &Nx.Defn.Composite.flatten_list([&1]))
    assert length(l) == length(r)

    for {a, b} <- Enum.zip(l, r) do
      assert a.type == b.type and a.shape == b.shape
      assert Nx.to_binary(a) == Nx.to_binary(b)
    end
  end

  defn affine(a, b), do: a * 2 + b
  defn pair({a, b}, %{scale: s}), do: {a * s, Nx.sum(b)}
  defn pick(p, a, b), do: if(p > 0, do: a + 1, else: b - 1)
  defn only_first(a, _b), do: a + 1
  defn constant(_a), do: Nx.tensor([1, 2, 3])
  defn twice(a), do: {a + 1, a * 3}

  defn looped(n, x) do
    {_i, acc, _n} =
      while {i = 0, acc = x, n}, i < n do
        {i + 1, acc * 2, n}
      end

    acc
  end

  test "results equal the eager path for several shapes and types" do
    cases = [
      {Nx.tensor([1.0, 2.0, 3.0]), Nx.tensor([0.5, 0.25, 0.125])},
      {Nx.iota({2, 3}, type: :s64), Nx.iota({2, 3}, type: :s64)},
      {Nx.tensor(7, type: :u8), Nx.tensor([1, 2], type: :u8)},
      {Nx.tensor([1.5, -2.25], type: :bf16), Nx.tensor(0.5, type: :bf16)},
      {Nx.tensor([[1.0], [2.0]], type: :f16), Nx.tensor([[3.0], [4.0]], type: :f16)},
      {Nx.tensor([1.0, -2.0], type: :f64), Nx.tensor([0.0, 1.0e100], type: :f64)},
      {Nx.complex(Nx.tensor([1.0, 2.0]), Nx.tensor([3.0, 4.0])), Nx.tensor(1.0, type: :c64)},
      {Nx.tensor([[-1, 1]], type: :s8), Nx.tensor([[2], [3]], type: :s8)}
    ]

    for {a, b} <- cases do
      assert_same(lazy(&affine/2).(a, b), eager(&affine/2, [a, b]))
      assert transfers() |> Enum.map(&elem(&1, 0)) == [0, 1]
    end
  end

  test "containers and numbers" do
    args = [{Nx.tensor([1, 2]), Nx.iota({2, 2}, type: :f32)}, %{scale: Nx.tensor(3)}]
    assert_same(apply(lazy(&pair/2), args), eager(&pair/2, args))
    assert transfers() |> Enum.map(&elem(&1, 0)) |> Enum.sort() == [0, 1, 2]

    assert_same(lazy(&affine/2).(2, 0.5), eager(&affine/2, [2, 0.5]))
  end

  test "an input used twice is transferred once; outputs may share it" do
    a = Nx.tensor([1.0, 2.0])
    assert_same(lazy(&twice/1).(a), eager(&twice/1, [a]))
    assert transfers() == [{0, 8}]
  end

  test "inputs used by loops and EXLA.compile" do
    args = [Nx.tensor(3), Nx.tensor([1.0, 2.0])]
    assert_same(apply(lazy(&looped/2), args), eager(&looped/2, args))

    compiled =
      EXLA.compile(&affine/2, [Nx.template({2}, :f32), Nx.template({2}, :f32)],
        lazy_transfers: :always
      )

    assert_same(compiled.(Nx.tensor([1.0, 2.0]), Nx.tensor([3.0, 4.0])), Nx.tensor([5.0, 8.0]))
  end

  test "inputs on the device are parameters, never read back to the host" do
    a = Nx.tensor([1, 2, 3], backend: EXLA.Backend)
    b = Nx.tensor([4, 5, 6], backend: EXLA.Backend)
    assert_same(lazy(&affine/2).(a, b), Nx.tensor([6, 9, 12]))
    assert transfers() == []
  end

  test "device and host inputs in one call: only the host ones are fetched" do
    fun = lazy(&affine/2)
    device = Nx.tensor([1.0, 2.0, 3.0], backend: EXLA.Backend)
    host = Nx.tensor([0.5, 0.25, 0.125], backend: Nx.BinaryBackend)

    assert_same(fun.(device, host), eager(&affine/2, [device, host]))
    assert transfers() == [{1, 12}]
    assert_same(fun.(host, device), eager(&affine/2, [host, device]))
    assert transfers() == [{0, 12}]

    # The same function with every input on the host, then on the device.
    assert_same(fun.(host, host), eager(&affine/2, [host, host]))
    assert transfers() == [{0, 12}, {1, 12}]
    assert_same(fun.(device, device), eager(&affine/2, [device, device]))
    assert transfers() == []

    # The device input's buffer is used as is: it stays valid and unchanged.
    assert Nx.to_flat_list(device) == [1.0, 2.0, 3.0]
  end

  test "a host input is fetched only when the taken branch needs it" do
    fun = lazy(&pick/3)
    a = Nx.tensor([1, 2, 3], backend: EXLA.Backend)
    b = Nx.tensor([10, 20, 30], backend: Nx.BinaryBackend)
    p = Nx.tensor(1, backend: Nx.BinaryBackend)

    assert_same(fun.(p, a, b), Nx.tensor([2, 3, 4]))
    assert transfers() == [{0, @int}]
    assert_same(fun.(-1, a, b), Nx.tensor([9, 19, 29]))
    assert transfers() == [{0, @int}, {2, 3 * @int}]
  end

  test "device inputs with containers, loops, hooks and EXLA.compile" do
    args = [{Nx.tensor([1, 2]), Nx.iota({2, 2}, type: :f32, backend: EXLA.Backend)}, %{scale: 3}]
    assert_same(apply(lazy(&pair/2), args), eager(&pair/2, args))
    assert transfers() |> Enum.map(&elem(&1, 0)) |> Enum.sort() == [0, 2]

    n = Nx.tensor(3, backend: EXLA.Backend)
    assert_same(lazy(&looped/2).(n, Nx.tensor([1.0, 2.0])), Nx.tensor([8.0, 16.0]))
    assert transfers() == [{1, 8}]

    test = self()
    fun = lazy(&hooked/1, hooks: %{h: &send(test, {:hook, Nx.to_number(&1)})})
    assert_same(fun.(Nx.tensor(2, backend: EXLA.Backend)), Nx.tensor(6))
    assert_receive {:hook, 3}
    assert transfers() == []

    templates = [Nx.template({2}, :f32), Nx.template({2}, :f32)]
    compiled = EXLA.compile(&affine/2, templates, lazy_transfers: :always)
    device = Nx.tensor([1.0, 2.0], backend: EXLA.Backend)
    assert_same(compiled.(device, Nx.tensor([3.0, 4.0])), Nx.tensor([5.0, 8.0]))
    assert transfers() == [{1, 8}]
  end

  test "a lazy container that is not a tensor is only built when needed" do
    test = self()
    fun = lazy(&pick/3)
    b = %EXLA.Test.LazyLoader{notify: test, tensor: Nx.tensor([10, 20, 30])}
    assert_same(fun.(1, Nx.tensor([1, 2, 3], backend: EXLA.Backend), b), Nx.tensor([2, 3, 4]))
    refute_received :loaded
    assert_same(fun.(-1, Nx.tensor([1, 2, 3]), b), Nx.tensor([9, 19, 29]))
    assert_received :loaded
  end

  test "an input not needed by the taken branch is never transferred" do
    a = Nx.tensor([1, 2, 3])
    b = Nx.tensor([10, 20, 30])
    fun = lazy(&pick/3)

    assert_same(fun.(1, a, b), Nx.tensor([2, 3, 4]))
    assert transfers() == [{0, @int}, {1, 3 * @int}]

    assert_same(fun.(-1, a, b), Nx.tensor([9, 19, 29]))
    assert transfers() == [{0, @int}, {2, 3 * @int}]
  end

  test "unused inputs are never transferred" do
    assert_same(lazy(&only_first/2).(Nx.tensor(1), Nx.iota({1000})), Nx.tensor(2))
    assert transfers() == [{0, @int}]

    assert_same(lazy(&constant/1).(Nx.tensor(1)), Nx.tensor([1, 2, 3]))
    assert transfers() == []
  end

  test "hooks and lazy inputs run together, in program order" do
    test = self()
    fun = lazy(&hooked/1, hooks: %{h: &send(test, {:hook, Nx.to_number(&1)})})
    assert_same(fun.(Nx.tensor(2)), Nx.tensor(6))
    assert_receive {:hook, 3}
    assert transfers() == [{0, @int}]
  end

  defn hooked(a), do: hook(a + 1, :h) * 2

  test ":opt_in is the default, and like :never, it passes inputs up front" do
    assert EXLA.Defn.Compilation.validate_options!([])[:lazy_transfers] == :opt_in
    device = Nx.tensor([1.0, 2.0], backend: EXLA.Backend)
    host = Nx.tensor([3.0, 4.0], backend: Nx.BinaryBackend)

    for opts <- [[], [lazy_transfers: :opt_in], [lazy_transfers: :never]] do
      fun = EXLA.jit(&only_first/2, opts)
      assert_same(fun.(device, host), Nx.tensor([2.0, 3.0]))
      assert transfers() == []
      refute EXLA.to_mlir_module(&only_first/2, [device, host], opts).mlir_module =~ "callback"
    end
  end

  test ":never and :opt_in pass inputs up front" do
    for mode <- [:never, :opt_in] do
      fun = EXLA.jit(&affine/2, lazy_transfers: mode)
      assert_same(fun.(Nx.tensor(1), Nx.tensor(2)), Nx.tensor(4))
      assert transfers() == []
    end
  end

  test "wrong data fails the run with an exception, without hanging or leaking" do
    sessions = EXLA.HostCallback.session_count()
    template = Nx.template({3}, :f32)
    build = fn [a, b] -> Nx.add(Nx.multiply(a, 2), b) end
    opts = [lazy_transfers: :always]
    compiled = EXLA.Defn.__compile_op__(make_ref(), :liar, [template, template], build, opts)
    good = fn -> Nx.tensor([1.0, 2.0, 3.0]) end

    # The lazy inputs Nx hands the compiler are functions, called when
    # needed. The failed callback is also logged, as a warning that
    # EXLA.NativeLog delivers from its own process: it is flushed here,
    # inside the capture, so that it never reaches the console later.
    log =
      capture_log(fn ->
        assert_raise RuntimeError, ~r/bytes/, fn ->
          EXLA.Defn.__run__(compiled, [fn -> Nx.tensor([1.0, 2.0]) end, good])
        end

        assert_raise RuntimeError, "no data for you", fn ->
          EXLA.Defn.__run__(compiled, [good, fn -> raise "no data for you" end])
        end

        EXLA.NativeLog.flush()
      end)

    assert log =~
             ~r/\[exla::callback\] host callback failed \(site: \d+, error: a stream chunk tensor has 8 bytes, the program expects 12\)/

    refute_received {:exla_callback, _, _, _}
    refute_received {:exla_run, _, _}
    assert EXLA.HostCallback.session_count() == sessions

    # The compiled function still works afterwards.
    assert_same(EXLA.Defn.__run__(compiled, [good, good]), Nx.tensor([3.0, 6.0, 9.0]))
  end

  defn running_sum(x, acc), do: {acc, x + acc}

  defp pool_threads do
    "/proc/self/task/*/comm"
    |> Path.wildcard()
    |> Enum.count(&(File.read!(&1) =~ "exla-run"))
  end

  @tag nx: :streams?
  test "streams blocked on input do not starve other runs of pool threads" do
    # Each open stream holds a native thread while it waits for input.
    streams = for _ <- 1..8, do: EXLA.stream(&running_sum/2, [0, 0])
    assert_same(lazy(&affine/2).(Nx.tensor(1), Nx.tensor(2)), Nx.tensor(4))

    concurrent =
      1..8
      |> Task.async_stream(fn i -> lazy(&affine/2).(Nx.tensor(i), Nx.tensor(i)) end)
      |> Enum.map(fn {:ok, t} -> Nx.to_number(t) end)

    assert concurrent == Enum.map(1..8, &(&1 * 3))

    for stream <- streams do
      :ok = Nx.Stream.send(stream, 5)
      assert Nx.to_number(Nx.Stream.recv(stream)) == 0
      assert Nx.to_number(Nx.Stream.done(stream)) == 5
    end

    # Sequential calls reuse the pool's threads instead of starting new ones.
    threads = pool_threads()
    assert threads > 0
    for _ <- 1..200, do: lazy(&affine/2).(Nx.tensor(1), Nx.tensor(2))
    assert pool_threads() <= threads
  end
end
