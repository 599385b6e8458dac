defmodule EXLA.SmallTypesTest do
  # Sub-byte integers (s2, s4, u2, u4; Nx 0.12 and later) read back from
  # the device. The CPU plugin packs them in device memory (two s4 or four
  # s2 per byte) and gives them back a byte each; reads once copied the
  # unpacked size from the packed storage, past its end (a segfault for
  # tensors of megabytes).
  use ExUnit.Case, async: true

  @moduletag nx: :small_types?

  if EXLA.NxVersion.small_types?() do
    @n 4_000_000

    test "large tensors placed and computed read back as Nx packs them" do
      for {type, bits} <- [s2: 2, s4: 4, u2: 2, u4: 4] do
        data = :crypto.strong_rand_bytes(div(@n * bits, 8))
        t = Nx.from_binary(data, type, backend: EXLA.Backend)
        assert Nx.to_binary(t) == data, inspect(type)

        # Computed on the device; every bit flipped, as Nx packs them.
        flipped = :crypto.exor(data, :binary.copy(<<255>>, byte_size(data)))
        assert Nx.to_binary(Nx.bitwise_not(t)) == flipped, inspect(type)

        reference = Nx.from_binary(data, type)
        last = Nx.bitwise_not(t)[(@n - 5)..(@n - 1)]

        assert Nx.to_flat_list(last) ==
                 Nx.to_flat_list(Nx.bitwise_not(reference[(@n - 5)..(@n - 1)]))

        assert Nx.to_binary(t, limit: 7) == Nx.to_binary(reference, limit: 7)
      end
    end
  end
end
