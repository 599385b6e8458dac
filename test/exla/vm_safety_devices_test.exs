defmodule EXLA.VMSafetyDevicesTest do
  # Runs on several devices raced by deallocation, which once froze them
  # until XLA aborted the VM (issue 9; see also EXLA.VMSafetyTest).
  # Uses a client of its own, with two devices (changes :clients).
  use ExUnit.Case, async: false

  alias EXLA.{DeviceBuffer, Executable, Shape}

  @client :vm_safety_devices_test
  @deleted ~r/called on deleted or donated buffer/

  setup_all do
    EXLA.TestClients.add(@client, platform: :host, device_count: 2)
  end

  # An argument deleted between the liveness check of a run on two
  # devices and its launch started the other device's part, which waited
  # in its all-reduce for the missing one until XLA aborted the VM (40 s
  # later; the first hang came within 700 rounds). Deletion now waits for
  # the launch: each run either refuses the deleted argument or computes.
  test "deallocating an argument while a two-device run with a collective launches" do
    two = EXLA.Client.fetch!(@client)

    mlir = """
    module {
      func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
        %0 = "stablehlo.all_reduce"(%arg0) ({
        ^bb0(%a: tensor<f32>, %b: tensor<f32>):
          %s = "stablehlo.add"(%a, %b) : (tensor<f32>, tensor<f32>) -> tensor<f32>
          "stablehlo.return"(%s) : (tensor<f32>) -> ()
        }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<4xf32>) -> tensor<4xf32>
        "func.return"(%0) : (tensor<4xf32>) -> ()
      }
    }
    """

    exe = Executable.compile(two, mlir, num_replicas: 2)
    shape = Shape.make_shape({:f, 32}, {4})
    data = for x <- [1.0, 2.0, 3.0, 4.0], into: <<>>, do: <<x::float-32-native>>
    sum = for x <- [2.0, 4.0, 6.0, 8.0], into: <<>>, do: <<x::float-32-native>>

    outcomes =
      for round <- 1..10_000, reduce: %{} do
        outcomes ->
          args = for device <- [0, 1], do: DeviceBuffer.place_on_device(data, shape, two, device)

          # A varying delay puts the deletion before, during or after the launch.
          spin = rem(round * 7919, 20_000)
          spawn(fn -> Enum.each(1..spin, & &1) && DeviceBuffer.deallocate(List.last(args)) end)
          run = Task.async(fn -> run_both(exe, args) end)
          outcome = Task.yield(run, 10_000) || flunk("a run hung in round #{round}")
          Map.update(outcomes, outcome, 1, &(&1 + 1))
      end

    # Both outcomes happen: the deletions do land around the launches.
    assert Enum.sort(Map.keys(outcomes)) == [{:ok, :deleted}, {:ok, [sum, sum]}]
  end

  defp run_both(exe, args) do
    [[out0], [out1]] = Executable.run(exe, Enum.map(args, &[&1]))
    [DeviceBuffer.read(out0), DeviceBuffer.read(out1)]
  rescue
    error in RuntimeError ->
      assert Exception.message(error) =~ @deleted
      :deleted
  end
end
