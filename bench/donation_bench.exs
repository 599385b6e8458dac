# The MLP training loop (784-512-512-10, batch 128, f32, SGD; see
# support/mlp.exs) with and without donating the parameters (`donate: [0]`),
# measured in one run:
#
#   * steps per second, in interleaved rounds, reading the loss back after
#     every step (as a training loop that logs it does);
#   * the peak of the client's memory statistics over a loop of steps,
#     above what x, y and the starting parameters hold.
#
#     MIX_ENV=prod mix run bench/donation_bench.exs
#
# Without donation, each step allocates new parameters next to the old
# ones, which are freed only when the process's garbage collector finds
# them; with donation, the new parameters reuse the old ones' buffers.
#
# Environment: BENCH_ROUNDS (default 9), BENCH_STEPS (default 20).
#
# Measured on the 2-core shared machine (CPU plugin), five runs: donated /
# kept steps/s 0.993 to 1.088 (median 1.014; about 225 steps/s either
# way: the step is compute-bound and freed blocks are reused warm); peak
# above x, y and the parameters 7.66 MiB (3 copies of the parameters,
# waiting for garbage collection) kept, 16-20 bytes (the losses) donated.
Code.require_file("support/mlp.exs", __DIR__)
Code.require_file("support/timing.exs", __DIR__)

defmodule DonationBench do
  def loop(step, params, x, y, steps) do
    Enum.reduce(1..steps, params, fn _, params ->
      {params, loss} = step.(params, x, y)
      Nx.to_number(loss)
      params
    end)
  end

  # Steps per second of `steps` steps.
  def rate(step, params, x, y, steps) do
    {us, params} = :timer.tc(fn -> loop(step, params, x, y, steps) end)
    {steps / (us / 1.0e6), params}
  end

  # The most bytes held above `base` while running `steps` steps from
  # `params` (a copy, so the caller's parameters survive donation).
  def peak(step, params, x, y, steps, client) do
    params = Nx.backend_copy(params, EXLA.Backend)
    :erlang.garbage_collect()
    base = EXLA.Client.get_memory_statistics(client).allocated
    EXLA.Client.reset_peak_memory(client)
    params = loop(step, params, x, y, steps)
    stats = EXLA.Client.get_memory_statistics(client)
    Nx.backend_deallocate(params)
    stats.peak - base
  end
end

alias CompilerBench.MLP

rounds = String.to_integer(System.get_env("BENCH_ROUNDS", "9"))
steps = String.to_integer(System.get_env("BENCH_STEPS", "20"))
client = EXLA.Client.fetch!(EXLA.Client.default_name())

{params, x, y} = MLP.inputs(EXLA.Backend)

param_bytes =
  [params] |> Nx.Defn.Composite.flatten_list() |> Enum.map(&Nx.byte_size/1) |> Enum.sum()

variants = [keep: EXLA.jit(&MLP.step/3), donate: EXLA.jit(&MLP.step/3, donate: [0])]

# Compile and warm up both.
for {_, step} <- variants,
    do: DonationBench.loop(step, Nx.backend_copy(params, EXLA.Backend), x, y, 3)

rates =
  Enum.reduce(1..rounds, %{keep: [], donate: []}, fn _, acc ->
    Enum.reduce(variants, acc, fn {name, step}, acc ->
      {rate, last} = DonationBench.rate(step, Nx.backend_copy(params, EXLA.Backend), x, y, steps)
      Nx.backend_deallocate(last)
      Map.update!(acc, name, &[rate | &1])
    end)
  end)

peaks =
  Map.new(variants, fn {name, step} ->
    {name, DonationBench.peak(step, params, x, y, steps, client)}
  end)

mib = fn bytes -> :erlang.float_to_binary(bytes / 1_048_576, decimals: 2) end
[keep, donate] = Enum.map([:keep, :donate], &BenchTiming.median(rates[&1]))

IO.puts("""
MLP 784-512-512-10, batch 128, one SGD step, loss read back every step
parameters: #{mib.(param_bytes)} MiB; #{rounds} interleaved rounds of #{steps} steps

                         steps/s (median)   peak above x, y, parameters (#{steps} steps)
  parameters kept        #{String.pad_leading(:erlang.float_to_binary(keep, decimals: 1), 10)}         #{mib.(peaks.keep)} MiB (#{peaks.keep} bytes)
  parameters donated     #{String.pad_leading(:erlang.float_to_binary(donate, decimals: 1), 10)}         #{mib.(peaks.donate)} MiB (#{peaks.donate} bytes)

  donated / kept: steps/s #{:erlang.float_to_binary(donate / keep, decimals: 3)}, peak #{:erlang.float_to_binary(peaks.donate / peaks.keep, decimals: 3)}
""")
