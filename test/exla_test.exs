defmodule EXLATest do
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog
  require Logger

  setup do
    previous = Application.get_env(:exla, :add_backend_on_inspect)
    Application.put_env(:exla, :add_backend_on_inspect, false)
    on_exit(fn -> Application.put_env(:exla, :add_backend_on_inspect, previous) end)
    :ok
  end

  doctest EXLA

  defp on_device(list, type \\ {:f, 32}) do
    Nx.tensor(list, type: type, backend: EXLA.Backend)
  end

  defp to_list(tensor), do: Nx.to_flat_list(tensor)

  # A fresh function (and so a fresh cache key) for each call site.
  defp adder(n), do: fn x -> Nx.add(x, n) end

  describe "jit/2 and jit_apply/3" do
    test "computes on the device and returns EXLA.Backend tensors" do
      x = on_device([1.0, 2.0, 3.0])
      result = EXLA.jit(fn x -> Nx.add(x, x) end).(x)
      assert %EXLA.Backend{} = result.data
      assert to_list(result) == [2.0, 4.0, 6.0]
    end

    test "accepts tensors from other backends" do
      x = Nx.tensor([1, 2, 3], backend: Nx.BinaryBackend)
      assert to_list(EXLA.jit_apply(&Nx.multiply(&1, 2), [x])) == [2, 4, 6]
    end

    test "accepts numbers as arguments" do
      assert Nx.to_number(EXLA.jit(&Nx.add/2).(1, 2)) == 3
    end

    test "returns containers in order" do
      fun = fn {a, b}, %{c: c} -> %{sum: Nx.add(a, b), both: {Nx.negate(c), c}} end
      result = EXLA.jit(fun).({on_device([1.0]), on_device([2.0])}, %{c: on_device([5.0])})
      assert to_list(result.sum) == [3.0]
      assert {neg, c} = result.both
      assert to_list(neg) == [-5.0]
      assert to_list(c) == [5.0]
    end

    test "keeps names of the output" do
      x = Nx.tensor([[1, 2]], names: [:x, :y], backend: EXLA.Backend)
      assert EXLA.jit(&Nx.negate/1).(x).names == [:x, :y]
    end

    test "uses keyword arguments as static arguments" do
      fun = fn x, opts -> Nx.sum(x, opts) end
      x = on_device([[1.0, 2.0], [3.0, 4.0]])
      assert to_list(EXLA.jit(fun).(x, axes: [0])) == [4.0, 6.0]
      assert to_list(EXLA.jit(fun).(x, axes: [1])) == [3.0, 7.0]
    end

    test "runs on the given device" do
      client = EXLA.Client.fetch!(EXLA.Client.default_name())
      device_id = client.device_count - 1
      result = EXLA.jit(&Nx.add(&1, 1), device_id: device_id).(on_device([1.0]))
      assert result.data.buffer.device_id == device_id
      assert to_list(result) == [2.0]
    end
  end

  describe "compile/3" do
    test "compiles ahead of time from templates" do
      fun = EXLA.compile(&Nx.add/2, [Nx.template({3}, {:f, 32}), Nx.template({3}, {:f, 32})])
      x = on_device([1.0, 2.0, 3.0])
      assert to_list(fun.(x, x)) == [2.0, 4.0, 6.0]
      assert to_list(fun.(x, Nx.tensor([1.0, 1.0, 1.0]))) == [2.0, 3.0, 4.0]
    end

    test "raises on incompatible arguments" do
      fun = EXLA.compile(&Nx.negate/1, [Nx.template({3}, {:f, 32})])

      assert_raise ArgumentError, ~r/not compatible with compiled function template/, fn ->
        fun.(Nx.tensor([1, 2]))
      end
    end

    test "shares the cache with jit" do
      fun = adder(7)
      EXLA.compile(fun, [Nx.template({2}, {:f, 32})])
      assert EXLA.cached?(fun, [Nx.template({2}, {:f, 32})])
    end
  end

  describe "cached?/3" do
    test "tells whether a call would hit the cache" do
      fun = adder(1)
      x = on_device([1.0, 2.0])
      refute EXLA.cached?(fun, [x])
      EXLA.jit(fun).(x)
      assert EXLA.cached?(fun, [x])
      refute EXLA.cached?(fun, [on_device([1.0, 2.0, 3.0])])
      refute EXLA.cached?(fun, [on_device([1, 2], {:s, 32})])
      refute EXLA.cached?(fun, [x], debug: true)
    end

    test "does not run or compile" do
      ref = :telemetry_test.attach_event_handlers(self(), [[:exla, :compilation]])
      refute EXLA.cached?(adder(2), [Nx.template({2}, {:f, 32})])
      refute_received {[:exla, :compilation], ^ref, _, _}
    end

    test "is false with cache: false" do
      fun = adder(3)
      EXLA.jit(fun, cache: false).(on_device([1.0]))
      refute EXLA.cached?(fun, [on_device([1.0])], cache: false)
    end
  end

  describe "to_mlir_module/3" do
    test "returns the module, used inputs and output container" do
      args = [Nx.template({3}, {:f, 32}), Nx.template({3}, {:f, 32})]

      assert %{mlir_module: mlir, used_inputs: used, output_container: out} =
               EXLA.to_mlir_module(fn a, _b -> {Nx.negate(a), a} end, args)

      assert mlir =~ "@main"
      assert used == MapSet.new([0])
      assert {%Nx.Tensor{shape: {3}, type: {:f, 32}}, %Nx.Tensor{}} = out
      refute EXLA.cached?(fn a, _b -> {Nx.negate(a), a} end, args)
    end

    test "its text compiles and computes what jit computes" do
      fun = fn x, y -> Nx.sum(Nx.multiply(Nx.cos(x), y), axes: [0]) end
      x = Nx.iota({4, 3}, type: :f32)
      y = Nx.tensor([2.0, -1.0, 0.5], type: :f32)

      %{mlir_module: mlir, used_inputs: used} = EXLA.to_mlir_module(fun, [x, y])
      assert used == MapSet.new([0, 1])
      exe = EXLA.Executable.compile(EXLA.Client.fetch!(:host), mlir)

      inputs = for t <- [x, y], do: {Nx.to_binary(t), EXLA.Shape.make_shape(t.type, t.shape)}

      [[out]] = EXLA.Executable.run(exe, [inputs])
      expected = Nx.Defn.jit_apply(fun, [x, y], compiler: Nx.Defn.Evaluator)
      assert EXLA.DeviceBuffer.read(out) == Nx.to_binary(EXLA.jit(fun).(x, y))

      assert Nx.to_number(
               Nx.all_close(Nx.from_binary(EXLA.DeviceBuffer.read(out), :f32), expected)
             ) == 1
    end

    # A defn compiler of another library that asks EXLA for the module of
    # what it compiles, with or without the flag, and hands the answer back.
    defmodule LoweringCompiler do
      def __jit__(key, vars, fun, args_list, opts),
        do: __compile__(key, vars, fun, opts).(args_list)

      def __compile__(_key, vars, fun, opts) do
        {flag, opts} = Keyword.pop!(opts, :flag)
        opts = if flag == nil, do: opts, else: [within_defn_compiler: flag] ++ opts
        throw({__MODULE__, EXLA.to_mlir_module(fun, vars, opts)})
      end
    end

    defp lower_within(fun, args, opts) do
      Nx.Defn.jit_apply(fun, args, [compiler: LoweringCompiler] ++ opts)
    catch
      {LoweringCompiler, result} -> result
    end

    test "within_defn_compiler: true, from a compiler's callback, lowers its function of the vars" do
      x = Nx.tensor([1.0, 2.0])
      y = Nx.tensor(3, type: :s32)
      fun = fn x, y -> {Nx.exp(x), Nx.add(y, 1)} end

      assert %{mlir_module: mlir, used_inputs: used, output_container: out} =
               lower_within(fun, [x, y], flag: true, precision: :highest)

      assert mlir =~ "stablehlo.exponential" and mlir =~ "stablehlo.add"
      assert used == MapSet.new([0, 1])
      assert {%Nx.Tensor{shape: {2}, type: {:f, 32}}, %Nx.Tensor{shape: {}, type: {:s, 32}}} = out
      # the module jit would compile, and nothing compiled or cached
      assert mlir == EXLA.to_mlir_module(fun, [x, y]).mlir_module
      refute EXLA.cached?(fun, [x, y])

      # unused inputs are left out, as in jit
      assert lower_within(fn _x, y -> Nx.negate(y) end, [x, y], flag: true).used_inputs ==
               MapSet.new([1])
    end

    if EXLA.NxVersion.meshes?() do
      test "within_defn_compiler: true with a mesh gives the module shard_jit/3 lowers" do
        # 8 partitions, more than the host's devices: nothing runs
        opts = [
          mesh: %Nx.Mesh{name: "mesh", shape: {2, 4}},
          input_shardings: [%{0 => [0], 1 => [1]}, %{0 => [0]}]
        ]

        vars = [Nx.template({4, 1}, :s32), Nx.template({4, 1}, :f32)]
        result = lower_within(&Nx.add/2, vars, [flag: true] ++ opts)
        assert result == EXLA.to_mlir_module(&Nx.add/2, List.duplicate(vars, 8), opts)
        assert result.mlir_module =~ "sdy.sharding"
      end
    end

    test "without the flag a compiler's function is called with the vars as arguments" do
      # as in EXLA: the function takes the list of vars, not each of them
      assert_raise BadArityError, fn ->
        lower_within(&Nx.add/2, [Nx.tensor(1), Nx.tensor(2)], flag: nil)
      end

      assert_raise ArgumentError, ~r/expected :within_defn_compiler to be a boolean/, fn ->
        lower_within(&Nx.add/2, [Nx.tensor(1), Nx.tensor(2)], flag: :yes)
      end
    end

    test "inside a traced function, a plain call raises as Nx does" do
      inner = fn x -> Nx.exp(x) end

      assert_raise RuntimeError, ~r/when there is a JIT compilation happening/, fn ->
        EXLA.jit(fn x -> EXLA.to_mlir_module(inner, [x]) && x end).(Nx.tensor(2.0))
      end
    end
  end

  describe "stream/3" do
    @describetag nx: :streams?
    test "stream_cached?/3 is false for streams never started" do
      refute EXLA.stream_cached?(fn x, acc -> {x, acc} end, [Nx.template({}, {:f, 32}), 0])
    end
  end

  describe "caching and telemetry" do
    setup do
      ref =
        :telemetry_test.attach_event_handlers(self(), [
          [:exla, :compilation],
          [:exla, :compilation, :details]
        ])

      on_exit(fn -> :telemetry.detach(ref) end)
      %{ref: ref}
    end

    test "emits [:exla, :compilation] once per compilation", %{ref: ref} do
      fun = adder(4)
      x = on_device([1.0])
      EXLA.jit(fun).(x)

      assert_received {[:exla, :compilation], ^ref, measurements, %{key: key}}
      assert key == fun
      %{eval_time: eval, compile_time: compile, total_time: total} = measurements
      assert is_integer(eval) and is_integer(compile)
      assert total == eval + compile

      EXLA.jit(fun).(x)
      refute_received {[:exla, :compilation], ^ref, _, _}

      EXLA.jit(fun).(on_device([1.0, 2.0]))
      assert_received {[:exla, :compilation], ^ref, _, _}
    end

    test "[:exla, :compilation] has EXLA's measurements and exactly %{key: key}", %{ref: ref} do
      fun = adder(42)
      EXLA.jit(fun).(on_device([1.0]))
      assert_received {[:exla, :compilation], ^ref, measurements, metadata}
      assert metadata == %{key: fun}
      assert Enum.sort(Map.keys(measurements)) == [:compile_time, :eval_time, :total_time]

      # An eager operation of a shape no other test uses.
      t = Nx.tensor([[[1.0], [2.0], [3.0]]], type: :f64, backend: EXLA.Backend)
      Nx.exp(t)
      assert_received {[:exla, :compilation], ^ref, _, metadata}
      assert metadata == %{key: :exp}
    end

    test "[:exla, :compilation, :details] follows it with this EXLA's facts", %{ref: ref} do
      fun = adder(43)
      EXLA.jit(fun).(on_device([1.0]))
      assert_received {[:exla, :compilation], ^ref, measurements, _}
      assert_received {[:exla, :compilation, :details], ^ref, details, metadata}
      assert Map.take(details, Map.keys(measurements)) == measurements

      assert Enum.sort(Map.keys(details)) ==
               Enum.sort([
                 :eval_time,
                 :compile_time,
                 :total_time,
                 :lower_time,
                 :xla_compile_time,
                 :cache_load_time,
                 :cache_write_time
               ])

      assert %{key: ^fun, kind: :jit, client: client, disk_cache: cache} = metadata
      assert client == EXLA.Client.default_name()
      assert cache in [:miss, :hit, :off, :memory]

      # A cached call emits neither.
      EXLA.jit(fun).(on_device([2.0]))
      refute_received {[:exla, :compilation], ^ref, _, _}
      refute_received {[:exla, :compilation, :details], ^ref, _, _}
    end

    test "splits :compile_time into its stages and tells jit from EXLA.Backend", %{ref: ref} do
      fun = adder(41)
      EXLA.jit(fun, cache: false).(on_device([1.0]))
      assert_received {[:exla, :compilation, :details], ^ref, m, %{kind: :jit, disk_cache: :off}}
      assert m.lower_time > 0 and m.xla_compile_time > 0
      assert m.cache_load_time == 0 and m.cache_write_time == 0
      assert m.lower_time + m.xla_compile_time <= m.compile_time

      # An operation shape no other test uses: compiled here, eagerly.
      t = Nx.iota({4, 1, 3, 1, 7}, backend: EXLA.Backend)
      assert Nx.to_flat_list(Nx.negate(t)) == Enum.map(0..83, &(-&1))
      assert_received {[:exla, :compilation, :details], ^ref, m, %{kind: :backend, key: :negate}}
      assert m.lower_time > 0 and m.xla_compile_time > 0
    end

    test "a program with the same MLIR as one compiled before takes its executable",
         %{ref: ref} do
      parent = self()
      x = on_device([1.0, 27.0])
      # Two closures (two jit keys) lowering to one text; each keeps its hook.
      hooked = fn tag ->
        fn x -> x |> Nx.multiply(7) |> Nx.Defn.Kernel.hook(&send(parent, {tag, &1})) end
      end

      assert to_list(EXLA.jit(hooked.(:first)).(x)) == [7.0, 189.0]
      # (or from disk, when another run wrote it)
      assert_received {[:exla, :compilation, :details], ^ref, m, %{disk_cache: first}}
      assert first in [:miss, :hit, :off]
      if first != :hit, do: assert(m.xla_compile_time > 0)
      assert_receive {:first, _}

      assert to_list(EXLA.jit(hooked.(:second)).(x)) == [7.0, 189.0]
      assert_received {[:exla, :compilation, :details], ^ref, m, %{disk_cache: :memory}}
      assert m.xla_compile_time == 0
      assert_receive {:second, seen}
      assert to_list(seen) == [7.0, 189.0]
      refute_received {:first, _}

      # cache: false neither uses nor keeps them
      EXLA.jit(hooked.(:third), cache: false).(x)
      assert_received {[:exla, :compilation, :details], ^ref, m, %{disk_cache: :off}}
      assert m.xla_compile_time > 0
    end

    test "cache: false compiles every time", %{ref: ref} do
      fun = adder(5)
      x = on_device([1.0])
      assert to_list(EXLA.jit(fun, cache: false).(x)) == [6.0]
      assert_received {[:exla, :compilation], ^ref, _, _}
      EXLA.jit(fun, cache: false).(x)
      assert_received {[:exla, :compilation], ^ref, _, _}
      refute EXLA.cached?(fun, [x])
    end

    test "50 concurrent callers compile once", %{ref: ref} do
      fun = adder(6)

      tasks =
        for _ <- 1..50 do
          Task.async(fn -> Nx.to_flat_list(EXLA.jit(fun).(Nx.tensor([1.0, 2.0]))) end)
        end

      assert Enum.all?(Task.await_many(tasks, 60_000), &(&1 == [7.0, 8.0]))
      assert_received {[:exla, :compilation], ^ref, _, %{key: ^fun}}
      refute_received {[:exla, :compilation], ^ref, _, %{key: ^fun}}
    end
  end

  describe "EXLA.LockedCache" do
    alias EXLA.LockedCache

    test "waiters reuse the value computed by the lock holder" do
      key = {__MODULE__, make_ref()}
      parent = self()

      holder =
        Task.async(fn ->
          LockedCache.run(key, fn ->
            send(parent, :computing)
            receive do: (:go -> :value)
          end)
        end)

      assert_receive :computing
      waiter = Task.async(fn -> LockedCache.run(key, fn -> flunk("computed twice") end) end)
      refute Task.yield(waiter, 50)
      send(holder.pid, :go)
      assert Task.await(holder) == {:miss, :value}
      assert Task.await(waiter) == {:hit, :value}
      assert LockedCache.get(key) == :value
    end

    test "a waiter computes when the lock holder dies" do
      key = {__MODULE__, make_ref()}
      parent = self()

      holder =
        spawn(fn ->
          LockedCache.run(key, fn ->
            send(parent, :computing)
            Process.sleep(:infinity)
          end)
        end)

      assert_receive :computing
      waiter = Task.async(fn -> LockedCache.run(key, fn -> :from_waiter end) end)
      refute Task.yield(waiter, 50)
      Process.exit(holder, :kill)
      assert Task.await(waiter) == {:miss, :from_waiter}
    end

    test "a failed computation is not cached and releases the lock" do
      for kind <- [:permanent, :bounded] do
        key = {__MODULE__, make_ref()}

        assert_raise RuntimeError, "boom", fn ->
          LockedCache.run(key, fn -> raise "boom" end, kind)
        end

        assert LockedCache.get(key, kind) == nil
        assert LockedCache.run(key, fn -> :ok end, kind) == {:miss, :ok}
        assert LockedCache.get(key, kind) == :ok
      end
    end

    test "bounded entries: waiters reuse the value computed by the lock holder" do
      key = {__MODULE__, make_ref()}
      parent = self()

      holder =
        Task.async(fn ->
          LockedCache.run(
            key,
            fn ->
              send(parent, :computing)
              receive do: (:go -> :value)
            end,
            :bounded
          )
        end)

      assert_receive :computing
      waiter = Task.async(fn -> LockedCache.run(key, fn -> flunk("twice") end, :bounded) end)
      refute Task.yield(waiter, 50)
      send(holder.pid, :go)
      assert Task.await(holder) == {:miss, :value}
      assert Task.await(waiter) == {:hit, :value}
      assert LockedCache.get(key, :bounded) == :value
      assert LockedCache.get(key) == nil
    end

    test "bounded entries: the least recently used one is evicted past the capacity" do
      # Room for 4: one pinned (or none, when other tests pinned entries
      # before), and 3 evictable.
      with_capacity(4, fn ->
        %{pinned: pinned} = bounded_counts()
        keys = for i <- 0..5, do: {__MODULE__, :lru, i}
        {first, [a, b, c, d, e]} = if pinned == 0, do: Enum.split(keys, 1), else: {[], tl(keys)}
        for key <- first, do: {:miss, _} = LockedCache.run(key, fn -> key end, :bounded)
        for key <- [a, b, c], do: {:miss, _} = LockedCache.run(key, fn -> key end, :bounded)
        pinned = max(pinned, 1)
        assert %{pinned: ^pinned, evictable: 3} = bounded_counts()

        # a was used since it was stored, b was not: b goes.
        assert LockedCache.get(a, :bounded) == a
        {:miss, _} = LockedCache.run(d, fn -> d end, :bounded)
        assert LockedCache.get(b, :bounded) == nil
        assert Enum.map([a, c, d], &LockedCache.get(&1, :bounded)) == [a, c, d]

        # Now every entry was used: the oldest goes.
        {:miss, _} = LockedCache.run(e, fn -> e end, :bounded)
        assert %{pinned: ^pinned, evictable: 3} = bounded_counts()
        assert LockedCache.get(c, :bounded) == nil
        assert LockedCache.run(b, fn -> :again end, :bounded) == {:miss, :again}

        # Pinned entries stay.
        for key <- first, do: assert(LockedCache.get(key, :bounded) == key)
      end)
    end

    test "EXLA.Backend recompiles an evicted program" do
      with_capacity(2, fn ->
        tensors = for n <- 1..4, do: Nx.iota({n}, type: :f32, backend: EXLA.Backend)

        for _ <- 1..2, t <- tensors do
          assert Nx.to_flat_list(Nx.negate(t)) == Enum.map(Nx.to_flat_list(t), &(-&1))
        end

        assert %{evictable: 2} = bounded_counts()
      end)
    end

    # The pinned and evictable bounded entries, read from the cache's state
    # and table (no production function exists for tests alone).
    defp bounded_counts do
      %{pinned: :sys.get_state(LockedCache).pinned, evictable: :ets.info(LockedCache, :size)}
    end

    # Restarts the cache with room for `capacity` bounded entries.
    defp with_capacity(capacity, fun) do
      previous = Application.fetch_env(:exla, :backend_cache_size)
      restart_cache(fn -> Application.put_env(:exla, :backend_cache_size, capacity) end)

      try do
        fun.()
      after
        restart_cache(fn ->
          case previous do
            {:ok, value} -> Application.put_env(:exla, :backend_cache_size, value)
            :error -> Application.delete_env(:exla, :backend_cache_size)
          end
        end)
      end
    end

    defp restart_cache(configure) do
      :ok = Supervisor.terminate_child(EXLA.Supervisor, LockedCache)
      configure.()
      {:ok, _} = Supervisor.restart_child(EXLA.Supervisor, LockedCache)
    end
  end

  describe "options" do
    test "debug: true logs evaluation, compilation and execution" do
      level = Logger.level()
      Logger.configure(level: :debug)
      on_exit(fn -> Logger.configure(level: level) end)
      fun = adder(8)
      x = on_device([1.0])

      logs = capture_log([level: :debug], fn -> EXLA.jit(fun, debug: true).(x) end)
      assert logs =~ ~r"EXLA defn evaluation #Function<[^>]+> cache miss in \d+\.\dms"
      assert logs =~ ~r"EXLA compilation #Function<[^>]+> cache miss in \d+\.\dms"
      assert logs =~ ~r"EXLA execution on device \d+ in \d+\.\dms"

      logs = capture_log([level: :debug], fn -> EXLA.jit(fun, debug: true).(x) end)
      assert logs =~ ~r"EXLA defn evaluation #Function<[^>]+> cache hit in \d+\.\dms"
      assert logs =~ ~r"EXLA compilation #Function<[^>]+> cache hit in \d+\.\dms"
      assert logs =~ ~r"EXLA execution on device \d+ in \d+\.\dms"
    end

    test "without debug nothing is logged" do
      level = Logger.level()
      Logger.configure(level: :debug)
      on_exit(fn -> Logger.configure(level: level) end)
      logs = capture_log([level: :debug], fn -> EXLA.jit(adder(9)).(on_device([1.0])) end)
      refute logs =~ "EXLA"
    end

    test "validates options" do
      x = on_device([1.0])

      assert_raise ArgumentError, ~r/expected precision configuration to be one of/, fn ->
        EXLA.jit(adder(10), precision: :low).(x)
      end

      assert_raise ArgumentError, ~r/:lazy_transfers/, fn ->
        EXLA.jit(adder(10), lazy_transfers: :sometimes).(x)
      end

      assert_raise ArgumentError, ~r/:cache/, fn ->
        EXLA.jit(adder(10), cache: :yes).(x)
      end

      assert_raise ArgumentError, ~r/invalid :device_id 1024/, fn ->
        EXLA.jit(adder(10), device_id: 1024).(x)
      end
    end

    test "accepts every lazy_transfers and precision value" do
      x = on_device([1.0])

      for lazy <- [:always, :never, :opt_in], precision <- [:default, :high, :highest] do
        assert to_list(EXLA.jit(adder(11), lazy_transfers: lazy, precision: precision).(x)) ==
                 [12.0]
      end
    end
  end

  describe "compiler callbacks" do
    test "__to_backend__/1 and __partitions_options__/1" do
      client = EXLA.Client.fetch!(EXLA.Client.default_name())

      assert EXLA.__to_backend__([]) ==
               {EXLA.Backend, [client: client.name, device_id: client.default_device_id]}

      assert EXLA.__to_backend__(device_id: 0) ==
               {EXLA.Backend, [client: client.name, device_id: 0]}

      partitions = EXLA.__partitions_options__([])
      assert length(partitions) == client.device_count
      assert Enum.map(partitions, & &1[:device_id]) == Enum.to_list(0..(client.device_count - 1))
    end

    test "works as the defn compiler" do
      result = Nx.Defn.jit(&Nx.exp/1, compiler: EXLA).(Nx.tensor(0.0))
      assert %EXLA.Backend{} = result.data
      assert Nx.to_number(result) == 1.0
    end
  end
end
