# Do compiles of independent programs overlap? Two different programs (the
# MLP training step of bench/support/mlp.exs at batch 128 and at batch 64)
# are compiled with EXLA.jit (cache: false, so nothing is reused) one after
# the other, and at once from two processes. Rounds alternate the two
# modes; the table gives medians of wall time and of the VM's CPU time
# (all threads, /proc/self/stat), and for the concurrent mode how long the
# two compiles ran at the same time.
#
#     MIX_ENV=prod mix run bench/concurrent_compile_bench.exs
#
# Environment: BENCH_ROUNDS (default 7).
Code.require_file("support/mlp.exs", __DIR__)
Code.require_file("support/timing.exs", __DIR__)

defmodule ConcurrentCompileBench do
  def cpu_ms do
    fields =
      "/proc/self/stat" |> File.read!() |> String.split(") ") |> List.last() |> String.split()

    (String.to_integer(Enum.at(fields, 11)) + String.to_integer(Enum.at(fields, 12))) * 10
  end

  # Compiles (and runs once) the step for `inputs`; returns {start, stop} in µs.
  def compile({params, x, y}) do
    start = System.monotonic_time(:microsecond)
    {_params, loss} = EXLA.jit(&CompilerBench.MLP.step/3, cache: false).(params, x, y)
    Nx.to_number(loss)
    {start, System.monotonic_time(:microsecond)}
  end
end

alias ConcurrentCompileBench, as: B

{params, x, y} = CompilerBench.MLP.pattern_inputs(EXLA.Backend)
a = {params, x, y}
b = {params, Nx.slice(x, [0, 0], [64, 784]), Nx.slice(y, [0, 0], [64, 10])}
rounds = String.to_integer(System.get_env("BENCH_ROUNDS", "7"))

# Warm-up: the first compile of a process costs more.
B.compile(a)
B.compile(b)

measure = fn mode ->
  cpu = B.cpu_ms()
  start = System.monotonic_time(:microsecond)

  overlap =
    case mode do
      :sequential ->
        B.compile(a)
        B.compile(b)
        0

      :concurrent ->
        [{s1, e1}, {s2, e2}] =
          [a, b] |> Enum.map(&Task.async(fn -> B.compile(&1) end)) |> Task.await_many(:infinity)

        max(min(e1, e2) - max(s1, s2), 0)
    end

  {System.monotonic_time(:microsecond) - start, B.cpu_ms() - cpu, overlap}
end

results =
  for round <- 1..rounds,
      mode <-
        if(rem(round, 2) == 0, do: [:sequential, :concurrent], else: [:concurrent, :sequential]),
      reduce: %{} do
    acc -> Map.update(acc, mode, [measure.(mode)], &[measure.(mode) | &1])
  end

ms = fn us -> Float.round(us / 1000, 1) end

IO.puts("""
Two different MLP steps (batch 128 and 64) compiled by EXLA.jit, median of #{rounds} rounds
(#{System.schedulers_online()} schedulers, #{:erlang.system_info(:logical_processors_available)} cores available)
""")

for mode <- [:sequential, :concurrent] do
  rows = results[mode]
  wall = BenchTiming.median(Enum.map(rows, &elem(&1, 0)))
  cpu = BenchTiming.median(Enum.map(rows, &elem(&1, 1)))
  overlap = BenchTiming.median(Enum.map(rows, &elem(&1, 2)))
  extra = if mode == :concurrent, do: "   compiles overlapping for #{ms.(overlap)} ms", else: ""

  IO.puts(
    "  #{String.pad_trailing(to_string(mode), 12)} wall #{ms.(wall)} ms   CPU #{cpu} ms#{extra}"
  )
end

seq = BenchTiming.median(Enum.map(results.sequential, &elem(&1, 0)))
con = BenchTiming.median(Enum.map(results.concurrent, &elem(&1, 0)))
IO.puts("\n  concurrent / sequential wall: #{Float.round(con / seq, 2)}")
