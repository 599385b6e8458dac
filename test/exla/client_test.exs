defmodule EXLA.ClientTest do
  # Tests change the :exla application environment and XLA_FLAGS.
  use ExUnit.Case, async: false

  import EXLA.TestEnv, only: [with_env: 3]
  import EXLA.TestClients, only: [creation_error: 1]

  alias EXLA.Client
  alias EXLA.Client.Options
  alias EXLA.Platform.Discovery

  doctest EXLA.Client

  # Adds clients to the configuration for one test.
  defp put_clients(new) do
    clients = Application.fetch_env!(:exla, :clients)
    Application.put_env(:exla, :clients, clients ++ new)
    on_exit(fn -> Application.put_env(:exla, :clients, clients) end)
  end

  defp unique_name(prefix) do
    :"#{prefix}_#{System.unique_integer([:positive])}"
  end

  describe "fetch!/1" do
    test "creates the host client once and shares it" do
      client = Client.fetch!(:host)

      assert %Client{name: :host, platform: :host, default_device_id: 0} = client
      assert client.device_count == Options.host_device_count([])
      assert client.platform_name == "cpu"
      assert is_binary(client.platform_version)
      assert File.regular?(client.plugin_path)
      assert is_reference(client.ref)
      assert Client.fetch!(:host) == client
    end

    test "is fast once the client exists" do
      Client.fetch!(:host)
      {time, _} = :timer.tc(fn -> for _ <- 1..10_000, do: Client.fetch!(:host) end)
      assert time < 500_000
    end

    test "raises on unknown clients, with EXLA's words" do
      names = inspect(Keyword.keys(Application.fetch_env!(:exla, :clients)))

      assert_raise ArgumentError,
                   "could not find EXLA client named :unknown, the clients specified in " <>
                     "your config files are: #{names}",
                   fn -> Client.fetch!(:unknown) end
    end

    # EXLA creates clients in a server process, which crashes on a failure:
    # the caller exits with the exception (upstream's tests catch_exit it).
    # Here the server carries on and the next call tries again.
    test "a client that cannot be created exits the caller with the exception, as in EXLA" do
      name = unique_name(:exits)
      put_clients([{name, [platform: :host, plugin: "/nonexistent/plugin.so"]}])
      server = Process.whereis(EXLA.Client)

      assert {{%RuntimeError{message: message}, [_ | _]},
              {GenServer, :call, [EXLA.Client, {:client, ^name, options}, :infinity]}} =
               catch_exit(Client.fetch!(name))

      assert message =~ "/nonexistent/plugin.so"
      # EXLA's request: the name and the configured options
      assert options == [platform: :host, plugin: "/nonexistent/plugin.so"]

      # through the compiler's options too, and nothing is kept
      assert {{%RuntimeError{}, _}, {GenServer, :call, _}} =
               catch_exit(EXLA.jit_apply(&Nx.add(&1, 1), [Nx.iota({5})], client: name))

      assert Process.whereis(EXLA.Client) == server
      assert Client.fetch!(:host).name == :host
    end

    test "creates a client only once when fetched concurrently" do
      name = unique_name(:concurrent)
      put_clients([{name, [platform: :host, device_count: 2]}])

      clients =
        1..16
        |> Task.async_stream(fn _ -> Client.fetch!(name) end, max_concurrency: 16)
        |> Enum.map(fn {:ok, client} -> client end)

      assert [%Client{name: ^name, device_count: 2}] = Enum.uniq(clients)
      # the same native client everywhere, not equal copies
      assert Enum.all?(clients, &(&1.ref == hd(clients).ref))
    end

    test "honours :device_count and :default_device_id" do
      name = unique_name(:two_devices)
      put_clients([{name, [platform: :host, device_count: 3, default_device_id: 2]}])

      assert %Client{device_count: 3, default_device_id: 2} = Client.fetch!(name)
    end

    # XLA_FLAGS is read from the environment of the OS process, which
    # System.put_env/2 does not change: a fresh VM gets it.
    @tag :tmp_dir
    test "honours XLA_FLAGS for host clients", %{tmp_dir: dir} do
      code = """
      Application.ensure_all_started(:exla)
      # only the VM's copy of the environment, which XLA never reads
      System.put_env("XLA_FLAGS", "--xla_force_host_platform_device_count=3")
      IO.puts("devices: \#{EXLA.Client.fetch!(:host).device_count}")
      """

      {output, 0} =
        EXLA.TestScript.run(code,
          env: [{"XLA_FLAGS", "--xla_force_host_platform_device_count=4"}],
          cd: dir,
          stderr_to_stdout: true
        )

      assert output =~ "devices: 4"
    end

    test "takes the XLA_FLAGS device count from the process environment only" do
      name = unique_name(:xla_flags_vm_env)
      put_clients([{name, [platform: :host]}])
      from_process = Options.host_device_count([], EXLA.NIF.xla_flags_env())

      # A value only the VM's copy holds would be a count the XLA_FLAGS
      # check never saw.
      with_env("XLA_FLAGS", "--xla_force_host_platform_device_count=3", fn ->
        assert Options.host_device_count([]) == from_process
        assert Client.fetch!(name).device_count == from_process
      end)
    end

    test "checks :default_device_id against the devices" do
      name = unique_name(:bad_device)
      put_clients([{name, [platform: :host, device_count: 1, default_device_id: 2]}])

      message =
        ":default_device_id of EXLA client #{inspect(name)} must be a number between 0 and 0 " <>
          "(it has 1 device(s)), got: 2"

      assert %ArgumentError{message: ^message} = creation_error(fn -> Client.fetch!(name) end)

      # nothing was kept: the error comes again
      assert %ArgumentError{message: ^message} = creation_error(fn -> Client.fetch!(name) end)
    end

    test "validates the options before creating anything" do
      name = unique_name(:invalid)
      put_clients([{name, [platform: :host, bogus: true]}])

      assert %ArgumentError{message: message} = creation_error(fn -> Client.fetch!(name) end)
      assert message =~ "invalid options for EXLA client #{inspect(name)}"
    end

    test "uses the :plugin option" do
      host = Client.fetch!(:host)
      name = unique_name(:own_plugin)
      put_clients([{name, [platform: :host, plugin: host.plugin_path]}])
      assert Client.fetch!(name).plugin_path == host.plugin_path

      missing = unique_name(:missing_plugin)
      put_clients([{missing, [platform: :host, plugin: "/nonexistent/plugin.so"]}])

      assert %RuntimeError{message: message} = creation_error(fn -> Client.fetch!(missing) end)
      assert message =~ ~s("/nonexistent/plugin.so" given by the :plugin option)
    end

    # Its failure also logs a warning (EXLA.NativeLog), kept off the console.
    @tag :capture_log
    test "reports files that are not PJRT plugins", %{} do
      path = Path.join(System.tmp_dir!(), "exla_not_a_plugin_#{System.unique_integer()}.so")
      File.write!(path, "not a shared library")
      on_exit(fn -> File.rm(path) end)

      name = unique_name(:not_plugin)
      put_clients([{name, [platform: :host, plugin: path]}])
      assert %RuntimeError{} = creation_error(fn -> Client.fetch!(name) end)
      EXLA.NativeLog.flush()
    end
  end

  describe "default_name/0 and get_supported_platforms/0" do
    test "the host is supported with its devices" do
      platforms = Client.get_supported_platforms()
      assert platforms[:host] == Options.host_device_count([])
      assert Enum.all?(platforms, fn {_, count} -> is_integer(count) and count > 0 end)
      assert Client.get_supported_platforms() == platforms
    end

    test "picks a supported client" do
      name = Client.default_name()
      assert is_atom(name)
      assert Client.fetch!(name).platform in Map.keys(Client.get_supported_platforms())
    end

    test ":default_client wins" do
      Application.put_env(:exla, :default_client, :some_client)
      on_exit(fn -> Application.delete_env(:exla, :default_client) end)
      assert Client.default_name() == :some_client
    end

    test "choose_default/3 takes the first preferred client on a supported platform" do
      clients = [
        cuda: [platform: :cuda],
        rocm: [platform: :rocm],
        tpu: [platform: :tpu],
        host: [platform: :host],
        other: []
      ]

      preferred = [:cuda, :rocm, :tpu, :host]
      assert Discovery.choose_default(clients, preferred, %{host: 1}) == :host
      assert Discovery.choose_default(clients, preferred, %{host: 1, rocm: 2}) == :rocm
      assert Discovery.choose_default(clients, preferred, %{host: 1, cuda: 1, tpu: 4}) == :cuda
      # a client without :platform is on the host
      assert Discovery.choose_default(clients, [:other, :host], %{host: 1}) == :other

      assert_raise ArgumentError, "unknown client :nope given as :preferred_clients", fn ->
        Discovery.choose_default(clients, [:nope, :host], %{host: 1})
      end

      error =
        assert_raise RuntimeError, ~r/could not find a default client for EXLA/, fn ->
          Discovery.choose_default(clients, [:cuda, :tpu], %{host: 1})
        end

      # it says how to provide a plugin
      assert Exception.message(error) =~ "EXLA_PJRT_PLUGIN_HOST"
      assert Exception.message(error) =~ ~s|pip install "jax[cuda13]"|
    end
  end

  describe "Options.validate!/2" do
    test "fills in the defaults" do
      defaults = [
        platform: :host,
        default_device_id: 0,
        preallocate: true,
        memory_fraction: 0.9,
        plugin: nil,
        device_count: nil,
        warm_up: true,
        automatic_transfers: true
      ]

      assert Enum.sort(Options.validate!(:a, [])) == Enum.sort(defaults)
      assert Options.validate!(:a, platform: :cuda)[:automatic_transfers] == false

      options = Options.validate!(:a, platform: :cuda, memory_fraction: 1, preallocate: false)

      assert options[:memory_fraction] === 1.0
      assert options[:preallocate] == false
    end

    test "rejects invalid options" do
      invalid = [
        {[platform: :gpu], ~r/unknown EXLA platform :gpu for client :a/},
        {[unknown: 1], ~r/invalid options for EXLA client :a: unknown keys \[:unknown\]/},
        {[default_device_id: -1],
         ~r/invalid :default_device_id .* non-negative integer, got: -1/},
        {[default_device_id: "0"], ~r/invalid :default_device_id/},
        {[preallocate: "yes"], ~r/invalid :preallocate for EXLA client :a: expected a boolean/},
        {[warm_up: 1], ~r/invalid :warm_up for EXLA client :a: expected a boolean, got: 1/},
        {[memory_fraction: 0], ~r/invalid :memory_fraction .* greater than 0 and at most 1/},
        {[memory_fraction: 1.5], ~r/invalid :memory_fraction/},
        {[memory_fraction: "0.5"], ~r/invalid :memory_fraction/},
        {[plugin: :path], ~r/invalid :plugin for EXLA client :a: expected a path/},
        {[device_count: 0], ~r/invalid :device_count .* positive integer, got: 0/},
        {[device_count: 1025],
         "invalid :device_count for EXLA client :a: must be an integer between 1 and 1024, " <>
           "got: 1025"},
        {[platform: :cuda, device_count: 2], ~r/:device_count option .* only supported by :host/}
      ]

      for {options, message} <- invalid do
        assert_raise ArgumentError, message, fn -> Options.validate!(:a, options) end
      end

      assert_raise ArgumentError, ~r/to be a keyword list, got: %{}/, fn ->
        Options.validate!(:a, %{})
      end
    end
  end

  describe "warm-up" do
    alias EXLA.Client.WarmUp

    test "the first CPU client of a plugin file warms it up once, in the background" do
      host = Client.fetch!(:host)
      # Started when :host was created (warm_up defaults to true).
      assert is_pid(:persistent_term.get({WarmUp, :started})[host.plugin_path])
      assert WarmUp.await(10_000) == :ok

      name = unique_name(:same_plugin)
      put_clients([{name, [platform: :host]}])
      assert WarmUp.start(Client.fetch!(name)) == nil
    end

    test "compiles and runs its program, leaving no buffer behind" do
      name = unique_name(:warm_up_off)
      put_clients([{name, [platform: :host, warm_up: false]}])
      client = Client.fetch!(name)
      before = Client.get_memory_statistics(client)

      assert WarmUp.run(client) == :ok
      assert Client.get_memory_statistics(client).allocated == before.allocated
    end

    test "a caller may send a small program's runs to a native thread" do
      client = Client.fetch!(:host)

      mlir = """
      module {
        func.func public @main(%arg0: tensor<2xf32>) -> tensor<2xf32> {
          %0 = "stablehlo.add"(%arg0, %arg0) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
          "func.return"(%0) : (tensor<2xf32>) -> ()
        }
      }
      """

      assert EXLA.Executable.compile(client, mlir).run_on == :scheduler
      exe = EXLA.Executable.compile(client, mlir, run_on: :thread)
      assert exe.run_on == :thread
      arg = {<<1.0::float-32-native, 2.0::float-32-native>>, EXLA.Shape.make_shape({:f, 32}, {2})}
      [[out]] = EXLA.Executable.run(exe, [[arg]])
      assert EXLA.DeviceBuffer.read(out) == <<2.0::float-32-native, 4.0::float-32-native>>
    end

    # An exit while the plugin generates code would crash the VM in C++
    # exit handlers (measured: about half of the scripts below, those that
    # end 20-60 ms after creating the client). Scripts wait for the warm-up.
    @tag :slow
    @tag :tmp_dir
    test "a script that ends while the warm-up runs exits cleanly", %{tmp_dir: dir} do
      assert_scripts_exit_cleanly(dir, 0..100//10, "EXLA.Client.fetch!(:host)")
    end
  end

  describe "exits" do
    # C++ exit handlers free the compiler's global tables under a compile
    # still under way: a script that ended during one crashed (segfault) in
    # about one run in five, late in the compile. The end of a script waits
    # for compiles queued or running (EXLA.Application.await_native_work/1).
    @tag :slow
    @tag :tmp_dir
    test "a script that ends while a compile runs exits cleanly", %{tmp_dir: dir} do
      assert_scripts_exit_cleanly(dir, 100..500//50, """
      Application.put_env(:exla, :cache_dir, false)
      x = Nx.iota({64}, type: :f32, backend: EXLA.Backend)
      EXLA.Client.WarmUp.await(10_000)
      chain = fn x -> Enum.reduce(1..40, x, fn _, acc -> Nx.subtract(acc, Nx.sum(acc)) end) end
      Task.start(fn -> EXLA.compile(chain, [x]) end)
      """)
    end
  end

  describe "halts" do
    # System.halt/1 ends the process with exit(), whose C++ exit handlers
    # freed the compiler's tables under the warm-up's compile: 11 of 30
    # scripts that halted right after their first transfer died (segfault
    # or "pure virtual method called") instead of exiting with their
    # status. The NIF makes the halt wait for native work (OTP 26+).
    @halting_start "Nx.to_binary(Nx.tensor([1.0, 2.0], backend: EXLA.Backend))"

    @tag :halt_hook
    @tag :tmp_dir
    test "a script that halts during the warm-up exits with its status", %{tmp_dir: dir} do
      assert_scripts_exit_cleanly(dir, [0, 9, 30], @halting_start, 7)
    end

    @tag :slow
    @tag :halt_hook
    @tag :tmp_dir
    test "a script that halts during the warm-up or a compile exits with its status",
         %{tmp_dir: dir} do
      assert_scripts_exit_cleanly(dir, 0..60//3, @halting_start, 7)
    end
  end

  # Runs `start` in a fresh VM (`elixir -e`, with this VM's code paths),
  # then lets the script end `delay` ms later, for each delay: every run
  # must print its line and exit with status 0 or, given `halt`, call
  # System.halt(halt) and exit with that status.
  defp assert_scripts_exit_cleanly(dir, delays, start, halt \\ nil) do
    for delay <- delays do
      code = """
      Application.ensure_all_started(:exla)
      #{start}
      Process.sleep(#{delay})
      IO.puts(:done)
      #{if halt, do: "System.halt(#{halt})"}
      """

      assert {"done\n", halt || 0} ==
               EXLA.TestScript.run(code, cd: dir),
             "the script ending #{delay} ms after it started: #{start}"
    end
  end

  describe "the :pjrt_plugin platform" do
    test "runs on the plugin its :plugin_path names (here, the CPU plugin)" do
      cpu = Client.fetch!(:host)
      name = unique_name(:pjrt_plugin)

      put_clients([
        {name, [platform: :pjrt_plugin, device_type: :cpu, plugin_path: cpu.plugin_path]}
      ])

      client = Client.fetch!(name)
      assert %Client{platform: :pjrt_plugin, device_type: "cpu", platform_name: "cpu"} = client
      assert client.plugin_path == cpu.plugin_path
      assert client.device_count >= 1
      # No EXLA defaults for a plugin it does not know by name.
      assert client.xla_options == []

      # A client of its own: its memory statistics count its tensors only.
      assert %{allocated: 0} = Client.get_memory_statistics(client)
      on = {EXLA.Backend, client: name}
      kept = Nx.from_binary(:binary.copy(<<1.0::float-32-native>>, 256), :f32, backend: on)
      assert %{allocated: 1024, peak: 1024} = Client.get_memory_statistics(name)
      Nx.backend_deallocate(kept)
      assert %{allocated: 0, peak: 1024} = Client.get_memory_statistics(name)

      x = Nx.tensor([[1.0, -2.0], [3.5, 4.0]])
      fun = fn x -> Nx.sum(Nx.multiply(Nx.exp(x), Nx.transpose(x)), axes: [1]) end
      got = EXLA.jit(fun, client: name).(x)
      assert %EXLA.Backend{buffer: %{client_name: ^name}} = got.data
      expected = Nx.Defn.jit_apply(fun, [x], compiler: Nx.Defn.Evaluator)
      assert Nx.to_number(Nx.all_close(Nx.backend_transfer(got), expected)) == 1

      t = Nx.iota({4}, backend: {EXLA.Backend, client: name})
      assert Nx.to_flat_list(Nx.add(t, 1)) == [1, 2, 3, 4]
    end

    test "is supported when a configured client of it can be created" do
      cpu = Client.fetch!(:host)
      name = unique_name(:supported_pjrt_plugin)
      # The VM's answer before this test's client (computed if this test
      # comes first), put back at the end.
      previous = Client.get_supported_platforms()

      put_clients([
        {name, [platform: :pjrt_plugin, device_type: "cpu", plugin_path: cpu.plugin_path]}
      ])

      # The answer is computed once per VM: computed again here.
      key = {EXLA.Platform.Discovery, :supported_platforms}
      :persistent_term.erase(key)

      try do
        platforms = Client.get_supported_platforms()
        assert platforms[:pjrt_plugin] == Client.fetch!(name).device_count
        assert platforms[:host] == previous[:host]

        assert Discovery.choose_default(
                 Application.fetch_env!(:exla, :clients),
                 [name],
                 platforms
               ) ==
                 name
      after
        :persistent_term.put(key, previous)
      end

      options =
        Options.validate!(:a,
          platform: :pjrt_plugin,
          device_type: "x",
          plugin_path: "/x.so"
        )

      assert Options.create_options(options) == []
    end

    test "requires :device_type and :plugin_path, valid, and only there" do
      path = "/opt/tt/pjrt_plugin_tt.so"

      invalid = [
        {[platform: :pjrt_plugin, plugin_path: path],
         ~r/client :a of the :pjrt_plugin platform requires :device_type/},
        {[platform: :pjrt_plugin, device_type: "tt"],
         ~r/client :a of the :pjrt_plugin platform requires :plugin_path: the path/},
        {[platform: :pjrt_plugin, device_type: "", plugin_path: path],
         ~r/invalid :device_type for EXLA client :a: expected a non-empty string or an atom/},
        {[platform: :pjrt_plugin, device_type: 1, plugin_path: path], ~r/invalid :device_type/},
        {[platform: :pjrt_plugin, device_type: "tt", plugin_path: :nope],
         ~r/invalid :plugin_path for EXLA client :a: expected the path of a PJRT plugin/},
        {[platform: :pjrt_plugin, device_type: "tt", plugin_path: path, plugin: path],
         ~r/takes its plugin's path as :plugin_path, not :plugin/},
        {[platform: :host, device_type: "tt"],
         ~r/:device_type option of EXLA client :a is only supported by :pjrt_plugin clients/},
        {[platform: :cuda, plugin_path: path], ~r/:plugin_path option .* only supported by/}
      ]

      for {options, message} <- invalid do
        assert_raise ArgumentError, message, fn -> Options.validate!(:a, options) end
      end

      options = Options.validate!(:a, platform: :pjrt_plugin, device_type: :tt, plugin_path: path)

      assert options[:device_type] == "tt"
      assert options[:plugin] == path
    end

    test "a missing plugin file fails naming :plugin_path" do
      name = unique_name(:missing_pjrt_plugin)

      put_clients([
        {name, [platform: :pjrt_plugin, device_type: "tt", plugin_path: "/nonexistent/tt.so"]}
      ])

      assert %RuntimeError{message: message} = creation_error(fn -> Client.fetch!(name) end)
      assert message =~ ~s("/nonexistent/tt.so" given by the :plugin_path option)
    end
  end

  describe "create_options/1" do
    test "host clients pass only an int64 device count" do
      # Without :device_count, the count is XLA_FLAGS's (see the tests of
      # host_device_count/2), which this VM's process environment decides.
      options = Options.validate!(:a, platform: :host, memory_fraction: 0.5)
      count = Options.host_device_count([])
      assert Options.create_options(options) == [{"cpu_device_count", {:int64, count}}]

      options = Options.validate!(:a, platform: :host, device_count: 8)
      assert Options.create_options(options) == [{"cpu_device_count", {:int64, 8}}]
    end

    test "GPU clients pass a bool and a float" do
      for platform <- [:cuda, :rocm] do
        options = Options.validate!(:a, platform: platform, memory_fraction: 1)

        assert Options.create_options(options) == [
                 {"preallocate", {:bool, true}},
                 {"memory_fraction", {:float, 1.0}}
               ]
      end
    end

    test "TPU clients pass nothing" do
      assert Options.create_options(Options.validate!(:a, platform: :tpu)) == []
    end
  end

  describe "EXLA_HOST_MALLOC_TUNING" do
    test "tunes the C heap unless it says no" do
      for value <- [nil, "", "true", "1", "yes"] do
        assert with_env("EXLA_HOST_MALLOC_TUNING", value, &Options.host_malloc_tuning?/0),
               inspect(value)
      end

      for value <- ["false", "0", "no", "OFF", " False "] do
        refute with_env("EXLA_HOST_MALLOC_TUNING", value, &Options.host_malloc_tuning?/0),
               inspect(value)
      end
    end
  end

  describe ":xla_options" do
    test "are merged over the platform defaults and sent as compile overrides" do
      host = Options.validate!(:a, platform: :host)
      assert Options.xla_compile_options(host) == [{"xla_cpu_use_xnnpack", {:bool, false}}]

      mine =
        Options.validate!(:a,
          platform: :host,
          xla_options: [xla_cpu_use_xnnpack: true, xla_cpu_enable_fast_math: false]
        )

      assert Options.xla_compile_options(mine) == [
               {"xla_cpu_enable_fast_math", {:bool, false}},
               {"xla_cpu_use_xnnpack", {:bool, true}}
             ]

      tpu = Options.validate!(:a, platform: :tpu, xla_options: %{"xla_dump_to" => "/tmp"})
      assert Options.xla_compile_options(tpu) == [{"xla_dump_to", {:string, "/tmp"}}]
    end

    test "are validated" do
      for bad <- [:yes, [xla_cpu_use_xnnpack: :maybe], [{"x", [1]}]] do
        assert_raise ArgumentError, ~r/invalid :xla_options for EXLA client :a/, fn ->
          Options.validate!(:a, platform: :host, xla_options: bad)
        end
      end
    end

    test "a known option compiles and runs; an unknown one fails at client creation" do
      good = unique_name(:xla_options_good)
      bad = unique_name(:xla_options_bad)

      put_clients([
        {good, [platform: :host, xla_options: [xla_cpu_enable_fast_math: false]]},
        {bad, [platform: :host, xla_options: [xla_no_such_option: true]]}
      ])

      fun = fn x -> Nx.multiply(x, 2) end
      x = Nx.tensor([1.0, 2.0])
      assert Nx.to_flat_list(EXLA.jit(fun, client: good).(x)) == [2.0, 4.0]

      for _ <- 1..2 do
        assert %ArgumentError{message: message} = creation_error(fn -> Client.fetch!(bad) end)
        assert message =~ "xla_no_such_option is not an XLA option of this plugin"
      end

      # the VM and the other clients carry on
      assert Nx.to_flat_list(EXLA.jit(fun).(x)) == [2.0, 4.0]
    end
  end

  describe "XLA_FLAGS" do
    alias EXLA.XLAOptions

    test "flags_device_count/1 reads the host device count" do
      assert XLAOptions.flags_device_count(nil) == nil
      assert XLAOptions.flags_device_count("") == nil
      assert XLAOptions.flags_device_count("--xla_cpu_use_thunk_runtime=false") == nil
      assert XLAOptions.flags_device_count("--xla_force_host_platform_device_count=8") == 8

      assert XLAOptions.flags_device_count(
               "  --xla_dump_to=/tmp/x\t--xla_force_host_platform_device_count=2  "
             ) == 2

      # the last one wins
      assert XLAOptions.flags_device_count(
               "--xla_force_host_platform_device_count=2 --xla_force_host_platform_device_count=3"
             ) == 3

      # other flags with the same prefix are not it
      assert XLAOptions.flags_device_count("--xla_force_host_platform_device_count_x=5") == nil
    end

    test "flags_device_count/1 rejects bad values as the XLA_FLAGS check does" do
      for value <- ["0", "-1", "two", "", "2.0", "1025"] do
        flags = "--xla_force_host_platform_device_count=#{value}"

        error = assert_raise ArgumentError, fn -> XLAOptions.flags_device_count(flags) end

        assert error.message =~ "invalid XLA_FLAGS: #{flags} "
        plugin = Client.fetch!(:host).plugin_path
        checked = assert_raise ArgumentError, fn -> XLAOptions.check_flags!(flags, plugin) end
        assert error.message == checked.message
      end

      # as flags XLA cannot parse
      assert_raise ArgumentError, ~r/invalid XLA_FLAGS: .* does not start with --/, fn ->
        XLAOptions.flags_device_count("--xla_force_host_platform_device_count=2 stray")
      end
    end

    test "host_device_count/2 prefers :device_count, then XLA_FLAGS, then 1" do
      assert Options.host_device_count([], nil) == 1
      assert Options.host_device_count([device_count: 5], nil) == 5

      flags = "--xla_force_host_platform_device_count=6"
      assert Options.host_device_count([], flags) == 6
      assert Options.host_device_count([device_count: 5], flags) == 5
    end
  end

  describe "without the EXLA.Client process" do
    test "fetch!/1 still creates a client once" do
      name = unique_name(:no_server)
      put_clients([{name, [platform: :host]}])

      pid = Process.whereis(EXLA.Client)
      :ok = Supervisor.terminate_child(EXLA.Supervisor, EXLA.Client)
      on_exit(fn -> Supervisor.restart_child(EXLA.Supervisor, EXLA.Client) end)
      refute Process.whereis(EXLA.Client)

      clients =
        1..8
        |> Task.async_stream(fn _ -> Client.fetch!(name) end, max_concurrency: 8)
        |> Enum.map(fn {:ok, client} -> client.ref end)

      assert length(Enum.uniq(clients)) == 1
      assert is_pid(pid)
    end
  end
end
