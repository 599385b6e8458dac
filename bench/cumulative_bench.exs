# Cumulative ops on the CPU plugin: one window reduction along the axis
# (the lowering JAX gives cumsum/cummax on CPU and GPU) against Nx's default
# implementation of the block (an associative scan: log2(n) levels of
# slices, pads and concatenates), which is what EXLA compiles for
# `Nx.cumulative_*` on Nx 0.12/0.13. Both compiled by EXLA, in one run.
#
#     NX_PATH=path/to/nx-0.13/nx MIX_ENV=prod mix run bench/cumulative_bench.exs
#
# (`CUMULATIVE_SIZES=2,8,64` picks the axis sizes.) The window reduction is
# written as `Nx.window_sum/3` or `Nx.window_max/3` with a window spanning
# the axis and padding n - 1 before it: one `stablehlo.reduce_window`, the
# same one a native lowering of the block would emit. Each shape has about
# 64K elements (but at least the axis): `{n}`, `{64K / n, n}` along the last
# axis and `{n, 64K / n}` along the first. A row prints the median time of
# one call (waiting for its result) over interleaved rounds, the ratio
# window / default, and each side's first call (compile, disk cache off).
Code.require_file("support/timing.exs", __DIR__)

defmodule CumulativeBench do
  @rounds 5
  @elements 65_536

  def run do
    IO.puts(
      "op    shape            axis  window (µs)  default (µs)  window/default  compile window/default (ms)"
    )

    for op <- [:cumulative_sum, :cumulative_max],
        n <- sizes(),
        {shape, axis} <- shapes(n) do
      row(op, shape, axis)
    end
  end

  # Axis sizes: CUMULATIVE_SIZES="8,64" or the default list.
  defp sizes do
    case System.get_env("CUMULATIVE_SIZES") do
      nil -> [8, 64, 512, 4096, 32768]
      list -> list |> String.split(",") |> Enum.map(&String.to_integer/1)
    end
  end

  defp shapes(n) do
    other = max(div(@elements, n), 1)
    Enum.uniq([{{n}, 0}, {{other, n}, 1}, {{n, other}, 0}])
  end

  defp row(op, shape, axis) do
    x = Nx.iota(shape, type: :f32) |> Nx.divide(Nx.size(shape))
    x = Nx.backend_transfer(x, EXLA.Backend)
    native = EXLA.jit(fn x -> window(op, x, axis) end)
    default = EXLA.jit(fn x -> apply(Nx, op, [x, [axis: axis]]) end)

    {native_compile, _} = :timer.tc(fn -> wait(native.(x)) end)
    {default_compile, _} = :timer.tc(fn -> wait(default.(x)) end)
    same!(native.(x), default.(x), op, shape, axis)
    iterations = iterations(fn -> wait(default.(x)) end)

    {n_times, d_times} =
      for _ <- 1..@rounds, reduce: {[], []} do
        {ns, ds} ->
          {[per_call(fn -> wait(native.(x)) end, iterations) | ns],
           [per_call(fn -> wait(default.(x)) end, iterations) | ds]}
      end

    {nt, dt} = {BenchTiming.median(n_times), BenchTiming.median(d_times)}

    IO.puts(
      String.pad_trailing(to_string(op) |> String.replace("cumulative_", ""), 6) <>
        String.pad_trailing(inspect(shape), 17) <>
        String.pad_trailing(to_string(axis), 6) <>
        fmt(nt, 11) <>
        fmt(dt, 14) <>
        fmt(nt / dt, 16) <>
        "  " <> fmt(native_compile / 1000, 7) <> " /" <> fmt(default_compile / 1000, 7)
    )
  end

  # Both sides compute the same op (f32 sums in other orders: rtol 1e-3).
  defp same!(native, default, op, shape, axis) do
    unless Nx.to_number(Nx.all_close(native, default, rtol: 1.0e-3)) == 1 do
      raise "the window reduction and the default differ: #{op} of #{inspect(shape)} on #{axis}"
    end
  end

  # The cumulative op as one window reduction: each window ends at its
  # element and spans the axis, padded with the op's identity.
  defp window(op, x, axis) do
    n = Nx.axis_size(x, axis)
    rank = Nx.rank(x)
    window = put_elem(Tuple.duplicate(1, rank), axis, n)
    padding = List.replace_at(List.duplicate({0, 0}, rank), axis, {n - 1, 0})
    fun = if op == :cumulative_sum, do: &Nx.window_sum/3, else: &Nx.window_max/3
    fun.(x, window, padding: padding)
  end

  defp iterations(fun) do
    {us, _} = :timer.tc(fun)
    min(max(div(100_000, max(us, 1)), 3), 2_000)
  end

  defp per_call(fun, iterations) do
    {us, _} = :timer.tc(fn -> for _ <- 1..iterations, do: fun.() end)
    us / iterations
  end

  defp wait(%Nx.Tensor{data: %EXLA.Backend{buffer: b}}), do: EXLA.DeviceBuffer.await([b])

  defp fmt(value, width),
    do: String.pad_leading(:erlang.float_to_binary(value / 1, decimals: 2), width)
end

# Compile times without the disk cache (a program compiled by an earlier
# run would load in milliseconds).
Application.put_env(:exla, :cache_dir, false)
CumulativeBench.run()
