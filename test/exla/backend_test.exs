defmodule EXLA.BackendTest do
  use ExUnit.Case, async: false

  setup do
    previous = Application.get_env(:exla, :add_backend_on_inspect)
    Application.put_env(:exla, :add_backend_on_inspect, false)
    on_exit(fn -> Application.put_env(:exla, :add_backend_on_inspect, previous) end)
    :ok
  end

  doctest EXLA.Backend

  # A second host client with two devices, to mix clients and devices.
  setup_all do
    clients = Application.fetch_env!(:exla, :clients)

    unless Keyword.has_key?(clients, :backend_test_multi) do
      multi = clients ++ [backend_test_multi: [platform: :host, device_count: 2]]
      Application.put_env(:exla, :clients, multi)
      on_exit(fn -> Application.put_env(:exla, :clients, clients) end)
    end

    :ok
  end

  defp multi(device_id), do: {EXLA.Backend, client: :backend_test_multi, device_id: device_id}

  defp client, do: EXLA.Client.fetch!(EXLA.Client.default_name())

  defp assert_deleted(fun) do
    fun.()
    flunk("expected an error about a deleted buffer")
  rescue
    error in RuntimeError ->
      assert Exception.message(error) =~ "called on deleted or donated buffer"
  end

  defp last_device, do: client().device_count - 1

  describe "options" do
    test "accepts :client and :device_id" do
      t = Nx.tensor([1, 2], backend: {EXLA.Backend, client: client().name, device_id: 0})
      assert %EXLA.Backend{buffer: %EXLA.DeviceBuffer{device_id: 0}} = t.data
      assert t.data.buffer.client_name == client().name
    end

    test "validates options" do
      assert_raise ArgumentError, ~r/unknown keys \[:device\]/, fn ->
        Nx.tensor([1], backend: {EXLA.Backend, device: 0})
      end

      assert_raise ArgumentError, ~r/:client must be an atom/, fn ->
        Nx.tensor([1], backend: {EXLA.Backend, client: "host"})
      end

      assert_raise ArgumentError, ~r/:device_id must be a non-negative integer/, fn ->
        Nx.tensor([1], backend: {EXLA.Backend, device_id: -1})
      end

      assert_raise ArgumentError, ~r/invalid :device_id 1024/, fn ->
        Nx.tensor([1], backend: {EXLA.Backend, device_id: 1024})
      end
    end
  end

  describe "creation" do
    test "from_binary, constant, eye and iota" do
      assert Nx.to_flat_list(Nx.tensor([1.5, 2.5], backend: EXLA.Backend)) == [1.5, 2.5]

      t = Nx.broadcast(Nx.tensor(7, backend: EXLA.Backend), {2, 2})
      assert Nx.to_flat_list(t) == [7, 7, 7, 7]

      eye = Nx.eye(2, backend: EXLA.Backend)
      assert %EXLA.Backend{} = eye.data
      assert Nx.to_flat_list(eye) == [1, 0, 0, 1]

      iota = Nx.iota({2, 3}, axis: 1, backend: EXLA.Backend)
      assert %EXLA.Backend{} = iota.data
      assert Nx.to_flat_list(iota) == [0, 1, 2, 0, 1, 2]
      assert Nx.to_flat_list(Nx.iota({4}, backend: EXLA.Backend)) == [0, 1, 2, 3]
    end

    test "eye and iota honour the device" do
      d = last_device()
      assert Nx.iota({3}, backend: {EXLA.Backend, device_id: d}).data.buffer.device_id == d
    end
  end

  describe "transfers" do
    test "to_binary with a limit" do
      t = Nx.tensor([1, 2, 3, 4], type: {:s, 32}, backend: EXLA.Backend)
      assert Nx.to_binary(t) == <<1::32-native, 2::32-native, 3::32-native, 4::32-native>>
      assert Nx.to_binary(t, limit: 2) == <<1::32-native, 2::32-native>>
    end

    test "backend_transfer to Nx.BinaryBackend frees the device buffer" do
      t = Nx.tensor([1, 2, 3], backend: EXLA.Backend)
      b = Nx.backend_transfer(t, Nx.BinaryBackend)
      assert %Nx.BinaryBackend{} = b.data
      assert Nx.to_flat_list(b) == [1, 2, 3]
      assert Nx.backend_deallocate(t) == :already_deallocated
    end

    test "backend_copy keeps the source" do
      t = Nx.tensor([1, 2, 3], backend: EXLA.Backend)
      b = Nx.backend_copy(t, Nx.BinaryBackend)
      assert Nx.to_flat_list(b) == [1, 2, 3]
      assert Nx.to_flat_list(t) == [1, 2, 3]

      c = Nx.backend_copy(t, EXLA.Backend)
      assert c.data.buffer.ref != t.data.buffer.ref
      assert Nx.to_flat_list(c) == [1, 2, 3]
    end

    test "backend_transfer to the same device returns the tensor" do
      t = Nx.tensor([1, 2, 3], backend: EXLA.Backend)
      opts = [client: t.data.buffer.client_name, device_id: t.data.buffer.device_id]
      assert Nx.backend_transfer(t, {EXLA.Backend, opts}) == t
    end

    test "backend_transfer to another device" do
      d = last_device()
      t = Nx.tensor([1, 2, 3], backend: EXLA.Backend)
      moved = Nx.backend_transfer(t, {EXLA.Backend, device_id: d})
      assert moved.data.buffer.device_id == d
      assert Nx.to_flat_list(moved) == [1, 2, 3]

      if d != t.data.buffer.device_id do
        assert Nx.backend_deallocate(t) == :already_deallocated
      end
    end

    test "from Nx.BinaryBackend to EXLA.Backend" do
      t = Nx.tensor([[1.0, 2.0]], names: [:a, :b])
      e = Nx.backend_transfer(t, EXLA.Backend)
      assert %EXLA.Backend{} = e.data
      assert e.names == [:a, :b]
      assert Nx.to_flat_list(e) == [1.0, 2.0]
    end

    test "to_batched" do
      t = Nx.iota({5, 2}, backend: EXLA.Backend)
      batches = t |> Nx.to_batched(2) |> Enum.map(&Nx.to_flat_list/1)
      assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]

      batches = t |> Nx.to_batched(2, leftover: :discard) |> Enum.to_list()
      assert length(batches) == 2
      assert Enum.all?(batches, &match?(%EXLA.Backend{}, &1.data))
    end
  end

  describe "clients and devices" do
    test "allocates on the given client and device" do
      t = Nx.tensor([1, 2, 3], backend: multi(1))
      assert %{client_name: :backend_test_multi, device_id: 1} = t.data.buffer
      assert Nx.to_flat_list(t) == [1, 2, 3]
    end

    test "transfers between devices of a client" do
      t = Nx.tensor([1, 2, 3], backend: multi(0))
      moved = Nx.backend_transfer(t, multi(1))
      assert %{client_name: :backend_test_multi, device_id: 1} = moved.data.buffer
      assert Nx.to_flat_list(moved) == [1, 2, 3]
      assert Nx.backend_deallocate(t) == :already_deallocated
    end

    test "copies between clients" do
      t = Nx.tensor([1.0, 2.0], backend: multi(1))
      copy = Nx.backend_copy(t, EXLA.Backend)
      assert copy.data.buffer.client_name == client().name
      assert Nx.to_flat_list(copy) == [1.0, 2.0]
      assert Nx.to_flat_list(t) == [1.0, 2.0]
    end

    # As EXLA: a tensor on a host client's default device gives way (see
    # "Tensors on several devices" in EXLA.Backend).
    test "operations run on the last tensor off a host client's default device" do
      a = Nx.tensor([1, 2], backend: multi(1))
      b = Nx.tensor([10, 20], backend: multi(0))
      c = Nx.tensor([100, 200], backend: {EXLA.Backend, client: :host})

      ab = Nx.add(a, b)
      assert %{client_name: :backend_test_multi, device_id: 1} = ab.data.buffer
      assert Nx.to_flat_list(ab) == [11, 22]

      ca = Nx.add(c, a)
      assert %{client_name: :backend_test_multi, device_id: 1} = ca.data.buffer
      assert Nx.to_flat_list(ca) == [101, 202]

      cb = Nx.add(b, c)
      assert %{client_name: :host, device_id: 0} = cb.data.buffer
      assert Nx.to_flat_list(cb) == [110, 220]

      # the inputs are untouched
      assert Nx.to_flat_list(b) == [10, 20]
    end

    test "eye and iota on another device" do
      assert %{device_id: 1} = Nx.iota({3}, backend: multi(1)).data.buffer
      assert Nx.to_flat_list(Nx.eye(2, backend: multi(1))) == [1, 0, 0, 1]
    end

    test "jit on another client or device transfers the arguments" do
      a = Nx.tensor([1, 2], backend: EXLA.Backend)
      b = Nx.tensor([3, 4], backend: multi(0))
      result = EXLA.jit(&Nx.add/2, client: :backend_test_multi, device_id: 1).(a, b)
      assert %{client_name: :backend_test_multi, device_id: 1} = result.data.buffer
      assert Nx.to_flat_list(result) == [4, 6]
    end

    test "jit results follow the compiler options" do
      result = Nx.Defn.jit(&Nx.negate/1, compiler: EXLA, client: :backend_test_multi).(1)
      assert %{client_name: :backend_test_multi, device_id: 0} = result.data.buffer

      partitions = EXLA.__partitions_options__(client: :backend_test_multi)
      assert Enum.map(partitions, & &1[:device_id]) == [0, 1]
      assert Enum.all?(partitions, &(&1[:client] == :backend_test_multi))
    end
  end

  describe "lifetime" do
    test "backend_deallocate frees at once" do
      t = Nx.tensor([1, 2, 3], backend: EXLA.Backend)
      assert Nx.backend_deallocate(t) == :ok
      assert Nx.backend_deallocate(t) == :already_deallocated
    end

    test "using a deallocated tensor raises" do
      t = Nx.tensor([1, 2, 3], backend: EXLA.Backend)
      :ok = Nx.backend_deallocate(t)

      assert_deleted(fn -> Nx.to_binary(t) end)
      assert_deleted(fn -> Nx.add(t, 1) end)
      assert_deleted(fn -> EXLA.jit(&Nx.negate/1).(t) end)
      assert inspect(t) =~ "called on deleted or donated buffer"
      assert_deleted(fn -> Nx.backend_copy(t, Nx.BinaryBackend) end)
    end
  end

  describe "operations" do
    test "compile once per shape and type" do
      ref = :telemetry_test.attach_event_handlers(self(), [[:exla, :compilation]])
      a = Nx.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], backend: EXLA.Backend)
      Nx.subtract(a, a)
      assert_received {[:exla, :compilation], ^ref, _, _}
      Nx.subtract(a, a)
      Nx.subtract(a, a)
      refute_received {[:exla, :compilation], ^ref, _, _}
      :telemetry.detach(ref)
    end

    test "50 concurrent callers of a new operation compile it once" do
      ref = :telemetry_test.attach_event_handlers(self(), [[:exla, :compilation]])
      t = Nx.iota({3, 1, 7}, type: {:f, 32}, backend: EXLA.Backend)

      results =
        1..50
        |> Enum.map(fn _ -> Task.async(fn -> t |> Nx.multiply(t) |> Nx.to_flat_list() end) end)
        |> Task.await_many(60_000)

      assert results |> Enum.uniq() |> length() == 1
      assert_received {[:exla, :compilation], ^ref, _, %{key: :multiply}}
      refute_received {[:exla, :compilation], ^ref, _, %{key: :multiply}}
      :telemetry.detach(ref)
    end

    test "results stay on the device of the inputs" do
      d = last_device()
      a = Nx.tensor([1, 2], backend: {EXLA.Backend, device_id: d})
      sum = Nx.add(a, a)
      assert sum.data.buffer.device_id == d
      assert Nx.to_flat_list(sum) == [2, 4]
    end

    test "mixing with Nx.BinaryBackend" do
      a = Nx.tensor([1, 2], backend: EXLA.Backend)
      b = Nx.tensor([10, 20], backend: Nx.BinaryBackend)
      assert %EXLA.Backend{} = Nx.add(a, b).data
      assert Nx.to_flat_list(Nx.add(b, a)) == [11, 22]
    end

    test "mixing devices copies to the first device tensor's device" do
      d = last_device()
      a = Nx.tensor([1, 2], backend: {EXLA.Backend, device_id: 0})
      b = Nx.tensor([10, 20], backend: {EXLA.Backend, device_id: d})
      sum = Nx.add(a, b)
      assert sum.data.buffer.device_id == 0
      assert Nx.to_flat_list(sum) == [11, 22]
    end

    test "lu factorizes with partial pivoting, so determinant and invert work" do
      t = Nx.tensor([[4.0, 3.0, 1.0], [6.0, 3.0, 2.0], [1.0, 5.0, 9.0]], backend: EXLA.Backend)
      {p, l, u} = Nx.LinAlg.lu(t)
      assert %EXLA.Backend{} = l.data
      assert Nx.all_close(p |> Nx.dot(l) |> Nx.dot(u), t) |> Nx.to_number() == 1
      expected = Nx.LinAlg.determinant(Nx.backend_copy(t, Nx.BinaryBackend))
      assert_in_delta Nx.to_number(Nx.LinAlg.determinant(t)), Nx.to_number(expected), 1.0e-4
      identity = Nx.dot(t, Nx.LinAlg.invert(t))
      assert Nx.all_close(identity, Nx.eye(3), atol: 1.0e-5) |> Nx.to_number() == 1
    end

    test "tuple results of optional callbacks" do
      t = Nx.tensor([1, 3, 2], backend: EXLA.Backend)
      {values, indices} = Nx.top_k(t, k: 2)
      assert %EXLA.Backend{} = values.data
      assert Nx.to_flat_list(values) == [3, 2]
      assert Nx.to_flat_list(indices) == [1, 2]
    end

    test "functions as arguments" do
      t = Nx.tensor([1, 2, 3], backend: EXLA.Backend)
      assert Nx.to_number(Nx.reduce(t, 0, &Nx.add/2)) == 6
    end

    test "optional callbacks" do
      t = Nx.tensor([1, 2, 3, 4], backend: EXLA.Backend)
      assert Nx.to_flat_list(Nx.cumulative_sum(t)) == [1, 3, 6, 10]
    end
  end

  describe "numerics (eager ops are EXLA.jit's ops)" do
    defp random_f32(shape, seed) do
      key = Nx.Random.key(seed) |> Nx.backend_copy(Nx.BinaryBackend)
      {t, _} = Nx.Random.uniform(key, -1.0, 1.0, shape: shape, type: :f32)
      t
    end

    defp eager_and_reference(fun, args) do
      got = apply(fun, Enum.map(args, &Nx.backend_copy(&1, EXLA.Backend)))
      assert %EXLA.Backend{} = got.data
      {Nx.backend_copy(got, Nx.BinaryBackend), apply(fun, args)}
    end

    test "f32 sums, products, dots and math functions are close to Nx.BinaryBackend's" do
      x = random_f32({64, 33}, 1)
      y = random_f32({33, 17}, 2)

      # On CUDA, f32 dots are TF32 products under the default precision
      # (docs/gpu.md): a 10-bit mantissa, so 33 terms of about 1 stay
      # within 1.0e-2.
      dot_atol = if EXLA.TestPlatform.cuda?(), do: 1.0e-2, else: 1.0e-6

      # the reference accumulates in double precision, XLA in f32
      for {fun, args, atol} <- [
            {&Nx.sum/1, [x], 1.0e-5},
            {&Nx.sum(&1, axes: [1]), [x], 1.0e-6},
            {&Nx.product(&1, axes: [0]), [Nx.add(x, 1.5)], 1.0e-3},
            {&Nx.dot/2, [x, y], dot_atol},
            {&Nx.window_sum(&1, {4, 3}), [x], 1.0e-6},
            {&Nx.exp/1, [x], 0},
            {&Nx.tanh/1, [x], 0},
            {&Nx.erf_inv/1, [Nx.multiply(x, 0.99)], 0}
          ] do
        {got, expected} = eager_and_reference(fun, args)
        assert Nx.to_number(Nx.all_close(got, expected, atol: atol, rtol: 1.0e-6)) == 1
      end
    end

    # The one exception, qr, computes f32 in f64 on the host, eagerly as in
    # jit (see EXLA.Defn.Lowering.QR and lin_alg_test.exs).
    test "no f64 work for f32 input, eagerly or in jit" do
      f32 = fn shape -> Nx.template(shape, :f32) end

      for {fun, args} <- [
            {&Nx.dot/2, [f32.({4, 4}), f32.({4, 4})]},
            {&Nx.sum/1, [f32.({8})]},
            {&Nx.exp/1, [f32.({8})]},
            {&Nx.erf_inv/1, [f32.({8})]},
            {&Nx.LinAlg.lu/1, [f32.({3, 3})]},
            {&Nx.LinAlg.triangular_solve/2, [f32.({3, 3}), f32.({3})]},
            {&Nx.LinAlg.eigh/1, [f32.({3, 3})]}
          ] do
        refute EXLA.to_mlir_module(fun, args).mlir_module =~ "f64"
      end
    end

    test "round keeps XLA's sign of zero (-0.0 for -0.3), eagerly as in jit" do
      t = Nx.tensor([-0.3, -0.0, 0.3, -0.5, -1.5])
      eager = Nx.round(Nx.backend_copy(t, EXLA.Backend))
      assert Nx.to_binary(eager) == Nx.to_binary(EXLA.jit(&Nx.round/1).(t))
      assert Nx.to_binary(eager) == Nx.to_binary(Nx.tensor([-0.0, -0.0, 0.0, -1.0, -2.0]))
    end

    test "eigh runs Nx's default implementation: properties and closeness to the reference" do
      t =
        Nx.tensor(
          [[4.0, 1.0, -2.0, 2.0], [1.0, 2.0, 0.0, 1.0], [-2.0, 0.0, 3.0, -2.0]] ++
            [[2.0, 1.0, -2.0, -1.0]]
        )

      {vals, vecs} = Nx.LinAlg.eigh(Nx.backend_copy(t, EXLA.Backend))
      {ref_vals, _} = Nx.LinAlg.eigh(t)
      av = Nx.dot(Nx.backend_copy(t, EXLA.Backend), vecs)
      vl = Nx.multiply(vecs, vals)
      # Nx's default eps: 1.0e-4 stops the QR iterations early: A.V - V.L is
      # about 1e-2 here, on the reference too; the eigenvalues are close
      assert Nx.to_number(Nx.all_close(av, vl, atol: 2.0e-2, rtol: 0)) == 1
      sorted = vals |> Nx.backend_copy(Nx.BinaryBackend) |> Nx.sort()
      assert Nx.to_number(Nx.all_close(sorted, Nx.sort(ref_vals), atol: 1.0e-4)) == 1
    end

    # Nx 0.12 and later compute the eigenvalues of complex matrices.
    @tag nx: :v0_7
    test "eigh of complex input raises, eagerly as in jit (Nx's default gives real values)" do
      t = Nx.tensor([[2, Complex.new(1, -1)], [Complex.new(1, 1), 3]])
      message = ~r/expected default implementation to match template/

      assert_raise ArgumentError, message, fn ->
        Nx.LinAlg.eigh(Nx.backend_copy(t, EXLA.Backend))
      end

      assert_raise ArgumentError, message, fn -> EXLA.jit(&Nx.LinAlg.eigh/1).(t) end
    end

    test "lu of a singular matrix leaves the rows below a zero pivot alone" do
      t = Nx.tensor([[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
      {p, l, u} = Nx.LinAlg.lu(Nx.backend_copy(t, EXLA.Backend))

      for f <- [l, u],
          do: assert(Nx.to_number(Nx.all(Nx.is_infinity(f) |> Nx.logical_not())) == 1)

      assert p |> Nx.dot(l) |> Nx.dot(u) |> Nx.backend_copy() == Nx.as_type(t, :f32)
    end

    test "triangular_solve with a zero on the diagonal returns XLA's IEEE result, as jit does" do
      a = Nx.tensor([[1.0, 0.0, 0.0], [2.0, 0.0, 0.0], [3.0, 4.0, 5.0]])
      b = Nx.tensor([1.0, 2.0, 3.0])
      eager = Nx.LinAlg.triangular_solve(Nx.backend_copy(a, EXLA.Backend), b)
      jitted = EXLA.jit(&Nx.LinAlg.triangular_solve/2).(a, b)
      assert Nx.to_flat_list(eager) == [1.0, :nan, :nan]
      assert Nx.to_flat_list(jitted) == Nx.to_flat_list(eager)
    end
  end

  describe "inspect" do
    test "adds the backend line when configured" do
      t = Nx.tensor([1, 2, 3], type: :s64, backend: EXLA.Backend)
      Application.put_env(:exla, :add_backend_on_inspect, true)
      %{client_name: name, device_id: id} = t.data.buffer

      assert inspect(t) =~
               ~r/\A#Nx.Tensor<\n  s64\[3\]\n  EXLA.Backend<#{name}:#{id}, [\d.]+>\n  \[1, 2, 3\]\n>\z/

      Application.put_env(:exla, :add_backend_on_inspect, false)
      assert inspect(t) == "#Nx.Tensor<\n  s64[3]\n  [1, 2, 3]\n>"
    end

    test "respects the limit" do
      t = Nx.iota({100}, type: :s64, backend: EXLA.Backend)
      assert inspect(t, limit: 3) == "#Nx.Tensor<\n  s64[100]\n  [0, 1, 2, ...]\n>"
    end
  end
end
