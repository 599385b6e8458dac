# Host-callback costs against a plain cached jit call, in one run.
#
#   NX_PATH=... EXLA_PJRT_PLUGIN_HOST=... MIX_ENV=test mix run bench/stream_bench.exs
#
# Prints microseconds per operation and the ratio to a plain cached call of
# the same function: one stream chunk round trip (send + recv) and one call
# of a function with an active hook.
defmodule StreamBench do
  import Nx.Defn

  defn step(x, acc), do: {acc, x + acc}
  defn plain(x, acc), do: x + acc
  defn hooked(x, acc), do: hook(x + acc, :h)

  def time(n, fun) do
    for _ <- 1..div(n, 10), do: fun.()
    {us, _} = :timer.tc(fn -> for _ <- 1..n, do: fun.() end)
    us / n
  end

  def run(n) do
    x = Nx.tensor([1.0, 2.0, 3.0])
    acc = Nx.tensor([0.0, 0.0, 0.0])
    plain = EXLA.jit(&plain/2)
    hooked = EXLA.jit(&hooked/2, hooks: %{h: fn _ -> :ok end})
    stream = EXLA.stream(&step/2, [x, acc])

    plain_us = time(n, fn -> plain.(x, acc) end)
    hooked_us = time(n, fn -> hooked.(x, acc) end)
    stream_us = time(n, fn -> Nx.Stream.send(stream, x) && Nx.Stream.recv(stream) end)
    Nx.Stream.done(stream)

    IO.puts("iterations per case: #{n}")
    IO.puts("plain cached jit call:       #{Float.round(plain_us, 2)} us (1.00x)")

    IO.puts(
      "hooked jit call:             #{Float.round(hooked_us, 2)} us (#{ratio(hooked_us, plain_us)}x)"
    )

    IO.puts(
      "stream round trip send+recv: #{Float.round(stream_us, 2)} us (#{ratio(stream_us, plain_us)}x)"
    )
  end

  defp ratio(a, b), do: Float.round(a / b, 2)
end

StreamBench.run(String.to_integer(System.get_env("N", "20000")))
