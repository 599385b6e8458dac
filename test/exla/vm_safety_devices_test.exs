defmodule EXLA.VMSafetyDevicesTest do
  # Runs on several devices raced by deallocation or by another client's
  # runs, which once froze them or made XLA abort the VM (issue 9; see also
  # EXLA.VMSafetyTest). Uses two clients of its own, with two devices each
  # (changes :clients).
  use ExUnit.Case, async: false

  alias EXLA.{DeviceBuffer, Executable, Shape}

  @client :vm_safety_devices_test
  @other :vm_safety_devices_test_other
  @deleted ~r/called on deleted or donated buffer/

  setup_all do
    EXLA.TestClients.add(@client, platform: :host, device_count: 2)
    EXLA.TestClients.add(@other, platform: :host, device_count: 2)
  end

  @all_reduce """
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

  @data for x <- [1.0, 2.0, 3.0, 4.0], into: <<>>, do: <<x::float-32-native>>
  @sum for x <- [2.0, 4.0, 6.0, 8.0], into: <<>>, do: <<x::float-32-native>>

  # An SPMD program: XLA's partitioner adds an all-gather.
  @sharded_sum """
  module @sharded attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
    func.func public @main(%a: tensor<4xf32> {mhlo.sharding = "{devices=[2]0,1}"}) -> tensor<f32> {
      %z = stablehlo.constant dense<0.0> : tensor<f32>
      %0 = stablehlo.reduce(%a init: %z) applies stablehlo.add across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
      return %0 : tensor<f32>
    }
  }
  """

  # The CPU plugin meets the parts of a run in its collectives by the run's
  # launch id, across the whole process: two clients' runs with the same id
  # met each other and XLA aborted the VM ("Unexpected number of
  # participants"). Each run on several devices now has an id of its own.
  test "programs with collectives run on two clients at once" do
    [@client, @other]
    |> Enum.map(fn name ->
      Task.async(fn ->
        client = EXLA.Client.fetch!(name)
        part = Shape.make_shape({:f, 32}, {2})
        exe = Executable.compile(client, @sharded_sum, num_partitions: 2, input_shapes: [part])

        halves = [
          <<1.0::float-32-native, 2.0::float-32-native>>,
          <<3.0::float-32-native, 4.0::float-32-native>>
        ]

        args =
          for {half, d} <- Enum.zip(halves, [0, 1]),
              do: [DeviceBuffer.place_on_device(half, part, client, d)]

        for _ <- 1..2000 do
          [[out0], [out1]] = Executable.run(exe, args)

          assert [DeviceBuffer.read(out0), DeviceBuffer.read(out1)] == [
                   <<10.0::float-32-native>>,
                   <<10.0::float-32-native>>
                 ]
        end
      end)
    end)
    |> Task.await_many(60_000)
  end

  # An argument deleted between the liveness check of a run on two
  # devices and its launch started the other device's part, which waited
  # in its all-reduce for the missing one until XLA aborted the VM (40 s
  # later; the first hang came within 700 rounds). Deletion now waits for
  # the launch: each run either refuses the deleted argument or computes.
  test "deallocating an argument while a two-device run with a collective launches" do
    two = EXLA.Client.fetch!(@client)

    exe = Executable.compile(two, @all_reduce, num_replicas: 2)
    shape = Shape.make_shape({:f, 32}, {4})

    outcomes =
      for round <- 1..10_000, reduce: %{} do
        outcomes ->
          args = for device <- [0, 1], do: DeviceBuffer.place_on_device(@data, shape, two, device)

          # A varying delay puts the deletion before, during or after the launch.
          spin = rem(round * 7919, 20_000)
          spawn(fn -> Enum.each(1..spin, & &1) && DeviceBuffer.deallocate(List.last(args)) end)
          run = Task.async(fn -> run_both(exe, args) end)
          outcome = Task.yield(run, 10_000) || flunk("a run hung in round #{round}")
          Map.update(outcomes, outcome, 1, &(&1 + 1))
      end

    # Both outcomes happen: the deletions do land around the launches.
    assert Enum.sort(Map.keys(outcomes)) == [{:ok, :deleted}, {:ok, [@sum, @sum]}]
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
