defmodule EXLA.DeviceBufferTest do
  use ExUnit.Case, async: true

  alias EXLA.{DeviceBuffer, Shape}

  setup do
    {:ok, client: EXLA.Client.fetch!(:host)}
  end

  defp f32(values), do: for(v <- values, into: <<>>, do: <<v::float-32-native>>)

  test "places and reads data of every type", %{client: client} do
    for {type, data} <- [
          {{:u, 8}, <<1, 2, 255>>},
          {{:s, 16}, <<-2::16-native-signed, 7::16-native-signed, 0::16>>},
          {{:s, 64}, <<-1::64-native-signed, 2::64-native, 3::64-native>>},
          {{:f, 16}, <<0x3C00::16-native, 0xC000::16-native, 0::16>>},
          {{:bf, 16}, <<0x3F80::16-native, 0xC000::16-native, 0::16>>},
          {{:f, 64}, <<1.5::float-64-native, -2.0::float-64-native, 0.0::float-64-native>>},
          {{:c, 64}, f32([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])}
        ] do
      buffer = DeviceBuffer.place_on_device(data, Shape.make_shape(type, {3}), client, 0)
      assert DeviceBuffer.read(buffer) == data
      assert is_reference(buffer.ref)
    end
  end

  test "reads at most the given number of bytes", %{client: client} do
    buffer =
      DeviceBuffer.place_on_device(
        f32([1.0, 2.0, 3.0]),
        Shape.make_shape({:f, 32}, {3}),
        client,
        0
      )

    assert DeviceBuffer.read(buffer, 4) == f32([1.0])
    assert DeviceBuffer.read(buffer, 0) == ""
    assert DeviceBuffer.read(buffer, 1000) == f32([1.0, 2.0, 3.0])
  end

  test "transfers large buffers both ways", %{client: client} do
    data = :crypto.strong_rand_bytes(8 * 1024 * 1024)

    buffer =
      DeviceBuffer.place_on_device(data, Shape.make_shape({:u, 8}, {byte_size(data)}), client, 0)

    assert DeviceBuffer.read(buffer) == data
  end

  test "deallocate frees once, small and large buffers", %{client: client} do
    # 1 MiB and more are deleted on a dirty scheduler.
    for bytes <- [4, 48 * 1024 * 1024] do
      data = :binary.copy(<<7>>, bytes)
      shape = Shape.make_shape({:u, 8}, {bytes})
      buffer = DeviceBuffer.place_on_device(data, shape, client, 0)
      assert DeviceBuffer.deallocate(buffer) == :ok
      assert DeviceBuffer.deallocate(buffer) == :already_deallocated

      assert_raise RuntimeError, ~r/called on deleted or donated buffer/, fn ->
        DeviceBuffer.read(buffer)
      end
    end
  end

  @negate """
  module {
    func.func public @main(%x: tensor<f32>) -> tensor<f32> {
      %0 = stablehlo.negate %x : tensor<f32>
      return %0 : tensor<f32>
    }
  }
  """

  @tag cpu_only:
         "measures the VM's resident memory, which on a GPU host the CUDA driver and " <>
           "other tests' pinned staging buffers move by gigabytes"
  test "buffers and executables the VM drops are freed", %{client: client} do
    # Large buffers and executables are destroyed on the NIF's drop thread:
    # dropping 48 buffers of 32 MiB (1.5 GiB) one after the other must not
    # keep their memory.
    shape = Shape.make_shape({:u, 8}, {32 * 1024 * 1024})
    data = :binary.copy(<<1>>, 32 * 1024 * 1024)
    scalar = Shape.make_shape({:f, 32}, {})
    before = EXLA.TestMemory.rss_kb() * 1024

    for _ <- 1..48 do
      fresh = fn ->
        buffer = DeviceBuffer.place_on_device(data, shape, client, 0)
        exe = EXLA.Executable.compile(client, @negate)
        [[out]] = EXLA.Executable.run(exe, [[{f32([2.0]), scalar}]])
        assert DeviceBuffer.read(out) == f32([-2.0])
        DeviceBuffer.read(buffer, 1)
      end

      assert fresh.() == <<1>>
      :erlang.garbage_collect()
    end

    assert EXLA.TestMemory.rss_kb() * 1024 - before < 1024 * 1024 * 1024
  end

  test "copies to a device of the same client", %{client: client} do
    buffer = DeviceBuffer.place_on_device(f32([4.0]), Shape.make_shape({:f, 32}, {1}), client, 0)
    copy = DeviceBuffer.copy_to_device(buffer, client, 0)
    assert copy.ref != buffer.ref
    assert DeviceBuffer.read(copy) == f32([4.0])
  end

  test "rejects data of the wrong size", %{client: client} do
    assert_raise ArgumentError, ~r/expected 12 bytes/, fn ->
      DeviceBuffer.place_on_device(<<0, 0, 0, 0>>, Shape.make_shape({:f, 32}, {3}), client, 0)
    end
  end

  test "rejects non-binary data and unknown types", %{client: client} do
    assert_raise ArgumentError, ~r/expected a binary/, fn ->
      DeviceBuffer.place_on_device([1, 2, 3], Shape.make_shape({:u, 8}, {3}), client, 0)
    end

    assert_raise ArgumentError, ~r/unsupported type/, fn ->
      Shape.make_shape({:f, 128}, {3})
    end
  end

  test "rejects device ids out of range", %{client: client} do
    assert_raise ArgumentError, ~r/device id 7 is out of range/, fn ->
      DeviceBuffer.place_on_device(<<1>>, Shape.make_shape({:u, 8}, {1}), client, 7)
    end
  end
end
