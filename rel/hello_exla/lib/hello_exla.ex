defmodule HelloExla do
  @moduledoc """
  Runs one program on EXLA's default client and prints what it ran on:

      bin/hello_exla eval "HelloExla.main()"

  The default client is the first of `:cuda, :rocm, :tpu, :host` whose
  plugin and devices are found (see `EXLA.Client`).
  """

  import Nx.Defn

  defn(gram_sum(x), do: Nx.sum(Nx.dot(x, Nx.transpose(x))))

  def main do
    {:ok, _} = Application.ensure_all_started(:exla)
    client = EXLA.Client.fetch!(EXLA.Client.default_name())
    x = Nx.iota({3, 3}, type: :f32)
    sum = EXLA.jit(&gram_sum/1).(x)

    IO.puts(
      "client #{client.name}: #{client.platform_name} #{client.platform_version}, " <>
        "#{client.device_count} device(s)"
    )

    IO.puts("sum of x . transpose(x) for x = iota({3, 3}): #{Nx.to_number(sum)}")
  end
end
