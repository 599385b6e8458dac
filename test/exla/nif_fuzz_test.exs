defmodule EXLA.NIFFuzzTest do
  # Drives every NIF with random, mostly malformed, arguments. Each call must
  # return or raise; none may crash the VM.
  use ExUnit.Case, async: true

  import Bitwise

  alias EXLA.{DeviceBuffer, Executable, NIF, Shape}

  @cases 4000

  @add """
  module {
    func.func public @main(%a: tensor<3xf32>, %b: tensor<3xf32>) -> tensor<3xf32> {
      %0 = stablehlo.add %a, %b : tensor<3xf32>
      return %0 : tensor<3xf32>
    }
  }
  """

  @functions [
    client_create: 3,
    client_info: 1,
    plugin_xla_options: 1,
    plugin_flag_names: 1,
    buffer_from_binary: 5,
    buffer_from_binary_dirty: 5,
    buffer_read: 2,
    buffer_read_dirty: 2,
    buffer_delete: 1,
    buffer_ready: 1,
    buffer_await: 1,
    buffer_copy_to_device: 2,
    executable_compile: 8,
    executable_output_shapes: 1,
    executable_run: 3,
    executable_run_dirty: 3,
    executable_run_async: 4,
    executable_serialize: 2,
    executable_deserialize: 5
  ]

  test "random arguments never crash the VM" do
    client = EXLA.Client.fetch!(:host)
    exe = Executable.compile(client, @add)
    shape = Shape.make_shape({:f, 32}, {3})
    buffer = DeviceBuffer.place_on_device(<<0::96>>, shape, client, 0)
    plugin = NIF.unwrap!(NIF.plugin_load(client.plugin_path))
    pool = [plugin, client.ref, buffer.ref, exe.ref, make_ref(), @add, "", <<0::96>>]

    :rand.seed(:exsss, {1, 2, 3})

    outcomes =
      for _ <- 1..@cases do
        {name, arity} = Enum.random(@functions)
        args = for _ <- 1..arity, do: argument(pool)
        outcome(fn -> apply(NIF, name, args) end)
      end

    assert :raised in outcomes
    # The client, executable and buffer still work.
    fresh = DeviceBuffer.place_on_device(<<0::96>>, shape, client, 0)
    [[out]] = Executable.run(exe, [[fresh, fresh]])
    assert DeviceBuffer.read(out) == <<0::96>>
  end

  defp outcome(fun) do
    fun.()
    :returned
  rescue
    _ -> :raised
  end

  defp argument(pool) do
    case :rand.uniform(10) do
      n when n <= 4 ->
        Enum.random(pool)

      5 ->
        :rand.uniform(1 <<< 70) - (1 <<< 69)

      6 ->
        Enum.random([0, 1, 2, 3, -1, 11, 15, 16, 1024])

      7 ->
        :crypto.strong_rand_bytes(:rand.uniform(16))

      8 ->
        Enum.random([[], [1, 2], [-1], [1 <<< 40, 1 <<< 40], [{"cpu_device_count", {:int64, 2}}]])

      9 ->
        Enum.random([:ok, nil, 1.5, {:int64, 3}, %{}, {1, 2}, self(), [buffer_like()]])

      10 ->
        [Enum.random(pool), Enum.random(pool)]
    end
  end

  defp buffer_like, do: make_ref()
end
