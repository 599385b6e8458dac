defmodule EXLA.AutomaticTransfersTest do
  # The :automatic_transfers client option, as EXLA has it since 0.6.4:
  # whether a client's tensors are copied to other devices implicitly, and
  # where EXLA.Backend's operations on tensors of several devices run.
  use ExUnit.Case, async: true

  # Host clients of two devices each: one with the default (true for the
  # host), one without transfers.
  @auto :automatic_transfers_auto
  @manual :automatic_transfers_manual

  setup_all do
    EXLA.TestClients.add(@auto, platform: :host, device_count: 2)
    EXLA.TestClients.add(@manual, platform: :host, device_count: 2, automatic_transfers: false)
  end

  defp on(values, client, device_id),
    do:
      Nx.tensor(values, type: :f32, backend: {EXLA.Backend, client: client, device_id: device_id})

  defp place(%Nx.Tensor{data: %EXLA.Backend{buffer: buffer}}),
    do: {buffer.client_name, buffer.device_id}

  test "defaults to true for :host clients, and is validated" do
    assert EXLA.Client.fetch!(@auto).automatic_transfers == true
    assert EXLA.Client.fetch!(@manual).automatic_transfers == false

    name = :"automatic_transfers_bad_#{System.unique_integer([:positive])}"
    EXLA.TestClients.add(name, platform: :host, automatic_transfers: :yes)

    assert %ArgumentError{message: message} =
             EXLA.TestClients.creation_error(fn -> EXLA.Client.fetch!(name) end)

    assert message =~
             "invalid :automatic_transfers for EXLA client #{inspect(name)}: " <>
               "expected a boolean, got: :yes"
  end

  test "defaults to false for other platforms" do
    cpu = EXLA.Client.fetch!(:host)
    name = :"automatic_transfers_plugin_#{System.unique_integer([:positive])}"

    EXLA.TestClients.add(name,
      platform: :pjrt_plugin,
      device_type: "cpu",
      plugin_path: cpu.plugin_path
    )

    assert EXLA.Client.fetch!(name).automatic_transfers == false
  end

  describe "a jitted function" do
    test "copies an input of a client with automatic transfers" do
      x = on([1.0, 2.0], @auto, 1)
      y = EXLA.jit(&Nx.multiply(&1, 10), client: @manual, device_id: 0).(x)
      assert Nx.to_flat_list(y) == [10.0, 20.0]
      assert place(y) == {@manual, 0}
    end

    test "raises, with EXLA's words, for an input of a client without them" do
      x = on([1.0, 2.0], @manual, 0)

      for {client, device_id} <- [{@manual, 1}, {@auto, 0}] do
        error =
          assert_raise ArgumentError, fn ->
            EXLA.jit(&Nx.multiply(&1, 10), client: client, device_id: device_id).(x)
          end

        assert error.message =~
                 "EXLA computation (defn) is allocated on client #{client} ##{device_id} " <>
                   "(host) but one of the input tensors are allocated on #{@manual} #0 (host)."
      end

      # Where it is, or moved there explicitly, it runs.
      assert Nx.to_flat_list(EXLA.jit(&Nx.negate/1, client: @manual, device_id: 0).(x)) ==
               [-1.0, -2.0]

      moved = Nx.backend_copy(x, {EXLA.Backend, client: @manual, device_id: 1})
      y = EXLA.jit(&Nx.negate/1, client: @manual, device_id: 1).(moved)
      assert Nx.to_flat_list(y) == [-1.0, -2.0]
    end
  end

  describe "EXLA.Backend" do
    test "runs where the last tensor off a transferring client's default device is" do
      a = on([1.0], @auto, 0)
      b = on([2.0], @auto, 1)

      # @auto's device 0 is its default: device 1 wins, in either order.
      assert place(Nx.add(a, b)) == {@auto, 1}
      assert place(Nx.add(b, a)) == {@auto, 1}
      assert Nx.to_flat_list(Nx.add(b, a)) == [3.0]

      # A client without transfers wins over a transferring client's default
      # device, and takes its tensor.
      c = on([4.0], @manual, 0)
      sum = Nx.add(c, a)
      assert place(sum) == {@manual, 0}
      assert Nx.to_flat_list(sum) == [5.0]
    end

    test "raises for a tensor of a client without transfers on another device" do
      a = on([1.0], @manual, 0)
      b = on([2.0], @manual, 1)

      # The last one's device is chosen: the first would have to move.
      assert_raise ArgumentError,
                   ~r/allocated on client #{@manual} #1 .* on #{@manual} #0/s,
                   fn ->
                     Nx.add(a, b)
                   end

      assert_raise ArgumentError,
                   ~r/allocated on client #{@manual} #0 .* on #{@manual} #1/s,
                   fn ->
                     Nx.add(b, a)
                   end
    end

    # EXLA 0.12 and later gather them whatever the clients say; EXLA 0.7.2
    # runs concatenate as any other op.
    @tag nx: :stack?
    test "concatenate and stack end where the last tensor is, on any client" do
      a = on([1.0], @manual, 0)
      b = on([2.0], @manual, 1)

      for {first, second, device_id} <- [{a, b, 1}, {b, a, 0}] do
        stacked = Nx.stack([first, second])
        joined = Nx.concatenate([first, second])
        assert place(stacked) == {@manual, device_id}
        assert place(joined) == {@manual, device_id}
        assert Nx.to_flat_list(joined) == Nx.to_flat_list(first) ++ Nx.to_flat_list(second)
        assert Nx.to_flat_list(stacked) == Nx.to_flat_list(joined)
      end

      # Tensors not on a device join them there.
      mixed = Nx.concatenate([a, Nx.tensor([3.0], backend: Nx.BinaryBackend), b])
      assert place(mixed) == {@manual, 1}
      assert Nx.to_flat_list(mixed) == [1.0, 3.0, 2.0]
    end

    @tag nx: :v0_7
    test "on Nx 0.7, concatenate raises as other ops do" do
      a = on([1.0], @manual, 0)
      b = on([2.0], @manual, 1)

      assert_raise ArgumentError, ~r/EXLA computation \(defn\) is allocated on client/, fn ->
        Nx.concatenate([a, b])
      end
    end
  end
end
