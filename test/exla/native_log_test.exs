defmodule EXLA.NativeLogTest do
  # Changes the native log level and Logger's level, which are global.
  use ExUnit.Case, async: false

  # Streams exist on Nx 0.7 only (Nx 0.10 removed them); these tests are
  # excluded on the other lines, where the calls below are undefined.
  @compile {:no_warn_undefined, [{EXLA, :stream, 2}, {EXLA, :stream, 3}, Nx.Stream]}

  import ExUnit.CaptureLog

  # Keeps the logged events off the console (printed only on failure).
  @moduletag :capture_log

  alias EXLA.NativeLog

  doctest EXLA.NativeLog

  # An Erlang :logger handler that sends every event to the test process,
  # to check levels and metadata exactly.
  defmodule Handler do
    def log(event, %{config: %{pid: pid}}), do: send(pid, {:logged, event})
  end

  @handler :exla_native_log_test

  setup_all do
    # The default client exists, and its plugin's warm-up (compiles in the
    # background, EXLA.Client.WarmUp) has ended, before any test counts
    # events.
    EXLA.Client.fetch!(:host)
    :ok = EXLA.Client.WarmUp.await(30_000)
  end

  setup do
    level = Logger.level()
    Logger.configure(level: :debug)
    :ok = :logger.add_handler(@handler, Handler, %{config: %{pid: self()}, level: :all})

    on_exit(fn ->
      :logger.remove_handler(@handler)
      NativeLog.put_level(:warning)
      NativeLog.flush()
      Logger.configure(level: level)
    end)

    NativeLog.flush()
    drain_logged()
    :ok
  end

  defp drain_logged do
    receive do
      {:logged, _} -> drain_logged()
    after
      0 -> :ok
    end
  end

  # The native events logged so far, as {level, target, message, metadata}.
  defp native_events do
    NativeLog.flush()
    collect()
  end

  defp collect do
    receive do
      {:logged, %{level: level, msg: msg, meta: %{exla_target: target} = meta}} ->
        [{level, target, message(msg), meta} | collect()]

      {:logged, _other} ->
        collect()
    after
      0 -> []
    end
  end

  defp message({:string, text}), do: IO.chardata_to_string(text)

  defp message({format, args}) when is_list(args),
    do: format |> :io_lib.format(args) |> to_string()

  defp message(other), do: inspect(other)

  defp events_of(target), do: Enum.filter(native_events(), &(elem(&1, 1) == target))

  # Waits for an event of `target` emitted on another thread.
  # (Reading the events takes them from the mailbox: keep what is found.)
  defp await_event(target) do
    EXLA.TestWait.until(fn -> non_empty(events_of(target)) end, 100, 20) || []
  end

  defp non_empty([]), do: nil
  defp non_empty(events), do: events

  defp plugin_path, do: EXLA.Client.fetch!(:host).plugin_path

  test "loading a plugin reports its path and API version at the info level" do
    # The API version the client of the same plugin reports.
    client = EXLA.Client.fetch!(:host)
    %{api_major: major, api_minor: minor} = EXLA.NIF.unwrap!(EXLA.NIF.client_info(client.ref))
    NativeLog.put_level(:info)
    assert {:ok, _plugin} = EXLA.NIF.plugin_load(plugin_path())

    assert [{:info, "exla::plugin", text, meta}] = native_events()
    assert text =~ "[exla::plugin] loaded a PJRT plugin (path: #{plugin_path()}"
    assert %{path: path, api_major: ^major, api_minor: ^minor, duration_ms: ms} = meta
    assert path == plugin_path() and is_float(ms) and ms >= 0
  end

  test "creating a client reports its platform and devices" do
    EXLA.TestClients.add(:native_log_test_client, platform: :host, device_count: 2)
    NativeLog.put_level(:info)
    EXLA.Client.fetch!(:native_log_test_client)

    assert [{:info, "exla::client", text, meta}] = events_of("exla::client")
    assert text =~ "[exla::client] created a PJRT client (platform: cpu"
    assert %{platform: "cpu", devices: 2, duration_ms: ms} = meta
    assert is_float(ms)
  end

  test "compiling and loading a serialized executable report their durations" do
    NativeLog.put_level(:info)
    fun = fn x -> Nx.multiply(x, 3) end
    x = Nx.tensor([1.0, 2.0])
    EXLA.jit(fun).(x)

    assert [{:info, "exla::compile", text, meta}] = native_events()
    assert text =~ "[exla::compile] compiled a program (device: 0"
    assert %{device: 0, mlir_bytes: bytes, duration_ms: ms} = meta
    assert bytes > 0 and is_float(ms) and ms > 0

    client = EXLA.Client.fetch!(:host)
    %{mlir_module: mlir} = EXLA.to_mlir_module(fun, [x])
    serialized = client |> EXLA.Executable.compile(mlir) |> EXLA.Executable.serialize()
    EXLA.Executable.deserialize(client, serialized)

    assert [{:info, _, _, _}, {:info, "exla::compile", text, meta}] = native_events()
    assert text =~ "loaded a serialized executable"
    assert %{bytes: bytes, duration_ms: _} = meta
    assert bytes > 0
  end

  @tag nx: :streams?
  test "a failing host callback is a warning with its site and error" do
    stream = EXLA.stream(fn x, acc -> {x, Nx.add(acc, x)} end, [0.0, 0.0])
    # The program expects an f32 (4 bytes) per chunk.
    EXLA.HostCallback.push!(stream.run, [<<1, 2>>])

    assert [{:warning, "exla::callback", text, meta}] = await_event("exla::callback")
    assert text =~ "[exla::callback] host callback failed"
    assert %{site: site, error: error} = meta
    assert is_integer(site)
    assert error =~ "a stream chunk tensor has 2 bytes, the program expects 4"
    EXLA.HostCallback.close(stream.run)
  end

  @tag :tmp_dir
  test "a plugin file that fails its checks is an integrity failure", %{tmp_dir: dir} do
    truncated = Path.join(dir, "truncated_plugin.so")
    File.write!(truncated, binary_part(File.read!(plugin_path()), 0, 4096))
    assert {:error, {_, message}} = EXLA.NIF.plugin_load(truncated)

    assert [{:warning, "exla::integrity", text, meta}] = native_events()
    assert text =~ "[exla::integrity] integrity check failed (subject: plugin file"
    assert %{subject: "plugin file", path: ^truncated, reason: reason} = meta
    assert message =~ reason
  end

  test "a missing plugin file is no integrity failure (debug only)" do
    NativeLog.put_level(:debug)
    assert {:error, _} = EXLA.NIF.plugin_load("/nonexistent/exla/plugin.so")
    assert [{:debug, "exla::plugin", text, %{error: error}}] = native_events()
    assert text =~ "could not load a PJRT plugin" and error =~ "No such file"
  end

  test "integrity_failure/3 logs Elixir's failures in the native shape" do
    NativeLog.integrity_failure("cache file", "checksum mismatch", path: "/tmp/a.bin")

    assert [{:warning, "exla::integrity", text, meta}] = collect()

    assert text ==
             "[exla::integrity] integrity check failed " <>
               "(subject: cache file, path: /tmp/a.bin, reason: checksum mismatch)"

    assert %{subject: "cache file", path: "/tmp/a.bin", reason: "checksum mismatch"} = meta
  end

  test "a damaged serialized executable is an integrity failure" do
    client = EXLA.Client.fetch!(:host)
    %{mlir_module: mlir} = EXLA.to_mlir_module(&Nx.negate/1, [Nx.template({2}, :f32)])
    serialized = client |> EXLA.Executable.compile(mlir) |> EXLA.Executable.serialize()
    <<head::binary-size(100), byte, rest::binary>> = serialized
    damaged = <<head::binary, Bitwise.bxor(byte, 1), rest::binary>>

    assert_raise ArgumentError, ~r/damaged/, fn ->
      EXLA.Executable.deserialize(client, damaged)
    end

    assert [{:warning, "exla::integrity", _, meta}] = collect()
    assert %{subject: "serialized executable", reason: "its checksum does not match"} = meta
  end

  test "a damaged binary is reported by whoever raises, not by load_binary/3" do
    client = EXLA.Client.fetch!(:host)
    %{mlir_module: mlir} = EXLA.to_mlir_module(&Nx.negate/1, [Nx.template({2}, :f32)])
    serialized = client |> EXLA.Executable.compile(mlir) |> EXLA.Executable.serialize()
    <<head::binary-size(100), byte, rest::binary>> = serialized
    damaged = <<head::binary, Bitwise.bxor(byte, 1), rest::binary>>

    # load_binary/3's caller has the error and reports it (the compile cache warns
    # naming its file): one warning per damaged file, not two
    assert {:error, message} = EXLA.Executable.load_binary(client, damaged)
    assert message =~ "damaged"
    assert collect() == []

    assert_raise ArgumentError, ~r/damaged/, fn ->
      EXLA.Executable.Serialized.load_sealed(client, damaged)
    end

    assert [{:warning, "exla::integrity", _, meta}] = collect()
    assert %{subject: "serialized executable", reason: "its checksum does not match"} = meta
  end

  test "runs are traced once per call at the trace level only" do
    x = Nx.tensor([1.0, 2.0])
    add = EXLA.jit(&Nx.add(&1, 1))
    add.(x)
    NativeLog.put_level(:debug)
    add.(x)
    assert native_events() == []

    NativeLog.put_level(:trace)
    add.(x)
    assert [{:debug, "exla::run", text, meta}] = native_events()
    assert text == "[exla::run] ran a program (arguments: 1, donated: 0, outputs: 1)"
    assert %{arguments: 1, donated: 0, outputs: 1} = meta
  end

  # native_log_emit/2 is in fault-injection builds only.
  @tag :fault_injection
  test "levels map to Logger's; trace is logged as debug" do
    NativeLog.put_level(:trace)
    for level <- 1..5, do: EXLA.NIF.native_log_emit(level, 1)

    assert Enum.map(native_events(), &elem(&1, 0)) == [:error, :warning, :info, :debug, :debug]

    NativeLog.put_level(:warning)
    for level <- 1..5, do: EXLA.NIF.native_log_emit(level, 1)
    assert Enum.map(native_events(), &elem(&1, 0)) == [:error, :warning]

    NativeLog.put_level(:off)
    for level <- 1..5, do: EXLA.NIF.native_log_emit(level, 1)
    assert native_events() == []
  end

  test "nothing is logged at the default level for info events" do
    assert NativeLog.level() == :warning
    EXLA.TestClients.add(:native_log_quiet_client, platform: :host)

    logs =
      capture_log([level: :debug], fn ->
        EXLA.Client.fetch!(:native_log_quiet_client)
        EXLA.jit(fn x -> Nx.subtract(x, 7) end).(Nx.tensor([1.0]))
        NativeLog.flush()
      end)

    refute logs =~ "exla::"
    assert native_events() == []
  end

  test "events reach CaptureLog with the level raised" do
    NativeLog.put_level(:info)

    logs =
      capture_log([level: :info], fn ->
        EXLA.jit(fn x -> Nx.subtract(x, 8) end).(Nx.tensor([1.0]))
        NativeLog.flush()
      end)

    assert logs =~ "[info]"
    assert logs =~ ~r/\[exla::compile\] compiled a program \(device: 0, mlir_bytes: \d+/
  end

  # native_log_emit/2 is in fault-injection builds only.
  @tag :fault_injection
  test "a slow receiver makes events drop, never the emitting thread wait" do
    dropped = NativeLog.dropped()
    :sys.suspend(NativeLog)

    try do
      # 1,500 warnings into a queue of 1,024 while nobody takes them.
      EXLA.NIF.native_log_emit(2, 1500)
      assert NativeLog.dropped() == dropped + 476
    after
      :sys.resume(NativeLog)
    end

    logs = capture_log([level: :warning], fn -> NativeLog.flush() end)
    assert logs =~ "EXLA dropped 476 native log event(s)"
    events = collect()
    assert length(events) == 1024
    assert {:warning, "exla::test", "[exla::test] test event (index: 0)", _} = hd(events)
  end

  test "put_level/1 validates the level" do
    assert_raise ArgumentError, ~r/expected the native log level to be one of/, fn ->
      NativeLog.put_level(:verbose)
    end
  end

  describe "plugin logs" do
    test "the user's variables win over :plugin_log_level, and empty ones count as unset" do
      assert NativeLog.plugin_level() == :fatal

      assert NativeLog.plugin_env(:warning, %{"TF_CPP_MIN_LOG_LEVEL" => ""}) ==
               [{"TF_CPP_MIN_LOG_LEVEL", "1"}]

      assert NativeLog.plugin_env(:info, %{"TF_CPP_MAX_VLOG_LEVEL" => "3"}) ==
               [{"TF_CPP_MIN_LOG_LEVEL", "0"}, {"TF_CPP_MAX_VLOG_LEVEL", "3"}]

      for level <- [:debug, {:verbose, 0}, {:verbose, :all}, "info"] do
        assert_raise ArgumentError, ~r/expected :plugin_log_level to be one of/, fn ->
          NativeLog.plugin_env(level, %{})
        end
      end
    end

    # The plugin reads its levels when it is loaded, once per OS process:
    # each case loads it in a fresh VM. Creating a host client makes the
    # CPU plugin write one info line (`cpu_device_count set via
    # create_options`).
    defp plugin_lines(code) do
      code = """
      #{code}
      Application.ensure_all_started(:exla)
      EXLA.Client.fetch!(:host)
      IO.puts("client created")
      """

      {output, 0} =
        EXLA.TestScript.run(code,
          env:
            for(
              name <- ~w(TF_CPP_MIN_LOG_LEVEL TF_CPP_MAX_VLOG_LEVEL TF_CPP_VMODULE),
              do: {name, nil}
            ),
          stderr_to_stdout: true
        )

      assert output =~ "client created"
      Regex.scan(~r/^(?:[IWEF]\d{4} .*|WARNING: All log messages before absl.*)$/m, output)
    end

    test "by default a plugin writes nothing; a level the user puts in the VM's environment reaches it" do
      assert plugin_lines("") == []

      # System.put_env/2 changes only the VM's copy of the environment:
      # EXLA passes it to the plugin, over :plugin_log_level.
      lines =
        plugin_lines("""
        Application.put_env(:exla, :plugin_log_level, :error)
        System.put_env("TF_CPP_MIN_LOG_LEVEL", "0")
        """)

      assert Enum.any?(lines, fn [line] ->
               line =~ ~r/^I\d{4} .*cpu_device_count set via create_options/
             end)
    end

    test ":plugin_log_level :info shows the plugin's info lines" do
      lines = plugin_lines("Application.put_env(:exla, :plugin_log_level, :info)")
      assert Enum.any?(lines, fn [line] -> line =~ "cpu_device_count set via create_options" end)
    end
  end
end
