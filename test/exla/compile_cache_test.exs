defmodule EXLA.CompileCacheTest do
  # Changes the application's cache settings: runs alone.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog
  require Logger
  import Bitwise, only: [<<<: 2]

  alias EXLA.{CompileCache, DeviceBuffer, Executable, Shape}
  alias EXLA.Executable.Sealed

  @moduletag :tmp_dir

  setup %{tmp_dir: dir} do
    previous =
      for key <- [:cache_dir, :cache_max_size, :cache_min_compile_time, :scheduler_max_elements],
          do: {key, Application.fetch_env(:exla, key)}

    Application.put_env(:exla, :cache_dir, dir)
    Application.put_env(:exla, :cache_min_compile_time, 0)
    Application.delete_env(:exla, :cache_max_size)
    # These tests are about the disk: programs of other tests are forgotten.
    EXLA.CompileCache.Memory.clear()

    on_exit(fn ->
      for {key, value} <- previous do
        case value do
          {:ok, value} -> Application.put_env(:exla, key, value)
          :error -> Application.delete_env(:exla, key)
        end
      end
    end)

    {:ok, client: EXLA.Client.fetch!(:host), dir: dir}
  end

  # sin(x) + c on f32[4]: a distinct program for each `c`.
  defp program(c), do: EXLA.MLIR.Check.read!(program_text(c), 2 ** 40)

  defp program_text(c) do
    """
    module {
      func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {
        %0 = stablehlo.sine %x : tensor<4xf32>
        %1 = stablehlo.constant dense<#{c}> : tensor<4xf32>
        %2 = stablehlo.add %0, %1 : tensor<4xf32>
        return %2 : tensor<4xf32>
      }
    }
    """
  end

  @input for(v <- [0.5, 1.0, 2.0, -3.0], into: <<>>, do: <<v::float-32-native>>)

  defp run(exe) do
    [[out]] = Executable.run(exe, [[{@input, Shape.make_shape({:f, 32}, {4})}]])
    DeviceBuffer.read(out)
  end

  import Bitwise, only: [<<<: 2]

  defp expected(client, c), do: run(Executable.compile(client, program(c)))

  defp entries(dir), do: dir |> File.ls!() |> Enum.filter(&String.ends_with?(&1, ".exla"))

  defp entry!(dir) do
    assert [name] = entries(dir)
    Path.join(dir, name)
  end

  test "a program compiled once is loaded from disk afterwards", %{client: client, dir: dir} do
    assert {exe, :miss} = CompileCache.compile(client, program(1.0), [], true)
    path = entry!(dir)
    assert Path.basename(path) =~ ~r/^[0-9a-f]{64}\.exla$/

    assert {loaded, :hit} = CompileCache.compile(client, program(1.0), [], true)
    assert run(loaded) == run(exe)
    assert loaded.input_shapes == exe.input_shapes
    assert loaded.output_shapes == exe.output_shapes
    assert loaded.run_on == exe.run_on

    # Another program gets another file; nothing is left behind but entries.
    assert {_, :miss} = CompileCache.compile(client, program(2.0), [], true)
    assert length(entries(dir)) == 2
    assert File.ls!(dir) -- entries(dir) == []
  end

  test "a cached executable is placed by the policy of the VM that loads it", %{client: client} do
    assert {exe, :miss} = CompileCache.compile(client, program(1.0), [], true)
    assert exe.run_on == :scheduler

    # The policy changes (as in a new release, or a new configuration):
    # small programs no longer run on the caller's scheduler.
    Application.put_env(:exla, :scheduler_max_elements, 0)
    assert {loaded, :hit} = CompileCache.compile(client, program(1.0), [], true)
    assert loaded.facts == exe.facts
    assert loaded.run_on == :dirty
    assert run(loaded) == run(exe)

    # And so is a deserialized one.
    Application.delete_env(:exla, :scheduler_max_elements)
    assert Executable.deserialize(client, Executable.serialize(loaded)).run_on == :scheduler
  end

  test "cache: false and a cache turned off compile without the disk", %{client: client, dir: dir} do
    assert {_, :off} = CompileCache.compile(client, program(1.0), [], false)
    Application.put_env(:exla, :cache_dir, false)
    assert {_, :off} = CompileCache.compile(client, program(1.0), [], true)
    assert File.ls!(dir) == []
  end

  test "the key follows the program and the compile options", %{client: client, dir: dir} do
    assert {_, :miss} = CompileCache.compile(client, program(1.0), [], true)
    assert {_, :hit} = CompileCache.compile(client, program(1.0), [device_id: 0], true)
    assert {_, :miss} = CompileCache.compile(client, program(2.0), [], true)

    other_options = %{client | xla_options: [{"xla_cpu_use_xnnpack", {:bool, true}}]}
    assert {_, :miss} = CompileCache.compile(other_options, program(1.0), [], true)

    EXLA.TestClients.add(:compile_cache_two_devices, platform: :host, device_count: 2)
    two = EXLA.Client.fetch!(:compile_cache_two_devices)
    assert {_, :hit} = CompileCache.compile(two, program(1.0), [], true)
    assert {_, :miss} = CompileCache.compile(two, program(1.0), [num_replicas: 2], true)
    assert {_, :miss} = CompileCache.compile(two, program(1.0), [num_partitions: 2], true)
    assert length(entries(dir)) == 5
  end

  # Replaces the entry by `damage.(binary)`, then checks that the next
  # compile ignores it (with a warning), computes the right result, and
  # leaves a good entry that the one after loads.
  defp assert_replaced(client, dir, damage, warning) do
    path = entry!(dir)
    File.write!(path, damage.(File.read!(path)))

    log =
      capture_log(fn ->
        assert {exe, :miss} = CompileCache.compile(client, program(1.0), [], true)
        assert run(exe) == expected(client, 1.0)
      end)

    assert log =~ "EXLA's compile cache ignores #{path}"
    assert log =~ warning
    # one warning per damaged file: the cache's, which names it
    refute log =~ "integrity check failed"
    assert {_, :hit} = CompileCache.compile(client, program(1.0), [], true)
  end

  test "a damaged file is never run: warned about, compiled again and replaced",
       %{client: client, dir: dir} do
    {_, :miss} = CompileCache.compile(client, program(1.0), [], true)
    binary = File.read!(entry!(dir))
    size = byte_size(binary)

    # Every 5th byte of the header, 60 random positions, the checksum's ends.
    {:ok, meta, _blob} = Sealed.open(binary)
    header = 8 + 2 + 4 + byte_size(:erlang.term_to_binary(meta)) + 8
    :rand.seed(:exsss, {3, 1, 4})

    positions =
      Enum.take_every(0..(header - 1), 5) ++ for(_ <- 1..60, do: :rand.uniform(size) - 1)

    positions = positions ++ [size - 32, size - 1]

    for pos <- Enum.uniq(positions) do
      flip = fn bin ->
        <<before::binary-size(pos), byte, rest::binary>> = bin
        <<before::binary, Bitwise.bxor(byte, 0x5A), rest::binary>>
      end

      assert_replaced(client, dir, flip, ~r/damaged|format|not an executable|malformed/)
    end
  end

  @tag :slow
  test "a file damaged at any byte of its header is never run", %{client: client, dir: dir} do
    {_, :miss} = CompileCache.compile(client, program(1.0), [], true)
    binary = File.read!(entry!(dir))
    {:ok, meta, _blob} = Sealed.open(binary)
    header = 8 + 2 + 4 + byte_size(:erlang.term_to_binary(meta)) + 8

    for pos <- 0..(header - 1) do
      flip = fn bin ->
        <<before::binary-size(pos), byte, rest::binary>> = bin
        <<before::binary, Bitwise.bxor(byte, 0xFF), rest::binary>>
      end

      assert_replaced(client, dir, flip, ~r/damaged|format|not an executable/)
    end
  end

  test "a truncated or extended file is replaced", %{client: client, dir: dir} do
    {_, :miss} = CompileCache.compile(client, program(1.0), [], true)
    size = byte_size(File.read!(entry!(dir)))

    for keep <- [0, 1, 10, 60, div(size, 2), size - 33, size - 1] do
      truncate = fn bin -> binary_part(bin, 0, keep) end
      assert_replaced(client, dir, truncate, ~r/damaged|not an executable/)
    end

    assert_replaced(client, dir, &(&1 <> "x"), "damaged")
  end

  test "a file made for another plugin, device or CPU is replaced", %{client: client, dir: dir} do
    {_, :miss} = CompileCache.compile(client, program(1.0), [], true)

    for change <- [
          plugin: String.duplicate("ab", 32),
          # no plugin has this version (lammps-jax-pjrt-cpu has 0.115)
          api_version: {0, 1},
          platform: {"cuda", "12.3"},
          device_kind: "NVIDIA H100",
          cpu: String.duplicate("0", 64)
        ] do
      reseal = fn bin ->
        {:ok, meta, blob} = Sealed.open(bin)
        Sealed.seal(%{meta | target: Map.merge(meta.target, Map.new([change]))}, blob)
      end

      assert_replaced(client, dir, reseal, "another target")
    end
  end

  test "a file of an older format is replaced", %{client: client, dir: dir} do
    {_, :miss} = CompileCache.compile(client, program(1.0), [], true)

    # The same layout under version 2, with a valid checksum.
    old_format = fn bin ->
      {:ok, meta, blob} = Sealed.open(bin)
      meta = :erlang.term_to_binary(Map.delete(meta, :target))
      body = ["EXLA_EXE", <<2::16, byte_size(meta)::32>>, meta, <<byte_size(blob)::64>>, blob]
      IO.iodata_to_binary([body, :crypto.hash(:sha256, body)])
    end

    assert_replaced(client, dir, old_format, "format 2")
  end

  test "a file holding another program is replaced", %{client: client, dir: dir} do
    {_, :miss} = CompileCache.compile(client, program(1.0), [], true)
    other = Path.join(dir, "other.bin")
    {_, :miss} = CompileCache.compile(client, program(2.0), [], other)
    assert_replaced(client, dir, fn _ -> File.read!(other) end, "holds another program")
  end

  test "cache: path keeps one program in that file", %{client: client, dir: dir} do
    path = Path.join([dir, "nested", "step.exla"])
    assert {_, :miss} = CompileCache.compile(client, program(1.0), [], path)
    assert {exe, :hit} = CompileCache.compile(client, program(1.0), [], path)
    assert run(exe) == expected(client, 1.0)

    # Another program in the same file (as EXLA.stream/3 gives it, with no
    # reader of its own): warned about and replaced.
    log =
      capture_log(fn ->
        assert {exe, :miss} = CompileCache.compile(client, program(3.0), [], path)
        assert run(exe) == expected(client, 3.0)
      end)

    assert log =~ "holds another program"
    assert {_, :hit} = CompileCache.compile(client, program(3.0), [], path)
    assert File.ls!(Path.join(dir, "nested")) == ["step.exla"]
  end

  test "cache: path is written whatever the compile time", %{client: client, dir: dir} do
    Application.put_env(:exla, :cache_min_compile_time, 3_600_000)
    path = Path.join(dir, "one.exla")
    assert {_, :miss} = CompileCache.compile(client, program(1.0), [], path)
    assert File.exists?(path)
  end

  test "programs compiled faster than the threshold are not written",
       %{client: client, dir: dir} do
    Application.put_env(:exla, :cache_min_compile_time, 3_600_000)
    assert {_, :miss} = CompileCache.compile(client, program(1.0), [], true)
    assert {_, :miss} = CompileCache.compile(client, program(1.0), [], true)
    assert entries(dir) == []

    # A file that was there but could not be used is replaced all the same.
    Application.put_env(:exla, :cache_min_compile_time, 0)
    {_, :miss} = CompileCache.compile(client, program(1.0), [], true)
    Application.put_env(:exla, :cache_min_compile_time, 3_600_000)
    assert_replaced(client, dir, &binary_part(&1, 0, 20), "not an executable")
  end

  test "the least recently used programs are evicted past the size cap",
       %{client: client, dir: dir} do
    # The file each program's compilation writes.
    new_entry = fn c ->
      before = entries(dir)
      {_, :miss} = CompileCache.compile(client, program(c), [], true)
      Enum.map(entries(dir) -- before, &Path.join(dir, &1))
    end

    [one] = new_entry.(1.0)
    [two] = new_entry.(2.0)
    path = %{1.0 => one, 2.0 => two}
    size = File.stat!(path[1.0]).size

    # Program 1 is the oldest, then 2; a hit makes 1 the most recent.
    File.touch!(path[1.0], 1_000_000)
    File.touch!(path[2.0], 2_000_000)
    assert {_, :hit} = CompileCache.compile(client, program(1.0), [], true)

    # Room for two: the third evicts 2, the least recently used.
    Application.put_env(:exla, :cache_max_size, 2 * size + div(size, 2))
    [three] = new_entry.(3.0)
    assert File.exists?(path[1.0])
    refute File.exists?(path[2.0])
    assert File.exists?(three)
    # Mtimes are in seconds, so files written in the same second tie; 1 is
    # made the older one of 1 and 3 explicitly.
    File.touch!(path[1.0], 3_000_000)
    File.touch!(three, 4_000_000)
    assert {_, :miss} = CompileCache.compile(client, program(2.0), [], true)
    assert File.exists?(path[2.0])
    refute File.exists?(path[1.0])
    assert length(entries(dir)) == 2

    # The file just written is never the one evicted, even when its time
    # ties with the others' or is older (here they are an hour ahead).
    later = System.os_time(:second) + 3600
    for file <- [path[2.0], three], do: File.touch!(file, later)
    [again] = new_entry.(1.0)
    assert File.exists?(again)
    assert length(entries(dir)) == 2

    # A program larger than the whole cap is not written.
    Application.put_env(:exla, :cache_max_size, div(size, 2))
    assert new_entry.(4.0) == []
  end

  test "a write scans the directory only when it may be over the limit, or every 64 writes",
       %{dir: dir} do
    alias EXLA.CompileCache.Usage
    # Never scanned by this VM: scan.
    assert Usage.written?(dir, 10, 100)
    Usage.scanned(dir, 50)
    refute Usage.written?(dir, 10, 100)
    # 50 + 10 + 41 > 100
    assert Usage.written?(dir, 41, 100)
    Usage.scanned(dir, 0)
    for _ <- 1..63, do: refute(Usage.written?(dir, 1, 100))
    assert Usage.written?(dir, 1, 100)
  end

  test "first scans of a directory finishing at once leave one consistent count", %{dir: dir} do
    alias EXLA.CompileCache.Usage
    dir = Path.join(dir, "concurrent")

    1..16
    |> Task.async_stream(fn i -> Usage.scanned(dir, 60 + i) end, max_concurrency: 16)
    |> Stream.run()

    # Each scan reset the writes since; the kept total is one of theirs,
    # and every later write counts into it.
    refute Usage.written?(dir, 1, 100)
    assert Usage.written?(dir, 40, 100)
  end

  test "trimming removes temporary files left over by dead writers", %{dir: dir} do
    stale = Path.join(dir, ".tmp-1-1")
    fresh = Path.join(dir, ".tmp-1-2")
    File.write!(stale, "half a file")
    File.write!(fresh, "being written")
    File.touch!(stale, System.os_time(:second) - 7200)
    CompileCache.trim(dir, 1 <<< 30)
    refute File.exists?(stale)
    assert File.exists?(fresh)
  end

  test "an unwritable directory only costs a warning", %{client: client, dir: dir} do
    blocked = Path.join(dir, "file")
    File.write!(blocked, "")
    Application.put_env(:exla, :cache_dir, Path.join(blocked, "cache"))

    log =
      capture_log(fn ->
        assert {exe, :miss} = CompileCache.compile(client, program(1.0), [], true)
        assert run(exe) == expected(client, 1.0)
      end)

    assert log =~ "EXLA's compile cache could not write"
  end

  test "the settings are checked", %{client: client, dir: dir} do
    for {key, value} <- [cache_dir: 1, cache_max_size: -1, cache_min_compile_time: 0.5] do
      Application.put_env(:exla, key, value)

      assert_raise ArgumentError, ~r/expected #{inspect(key)} of :exla/, fn ->
        CompileCache.compile(client, program(1.0), [], true)
      end

      Application.put_env(:exla, :cache_dir, dir)
      Application.delete_env(:exla, :cache_max_size)
      Application.put_env(:exla, :cache_min_compile_time, 0)
      File.rm_rf!(dir)
    end
  end

  describe "limits from the environment" do
    alias EXLA.CompileCache.Config
    import EXLA.TestEnv, only: [with_env: 3]

    test "EXLA_CACHE_MAX_SIZE takes bytes or K, M, G, T; the config wins over it" do
      for {value, bytes} <- [{"1000", 1000}, {"512M", 512 <<< 20}, {" 2g ", 2 <<< 30}, {"0", 0}] do
        with_env("EXLA_CACHE_MAX_SIZE", value, fn -> assert Config.max_size() == bytes end)
      end

      with_env("EXLA_CACHE_MAX_SIZE", "5K", fn ->
        Application.put_env(:exla, :cache_max_size, 7)
        assert Config.max_size() == 7
      end)
    end

    test "EXLA_CACHE_MIN_COMPILE_TIME takes milliseconds; the config wins over it" do
      Application.delete_env(:exla, :cache_min_compile_time)

      with_env("EXLA_CACHE_MIN_COMPILE_TIME", "250", fn ->
        assert Config.min_compile_time() == 250
      end)

      Application.put_env(:exla, :cache_min_compile_time, 0)

      with_env("EXLA_CACHE_MIN_COMPILE_TIME", "250", fn ->
        assert Config.min_compile_time() == 0
      end)
    end

    test "an empty variable counts as unset" do
      Application.delete_env(:exla, :cache_min_compile_time)
      Application.delete_env(:exla, :cache_max_size)

      with_env("EXLA_CACHE_MIN_COMPILE_TIME", "", fn ->
        with_env("EXLA_CACHE_MAX_SIZE", "", fn ->
          assert Config.min_compile_time() == 100
          assert Config.max_size() == 1 <<< 30
        end)
      end)
    end

    test "bad values raise, naming the variable", %{client: client} do
      for {name, value} <- [
            {"EXLA_CACHE_MAX_SIZE", "-1"},
            {"EXLA_CACHE_MAX_SIZE", "12Q"},
            {"EXLA_CACHE_MAX_SIZE", "lots"},
            {"EXLA_CACHE_MIN_COMPILE_TIME", "0.5"},
            {"EXLA_CACHE_MIN_COMPILE_TIME", "soon"}
          ] do
        # The size is read when a program is written: every one is.
        if name == "EXLA_CACHE_MAX_SIZE",
          do: Application.put_env(:exla, :cache_min_compile_time, 0),
          else: Application.delete_env(:exla, :cache_min_compile_time)

        with_env(name, value, fn ->
          assert_raise ArgumentError, ~r/environment variable #{name} to be/, fn ->
            CompileCache.compile(client, program(3.0), [], true)
          end
        end)
      end
    end
  end

  defp same?(a, b), do: Nx.to_binary(a) == Nx.to_binary(b) and a.shape == b.shape

  describe "through EXLA.jit" do
    setup do
      ref =
        :telemetry_test.attach_event_handlers(self(), [
          [:exla, :compilation],
          [:exla, :compilation, :details]
        ])

      on_exit(fn -> :telemetry.detach(ref) end)
      {:ok, ref: ref}
    end

    test "telemetry tells where the executable came from", %{ref: ref, dir: dir} do
      x = Nx.tensor([1.0, 2.0, 3.0])
      first = EXLA.jit(fn x -> Nx.exp(Nx.cos(x)) end)
      # Another function (another in-memory key) for the same program.
      second = EXLA.jit(fn x -> Nx.exp(Nx.cos(x)) end)

      # The eager ops are two programs, which a GPU may round differently
      # from the one fused kernel; every executable of the program gives its bits.
      expected = first.(x)
      # On the host, so that no other program reaches the cache.
      [got, x_host] = Enum.map([expected, x], &Nx.backend_copy(&1, Nx.BinaryBackend))
      assert Nx.to_number(Nx.all_close(got, Nx.exp(Nx.cos(x_host)))) == 1
      assert_received {[:exla, :compilation, :details], ^ref, _, %{disk_cache: :miss}}
      assert [_] = entries(dir)

      # The same program again in this VM: its executable, without looking on disk.
      assert same?(second.(x), expected)
      assert_received {[:exla, :compilation, :details], ^ref, m, %{disk_cache: :memory}}
      assert m.xla_compile_time == 0 and m.cache_load_time == 0

      EXLA.CompileCache.Memory.clear()
      assert same?(EXLA.jit(fn x -> Nx.exp(Nx.cos(x)) end).(x), expected)
      assert_received {[:exla, :compilation, :details], ^ref, _, %{disk_cache: :hit}}

      EXLA.jit(fn x -> Nx.exp(Nx.cos(x)) end, cache: false).(x)
      assert_received {[:exla, :compilation, :details], ^ref, _, %{disk_cache: :off}}
    end

    test "cache: a path", %{ref: ref, dir: dir} do
      path = Path.join(dir, "fun.exla")
      x = Nx.tensor([1.0, 2.0])
      assert same?(EXLA.jit(&Nx.multiply(&1, 3), cache: path).(x), Nx.multiply(x, 3))
      assert_received {[:exla, :compilation, :details], ^ref, _, %{disk_cache: :miss}}
      assert File.exists?(path)

      assert same?(EXLA.jit(&Nx.multiply(3, &1), cache: path).(x), Nx.multiply(x, 3))
      assert_received {[:exla, :compilation, :details], ^ref, _, %{disk_cache: :hit}}

      for bad <- [:yes, "", 1] do
        assert_raise ArgumentError, ~r/expected :cache to be true, false or a file path/, fn ->
          EXLA.jit(&Nx.negate/1, cache: bad).(x)
        end
      end
    end

    test "cache: a path with debug: true logs EXLA's lines for the file", %{dir: dir} do
      level = Logger.level()
      Logger.configure(level: :debug)
      on_exit(fn -> Logger.configure(level: level) end)
      path = Path.join(dir, "debugged.exla")
      x = Nx.tensor([1.0, 2.0])
      run = fn fun -> capture_log([level: :debug], fn -> fun.(x) end) end

      log = run.(EXLA.jit(&Nx.subtract(&1, 7), cache: path, debug: true))
      assert log =~ "EXLA disk cache not found at #{inspect(path)}"
      refute log =~ "EXLA disk cache found"

      log = run.(EXLA.jit(&Nx.subtract(&1, 7), cache: path, debug: true))
      assert log =~ "EXLA disk cache found at #{inspect(path)}"
      assert log =~ "(loaded from the disk cache)"

      # Without debug: true, nothing of the sort.
      log = run.(EXLA.jit(&Nx.subtract(&1, 7), cache: path))
      refute log =~ "EXLA disk cache"
    end

    test "programs with hooks run their hooks when loaded", %{ref: ref} do
      parent = self()
      x = Nx.tensor([1.0, 4.0])

      send_it = &send(parent, {:seen, &1})
      # Two functions (two in-memory keys) for the same program.
      first = EXLA.jit(fn x -> x |> Nx.sqrt() |> Nx.Defn.Kernel.hook(send_it) end)
      second = EXLA.jit(fn x -> x |> Nx.sqrt() |> Nx.Defn.Kernel.hook(send_it) end)

      assert same?(first.(x), Nx.sqrt(x))
      assert_received {[:exla, :compilation, :details], ^ref, _, %{disk_cache: :miss}}
      assert_receive {:seen, seen}
      assert same?(seen, Nx.sqrt(x))

      EXLA.CompileCache.Memory.clear()
      assert same?(second.(x), Nx.sqrt(x))
      assert_received {[:exla, :compilation, :details], ^ref, _, %{disk_cache: :hit}}
      assert_receive {:seen, again}
      assert same?(again, seen)
    end
  end

  describe "EXLA.Plugin.fingerprint/1" do
    alias EXLA.Plugin.Fingerprint

    test "is the file's sha256, remembered per file version", %{dir: dir} do
      path = Path.join(dir, "plugin.so")
      File.write!(path, :crypto.strong_rand_bytes(3_000_000))
      sha256 = EXLA.Plugin.sha256_file(path)
      assert Fingerprint.compute(path, dir) == sha256
      assert [memo] = File.ls!(Path.join(dir, "fingerprints"))

      # The memo is what later VMs read.
      memo = Path.join([dir, "fingerprints", memo])
      [sample, ^sha256] = memo |> File.read!() |> String.split("\n", trim: true)
      File.write!(memo, sample <> "\n" <> "remembered\n")
      assert Fingerprint.compute(path, dir) == "remembered"

      # Changed in place, same size: the memo no longer applies.
      {:ok, file} = :file.open(path, [:read, :write, :raw, :binary])
      :ok = :file.pwrite(file, 100, "changed")
      :ok = :file.close(file)
      assert Fingerprint.compute(path, dir) == EXLA.Plugin.sha256_file(path)
    end
  end

  describe "two VMs at once" do
    @describetag :peers

    test "compiling the same program into one directory leaves one whole file",
         %{client: client, dir: dir} do
      mlir = mlp_step()
      peers = for _ <- 1..2, do: start_peer(dir)

      results =
        peers
        |> Enum.map(fn peer -> Task.async(fn -> compile_in(peer, mlir, true) end) end)
        |> Task.await_many(:infinity)

      assert [{status1, result}, {status2, result}] = results
      assert status1 in [:miss, :hit] and status2 in [:miss, :hit]
      assert [_] = entries(dir)
      assert File.ls!(dir) -- entries(dir) == []

      assert {:hit, ^result} = compile_and_run(mlir, true)
      _ = client
    end

    test "a reader sees no file or a whole one while two VMs rewrite it",
         %{dir: dir} do
      path = Path.join(dir, "shared.exla")
      peers = for _ <- 1..2, do: start_peer(dir)

      writers =
        for {peer, i} <- Enum.with_index(peers) do
          # Each writer alternates programs, so every write replaces the file.
          Task.async(fn ->
            for round <- 1..15, do: compile_in(peer, program_text(7.0 + rem(round + i, 2)), path)
          end)
        end

      reads = read_until_done(path, writers, [])
      assert Enum.all?(reads, &(&1 in [:absent, :whole])), inspect(Enum.frequencies(reads))
      assert :whole in reads
      assert {:ok, _meta, _blob} = Sealed.open(File.read!(path))
      assert File.ls!(dir) == ["shared.exla"]
    end
  end

  # Reads `path` until every writer is done: :absent, :whole or :broken.
  defp read_until_done(_path, [], reads), do: reads

  defp read_until_done(path, writers, reads) do
    read =
      case File.read(path) do
        {:ok, binary} -> if match?({:ok, _, _}, Sealed.open(binary)), do: :whole, else: :broken
        {:error, :enoent} -> :absent
      end

    writers = Enum.reject(writers, &Task.yield(&1, 0))
    read_until_done(path, writers, [read | reads])
  end

  # A VM in another operating-system process, with this VM's code and the
  # cache in `dir`.
  defp start_peer(dir) do
    paths = Enum.flat_map(:code.get_path(), &[~c"-pa", &1])
    {:ok, peer, _node} = :peer.start_link(%{connection: :standard_io, args: paths})
    :peer.call(peer, Application, :put_env, [:exla, :cache_dir, dir])
    :peer.call(peer, Application, :put_env, [:exla, :cache_min_compile_time, 0])
    :peer.call(peer, Application, :put_env, [:logger, :level, :error])
    {:ok, _} = :peer.call(peer, Application, :ensure_all_started, [:exla])
    # Linked to the test process, the peer may be gone or still stopping
    # when this runs: stop it if it is there.
    on_exit(fn ->
      try do
        :peer.stop(peer)
      catch
        :exit, _ -> :ok
      end
    end)

    peer
  end

  defp compile_in(peer, mlir, cache) do
    :peer.call(peer, EXLA.CompileCachePeer, :compile_and_run, [mlir, cache], :infinity)
  end

  defp compile_and_run(mlir, cache), do: EXLA.CompileCachePeer.compile_and_run(mlir, cache)

  # A training step of a small MLP: compiles in a few hundred
  # milliseconds, long enough for two VMs to overlap.
  defp mlp_step do
    loss = fn {w1, w2}, x ->
      x |> Nx.dot(w1) |> Nx.max(0) |> Nx.dot(w2) |> Nx.logsumexp(axes: [1]) |> Nx.sum()
    end

    step = fn w1, w2, x ->
      {g1, g2} = Nx.Defn.grad({w1, w2}, &loss.(&1, x))
      {Nx.subtract(w1, Nx.multiply(g1, 0.01)), Nx.subtract(w2, Nx.multiply(g2, 0.01))}
    end

    args = [
      Nx.template({784, 256}, :f32),
      Nx.template({256, 10}, :f32),
      Nx.template({64, 784}, :f32)
    ]

    EXLA.to_mlir_module(step, args).mlir_module
  end
end
