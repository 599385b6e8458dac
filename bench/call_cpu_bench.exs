# CPU time of one cached call of a tiny program, on a busy machine.
#
#     ELIXIR_ERL_OPTIONS="+S 1 +sbwt none" MIX_ENV=prod mix run bench/call_cpu_bench.exs
#
# jit_bench.exs times calls by the wall clock, which other programs on a
# shared machine inflate whenever they preempt the VM. This script runs the
# VM with one normal scheduler that never spins, and reads that scheduler
# thread's CPU time from Linux's /proc/self/task/*/schedstat: time spent
# waiting for a CPU does not count. To compare two builds, run it in each,
# alternately, a few times. Linux only.
#
# Native diagnostics (EXLA.NativeLog): the two calls are measured at the
# default native log level (:warning), at :debug (the per-call event is a
# trace event, still disabled) and at :trace (every call emits an event,
# queued and forwarded; Logger, at :info meanwhile, discards it). For a
# build without any tracing calls (every event compiled out), build and run
# with the `no-tracing` cargo feature of the NIF:
#
#     EXLA_NIF_FEATURES=no-tracing ELIXIR_ERL_OPTIONS="+S 1 +sbwt none" \
#       MIX_ENV=prod mix run bench/call_cpu_bench.exs
#
# Measured on the 2-core shared machine, six runs of each build alternated,
# median of the runs' medians (µs of CPU time per call):
#
#                                    floor   cached jit
#     no-tracing build, :warning     3.62    4.90
#     default build,    :warning     3.82    5.02
#     no-tracing build, :debug       3.79    4.97
#     default build,    :debug       3.85    4.91
#     default build,    :trace       5.04    6.40   (an event per call)
#
# Between the first four the differences have no consistent sign and stay
# within the run-to-run spread (0.2-0.5 µs): a disabled event costs less
# than this benchmark can see. The commit before the memory ledger and the
# diagnostics (ac087a2), alternated with this one three times: floor 3.60
# vs 3.60, cached jit 4.86 vs 4.75.
Code.require_file("support/timing.exs", __DIR__)

defmodule CallCpuBench do
  @rounds 15
  @calls 5_000

  def scheduler_thread do
    Path.wildcard("/proc/self/task/*/comm")
    |> Enum.filter(&(File.read!(&1) =~ ~r/^\d+_scheduler\n$/))
    |> case do
      [comm] -> Path.dirname(comm)
      _ -> raise "run with ELIXIR_ERL_OPTIONS=\"+S 1 +sbwt none\" (one normal scheduler)"
    end
  end

  # The thread's time on a CPU, in nanoseconds.
  def cpu_ns(thread) do
    thread
    |> Path.join("schedstat")
    |> File.read!()
    |> String.split()
    |> hd()
    |> String.to_integer()
  end

  def measure(name, thread, fun) do
    BenchTiming.loop(fun, @calls)

    times =
      for _ <- 1..@rounds do
        start = cpu_ns(thread)
        BenchTiming.loop(fun, @calls)
        (cpu_ns(thread) - start) / @calls / 1000
      end
      |> Enum.sort()

    median = BenchTiming.median(times)
    min = hd(times)

    IO.puts(
      String.pad_trailing(name, 54) <>
        "median #{fmt(median)} µs   min #{fmt(min)} µs (CPU time per call)"
    )
  end

  defp fmt(x), do: :erlang.float_to_binary(x, decimals: 3)
end

thread = CallCpuBench.scheduler_thread()
{x, add, run_floor} = BenchTiming.add_floor()

jitted = EXLA.jit(add)

features = File.read!(Path.join(:code.priv_dir(:exla), "libexla.so.features"))
IO.puts("NIF features: #{inspect(features)}")

for level <- [:warning, :debug, :trace] do
  EXLA.NativeLog.put_level(level)
  if level == :trace, do: Logger.configure(level: :info)

  CallCpuBench.measure("EXLA.Executable.run + await (floor), native #{level}", thread, run_floor)

  CallCpuBench.measure("cached EXLA.jit(x + x) f32[3], native #{level}", thread, fn ->
    %Nx.Tensor{data: %EXLA.Backend{buffer: out}} = jitted.(x)
    EXLA.DeviceBuffer.await([out])
  end)
end

EXLA.NativeLog.flush()
