# What stopping runs nobody waits for costs, and how fast they stop (see
# "Runs nobody waits for" in the README and native/exla/src/cancel.rs).
#
#     MIX_ENV=test mix run bench/stop_bench.exs
#
# Part one: the time of one iteration of loops whose bodies take from a few
# nanoseconds to about 100 µs, compiled with the run checks and without
# (`config :exla, :stop_abandoned_runs`): 31 pairs of runs, the two
# alternating; the medians of the iteration times and of the pairs' ratios
# (checked / unchecked).
#
# Part two: a loop of 10^9 iterations whose caller is killed, exits or is
# shut down as a task: the CPU time the VM's threads take in the 300 ms
# after (the run's thread and the plugin's; about 0 once the run stopped,
# 300 ms a core while it runs).
defmodule StopBench do
  import Nx.Defn

  # A counter XLA cannot replace by its trip count (it does so with a
  # loop that only counts, unless the loop checks).
  defn count(n) do
    {i, _acc, _n} =
      while {i = 0, acc = 1.0, n}, i < n and acc > 0, do: {i + 1, acc * 0.5 + 1.0, n}

    i
  end

  # The condition reads the whole vector: it is evaluated once per
  # iteration, its predicate carried (see EXLA.Defn.Lowering).
  defn squash_while_small(x, n) do
    {_i, x, _n} =
      while {i = 0, x, n}, i < n and Nx.sum(x) < 1.0e30, do: {i + 1, Nx.tanh(x * 1.0001), n}

    x
  end

  defn squash(x, n) do
    {_i, x, _n} = while {i = 0, x, n}, i < n, do: {i + 1, Nx.tanh(x * 1.0001), n}
    x
  end

  def cpu_us do
    for stat <- Path.wildcard("/proc/self/task/*/schedstat"), reduce: 0 do
      total ->
        case File.read(stat) do
          {:ok, text} -> total + div(text |> String.split() |> hd() |> String.to_integer(), 1000)
          {:error, _} -> total
        end
    end
  end

  # A compiled function of `fun` on `args`, with or without the checks.
  def compiled(fun, args, checks?) do
    Application.put_env(:exla, :stop_abandoned_runs, checks?)
    templates = Enum.map(args, &Nx.to_template/1)
    compiled = Nx.Defn.compile(fun, templates, compiler: EXLA, cache: false)
    Application.delete_env(:exla, :stop_abandoned_runs)
    compiled
  end

  def time_us(fun, args) do
    {us, out} = :timer.tc(fn -> apply(fun, args) end)
    Nx.backend_deallocate(out)
    us
  end
end

IO.puts(
  "iteration time (µs), checked and unchecked, and their ratio: medians of 31 pairs of runs"
)

cases = [
  {"scalar counter", &StopBench.count/1, fn n -> [n] end, 20_000_000},
  {"tanh of 64 f32", &StopBench.squash/2, fn n -> [Nx.iota({64}, type: :f32), n] end, 200_000},
  {"tanh of 1024 f32", &StopBench.squash/2, fn n -> [Nx.iota({1024}, type: :f32), n] end, 20_000},
  {"tanh of 16384 f32", &StopBench.squash/2, fn n -> [Nx.iota({16_384}, type: :f32), n] end,
   4_000},
  {"tanh of 32768 f32", &StopBench.squash/2, fn n -> [Nx.iota({32_768}, type: :f32), n] end,
   2_000},
  {"same, while its sum is small", &StopBench.squash_while_small/2,
   fn n -> [Nx.iota({32_768}, type: :f32), n] end, 2_000},
  {"tanh of 262144 f32", &StopBench.squash/2, fn n -> [Nx.iota({262_144}, type: :f32), n] end,
   300}
]

for {name, fun, args, n} <- cases do
  args = args.(n)
  checked = StopBench.compiled(fun, args, true)
  unchecked = StopBench.compiled(fun, args, false)

  # Runs of the two alternate, so that both see the same machine; the
  # ratio is per pair of runs.
  StopBench.time_us(checked, args)
  StopBench.time_us(unchecked, args)

  pairs =
    for _ <- 1..31, do: {StopBench.time_us(checked, args), StopBench.time_us(unchecked, args)}

  median = &Enum.at(Enum.sort(&1), 15)
  {on, off} = Enum.unzip(pairs)
  ratio = median.(Enum.map(pairs, fn {on, off} -> on / off end))
  f = &:erlang.float_to_binary(&1, decimals: 4)

  IO.puts(
    String.pad_trailing(name, 32) <>
      "#{f.(median.(on) / n)}  #{f.(median.(off) / n)}  #{:erlang.float_to_binary(ratio, decimals: 3)}"
  )
end

IO.puts("\nCPU time in the 300 ms after the caller of a 10^9-iteration loop goes (ms)")
counter = EXLA.jit(&StopBench.count/1)
counter.(10)
{:ok, tasks} = Task.Supervisor.start_link()

for how <- [:kill, :exit, :task_shutdown, :none] do
  samples =
    for _ <- 1..3 do
      {stop, cleanup} =
        case how do
          :task_shutdown ->
            task = Task.Supervisor.async_nolink(tasks, fn -> counter.(1_000_000_000) end)
            {fn -> Task.shutdown(task, :brutal_kill) end, fn -> :ok end}

          other ->
            pid = spawn(fn -> counter.(1_000_000_000) end)

            case other do
              :kill -> {fn -> Process.exit(pid, :kill) end, fn -> :ok end}
              :exit -> {fn -> Process.exit(pid, :shutdown) end, fn -> :ok end}
              # the run goes on: the measure of a running loop
              :none -> {fn -> :ok end, fn -> Process.exit(pid, :kill) end}
            end
        end

      Process.sleep(500)
      before = StopBench.cpu_us()
      stop.()
      Process.sleep(300)
      taken = StopBench.cpu_us() - before
      cleanup.()
      Process.sleep(200)
      taken / 1000
    end

  IO.puts(String.pad_trailing("#{how}", 15) <> Enum.map_join(samples, "  ", &"#{round(&1)}"))
end
