# What EXLA.Backend's per-shape programs cost the cache: the time to
# compile and cache the N-th new shape, and the memory held after N shapes.
#
#     MIX_ENV=prod mix run bench/cache_bench.exs [N]   # N defaults to 10_000
#
# Each new shape is `Nx.negate/1` of an f32[n] tensor, n = 1..N: one tiny
# program each. For each call, the `[:exla, :compilation]` event gives the
# time spent evaluating and compiling; the rest of the call (the `rest`
# column) is the cache's work plus one run, which is where a cache whose
# every insert copies a growing table shows. Numbers are medians over
# windows of 100 shapes.
Code.require_file("support/timing.exs", __DIR__)

defmodule CacheBench do
  @window 100

  def run(count) do
    :telemetry.attach("cache-bench", [:exla, :compilation], &__MODULE__.compiled/4, nil)

    checkpoints =
      Enum.uniq(Enum.filter([@window, 1_000, 5_000, 10_000], &(&1 < count)) ++ [count])

    start_rss = rss_kib()

    IO.puts(
      String.pad_trailing("shapes", 16) <>
        Enum.map_join(
          ["call µs", "compile µs", "rest µs", "RSS MiB"],
          &String.pad_leading(&1, 14)
        )
    )

    Enum.reduce(1..count, [], fn n, window ->
      window = Enum.take([new_shape(n) | window], @window)
      if n in checkpoints, do: report(n, window)
      window
    end)

    :erlang.garbage_collect()
    Process.sleep(100)
    memory(count, start_rss)
  end

  def compiled(_event, %{total_time: us}, _metadata, _config), do: Process.put(:compile_us, us)

  defp new_shape(n) do
    t = Nx.from_binary(:binary.copy(<<1.0::float-32-native>>, n), :f32, backend: EXLA.Backend)
    Process.delete(:compile_us)
    {us, out} = :timer.tc(fn -> Nx.negate(t) end)
    Nx.backend_deallocate(out)
    Nx.backend_deallocate(t)
    compile = Process.get(:compile_us) || raise "shape #{n} was not compiled"
    {us, compile, us - compile}
  end

  defp report(n, window) do
    columns = [
      BenchTiming.median(Enum.map(window, &elem(&1, 0))),
      BenchTiming.median(Enum.map(window, &elem(&1, 1))),
      BenchTiming.median(Enum.map(window, &elem(&1, 2))),
      div(rss_kib(), 1024)
    ]

    label = "#{n - length(window) + 1}..#{n}"
    IO.puts(String.pad_trailing(label, 16) <> Enum.map_join(columns, &pad/1))
  end

  defp memory(count, start_rss) do
    pt = :persistent_term.info()
    cache = EXLA.LockedCache

    # EXLA.Backend's programs: pinned ones are among the :persistent_term
    # terms, evictable ones in ETS (caches without that split keep all of
    # them in :persistent_term).
    {pinned, entries, ets_words} =
      if :ets.whereis(cache) != :undefined do
        {:sys.get_state(cache).pinned, :ets.info(cache, :size), :ets.info(cache, :memory)}
      else
        {"all", 0, 0}
      end

    word = :erlang.system_info(:wordsize)

    IO.puts("""

    after #{count} shapes:
      :persistent_term                      #{pt.count} terms, #{kib(pt.memory)} KiB (EXLA.Backend programs pinned there: #{pinned})
      EXLA.Backend programs in ETS          #{entries} entries, #{kib(ets_words * word)} KiB
      BEAM memory (total)                   #{kib(:erlang.memory(:total))} KiB
      process RSS growth                    #{rss_kib() - start_rss} KiB (native programs included)
    """)
  end

  defp pad(us), do: String.pad_leading(Integer.to_string(us), 14)
  defp kib(bytes), do: div(bytes, 1024)

  defp rss_kib do
    "/proc/self/status"
    |> File.read!()
    |> String.split("\n")
    |> Enum.find_value(fn line ->
      case String.split(line) do
        ["VmRSS:", kib, "kB"] -> String.to_integer(kib)
        _ -> nil
      end
    end)
  end
end

CacheBench.run(String.to_integer(List.first(System.argv(), "10000")))
