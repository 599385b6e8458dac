defmodule EXLA.PointerTest do
  # Nx.to_pointer/2 and Nx.from_pointer/5 (Nx 0.12 and later) with
  # mode: :ipc: a host tensor shared with other operating-system processes
  # through POSIX shared memory (/dev/shm, Linux). A second BEAM, started
  # as a port, plays the other process.
  use ExUnit.Case, async: true

  @moduletag nx: :pointers?

  if EXLA.NxVersion.pointers?() do
    @shm "/dev/shm"

    defp object(%Nx.Pointer{handle: handle}), do: Path.join(@shm, handle)

    defp mode_bits(pointer), do: Bitwise.band(File.stat!(object(pointer)).mode, 0o7777)

    defp import_ipc(pointer, type, shape),
      do: Nx.from_pointer(EXLA.Backend, pointer, type, shape)

    # What the second process does: imports the handle it is given (a
    # 2x3 s32 tensor), prints its sum, exports two tensors of its own,
    # frees the first when told to, and ends when told to, the second
    # still alive.
    @child """
    [handle] = System.argv()
    {:ok, _} = Application.ensure_all_started(:exla)
    pointer = %Nx.Pointer{kind: :ipc, handle: handle, data_size: 24}
    imported = Nx.from_pointer(EXLA.Backend, pointer, :s32, {2, 3})
    IO.puts("sum " <> Integer.to_string(Nx.to_number(Nx.sum(imported))))
    own = Nx.tensor([1.5, 2.5], backend: EXLA.Backend)
    IO.puts("export " <> Nx.to_pointer(own, mode: :ipc).handle)
    kept = Nx.tensor([7], backend: EXLA.Backend)
    IO.puts("kept " <> Nx.to_pointer(kept, mode: :ipc).handle)
    # Alive when the VM halts, after this script.
    {:ok, _} = Agent.start(fn -> kept end)
    "free\\n" = IO.read(:line)
    Nx.backend_deallocate(own)
    IO.puts("freed")
    "exit\\n" = IO.read(:line)
    """

    # Runs `script` in a second BEAM: the same Elixir and Erlang as this
    # VM, with this build's applications. `prefix` runs it through another
    # command (setpriv).
    defp start_child(script, args, prefix \\ []) do
      elixir = Path.expand("../../bin/elixir", :code.lib_dir(:elixir))
      erts_bin = Path.join(:code.root_dir(), "bin")

      env = [
        {~c"ERL_LIBS", to_charlist(Path.dirname(:code.lib_dir(:exla)))},
        {~c"PATH", to_charlist(erts_bin <> ":" <> System.get_env("PATH", ""))}
      ]

      [program | rest] = prefix ++ [elixir]

      Port.open({:spawn_executable, System.find_executable(program) || program}, [
        :binary,
        :exit_status,
        {:line, 4096},
        args: rest ++ ["-e", script | args],
        env: env
      ])
    end

    defp line(port) do
      receive do
        {^port, {:data, {:eol, line}}} -> line
        {^port, {:exit_status, status}} -> flunk("the second process exited with #{status}")
      after
        60_000 -> flunk("no line from the second process")
      end
    end

    test "a tensor exported by one OS process is imported by another, both ways" do
      t = Nx.tensor([[1, 2, 3], [4, 5, 6]], type: :s32, backend: EXLA.Backend)
      pointer = Nx.to_pointer(t, mode: :ipc)

      assert %Nx.Pointer{kind: :ipc, address: nil, data_size: 24, handle: "exla:ipc:" <> _} =
               pointer

      port = start_child(@child, [pointer.handle])
      assert line(port) == "sum 21"

      "export " <> handle = line(port)
      "kept " <> kept = line(port)
      kept = %Nx.Pointer{kind: :ipc, handle: kept}
      on_exit(fn -> File.rm(object(kept)) end)
      theirs = %Nx.Pointer{kind: :ipc, handle: handle, data_size: 8}
      on_exit(fn -> File.rm(object(theirs)) end)
      imported = import_ipc(theirs, :f32, {2})
      assert Nx.to_flat_list(imported) == [1.5, 2.5]
      assert Nx.to_flat_list(Nx.multiply(imported, 2)) == [3.0, 5.0]

      # Freeing the exporter's tensor removes the name; a mapping made
      # before stays readable.
      Port.command(port, "free\n")
      assert line(port) == "freed"
      refute File.exists?(object(theirs))
      assert Nx.to_flat_list(imported) == [1.5, 2.5]

      assert_raise ArgumentError, ~r/no shared memory object for the IPC handle/, fn ->
        import_ipc(theirs, :f32, {2})
      end

      # A process that ends with exports alive unlinks them as it exits.
      assert File.exists?(object(kept))
      Port.command(port, "exit\n")
      assert_receive {^port, {:exit_status, 0}}, 60_000
      refute File.exists?(object(kept))
      assert Nx.to_flat_list(t) == [1, 2, 3, 4, 5, 6]
    end

    test "an import is a view of the shared memory, not a copy; the export is a copy" do
      t = Nx.tensor([1, 2, 3], type: :s32, backend: EXLA.Backend)
      pointer = Nx.to_pointer(t, mode: :ipc, permissions: 0o600)
      a = import_ipc(pointer, :s32, {3})
      b = import_ipc(pointer, :s32, {3})

      {:ok, file} = :file.open(object(pointer), [:read, :write, :binary])
      :ok = :file.pwrite(file, 4, <<99::32-native>>)
      :ok = :file.close(file)

      assert Nx.to_flat_list(a) == [1, 99, 3]
      assert Nx.to_flat_list(b) == [1, 99, 3]
      assert Nx.to_number(EXLA.jit(&Nx.sum/1).(a)) == 103
      assert Nx.to_flat_list(t) == [1, 2, 3]

      # An import's local pointer is the address of the mapping.
      assert %Nx.Pointer{kind: :local, data_size: 12} = Nx.to_pointer(a)
    end

    test "many processes import and compute on one handle at once" do
      t = Nx.iota({64, 64}, type: :f32, backend: EXLA.Backend)
      pointer = Nx.to_pointer(t, mode: :ipc)
      expected = Nx.to_number(Nx.sum(Nx.iota({64, 64}, type: :f32, backend: Nx.BinaryBackend)))

      sums =
        1..16
        |> Task.async_stream(fn _ ->
          Nx.to_number(Nx.sum(import_ipc(pointer, :f32, {64, 64})))
        end)
        |> Enum.map(fn {:ok, sum} -> sum end)

      assert sums == List.duplicate(expected, 16)
      # The export outlives the imports, as long as its tensor lives.
      assert File.exists?(object(pointer))
      assert Nx.to_number(Nx.sum(t)) == expected
    end

    test "the export lives until its tensor is freed: deallocated, donated or collected" do
      deallocated = Nx.tensor([1.0, 2.0], backend: EXLA.Backend)
      p1 = Nx.to_pointer(deallocated, mode: :ipc)
      assert File.exists?(object(p1))
      Nx.backend_deallocate(deallocated)
      refute File.exists?(object(p1))

      donated = Nx.tensor([1.0, 2.0], backend: EXLA.Backend)
      p2 = Nx.to_pointer(donated, mode: :ipc)
      assert Nx.to_flat_list(EXLA.jit(&Nx.add(&1, 1), donate: [0]).(donated)) == [2.0, 3.0]
      refute File.exists?(object(p2))

      # Exported by a process that then ends and drops its tensor.
      p3 =
        Task.async(fn -> Nx.to_pointer(Nx.tensor([1.0], backend: EXLA.Backend), mode: :ipc) end)
        |> Task.await()

      assert EXLA.TestWait.until(fn ->
               :erlang.garbage_collect()
               not File.exists?(object(p3))
             end)

      # A freed tensor exports nothing.
      assert_raise RuntimeError, ~r/deleted or donated/, fn ->
        Nx.to_pointer(deallocated, mode: :ipc)
      end
    end

    test ":permissions sets the object's mode bits exactly; 0o400 by default" do
      t = Nx.tensor([1, 2, 3], backend: EXLA.Backend)
      assert mode_bits(Nx.to_pointer(t, mode: :ipc)) == 0o400
      assert mode_bits(Nx.to_pointer(t, mode: :ipc, permissions: 0o600)) == 0o600
      assert mode_bits(Nx.to_pointer(t, mode: :ipc, permissions: 0o644)) == 0o644

      for bad <- [:not_an_int, -1, 0o10000, 1.0] do
        assert_raise ArgumentError, ~r/:permissions must be an integer in the range/, fn ->
          Nx.to_pointer(t, mode: :ipc, permissions: bad)
        end
      end

      assert_raise ArgumentError,
                   ~r/expected :mode to be one of :local, :ipc, got: :shared/,
                   fn ->
                     Nx.to_pointer(t, mode: :shared)
                   end

      assert_raise ArgumentError, ~r/unknown keys \[:bogus\]/, fn ->
        Nx.to_pointer(t, mode: :ipc, bogus: 1)
      end
    end

    test "bad pointers raise and lose nothing" do
      t = Nx.tensor([1.0, 2.0, 3.0], backend: EXLA.Backend)
      pointer = Nx.to_pointer(t, mode: :ipc)

      assert_raise ArgumentError,
                   ~r/no shared memory object for the IPC handle "exla:none"/,
                   fn ->
                     import_ipc(%Nx.Pointer{kind: :ipc, handle: "exla:none"}, :f32, {3})
                   end

      for handle <- ["", "/", ".", "/..", "../etc/passwd", "a/b", "//a", "a\0b"] do
        assert_raise ArgumentError, ~r/invalid IPC handle/, fn ->
          import_ipc(%Nx.Pointer{kind: :ipc, handle: handle}, :f32, {3})
        end
      end

      assert_raise ArgumentError,
                   ~r/the pointer holds 12 bytes, but \{:f, 64\} \{3\} takes 24/,
                   fn ->
                     import_ipc(pointer, :f64, {3})
                   end

      # Without a data_size, the object's own size is checked.
      assert_raise ArgumentError, ~r/holds 12 bytes, but the tensor takes 16/, fn ->
        import_ipc(%{pointer | data_size: nil}, :f32, {4})
      end

      assert_raise ArgumentError, ~r/expected a :local pointer with an address or an :ipc/, fn ->
        import_ipc(%Nx.Pointer{kind: :ipc, handle: nil}, :f32, {3})
      end

      assert_raise ArgumentError, ~r/invalid :device_id 5/, fn ->
        Nx.from_pointer({EXLA.Backend, device_id: 5}, pointer, :f32, {3})
      end

      # A leading slash, as shm_open(3) takes names, is the same name.
      slashed = %{pointer | handle: "/" <> pointer.handle}
      assert Nx.to_flat_list(import_ipc(slashed, :f32, {3})) == [1.0, 2.0, 3.0]

      # Nothing was lost: the tensor, its export and this VM go on.
      assert Nx.to_flat_list(import_ipc(pointer, :f32, {3})) == [1.0, 2.0, 3.0]
      assert Nx.to_flat_list(t) == [1.0, 2.0, 3.0]
    end

    test "every type round-trips, sub-byte ones one byte per element" do
      for type <- [:u8, :s16, :f32, :f64, :bf16, :c64] ++ small_types() do
        t = Nx.tensor([1, 0, 1], type: type, backend: Nx.BinaryBackend)
        exla = Nx.backend_transfer(t, EXLA.Backend)
        pointer = Nx.to_pointer(exla, mode: :ipc)
        {_, bits} = Nx.type(t)
        assert pointer.data_size == 3 * max(div(bits, 8), 1)
        back = import_ipc(pointer, Nx.type(t), {3})
        assert Nx.to_binary(back) == Nx.to_binary(t), inspect(type)
        assert Nx.to_binary(exla) == Nx.to_binary(t)
      end
    end

    if EXLA.NxVersion.small_types?() do
      # The device packs sub-byte integers; :ipc objects hold them a byte
      # each, large ones too (their export once read past the packed data).
      test "large sub-byte tensors round-trip through :ipc a byte per element" do
        n = 4_000_000

        for {type, bits} <- [s2: 2, s4: 4, u2: 2, u4: 4] do
          data = :crypto.strong_rand_bytes(div(n * bits, 8))
          t = Nx.bitwise_not(Nx.from_binary(data, type, backend: EXLA.Backend))
          pointer = Nx.to_pointer(t, mode: :ipc)
          assert pointer.data_size == n
          flipped = :crypto.exor(data, :binary.copy(<<255>>, byte_size(data)))
          assert Nx.to_binary(import_ipc(pointer, type, {n})) == flipped, inspect(type)
          # The export lives with the tensor.
          assert Nx.to_binary(t) == flipped
        end
      end

      # Memory at a :local address is the device's, packed; Nx.from_pointer/5
      # takes host memory, a byte per element, and copies it.
      test ":local refuses sub-byte tensors and imports them a byte per element" do
        for type <- small_types() do
          t = Nx.tensor([1, 0, 1], type: type, backend: EXLA.Backend)

          assert_raise ArgumentError, ~r/mode: :local does not support .* use mode: :ipc/, fn ->
            Nx.to_pointer(t, mode: :local)
          end
        end

        bytes = Nx.tensor([1, 0, 3, 2], type: :u8, backend: EXLA.Backend)
        pointer = Nx.to_pointer(bytes, mode: :local)

        for type <- small_types() do
          imported = Nx.from_pointer(EXLA.Backend, pointer, type, {4})
          assert Nx.to_flat_list(imported) == Nx.to_flat_list(Nx.tensor([1, 0, 3, 2], type: type))
        end

        # The address is valid while the tensor lives.
        assert Nx.to_flat_list(bytes) == [1, 0, 3, 2]
      end
    end

    defp small_types do
      if EXLA.NxVersion.small_types?(), do: [:s2, :s4, :u2, :u4], else: []
    end

    # The importer: reads the view, then tries to donate it.
    @read_only_child """
    [handle] = System.argv()
    {:ok, _} = Application.ensure_all_started(:exla)
    view = Nx.from_pointer(EXLA.Backend, %Nx.Pointer{kind: :ipc, handle: handle}, :f32, {2})
    IO.puts("read " <> inspect(Nx.to_flat_list(view)))

    try do
      EXLA.jit(&Nx.add(&1, 1), donate: [0]).(view)
      IO.puts("donated")
    rescue
      e in ArgumentError -> IO.puts("refused " <> Exception.message(e))
    end

    IO.puts("after " <> inspect(Nx.to_flat_list(view)))
    """

    # An object the importer may only read is mapped read-only, and donating
    # it would have the program write there. Root may write any object, so
    # as root the importer runs without capabilities (setpriv).
    test "an import the process may not write is read-only and never donated" do
      assert_never_donated(@read_only_child)
    end

    # Runs `script` on a read-only import of [1.0, 2.0]: it reads the view,
    # is refused its donation, and reads it again.
    defp assert_never_donated(script) do
      t = Nx.tensor([1.0, 2.0], backend: EXLA.Backend)
      pointer = Nx.to_pointer(t, mode: :ipc, permissions: 0o444)
      root? = String.trim(elem(System.cmd("id", ["-u"]), 0)) == "0"
      prefix = if root?, do: ["setpriv", "--bounding-set=-all", "--inh-caps=-all"], else: []
      port = start_child(script, [pointer.handle], prefix)

      assert line(port) == "read [1.0, 2.0]"
      assert line(port) =~ ~r/^refused argument 0 is a read-only view of shared memory/
      assert line(port) == "after [1.0, 2.0]"
      assert_receive {^port, {:exit_status, 0}}, 60_000
      assert Nx.to_flat_list(t) == [1.0, 2.0]
    end

    # The importer, on a client of two devices: runs a program of two
    # replicas that donates its argument, the view on device 0.
    @read_only_devices_child """
    [handle] = System.argv()
    :ok = Application.load(:exla)
    clients = Application.fetch_env!(:exla, :clients)
    Application.put_env(:exla, :clients, clients ++ [two: [platform: :host, device_count: 2]])
    {:ok, _} = Application.ensure_all_started(:exla)
    pointer = %Nx.Pointer{kind: :ipc, handle: handle}
    view = Nx.from_pointer({EXLA.Backend, client: :two}, pointer, :f32, {2})
    IO.puts("read " <> inspect(Nx.to_flat_list(view)))
    client = EXLA.Client.fetch!(:two)
    shape = EXLA.Shape.make_shape({:f, 32}, {2})

    mlir = ~s|module {
      func.func public @main(%a: tensor<2xf32> {tf.aliasing_output = 0 : i32}) -> tensor<2xf32> {
        %one = stablehlo.constant dense<1.0> : tensor<2xf32>
        %0 = stablehlo.add %a, %one : tensor<2xf32>
        return %0 : tensor<2xf32>
      }
    }|

    exe = EXLA.Executable.compile(client, mlir, num_replicas: 2, input_shapes: [shape])
    other = EXLA.DeviceBuffer.place_on_device(<<0::64>>, shape, client, 1)

    try do
      EXLA.Executable.run(exe, [[view.data.buffer], [other]], donate: [0])
      IO.puts("donated")
    rescue
      e in ArgumentError -> IO.puts("refused " <> Exception.message(e))
    end

    IO.puts("after " <> inspect(Nx.to_flat_list(view)))
    """

    # The same refusal on a run over several devices, which once donated
    # the view (it read as deleted afterwards).
    test "a read-only import is never donated to a run on several devices" do
      assert_never_donated(@read_only_devices_child)
    end
  end
end
