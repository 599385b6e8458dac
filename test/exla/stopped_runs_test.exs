defmodule EXLA.StoppedRunsTest do
  # A run nobody waits for stops at the next check of its loops (see
  # native/exla/src/cancel.rs). Not async: these tests read the CPU time
  # of the VM's threads.
  use ExUnit.Case, async: false

  import Nx.Defn

  @moduletag cpu_only: "the host platform's loops check their run; CUDA's do not"

  # Counts to n. (A loop that only counts XLA replaces by its trip count,
  # unless it checks: `acc` keeps it a loop.)
  defn count(n) do
    {i, _acc, _n} =
      while {i = 0, acc = 1.0, n}, i < n and acc > 0, do: {i + 1, acc * 0.5 + 1.0, n}

    i
  end

  # A loop that never ends (its condition cannot tell): only stopping its
  # run ends it. `x` is a scalar.
  defn forever(x) do
    {x, _acc} = while {x, acc = 1.0}, acc > 0, do: {x + 1, acc * 0.5 + 1.0}
    x
  end

  # forever/1 inside a loop of two iterations: the inner loop checks too.
  defn forever_inside(x) do
    {_j, x} = while {j = 0, x}, j < 2, do: {j + 1, forever(x)}
    x
  end

  # forever/1 of the first of a batch, as a batch of one.
  defn forever_first(batch), do: Nx.new_axis(forever(batch[0]), 0)

  # The CPU time, in µs, of each of the VM's threads but its normal
  # schedulers (which run these tests): a run's loop runs on a thread of
  # the NIF's run pool, or on the plugin's own threads (which Linux names
  # after the thread that made the client, a dirty scheduler).
  defp thread_cpu do
    for comm <- Path.wildcard("/proc/self/task/*/comm"),
        {:ok, name} <- [File.read(comm)],
        not (name =~ ~r/^(\d+_scheduler|erts_sched_\d+)\n$/),
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

  # Each way a caller goes: the run it waited for, which would never end,
  # takes less than 50 ms of a core once the caller is gone (it took the
  # whole 300 ms before EXLA checked).
  defp assert_stops(call) do
    for how <- [:kill, :exit, :task_shutdown] do
      {caller, threads} =
        case how do
          :task_shutdown -> start(&Task.async/1, call)
          _other -> start(&spawn/1, call)
        end

      {pid, stop} =
        case how do
          :kill -> {caller, fn -> Process.exit(caller, :kill) end}
          :exit -> {caller, fn -> Process.exit(caller, :shutdown) end}
          :task_shutdown -> {caller.pid, fn -> Task.shutdown(caller, :brutal_kill) end}
        end

      taken = cpu_after(threads, pid, stop)
      assert taken < 50_000, "#{how}: the run went on (#{taken} µs of CPU on #{inspect(threads)})"
    end
  end

  test "EXLA.jit: a run whose caller is gone stops" do
    assert Nx.to_number(EXLA.jit(&count/1).(1000)) == 1000
    looper = EXLA.jit(&forever/1)
    assert_stops(fn -> looper.(0) end)
  end

  test "a run stops in its innermost loop" do
    looper = EXLA.jit(&forever_inside/1)
    assert_stops(fn -> looper.(0) end)
  end

  test "EXLA.Executable.run: a run whose caller is gone stops" do
    client = EXLA.Client.fetch!(:host)
    shape = EXLA.Shape.make_shape({:s, 64}, {})
    lowering = [run_checks: true] ++ EXLA.Defn.Lowering.client_options(client)

    program = fn fun ->
      expr = Nx.Defn.debug_expr(fun).(Nx.tensor(0, type: :s64))
      %{program: program} = EXLA.Defn.Lowering.to_mlir(expr, [shape], lowering)
      assert program.facts.run_checks
      EXLA.Executable.compile(client, program)
    end

    arg = fn n -> {<<n::64-signed-native>>, shape} end
    counter = program.(&count/1)
    [[out]] = EXLA.Executable.run(counter, [[arg.(5)]])
    # the count's type is Nx's default integer's (s32 on Nx 0.12 and later)
    [%{dtype: type}] = counter.output_shapes
    assert Nx.to_flat_list(Nx.from_binary(EXLA.DeviceBuffer.read(out), type)) == [5]
    looper = program.(&forever/1)
    assert_stops(fn -> EXLA.Executable.run(looper, [[arg.(0)]]) end)
  end

  test "Nx.Serving: a run whose caller is gone stops" do
    serving = Nx.Serving.jit(&forever_first/1, compiler: EXLA)
    assert_stops(fn -> Nx.Serving.run(serving, Nx.Batch.stack([Nx.tensor(0)])) end)
  end

  test "runs of other processes on the same executable go on" do
    counter = EXLA.jit(&count/1)
    parent = self()
    n = 200_000_000
    # the program compiled, so that both start at once
    assert Nx.to_number(counter.(10)) == 10

    # 2^62 iterations: as good as never ending
    [doomed, kept] =
      for count <- [Nx.tensor(2 ** 62, type: :s64), Nx.tensor(n, type: :s64)] do
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
    carrier = EXLA.jit(&forever/1, donate: [0], client: :stopped_runs)
    before = EXLA.Client.get_memory_statistics(client).allocated
    x = Nx.tensor(1.0, backend: backend)
    assert EXLA.Client.get_memory_statistics(client).allocated == before + 4
    {caller, threads} = start(&spawn/1, fn -> carrier.(x) end)
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
      assert Nx.to_number(counter.(100)) == 100
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
        defn forever(x) do
          {x, _acc} = while {x, acc = 1.0}, acc > 0, do: {x + 1, acc * 0.5 + 1.0}
          x
        end
      end
      looper = Nx.Defn.compile(&Loop.forever/1, [0], compiler: EXLA)
      #{if run?, do: "spawn(fn -> looper.(0) end)", else: "_ = looper"}
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
