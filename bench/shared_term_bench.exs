# What a jitted closure costs per call, by what it captures (see "What a
# function captures" in EXLA's docs and EXLA.SharedTerm).
#
#     ELIXIR_ERL_OPTIONS="+S 1" MIX_ENV=test mix run bench/shared_term_bench.exs
#
# Part one: a closure capturing a doubling chain (`depth` tuples in memory,
# 2^depth leaves as a tree), as issue 37 reported it: the first call (the
# evaluation, the key, the compilation), the second (a cached call), the
# evaluator's call, and the longest time the VM's one scheduler kept a
# ticker process waiting meanwhile (its CPU time between two ticks, 2 ms
# apart, which Linux updates about every 4 ms) and the longest wall time
# between two ticks (which also counts the time other programs had the
# CPU). DEPTHS (comma-separated, default 16,20,22,30,40,60) chooses the
# depths: a build without EXLA.SharedTerm never returns from depth 30 on.
#
# Part two: the wall time of a cached call of closures of the same code
# capturing lists of several sizes (one closure called again, and a new
# closure of equal value at each call), median of 7 rounds.
defmodule SharedTermBench do
  def doubling(depth), do: Enum.reduce(1..depth, :leaf, fn _, acc -> {acc, acc} end)

  def captures(captured), do: fn t -> if is_list(captured), do: Nx.add(t, 1), else: t end
  def shared(captured), do: fn t -> if is_tuple(captured), do: Nx.add(t, 1), else: t end

  # The CPU time of the VM's one normal scheduler thread, in microseconds.
  def scheduler_cpu do
    [stat] =
      for comm <- Path.wildcard("/proc/self/task/*/comm"),
          File.read!(comm) in ["1_scheduler\n", "erts_sched_1\n"],
          do: Path.join(Path.dirname(comm), "schedstat")

    fn -> stat |> File.read!() |> String.split() |> hd() |> String.to_integer() |> div(1000) end
  end

  def ticker(cpu) do
    spawn_link(fn -> tick(cpu, {cpu.(), now()}, {0, 0}) end)
  end

  defp now, do: System.monotonic_time(:microsecond)

  defp tick(cpu, {last_cpu, last_wall}, {stall, gap}) do
    receive do
      {:stop, from} -> send(from, {:stall, stall, gap})
    after
      2 ->
        {cpu_now, wall} = {cpu.(), now()}
        tick(cpu, {cpu_now, wall}, {max(stall, cpu_now - last_cpu), max(gap, wall - last_wall)})
    end
  end

  def stop(ticker) do
    send(ticker, {:stop, self()})
    receive do: ({:stall, stall, gap} -> {stall, gap})
  end

  def ms(us), do: :erlang.float_to_binary(us / 1000, decimals: 2)

  def per_call(fun, calls) do
    times =
      for _ <- 1..7 do
        {us, _} = :timer.tc(fn -> Enum.each(1..calls, fn _ -> fun.() end) end)
        us / calls
      end

    Enum.at(Enum.sort(times), 3)
  end
end

cpu = SharedTermBench.scheduler_cpu()
x = Nx.tensor([1.0, 2.0])
Nx.to_flat_list(EXLA.jit(&Nx.multiply(&1, 3)).(x))

depths =
  System.get_env("DEPTHS", "16,20,22,30,40,60")
  |> String.split(",", trim: true)
  |> Enum.map(&String.to_integer/1)

IO.puts("depth  evaluator  first call  second call  scheduler held  longest tick gap (ms)")

for depth <- depths do
  f = SharedTermBench.shared(SharedTermBench.doubling(depth))
  {eval, _} = :timer.tc(fn -> Nx.Defn.jit(f, compiler: Nx.Defn.Evaluator).(x) end)
  ticker = SharedTermBench.ticker(cpu)
  {first, _} = :timer.tc(fn -> EXLA.jit(f).(x) end)
  {second, _} = :timer.tc(fn -> EXLA.jit(f).(x) end)
  {stall, gap} = SharedTermBench.stop(ticker)
  times = Enum.map([eval, first, second, stall, gap], &SharedTermBench.ms/1)
  IO.puts(Enum.join([depth | times], "   "))
end

IO.puts("\ncached call of a closure capturing... (µs per call, median of 7 rounds)")
IO.puts("captured                      same closure   a new equal closure per call")

cases = [
  {"nothing", [], &SharedTermBench.captures/1, 2000},
  {"a list of 1,000 integers", Enum.to_list(1..1_000), &SharedTermBench.captures/1, 2000},
  {"a list of 100,000 integers", Enum.to_list(1..100_000), &SharedTermBench.captures/1, 20},
  {"a doubling chain of depth 20", SharedTermBench.doubling(20), &SharedTermBench.shared/1, 20}
]

for {name, captured, make, calls} <- cases do
  same = make.(captured)
  EXLA.jit(same).(x)
  one = SharedTermBench.per_call(fn -> EXLA.jit(same).(x) end, calls)
  # Closures equal to `same` (new terms of the same code, capturing the
  # same value), each called once.
  Process.put(:fresh, for(_ <- 1..(calls * 8), do: make.(captured)))

  next = fn ->
    [f | rest] = Process.get(:fresh)
    Process.put(:fresh, rest)
    EXLA.jit(f).(x)
  end

  many = SharedTermBench.per_call(next, calls)

  IO.puts(
    String.pad_trailing(name, 30) <>
      String.pad_leading(:erlang.float_to_binary(one, decimals: 1), 12) <>
      String.pad_leading(:erlang.float_to_binary(many, decimals: 1), 16)
  )
end
