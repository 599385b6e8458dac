# The native core's overhead, measured in one run:
#
#   * executing `add` on f32[3] resident on the device and waiting for the
#     result, through the NIF (and through EXLA.Executable.run), against the
#     same through the Rust bindings alone (native/pjrt/examples/execute_bench.rs);
#   * host<->device bandwidth for 256 MiB, against memcpy.
#
# Run with: mix run bench/native_bench.exs
alias EXLA.{DeviceBuffer, Executable, NIF, Shape}

defmodule NativeBench do
  def stats(fun, iterations, warmup \\ 2_000) do
    for _ <- 1..warmup, do: fun.()

    times =
      for _ <- 1..iterations do
        start = System.monotonic_time(:nanosecond)
        fun.()
        System.monotonic_time(:nanosecond) - start
      end
      |> Enum.sort()

    %{median: pick(times, 0.5) / 1000, p99: pick(times, 0.99) / 1000}
  end

  defp pick(sorted, p), do: Enum.at(sorted, round((length(sorted) - 1) * p))

  def gbps(bytes, fun) do
    best = Enum.min(for _ <- 1..3, do: elem(:timer.tc(fun), 0))
    bytes / best / 1000
  end
end

iterations = 20_000
client = EXLA.Client.fetch!(:host)

rust =
  case System.cmd(
         "cargo",
         ~w(run --quiet --release --example execute_bench --) ++
           [client.plugin_path, Integer.to_string(iterations)],
         stderr_to_stdout: true
       ) do
    {out, 0} ->
      out
      |> String.split("\n", trim: true)
      |> List.last()
      |> String.split()
      |> Map.new(fn pair ->
        [k, v] = String.split(pair, "=")
        {k, String.to_float(v)}
      end)

    {out, _} ->
      raise "the Rust benchmark failed:\n#{out}"
  end

mlir = """
module {
  func.func public @main(%a: tensor<3xf32>, %b: tensor<3xf32>) -> tensor<3xf32> {
    %0 = stablehlo.add %a, %b : tensor<3xf32>
    return %0 : tensor<3xf32>
  }
}
"""

exe = Executable.compile(client, mlir)
shape = Shape.make_shape({:f, 32}, {3})

a =
  DeviceBuffer.place_on_device(
    <<1.0::float-32-native, 2.0::float-32-native, 3.0::float-32-native>>,
    shape,
    client,
    0
  )

nif =
  NativeBench.stats(
    fn ->
      [out] = NIF.executable_run(exe.ref, [a.ref, a.ref], []) |> NIF.unwrap!()
      NIF.unwrap!(NIF.buffer_ready(out)) || NIF.unwrap!(NIF.buffer_await([out]))
    end,
    iterations
  )

api =
  NativeBench.stats(
    fn ->
      [[out]] = Executable.run(exe, [[a, a]])
      DeviceBuffer.await([out])
    end,
    iterations
  )

size = 256 * 1024 * 1024
data = :binary.copy(<<1, 2, 3, 4, 5, 6, 7, 8>>, div(size, 8))
big = Shape.make_shape({:u, 8}, {size})
buffer = DeviceBuffer.place_on_device(data, big, client, 0)
DeviceBuffer.await([buffer])

h2d =
  NativeBench.gbps(size, fn ->
    b = DeviceBuffer.place_on_device(data, big, client, 0)
    DeviceBuffer.await([b])
  end)

d2h = NativeBench.gbps(size, fn -> DeviceBuffer.read(buffer) end)

fmt = fn x -> :erlang.float_to_binary(x / 1, decimals: 2) end

IO.puts("""
execute f32[3] add + wait (µs)      median    p99
  Rust bindings alone             #{fmt.(rust["execute_median_us"])}   #{fmt.(rust["execute_p99_us"])}
  NIF (EXLA.NIF)                  #{fmt.(nif.median)}   #{fmt.(nif.p99)}
  EXLA.Executable.run + await     #{fmt.(api.median)}   #{fmt.(api.p99)}
  ratio NIF / Rust                #{fmt.(nif.median / rust["execute_median_us"])}   #{fmt.(nif.p99 / rust["execute_p99_us"])}

bandwidth, 256 MiB (GB/s)
  host -> device: NIF #{fmt.(h2d)}   Rust #{fmt.(rust["h2d_gbps"])}
  device -> host: NIF #{fmt.(d2h)}   Rust #{fmt.(rust["d2h_gbps"])}
  memcpy (Rust, pre-faulted):  #{fmt.(rust["memcpy_gbps"])}
  ratio NIF d2h / memcpy: #{fmt.(d2h / rust["memcpy_gbps"])}   NIF h2d / Rust h2d: #{fmt.(h2d / rust["h2d_gbps"])}
""")
