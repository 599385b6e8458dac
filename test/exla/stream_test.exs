defmodule EXLA.StreamTest do
  use ExUnit.Case, async: false

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
      assert %ArgumentError{message: message} = Task.await(task)
      assert message =~ "process that started"
    end

    assert Nx.to_number(Nx.Stream.done(stream)) == 7
  end

  test "recv waits for a chunk not sent yet; queued chunks come out in order" do
    stream = EXLA.stream(&sum/2, [0, 0])
    id = stream.id

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

  test "a send of the wrong shape or type raises and the stream goes on" do
    stream = EXLA.stream(&sum/2, [Nx.tensor([0, 0]), Nx.tensor([0, 0])])
    assert_raise ArgumentError, ~r/shape/, fn -> Nx.Stream.send(stream, Nx.tensor([1, 2, 3])) end
    assert_raise ArgumentError, ~r/type/, fn -> Nx.Stream.send(stream, Nx.tensor([1.0, 2.0])) end
    Nx.Stream.send(stream, Nx.tensor([1, 2]))
    assert Nx.to_flat_list(Nx.Stream.recv(stream)) == [0, 0]
    assert Nx.to_flat_list(Nx.Stream.done(stream)) == [1, 2]
  end

  test "done before all recvs ends with a clear error; the client stays usable" do
    stream = EXLA.stream(&sum/2, [0, 0])
    Nx.Stream.send(stream, 1)
    Nx.Stream.send(stream, 2)
    assert Nx.to_number(Nx.Stream.recv(stream)) == 0

    assert_raise RuntimeError, ~r/1 result\(s\) not received/, fn ->
      Nx.Stream.done(stream)
    end

    stream = EXLA.stream(&sum/2, [0, 0])
    Nx.Stream.send(stream, 5)
    assert Nx.to_number(Nx.Stream.recv(stream)) == 0
    assert Nx.to_number(Nx.Stream.done(stream)) == 5
  end

  test "a crashed consumer ends the stream and frees its session" do
    before = EXLA.NIF.callback_session_count()
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
    wait_until(fn -> EXLA.NIF.callback_session_count() <= before end)
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

  defp rss_kb do
    "/proc/self/status"
    |> File.read!()
    |> then(&Regex.run(~r/VmRSS:\s+(\d+)/, &1))
    |> Enum.at(1)
    |> String.to_integer()
  end

  @tag :slow
  @tag timeout: 600_000
  test "100,000 chunks keep the BEAM's and the process's memory flat" do
    stream = EXLA.stream(&sum/2, [0, 0])
    round = fn -> Nx.Stream.send(stream, 1) && Nx.Stream.recv(stream) end
    for _ <- 1..5_000, do: round.()
    :erlang.garbage_collect()
    {before, rss} = {:erlang.memory(:total), rss_kb()}
    for _ <- 1..100_000, do: round.()
    :erlang.garbage_collect()
    growth = :erlang.memory(:total) - before
    assert growth < 20_000_000, "BEAM memory grew by #{growth} bytes"
    rss_growth = rss_kb() - rss
    assert rss_growth < 50_000, "the process's RSS grew by #{rss_growth} kB"
    assert Nx.to_number(Nx.Stream.done(stream)) == 105_000
  end

  defp wait_until(fun, tries \\ 100) do
    cond do
      fun.() -> :ok
      tries == 0 -> flunk("condition not met")
      true -> Process.sleep(20) && wait_until(fun, tries - 1)
    end
  end
end
