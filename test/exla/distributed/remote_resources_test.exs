defmodule EXLA.Distributed.RemoteResourcesTest do
  # Every public function of EXLA that takes a buffer, an executable or a
  # client, called with one of another node: live, it gives the right
  # answer; freed on its owner, or with its owner stopped, it raises an
  # Elixir exception naming the owner. The NIF never sees such a resource,
  # so none of these can take the VM down.
  use ExUnit.Case, async: false

  # Nx.map/2 exists on Nx 0.7 only (see map_cases/0).
  @compile {:no_warn_undefined, [{Nx, :map, 2}]}

  alias EXLA.{DeviceBuffer, Executable, TestPeer}

  @moduletag :distributed

  @add_mlir """
  module {
    func.func public @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> tensor<2x3xf32> {
      %0 = stablehlo.add %a, %b : tensor<2x3xf32>
      return %0 : tensor<2x3xf32>
    }
  }
  """

  @floats [[0.5, -1.5, 2.0], [3.25, -0.75, 0.125]]
  @ints [[3, -7, 12], [0, 5, -1]]

  setup_all do
    {_peer, node} = TestPeer.start!(:remote_resources)
    %{peer_node: node}
  end

  # What a case gets: tensors `f` (f32) and `s` (s64), each {2, 3}, the
  # buffer `b` of `f`, an executable `exe` (adds two f32 {2, 3}) and the
  # client `client`, all made on `node` and held there by `holders`.
  defp remote_resources(node) do
    client = :erpc.call(node, EXLA.Client, :fetch!, [:host])

    {f_holder, f} =
      TestPeer.hold(node, Nx, :tensor, [@floats, [type: :f32, backend: EXLA.Backend]])

    {s_holder, s} = TestPeer.hold(node, Nx, :tensor, [@ints, [type: :s64, backend: EXLA.Backend]])
    {exe_holder, exe} = TestPeer.hold(node, Executable, :compile, [client, @add_mlir])
    holders = [f_holder, s_holder, exe_holder]
    %{holders: holders, f: f, s: s, b: f.data.buffer, exe: exe, client: client}
  end

  defp release(r), do: Enum.each(r.holders, &TestPeer.release/1)

  # The same resources, made here: the expected answers.
  defp local_resources do
    client = EXLA.Client.fetch!(:host)
    f = Nx.tensor(@floats, type: :f32, backend: EXLA.Backend)
    s = Nx.tensor(@ints, type: :s64, backend: EXLA.Backend)
    exe = Executable.compile(client, @add_mlir)
    %{f: f, s: s, b: f.data.buffer, exe: exe, client: client}
  end

  float_unary =
    Enum.map(Nx.Shared.unary_math_funs(), &elem(&1, 0)) ++
      [:abs, :ceil, :floor, :negate, :round, :sign, :is_nan, :is_infinity, :conjugate]

  int_unary = [:bitwise_not, :count_leading_zeros, :population_count]

  float_binary =
    [:add, :subtract, :multiply, :pow, :remainder, :divide, :atan2, :min, :max] ++
      [:equal, :not_equal, :greater, :less, :greater_equal, :less_equal] ++
      [:logical_and, :logical_or, :logical_xor]

  int_binary = [:quotient, :bitwise_and, :bitwise_or, :bitwise_xor, :left_shift, :right_shift]

  # {name, function of the resources}; results are compared as binaries.
  @cases Enum.map(float_unary, &{"Nx.#{&1}", {:unary, :f, &1}}) ++
           Enum.map(int_unary, &{"Nx.#{&1}", {:unary, :s, &1}}) ++
           Enum.flat_map(float_binary, &[{"Nx.#{&1}", {:binary, :f, &1}}]) ++
           Enum.flat_map(int_binary, &[{"Nx.#{&1}", {:binary, :s, &1}}])

  defp run_case({:unary, key, op}, r), do: apply(Nx, op, [r[key]])

  defp run_case({:binary, key, op}, r) do
    local =
      Nx.tensor(if(key == :f, do: @floats, else: [[1, 2, 3], [4, 1, 2]]), backend: EXLA.Backend)

    local = Nx.as_type(local, r[key].type)
    {apply(Nx, op, [r[key], local]), apply(Nx, op, [local, r[key]])}
  end

  defp run_case(fun, r) when is_function(fun, 1), do: fun.(r)

  defp other_cases do
    [
      {"Nx.to_binary", &Nx.to_binary(&1.f)},
      {"Nx.to_binary with a limit", &Nx.to_binary(&1.f, limit: 2)},
      {"Nx.to_number", &Nx.to_number(&1.f[0][0])},
      {"inspect", &inspect(&1.f)},
      {"Nx.backend_copy to Nx.BinaryBackend", &Nx.backend_copy(&1.f, Nx.BinaryBackend)},
      {"Nx.backend_copy to EXLA.Backend", &Nx.backend_copy(&1.f, EXLA.Backend)},
      {"Nx.backend_transfer to Nx.BinaryBackend", &Nx.backend_transfer(&1.f, Nx.BinaryBackend)},
      {"Nx.backend_transfer to EXLA.Backend", &Nx.backend_transfer(&1.f, EXLA.Backend)},
      {"Nx.backend_deallocate", &Nx.backend_deallocate(&1.f)},
      {"Nx.to_batched", &(&1.f |> Nx.to_batched(1) |> Enum.to_list())},
      {"Nx.as_type", &Nx.as_type(&1.f, :f64)},
      {"Nx.bitcast", &Nx.bitcast(&1.f, :s32)},
      {"Nx.reshape", &Nx.reshape(&1.f, {3, 2})},
      {"Nx.squeeze", &Nx.squeeze(Nx.reshape(&1.f, {1, 2, 3}))},
      {"Nx.broadcast", &Nx.broadcast(&1.f, {4, 2, 3})},
      {"Nx.transpose", &Nx.transpose(&1.f)},
      {"Nx.pad", &Nx.pad(&1.f, 0.0, [{1, 0, 0}, {0, 1, 1}])},
      {"Nx.reverse", &Nx.reverse(&1.f)},
      {"Nx.dot", &Nx.dot(&1.f, Nx.transpose(&1.f))},
      {"Nx.clip", &Nx.clip(&1.f, -1.0, 1.0)},
      {"Nx.slice", &Nx.slice(&1.f, [0, 1], [2, 2])},
      {"Nx.slice with tensor starts", &Nx.slice(&1.f, [Nx.tensor(1), 0], [1, 2])},
      {"Nx.put_slice", &Nx.put_slice(&1.f, [0, 0], Nx.tensor([[9.0]]))},
      {"Nx.take", &Nx.take(&1.f, Nx.tensor([1, 0]))},
      {"Nx.take_along_axis", &Nx.take_along_axis(&1.f, Nx.tensor([[0], [2]]), axis: 1)},
      {"Nx.gather", &Nx.gather(&1.f, Nx.tensor([[0, 1], [1, 2]]))},
      {"Nx.concatenate", &Nx.concatenate([&1.f, &1.f])},
      {"Nx.select", &Nx.select(Nx.greater(&1.f, 0), &1.f, 0.0)},
      {"Nx.conv", &Nx.conv(Nx.reshape(&1.f, {1, 1, 2, 3}), Nx.broadcast(1.0, {1, 1, 1, 2}))},
      {"Nx.all", &Nx.all(&1.f)},
      {"Nx.any", &Nx.any(&1.f)},
      {"Nx.sum", &Nx.sum(&1.f, axes: [1])},
      {"Nx.product", &Nx.product(&1.f)},
      {"Nx.reduce_max", &Nx.reduce_max(&1.f)},
      {"Nx.reduce_min", &Nx.reduce_min(&1.f, axes: [0])},
      {"Nx.argmax", &Nx.argmax(&1.f, axis: 1)},
      {"Nx.argmin", &Nx.argmin(&1.f)},
      {"Nx.reduce", &Nx.reduce(&1.f, 0.0, fn a, b -> Nx.add(a, b) end)},
      {"Nx.window_reduce", &Nx.window_reduce(&1.f, 0.0, {1, 2}, fn a, b -> Nx.add(a, b) end)},
      {"Nx.window_sum", &Nx.window_sum(&1.f, {1, 2})},
      {"Nx.window_product", &Nx.window_product(&1.f, {2, 1})},
      {"Nx.window_max", &Nx.window_max(&1.f, {1, 2})},
      {"Nx.window_min", &Nx.window_min(&1.f, {2, 2})},
      {"Nx.window_scatter_max",
       &Nx.window_scatter_max(&1.f, Nx.tensor([[1.0, 2.0]]), 0.0, {2, 2}, strides: [1, 1])},
      {"Nx.window_scatter_min",
       &Nx.window_scatter_min(&1.f, Nx.tensor([[1.0, 2.0]]), 0.0, {2, 2}, strides: [1, 1])},
      {"Nx.indexed_add",
       &Nx.indexed_add(&1.f, Nx.tensor([[0, 0], [1, 2]]), Nx.tensor([1.0, 2.0]))},
      {"Nx.indexed_put", &Nx.indexed_put(&1.f, Nx.tensor([[0, 0]]), Nx.tensor([5.0]))},
      {"Nx.sort", &Nx.sort(&1.f, axis: 1)},
      {"Nx.argsort", &Nx.argsort(&1.f, axis: 1)},
      {"Nx.fft", &Nx.fft(&1.f)},
      {"Nx.ifft", &Nx.ifft(&1.f)},
      {"Nx.cumulative_sum (optional)", &Nx.cumulative_sum(&1.f, axis: 1)},
      {"Nx.LinAlg.qr", &Nx.LinAlg.qr(Nx.dot(&1.f, Nx.transpose(&1.f)))},
      {"Nx.LinAlg.lu", &Nx.LinAlg.lu(Nx.dot(&1.f, Nx.transpose(&1.f)))},
      {"Nx.LinAlg.triangular_solve",
       &Nx.LinAlg.triangular_solve(
         Nx.tensor([[2.0, 0.0], [1.0, 1.0]]),
         Nx.slice(&1.f, [0, 0], [2, 2])
       )},
      {"EXLA.jit", &EXLA.jit(fn a, b -> Nx.multiply(a, b) end).(&1.f, &1.f)},
      {"EXLA.jit with lazy transfers",
       &EXLA.jit(fn a -> Nx.sum(a) end, lazy_transfers: :always).(&1.f)},
      {"EXLA.compile",
       &EXLA.compile(fn x -> Nx.negate(x) end, [Nx.template({2, 3}, :f32)]).(&1.f)},
      {"EXLA.DeviceBuffer.read", &DeviceBuffer.read(&1.b)},
      {"EXLA.DeviceBuffer.read with a size", &DeviceBuffer.read(&1.b, 8)},
      {"EXLA.DeviceBuffer.await", &DeviceBuffer.await([&1.b, local_buffer()])},
      {"EXLA.DeviceBuffer.deallocate", &DeviceBuffer.deallocate(&1.b)},
      {"EXLA.DeviceBuffer.copy_to_device",
       &DeviceBuffer.read(DeviceBuffer.copy_to_device(&1.b, EXLA.Client.fetch!(:host), 0))},
      {"EXLA.DeviceBuffer.local?", &(DeviceBuffer.local?(&1.b) == (node(&1.b.ref) == node()))},
      {"EXLA.Executable.run with a remote buffer",
       &run_read(local_resources().exe, [&1.b, local_buffer()])},
      {"EXLA.Executable.run of a remote executable",
       &run_read(&1.exe, [local_buffer(), local_buffer()])},
      {"EXLA.Executable.run of a remote executable on remote buffers",
       &run_read(&1.exe, [&1.b, &1.b])},
      {"EXLA.Executable.serialize of a remote executable",
       &(&1.exe
         |> Executable.serialize()
         |> Executable.Sealed.open()
         |> elem(1)
         |> Map.delete(:plugin))}
    ] ++ map_cases()
  end

  # Nx.map/2 exists on Nx 0.7 only.
  defp map_cases do
    if EXLA.NxVersion.maps?(),
      do: [{"Nx.map", &Nx.map(&1.s, fn x -> Nx.add(x, 1) end)}],
      else: []
  end

  # Cases on the remote client, which stands for this node's client of the
  # same name (it never fails: a client is found by name).
  defp client_cases do
    [
      {"EXLA.DeviceBuffer.place_on_device on a remote client",
       &DeviceBuffer.read(
         DeviceBuffer.place_on_device(<<1.0::float-32-native>>, scalar(), &1.client, 0)
       )},
      {"EXLA.DeviceBuffer.copy_to_device to a remote client",
       &DeviceBuffer.read(DeviceBuffer.copy_to_device(local_buffer(), &1.client, 0))},
      {"EXLA.Executable.compile on a remote client",
       &run_read(Executable.compile(&1.client, @add_mlir), [local_buffer(), local_buffer()])},
      {"EXLA.Executable.deserialize into a remote client",
       &run_read(
         Executable.deserialize(&1.client, Executable.serialize(local_resources().exe)),
         [local_buffer(), local_buffer()]
       )},
      {"EXLA.HostCallback.install! on a remote client", &EXLA.HostCallback.install!(&1.client)},
      {"EXLA.Client.get_memory_statistics of a remote client",
       &Map.keys(EXLA.Client.get_memory_statistics(&1.client))},
      {"EXLA.Client.reset_peak_memory of a remote client",
       &EXLA.Client.reset_peak_memory(&1.client)}
    ]
  end

  defp scalar, do: EXLA.Shape.make_shape({:f, 32}, {})
  defp local_buffer, do: local_resources().b

  defp run_read(exe, args) do
    [[out]] = Executable.run(exe, [args])
    DeviceBuffer.read(out)
  end

  defp all_cases, do: @cases ++ other_cases()

  # Results compare by their data (and where tensors are, they are here).
  defp comparable(%Nx.Tensor{data: %EXLA.Backend{buffer: buffer}} = t) do
    assert DeviceBuffer.local?(buffer)
    {t.type, t.shape, Nx.to_binary(t)}
  end

  defp comparable(%Nx.Tensor{} = t), do: {t.type, t.shape, Nx.to_binary(t)}
  defp comparable(list) when is_list(list), do: Enum.map(list, &comparable/1)

  defp comparable(tuple) when is_tuple(tuple),
    do: tuple |> Tuple.to_list() |> Enum.map(&comparable/1)

  defp comparable("#Nx.Tensor<" <> _ = inspected),
    do: Regex.replace(~r/EXLA.Backend<[^>]*>/, inspected, "")

  defp comparable(other), do: other

  defp outcome(kind, r) do
    {:ok, run_case(kind, r)}
  rescue
    e -> {:raised, e}
  end

  test "with live resources of another node, gives the answers of local ones",
       %{peer_node: node} do
    for {name, kind} <- all_cases() ++ client_cases() do
      r = remote_resources(node)
      expected = comparable(run_case(kind, local_resources()))

      case outcome(kind, r) do
        {:ok, result} ->
          assert comparable(result) == expected, "#{name} gave another answer"

        {:raised, e} ->
          flunk("#{name} raised #{Exception.format(:error, e)}")
      end

      release(r)
    end
  end

  test "with resources freed on their owner, raises naming the owner", %{peer_node: node} do
    r = remote_resources(node)
    release(r)
    :erpc.call(node, :erlang, :garbage_collect, [])
    assert_each_raises(all_cases(), r, ~r/freed on node #{Regex.escape(inspect(node))}/)
  end

  test "with resources of a stopped node, raises naming it" do
    {peer, node} = TestPeer.start!(:stopped_resources)
    r = remote_resources(node)
    :peer.stop(peer)
    message = ~r/node #{Regex.escape(inspect(node))}, which cannot be reached/
    assert_each_raises(all_cases(), r, message)

    # A client is found by name: its node does not matter.
    for {name, kind} <- client_cases() do
      assert {:ok, _} = outcome(kind, r), "#{name} failed"
    end
  end

  defp assert_each_raises(cases, r, message) do
    for {name, kind} <- cases, name != "EXLA.DeviceBuffer.local?" do
      case outcome(kind, r) do
        {:raised, e} ->
          assert Exception.message(e) =~ message,
                 "#{name} raised another error: #{Exception.format(:error, e)}"

        {:ok, "#Inspect.Error<" <> _ = inspected} ->
          # Inspect shows what an inspected term raised.
          assert inspected =~ message, "inspect showed #{inspected}"

        {:ok, result} ->
          flunk("#{name} returned #{inspect(result)}")
      end
    end
  end
end
