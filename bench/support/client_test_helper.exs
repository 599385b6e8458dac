# The test_helper.exs that bench/scholar_bench.exs installs in a client
# library's checkout (Scholar's), so that one `mix test` runs the suite
# either under EXLA or under Nx's reference implementation, and reports
# what EXLA's compiles cost.
#
# Environment (set by the bench):
#
#   * EXLA_BENCH_MODE - `exla` (EXLA.Backend and `compiler: EXLA` as the
#     defaults) or `reference` (Nx.BinaryBackend and Nx.Defn.Evaluator);
#   * EXLA_BENCH_CACHE - `off` (no disk compile cache) or a directory for it;
#   * EXLA_BENCH_OUT - a file that receives, after the suite, the suite's
#     wall time and the sums of the `[:exla, :compilation, :details]` measurements per
#     kind of program (and, for the eager operations XLA compiled, per
#     operation), as an Erlang term.
#
# And, from the caller's environment: EXLA_BENCH_RUN_CHECKS=false (the
# `:stop_abandoned_runs` configuration off, to measure what the loops' run
# checks cost in compile time), and XLA_FLAGS as for any VM.
Application.ensure_all_started(:exla)

defmodule ClientBench.Collector do
  @moduledoc false
  # Sums the measurements of every [:exla, :compilation, :details] event, per kind
  # of program and disk-cache status, in an ETS table (tests run
  # concurrently).
  @table __MODULE__

  def start do
    :ets.new(@table, [:named_table, :public, :set, write_concurrency: true])
    :telemetry.attach("client-bench", [:exla, :compilation, :details], &__MODULE__.handle/4, nil)
  end

  def handle(_event, measurements, metadata, _config) do
    group = {Map.get(metadata, :kind, :jit), Map.get(metadata, :disk_cache, :off)}
    add(group, :count, 1)

    for {name, value} <- measurements, is_integer(value) do
      add(group, name, value)
    end

    # An eager operation's key is its name: its compiles are also summed
    # per operation.
    if group == {:backend, :off} or group == {:backend, :miss} do
      add({:op, metadata.key}, :count, 1)
      add({:op, metadata.key}, :xla_compile_time, measurements[:xla_compile_time] || 0)
    end
  end

  defp add(group, name, value) do
    :ets.update_counter(@table, {group, name}, value, {{group, name}, 0})
  end

  # The sums per kind and disk-cache status.
  def totals, do: Map.reject(sums(), &match?({{:op, _}, _}, &1))

  # The sums per eager operation compiled by XLA, as `%{op => sums}`.
  def ops, do: for({{:op, op}, sums} <- sums(), into: %{}, do: {op, sums})

  defp sums do
    @table
    |> :ets.tab2list()
    |> Enum.group_by(fn {{group, _name}, _} -> group end, fn {{_, name}, v} -> {name, v} end)
    |> Map.new(fn {group, pairs} -> {group, Map.new(pairs)} end)
  end
end

mode = System.get_env("EXLA_BENCH_MODE", "exla")

case mode do
  "exla" ->
    Nx.global_default_backend(EXLA.Backend)
    Nx.Defn.global_default_options(compiler: EXLA)

  "reference" ->
    :ok
end

case System.get_env("EXLA_BENCH_CACHE", "off") do
  "off" -> Application.put_env(:exla, :cache_dir, false)
  dir -> Application.put_env(:exla, :cache_dir, dir)
end

if System.get_env("EXLA_BENCH_RUN_CHECKS") == "false",
  do: Application.put_env(:exla, :stop_abandoned_runs, false)

ClientBench.Collector.start()
started = System.monotonic_time(:microsecond)

ExUnit.after_suite(fn _result ->
  wall = System.monotonic_time(:microsecond) - started

  if out = System.get_env("EXLA_BENCH_OUT") do
    report = %{
      mode: mode,
      wall_us: wall,
      compiles: ClientBench.Collector.totals(),
      ops: ClientBench.Collector.ops()
    }

    File.write!(out, :erlang.term_to_binary(report))
  end
end)

ExUnit.start()
