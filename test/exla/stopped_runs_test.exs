defmodule EXLA.StoppedRunsTest do
  # A run nobody waits for stops at the next check of its loops (see
  # native/exla/src/cancel.rs). Not async: the CPU time of the run
  # threads, which these tests read, is the whole VM's.
  use ExUnit.Case, async: false

  import Nx.Defn

  @moduletag cpu_only: "the host platform's loops check their run; CUDA's do not"

  # Counts to n: 10^9 iterations take seconds. (A loop that only counts
  # XLA replaces by its trip count, unless it checks.)
  defn count(n) do
    {i, _acc, _n} =
      while {i = 0, acc = 1.0, n}, i < n and acc > 0, do: {i + 1, acc * 0.5 + 1.0, n}

    i
  end

  # count/1 inside a loop of two iterations: the inner loop checks too.
  defn count_twice(n) do
    {_j, total, _n} = while {j = 0, total = 0, n}, j < 2, do: {j + 1, total + count(n), n}

    total
  end

  # count/1 of the first of a batch of counts, as a batch of one.
  defn count_first(batch), do: Nx.new_axis(count(batch[0]), 0)

  # Carries `x` through n iterations (n = 10^9 takes minutes).
  defn carry(x, n) do
    {_i, x, _n} =
      while {i = 0, x, n}, i < n do
        {i + 1, x + 1.0, n}
      end

    x
  end

  @long 1_000_000_000

  # The CPU time, in µs, of each thread of the NIF's run pool (`exla-run`):
  # these tests' loops are small, and XLA:CPU runs them on the thread that
  # runs the program.
  defp thread_cpu do
    for comm <- Path.wildcard("/proc/self/task/*/comm"),
        File.read(comm) == {:ok, "exla-run\n"},
        stat = Path.join(Path.dirname(comm), "schedstat"),
        {:ok, text} <- [File.read(stat)],
        into: %{} do
      {stat, div(text |> String.split() |> hd() |> String.to_integer(), 1000)}
    end
  end

  # The threads that took more than a tenth of `ms` of CPU in the next
  # `ms` (a run's thread may get much less than a core on this loaded
  # machine; an idle one takes none).
  defp busy_threads(ms) do
    before = thread_cpu()
    Process.sleep(ms)

    for {thread, cpu} <- thread_cpu(),
        cpu - Map.get(before, thread, cpu) > ms * 100,
        into: MapSet.new(),
        do: thread
  end

  # Starts `call` with `start` and returns, once it is running, the
  # threads its run keeps busy (not those busy before: other tests' runs
  # may still go on in this VM).
  defp start(start, call) do
    others = busy_threads(100)
    caller = start.(call)
    {caller, running(others)}
  end

  defp running(others, tries \\ 100) do
    ours = MapSet.difference(busy_threads(100), others)

    cond do
      MapSet.size(ours) > 0 -> ours
      tries > 0 -> running(others, tries - 1)
      true -> flunk("the run did not start")
    end
  end

  # The CPU time `threads` take in the 300 ms after `stop.()` ended the
  # process `caller`, counted from the moment the VM has ended it (the
  # monitors of the process, the run's included, fire then; on this loaded
  # 2-core machine the VM's own threads may wait tens of milliseconds for
  # a core before they get there, while the run's thread keeps one).
  defp cpu_after(threads, caller, stop) do
    cpu = fn ->
      thread_cpu() |> Map.take(MapSet.to_list(threads)) |> Map.values() |> Enum.sum()
    end

    monitor = Process.monitor(caller)
    stop.()
    assert_receive {:DOWN, ^monitor, :process, ^caller, _reason}, 5_000
    before = cpu.()
    Process.sleep(300)
    cpu.() - before
  end

  # Each way a caller goes: the run it waited for takes less than 50 ms of
  # a core once it has gone (it took the whole 300 ms before EXLA checked).
  defp assert_stops(call) do
    for how <- [:kill, :exit, :task_shutdown] do
      {caller, threads} =
        case how do
          :task_shutdown -> start(&Task.async/1, call)
          _other -> start(&spawn/1, call)
        end

      stop =
        case how do
          :kill -> fn -> Process.exit(caller, :kill) end
          :exit -> fn -> Process.exit(caller, :shutdown) end
          :task_shutdown -> fn -> Task.shutdown(caller, :brutal_kill) end
        end

      pid = if how == :task_shutdown, do: caller.pid, else: caller
      assert Process.alive?(pid), "#{how}: the run ended before it was stopped"
      taken = cpu_after(threads, pid, stop)
      assert taken < 50_000, "#{how}: the run went on (#{taken} µs of CPU on #{inspect(threads)})"
    end
  end

  test "EXLA.jit: a run whose caller is gone stops" do
    counter = EXLA.jit(&count/1)
    assert Nx.to_number(counter.(1000)) == 1000
    assert_stops(fn -> counter.(@long) end)
  end

  test "a run stops in its innermost loop" do
    counter = EXLA.jit(&count_twice/1)
    assert Nx.to_number(counter.(1000)) == 2000
    assert_stops(fn -> counter.(@long) end)
  end

  test "EXLA.Executable.run: a run whose caller is gone stops" do
    client = EXLA.Client.fetch!(:host)
    expr = Nx.Defn.debug_expr(&count/1).(10)
    shapes = [EXLA.Shape.make_shape({:s, 64}, {})]
    lowering = [run_checks: true] ++ EXLA.Defn.Lowering.client_options(client)
    %{program: program} = EXLA.Defn.Lowering.to_mlir(expr, shapes, lowering)
    assert program.facts.run_checks
    exe = EXLA.Executable.compile(client, program)
    n = fn n -> {<<n::64-signed-native>>, hd(shapes)} end

    [[out]] = EXLA.Executable.run(exe, [[n.(5)]])
    [%{dtype: type}] = exe.output_shapes
    assert out |> EXLA.DeviceBuffer.read() |> Nx.from_binary(type) |> Nx.to_flat_list() == [5]
    assert_stops(fn -> EXLA.Executable.run(exe, [[n.(@long)]]) end)
  end

  test "Nx.Serving: a run whose caller is gone stops" do
    serving = Nx.Serving.jit(&count_first/1, compiler: EXLA)
    assert_stops(fn -> Nx.Serving.run(serving, Nx.Batch.stack([Nx.tensor(@long)])) end)
  end

  test "runs of other processes on the same executable go on" do
    counter = EXLA.jit(&count/1)
    parent = self()
    n = 200_000_000

    [doomed, kept] =
      for count <- [@long, n] do
        spawn(fn -> send(parent, {self(), counter.(count)}) end)
      end

    Process.sleep(200)
    Process.exit(doomed, :kill)
    assert_receive {^kept, result}, 60_000
    assert Nx.to_number(result) == n
    refute_received {^doomed, _}
  end

  test "a donated argument is given up and the memory ledger comes back" do
    # A client of its own: no other test's buffers count in its ledger.
    EXLA.TestClients.add(:stopped_runs, platform: :host)
    client = EXLA.Client.fetch!(:stopped_runs)
    backend = {EXLA.Backend, client: :stopped_runs}
    carrier = EXLA.jit(&carry/2, donate: [0], client: :stopped_runs)
    # compiled beforehand, so that the ledger counts the run's buffers only
    carrier.(Nx.iota({16}, type: :f32, backend: backend), 1)
    :erlang.garbage_collect()
    before = EXLA.Client.get_memory_statistics(client).allocated
    x = Nx.iota({16}, type: :f32, backend: backend)
    assert EXLA.Client.get_memory_statistics(client).allocated == before + 64
    {caller, threads} = start(&spawn/1, fn -> carrier.(x, @long) end)
    assert cpu_after(threads, caller, fn -> Process.exit(caller, :kill) end) < 50_000

    assert_raise RuntimeError, ~r/donated|deleted/, fn -> Nx.to_binary(x) end
    assert EXLA.Client.get_memory_statistics(client).allocated == before
  end

  test "loops without checks (stop_abandoned_runs: false) run as before" do
    Application.put_env(:exla, :stop_abandoned_runs, false)

    try do
      # cache: false, so that the program is lowered with the setting
      counter = EXLA.jit(&count/1, cache: false)
      %{mlir_module: text} = EXLA.to_mlir_module(&count/1, [10])
      refute text =~ "exla_run_check"
      assert Nx.to_number(counter.(100)) == 100.0
    after
      Application.delete_env(:exla, :stop_abandoned_runs)
    end
  end

  # OTP 26 and later let the NIF make erlang:halt/1 wait for native work
  # (native/exla/src/halt.rs); the run stops at its next check instead of
  # holding the halt for up to 10 s.
  @tag :halt_hook
  @tag :tmp_dir
  test "System.halt/1 during a run ends the VM at once", %{tmp_dir: dir} do
    halt_ms = fn run? ->
      code = """
      Application.ensure_all_started(:exla)
      defmodule Loop do
        import Nx.Defn
        defn count(n) do
          {_i, acc, _n} = while {i = 0, acc = 0.0, n}, i < n, do: {i + 1, acc + 1.0, n}
          acc
        end
      end
      counter = EXLA.jit(&Loop.count/1)
      counter.(10)
      #{if run?, do: "spawn(fn -> counter.(#{@long}) end)"}
      Process.sleep(300)
      IO.puts("halting")
      System.halt(0)
      """

      port =
        Port.open({:spawn_executable, System.find_executable("elixir")}, script_args(code, dir))

      wait_halt(port, nil)
    end

    # the VM's own exit, without a run, is the baseline
    baseline = Enum.min(for _ <- 1..2, do: halt_ms.(false))
    with_run = Enum.min(for _ <- 1..2, do: halt_ms.(true))
    assert with_run - baseline < 50, "#{with_run} ms with a run, #{baseline} ms without"
  end

  defp script_args(code, dir) do
    paths = Enum.flat_map(:code.get_path(), &["-pa", List.to_string(&1)])
    [:binary, :exit_status, {:line, 1024}, {:cd, dir}, {:args, paths ++ ["-e", code]}]
  end

  # The milliseconds from the script's "halting" line to its exit.
  defp wait_halt(port, halting) do
    receive do
      {^port, {:data, {:eol, "halting"}}} ->
        wait_halt(port, System.monotonic_time(:millisecond))

      {^port, {:data, _}} ->
        wait_halt(port, halting)

      {^port, {:exit_status, 0}} when halting != nil ->
        System.monotonic_time(:millisecond) - halting
    after
      60_000 -> flunk("the script did not end")
    end
  end
end
