defmodule EXLA.StreamTest do
  use ExUnit.Case, async: false

  # Streams exist on Nx 0.7 only (Nx 0.10 removed them); these tests are
  # excluded on the other lines, where the calls below are undefined.
  @compile {:no_warn_undefined, [{EXLA, :stream, 2}, {EXLA, :stream, 3}, Nx.Stream]}

  # Nx 0.10 removed Nx.Defn.stream/3: streams exist on Nx 0.7 only.
  @moduletag nx: :streams?

  import Nx.Defn

  defn sum(tensor, acc), do: {acc, tensor + acc}

  test "the documented example: outputs are the accumulator before each chunk" do
    stream = EXLA.stream(&sum/2, [0, 0])

    for i <- 1..5, do: assert(Nx.Stream.send(stream, i) == :ok)
    received = for _ <- 1..5, do: stream |> Nx.Stream.recv() |> Nx.to_number()
    assert received == [0, 1, 3, 6, 10]
    assert stream |> Nx.Stream.done() |> Nx.to_number() == 15
  end

  test "interleaved send and recv, and the accumulator stays on the device" do
    stream = EXLA.stream(&sum/2, [Nx.tensor([0.0, 0.0]), Nx.tensor([1.0, 1.0])])
    Nx.Stream.send(stream, Nx.tensor([1.0, 2.0]))
    assert Nx.to_flat_list(Nx.Stream.recv(stream)) == [1.0, 1.0]
    Nx.Stream.send(stream, Nx.tensor([1.0, 2.0]))
    assert Nx.to_flat_list(Nx.Stream.recv(stream)) == [2.0, 3.0]
    acc = Nx.Stream.done(stream)
    assert %EXLA.Backend{} = acc.data
    assert Nx.to_flat_list(acc) == [3.0, 5.0]
  end

  defn pairs({a, b}, %{total: t, count: c}) do
    {a * b, %{total: t + a * b, count: c + 1}}
  end

  test "containers as chunk data and accumulator" do
    input = {Nx.tensor(0.0), Nx.tensor(0.0)}
    acc = %{total: Nx.tensor(0.0), count: Nx.tensor(0)}
    stream = EXLA.stream(&pairs/2, [input, acc])
    Nx.Stream.send(stream, {Nx.tensor(2.0), Nx.tensor(3.0)})
    Nx.Stream.send(stream, {Nx.tensor(4.0), Nx.tensor(5.0)})
    assert Nx.to_number(Nx.Stream.recv(stream)) == 6.0
    assert Nx.to_number(Nx.Stream.recv(stream)) == 20.0
    %{total: total, count: count} = Nx.Stream.done(stream)
    assert {Nx.to_number(total), Nx.to_number(count)} == {26.0, 2}
  end

  test "any process may send; only the starting process may recv and done" do
    stream = EXLA.stream(&sum/2, [0, 0])
    task = Task.async(fn -> Nx.Stream.send(stream, 7) end)
    assert Task.await(task) == :ok
    assert Nx.to_number(Nx.Stream.recv(stream)) == 0

    for op <- [&Nx.Stream.recv/1, &Nx.Stream.done/1] do
      task = Task.async(fn -> catch_error(op.(stream)) end)
      assert %RuntimeError{message: message} = Task.await(task)
      assert message =~ "from the process that started the stream"
    end

    assert Nx.to_number(Nx.Stream.done(stream)) == 7
  end

  test "recv waits for a chunk not sent yet; queued chunks come out in order" do
    stream = EXLA.stream(&sum/2, [0, 0])
    id = stream.run.id

    # Without input the program produces nothing: it waits for a chunk.
    refute_receive {:exla_callback, ^id, _, _}, 100

    sender =
      Task.async(fn ->
        Process.sleep(200)
        Nx.Stream.send(stream, 3)
      end)

    {time, output} = :timer.tc(fn -> Nx.Stream.recv(stream) end)
    assert Nx.to_number(output) == 0
    assert time >= 150_000, "recv returned after #{time}us, before the chunk was sent"
    assert Task.await(sender) == :ok

    # Sends never wait for recv; each recv takes the next output in order.
    for i <- 1..50, do: :ok = Nx.Stream.send(stream, i)
    outputs = for _ <- 1..50, do: stream |> Nx.Stream.recv() |> Nx.to_number()
    assert outputs == Enum.scan(0..49, 3, &(&1 + &2))
    refute_received {:exla_callback, ^id, _, _}
    assert Nx.to_number(Nx.Stream.done(stream)) == 3 + 1275
  end

  test "a send of data that is no container of tensors raises ArgumentError and the stream goes on" do
    stream = EXLA.stream(&sum/2, [Nx.tensor([0, 0]), Nx.tensor([0, 0])])

    for data <- [[1, 2], :two, "12", nil, true, {Nx.tensor([1, 2]), [3]}] do
      error = assert_raise ArgumentError, fn -> Nx.Stream.send(stream, data) end
      assert error.message =~ "on send"
      assert error.message =~ "not a tensor or a container of tensors"
    end

    Nx.Stream.send(stream, Nx.tensor([1, 2]))
    assert Nx.to_flat_list(Nx.Stream.recv(stream)) == [0, 0]
    assert Nx.to_flat_list(Nx.Stream.done(stream)) == [1, 2]
  end

  test "a send of the wrong shape or type raises and the stream goes on" do
    stream = EXLA.stream(&sum/2, [Nx.tensor([0, 0]), Nx.tensor([0, 0])])

    assert_raise ArgumentError, ~r/s64\[3\]/, fn ->
      Nx.Stream.send(stream, Nx.tensor([1, 2, 3]))
    end

    assert_raise ArgumentError, ~r/f32\[2\]/, fn ->
      Nx.Stream.send(stream, Nx.tensor([1.0, 2.0]))
    end

    assert_raise ArgumentError, ~r/on send/, fn -> Nx.Stream.send(stream, {1, 2}) end
    Nx.Stream.send(stream, Nx.tensor([1, 2]))
    assert Nx.to_flat_list(Nx.Stream.recv(stream)) == [0, 0]
    assert Nx.to_flat_list(Nx.Stream.done(stream)) == [1, 2]
  end

  test "done with outputs not received raises and leaves the stream usable" do
    stream = EXLA.stream(&sum/2, [0, 0])
    Nx.Stream.send(stream, 1)
    Nx.Stream.send(stream, 2)
    assert Nx.to_number(Nx.Stream.recv(stream)) == 0

    # Raised at once, whether the output is computed yet or not.
    for _ <- 1..2 do
      assert_raise RuntimeError,
                   "cannot mark stream as done when there are recv messages pending",
                   fn -> Nx.Stream.done(stream) end
    end

    # Nothing was lost: the stream goes on.
    assert Nx.to_number(Nx.Stream.recv(stream)) == 1
    Nx.Stream.send(stream, 3)

    assert_raise RuntimeError, ~r/recv messages pending/, fn -> Nx.Stream.done(stream) end
    assert Nx.to_number(Nx.Stream.recv(stream)) == 3
    assert Nx.to_number(Nx.Stream.done(stream)) == 6
    refute_received {:exla_callback, _, _, _}
    refute_received {:exla_run, _, _}
  end

  test "done with a chunk sent by another process and not received raises" do
    stream = EXLA.stream(&sum/2, [0, 0])
    assert Task.await(Task.async(fn -> Nx.Stream.send(stream, 4) end)) == :ok
    assert_raise RuntimeError, ~r/recv messages pending/, fn -> Nx.Stream.done(stream) end
    assert Nx.to_number(Nx.Stream.recv(stream)) == 0
    assert Nx.to_number(Nx.Stream.done(stream)) == 4
  end

  test "recv, done and send after done raise instead of waiting" do
    sessions = EXLA.HostCallback.session_count()
    stream = EXLA.stream(&sum/2, [0, 0])
    assert EXLA.HostCallback.session_count() == sessions + 1
    assert Nx.to_number(Nx.Stream.done(stream)) == 0
    assert EXLA.HostCallback.session_count() == sessions

    assert_raise RuntimeError, "cannot recv from stream because it has been terminated", fn ->
      Nx.Stream.recv(stream)
    end

    assert_raise RuntimeError, "cannot mark stream as done because it has been terminated", fn ->
      Nx.Stream.done(stream)
    end

    assert_raise RuntimeError, ~r/stream is (done|closed)/, fn -> Nx.Stream.send(stream, 1) end

    # The client is still usable, and so are new streams.
    stream = EXLA.stream(&sum/2, [0, 0])
    Nx.Stream.send(stream, 5)
    assert Nx.to_number(Nx.Stream.recv(stream)) == 0
    assert Nx.to_number(Nx.Stream.done(stream)) == 5
  end

  test "send takes any Nx.LazyContainer that matches the input, and builds it once" do
    input = {Nx.tensor(0.0), Nx.tensor(0.0)}
    acc = %{total: Nx.tensor(0.0), count: Nx.tensor(0)}
    stream = EXLA.stream(&pairs/2, [input, acc])

    lazy = %EXLA.Test.LazyLoader{notify: self(), tensor: Nx.tensor(3.0)}
    assert Nx.Stream.send(stream, {lazy, Nx.tensor(2.0, backend: EXLA.Backend)}) == :ok
    assert_received :loaded
    refute_received :loaded
    assert Nx.to_number(Nx.Stream.recv(stream)) == 6.0

    # A lazy container of the wrong type is refused before it is built.
    wrong = %EXLA.Test.LazyLoader{notify: self(), tensor: Nx.tensor(3)}

    assert_raise ArgumentError, ~r/expected a tensor of type, shape, and names on send/, fn ->
      Nx.Stream.send(stream, {wrong, Nx.tensor(2.0)})
    end

    refute_received :loaded
    assert_raise ArgumentError, ~r/on send/, fn -> Nx.Stream.send(stream, Nx.tensor(2.0)) end

    # Numbers are containers too.
    assert Nx.Stream.send(stream, {1.0, 5.0}) == :ok
    assert Nx.to_number(Nx.Stream.recv(stream)) == 5.0
    %{total: total, count: count} = Nx.Stream.done(stream)
    assert {Nx.to_number(total), Nx.to_number(count)} == {11.0, 2}
  end

  defn first_only({a, _unread}, acc), do: {a * 2, acc + a}
  defn ignores_input(_input, acc), do: {acc, acc + 1}

  test "send builds only the fields of a lazy container that the step reads" do
    stream = EXLA.stream(&first_only/2, [{Nx.tensor(0.0), Nx.tensor([0, 0])}, Nx.tensor(0.0)])
    read = %EXLA.Test.LazyLoader{notify: self(), tensor: Nx.tensor(3.0)}
    unread = %EXLA.Test.LazyLoader{notify: self(), tensor: Nx.tensor([1, 2])}
    assert Nx.Stream.send(stream, {read, unread}) == :ok
    # One of the two is built: the field the step reads.
    assert_received :loaded
    refute_received :loaded
    assert Nx.to_number(Nx.Stream.recv(stream)) == 6.0

    # The unread field is still checked against the input.
    wrong = %EXLA.Test.LazyLoader{notify: self(), tensor: Nx.tensor([1.0, 2.0])}

    assert_raise ArgumentError, ~r/on send/, fn ->
      Nx.Stream.send(stream, {Nx.tensor(1.0), wrong})
    end

    assert Nx.Stream.send(stream, {Nx.tensor(4.0), Nx.tensor([5, 6])}) == :ok
    assert Nx.to_number(Nx.Stream.recv(stream)) == 8.0
    assert Nx.to_number(Nx.Stream.done(stream)) == 7.0
    refute_received :loaded

    # A step that reads no input builds nothing, and still runs once per chunk.
    stream = EXLA.stream(&ignores_input/2, [Nx.tensor([0, 0]), 0])
    unread = %EXLA.Test.LazyLoader{notify: self(), tensor: Nx.tensor([1, 2])}
    for _ <- 1..2, do: assert(Nx.Stream.send(stream, unread) == :ok)
    assert Enum.map(1..2, fn _ -> Nx.to_number(Nx.Stream.recv(stream)) end) == [0, 1]
    assert Nx.to_number(Nx.Stream.done(stream)) == 2
    refute_received :loaded
  end

  test "names must be compatible with the input's" do
    stream = EXLA.stream(&sum/2, [Nx.tensor([0, 0], names: [:x]), Nx.tensor([0, 0])])
    assert Nx.Stream.send(stream, Nx.tensor([1, 2], names: [:x])) == :ok
    assert Nx.Stream.send(stream, Nx.tensor([1, 2])) == :ok

    assert_raise ArgumentError, ~r/on send/, fn ->
      Nx.Stream.send(stream, Nx.tensor([1, 2], names: [:y]))
    end

    assert Nx.to_flat_list(Nx.Stream.recv(stream)) == [0, 0]
    assert Nx.to_flat_list(Nx.Stream.recv(stream)) == [1, 2]
    assert Nx.to_flat_list(Nx.Stream.done(stream)) == [2, 4]
  end

  test "a crashed consumer ends the stream and frees its session" do
    before = EXLA.HostCallback.session_count()
    parent = self()

    {pid, ref} =
      spawn_monitor(fn ->
        stream = EXLA.stream(&sum/2, [0, 0])
        Nx.Stream.send(stream, 1)
        send(parent, {:stream, stream})
        exit(:crash)
      end)

    assert_receive {:DOWN, ^ref, :process, ^pid, :crash}, 5000
    assert_receive {:stream, stream}
    assert EXLA.TestWait.until(fn -> EXLA.HostCallback.session_count() <= before end, 100, 20)
    assert_raise RuntimeError, ~r/closed/, fn -> Nx.Stream.send(stream, 1) end
    assert Nx.to_number(EXLA.jit(&Nx.add/2).(1, 2)) == 3
  end

  test "stream_cached? tells whether the stream program is compiled" do
    fun = fn x, acc -> {Nx.multiply(x, 3), Nx.add(acc, x)} end
    args = [Nx.tensor(1.0), Nx.tensor(0.0)]
    refute EXLA.stream_cached?(fun, args)
    stream = EXLA.stream(fun, args)
    assert EXLA.stream_cached?(fun, args)
    refute EXLA.stream_cached?(fun, [Nx.tensor(1), Nx.tensor(0)])
    Nx.Stream.done(stream)
  end

  defn hooked_sum(x, acc), do: {hook(x * 2, :seen), acc + x}

  test "hooks inside a stream run before the chunk's output is received" do
    parent = self()
    stream = EXLA.stream(&hooked_sum/2, [0, 0], hooks: %{seen: &send(parent, {:seen, &1})})
    Nx.Stream.send(stream, 4)
    assert Nx.to_number(Nx.Stream.recv(stream)) == 8
    assert_received {:seen, seen}
    assert Nx.to_number(seen) == 8
    assert Nx.to_number(Nx.Stream.done(stream)) == 4
  end

  # A stream's file has no reader of its own (EXLA.Defn.CacheFile reads
  # jit's): the compile cache reports it.
  @tag :tmp_dir
  test "cache: path with debug: true logs EXLA's lines for the file", %{tmp_dir: dir} do
    level = Logger.level()
    Logger.configure(level: :debug)
    on_exit(fn -> Logger.configure(level: level) end)
    path = Path.join(dir, "stream.exla")

    # Two cache keys (an option EXLA does not know is part of it) of one
    # program.
    run = fn tag ->
      ExUnit.CaptureLog.capture_log([level: :debug], fn ->
        stream = EXLA.stream(&sum/2, [0, 0], cache: path, debug: true, tag: tag)
        Nx.Stream.send(stream, 2)
        assert Nx.to_number(Nx.Stream.recv(stream)) == 0
        assert Nx.to_number(Nx.Stream.done(stream)) == 2
      end)
    end

    log = run.(:first)
    assert log =~ "EXLA disk cache not found at #{inspect(path)}"
    assert File.exists?(path)

    EXLA.CompileCache.Memory.clear()
    log = run.(:second)
    assert log =~ "EXLA disk cache found at #{inspect(path)}"
    refute log =~ "not found"
  end

  test "a stream whose program was compiled before takes its executable, and keeps its own hooks" do
    ref = :telemetry_test.attach_event_handlers(self(), [[:exla, :compilation, :details]])
    on_exit(fn -> :telemetry.detach(ref) end)
    parent = self()

    # Two closures (two cache keys) lowering to one program text.
    step = fn tag ->
      fn x, acc ->
        {Nx.Defn.Kernel.hook(Nx.multiply(x, 5), &send(parent, {tag, &1})), Nx.add(acc, x)}
      end
    end

    first = EXLA.stream(step.(:first), [Nx.tensor(0.0), Nx.tensor(0.0)])
    assert_received {[:exla, :compilation, :details], ^ref, _, %{disk_cache: status}}
    assert status in [:miss, :hit, :off]

    second = EXLA.stream(step.(:second), [Nx.tensor(0.0), Nx.tensor(0.0)])
    assert_received {[:exla, :compilation, :details], ^ref, m, %{disk_cache: :memory}}
    assert m.xla_compile_time == 0

    # Both run at once, each with its accumulator and its hook.
    Nx.Stream.send(first, 1.0)
    Nx.Stream.send(second, 2.0)
    Nx.Stream.send(first, 3.0)
    assert Nx.to_number(Nx.Stream.recv(second)) == 10.0
    assert Nx.to_number(Nx.Stream.recv(first)) == 5.0
    assert Nx.to_number(Nx.Stream.recv(first)) == 15.0
    assert Nx.to_number(Nx.Stream.done(first)) == 4.0
    assert Nx.to_number(Nx.Stream.done(second)) == 2.0
    assert_received {:first, a}
    assert_received {:first, b}
    assert Enum.sort([Nx.to_number(a), Nx.to_number(b)]) == [5.0, 15.0]
    assert_received {:second, c}
    assert Nx.to_number(c) == 10.0
    refute_received {_, _}
  end

  # A broad sample of ops in one step: a stream step is lowered as jit
  # lowers (Nx.floor/ceil/round once raised KeyError :wide here).
  defn many_ops(x, acc) do
    i = Nx.as_type(x * 4, :s32)

    {n, _, _} =
      while {n = 0.0, k = 0, x}, k < 3 do
        {n + Nx.sum(x), k + 1, x}
      end

    out = %{
      floor: Nx.floor(x),
      ceil: Nx.ceil(x),
      round: Nx.round(x),
      exp: Nx.exp(x),
      log1p: Nx.log1p(Nx.abs(x)),
      tanh: Nx.tanh(x),
      sigmoid: Nx.sigmoid(x),
      erf: Nx.erf(x),
      rsqrt: Nx.rsqrt(Nx.abs(x) + 1),
      sign: Nx.sign(x),
      pow: Nx.pow(Nx.abs(x), 1.5),
      atan2: Nx.atan2(x, acc + 1),
      remainder: Nx.remainder(i, 3),
      quotient: Nx.quotient(i, 3),
      bitwise: Nx.bitwise_xor(i, Nx.left_shift(i, 1)),
      max: Nx.max(x, acc),
      less: Nx.less(x, acc),
      select: Nx.select(x > 0, x, -x),
      clip: Nx.clip(x, -1, 1),
      sum: Nx.sum(x, axes: [1]),
      product: Nx.product(x + 2, axes: [0]),
      reduce_max: Nx.reduce_max(x),
      argmax: Nx.argmax(x, axis: 1),
      mean: Nx.mean(x),
      cumulative_sum: Nx.cumulative_sum(x, axis: 1),
      transpose: Nx.transpose(x),
      slice: Nx.slice(x, [0, 1], [2, 2]),
      put_slice: Nx.put_slice(x, [1, 0], Nx.tensor([[9.0, 9.0]])),
      concatenate: Nx.concatenate([x, acc]),
      reverse: Nx.reverse(x),
      pad: Nx.pad(x, 0.0, [{1, 0, 0}, {0, 1, 1}]),
      take: Nx.take(x, Nx.tensor([2, 0]), axis: 1),
      gather: Nx.gather(x, Nx.tensor([[1, 2], [0, 0]])),
      indexed_add: Nx.indexed_add(x, Nx.tensor([[0, 0], [1, 2]]), Nx.tensor([1.0, 2.0])),
      sort: Nx.sort(x, axis: 1, direction: :desc),
      argsort: Nx.argsort(x, axis: 1),
      dot: Nx.dot(x, Nx.transpose(acc)),
      outer: Nx.outer(x[0], x[1]),
      window_sum: Nx.window_sum(x, {1, 2}),
      window_max: Nx.window_max(x, {2, 1}),
      conv: Nx.conv(Nx.reshape(x, {1, 1, 2, 3}), Nx.broadcast(0.5, {1, 1, 1, 2})),
      iota: Nx.iota({2, 3}) + i,
      while: n,
      cond: if(Nx.sum(x) > 0, do: x * 2, else: x - 2),
      determinant: Nx.LinAlg.determinant(Nx.dot(x, Nx.transpose(x)))
    }

    {out, acc + x}
  end

  test "a broad sample of ops in a stream step gives the evaluator's results" do
    x0 = Nx.tensor([[0.5, -1.25, 2.0], [-0.75, 1.5, 0.25]])
    acc0 = Nx.tensor([[0.1, 0.2, -0.3], [0.4, -0.5, 0.6]])
    stream = EXLA.stream(&many_ops/2, [x0, acc0])
    chunks = [x0, Nx.multiply(x0, -1.5), Nx.add(x0, 0.75)]
    for chunk <- chunks, do: :ok = Nx.Stream.send(stream, chunk)
    evaluator = Nx.Defn.jit(&many_ops/2, compiler: Nx.Defn.Evaluator)

    acc =
      Enum.reduce(chunks, acc0, fn chunk, acc ->
        {expected, acc} = evaluator.(chunk, acc)
        actual = Nx.Stream.recv(stream)
        assert Map.keys(actual) == Map.keys(expected)

        for {key, value} <- expected do
          EXLA.LoweringCase.assert_tensor(value, actual[key], label: key, atol: 1.0e-5)
        end

        acc
      end)

    EXLA.LoweringCase.assert_tensor(acc, Nx.Stream.done(stream))
  end

  @tag :slow
  @tag timeout: 600_000
  test "100,000 chunks keep the BEAM's and the process's memory flat" do
    stream = EXLA.stream(&sum/2, [0, 0])
    round = fn -> Nx.Stream.send(stream, 1) && Nx.Stream.recv(stream) end
    {beam, rss} = EXLA.TestMemory.growth(round, 5_000, 100_000)
    assert beam < 20_000_000, "BEAM memory grew by #{beam} bytes"
    assert rss < 50_000, "the process's RSS grew by #{rss} kB"
    assert Nx.to_number(Nx.Stream.done(stream)) == 105_000
  end
end
