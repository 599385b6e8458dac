defmodule EXLA.VMSafetyTest do
  # Inputs that once crashed or froze the whole VM (issue 9). Each must now
  # end in the right answer or an Elixir exception, with the VM, the client
  # and every other process alive.
  use ExUnit.Case, async: true

  alias EXLA.{DeviceBuffer, Executable, NIF, Shape}

  @deleted ~r/called on deleted or donated buffer/

  defp client, do: EXLA.Client.fetch!(:host)

  describe "buffers shared between processes" do
    # 64 readers of one tensor corrupted the C heap within a few rounds.
    test "64 processes read one 200,000-element tensor at once" do
      t = Nx.iota({200_000}, type: :f32, backend: EXLA.Backend)
      expected = Nx.to_binary(Nx.iota({200_000}, type: :f32, backend: Nx.BinaryBackend))

      for _round <- 1..20 do
        results =
          1..64
          |> Enum.map(fn _ -> Task.async(fn -> Nx.to_binary(t) end) end)
          |> Task.await_many(60_000)

        assert Enum.all?(results, &(&1 == expected))
      end
    end

    @tag :slow
    @tag timeout: 600_000
    test "64 processes x 1,000 rounds read, copy, run on and deallocate shared tensors" do
      add_one = EXLA.jit(&Nx.add(&1, 1))

      for round <- 1..1_000 do
        # Every 50th round the tensor is read on a dirty scheduler (> 1 MiB).
        size = if rem(round, 50) == 0, do: 300_000, else: 1_000
        t = Nx.iota({size}, type: :f32, backend: EXLA.Backend)
        expected = Nx.iota({size}, type: :f32, backend: Nx.BinaryBackend)

        1..64
        |> Enum.map(fn i -> Task.async(fn -> race(i, t, expected, add_one) end) end)
        |> Task.await_many(60_000)

        assert Nx.backend_deallocate(t) == :already_deallocated
      end
    end

    defp race(i, t, expected, add_one) do
      case rem(i, 8) do
        0 -> assert Nx.backend_deallocate(t) in [:ok, :already_deallocated]
        1 -> assert_data_or_deleted(fn -> Nx.backend_copy(t, EXLA.Backend) end, expected)
        2 -> assert_data_or_deleted(fn -> Nx.backend_copy(t, Nx.BinaryBackend) end, expected)
        3 -> assert_data_or_deleted(fn -> Nx.subtract(add_one.(t), 1) end, expected)
        _ -> assert_data_or_deleted(fn -> t end, expected)
      end
    end

    defp assert_data_or_deleted(fun, expected) do
      assert Nx.to_binary(fun.()) == Nx.to_binary(expected)
    rescue
      error in RuntimeError -> assert Exception.message(error) =~ @deleted
    end
  end

  describe "deep programs compile on a big stack" do
    # Compiles overflowed the 320 KB stack of a dirty scheduler from about
    # 150 such steps on (with the VM's default flags).
    defp chain(steps) do
      fn x ->
        Enum.reduce(1..steps, x, fn i, acc ->
          acc |> Nx.reverse() |> Nx.sin() |> Nx.multiply(i) |> Nx.remainder(7)
        end)
      end
    end

    # The same depth of ops, exact in any precision.
    defp integer_chain(steps) do
      fn x ->
        Enum.reduce(1..steps, x, fn i, acc ->
          acc |> Nx.reverse() |> Nx.multiply(i) |> Nx.add(i) |> Nx.remainder(7)
        end)
      end
    end

    defp assert_like_evaluator(fun, x) do
      expected = Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator).(x)
      assert Nx.to_binary(EXLA.jit(fun).(x)) == Nx.to_binary(expected)
    end

    test "a 150-step chain" do
      # sin is chaotic under this chain, so only values XLA and the
      # reference compute exactly are compared: zeros, and integers.
      assert_like_evaluator(chain(150), Nx.broadcast(Nx.tensor(0.0), {8}))
      assert_like_evaluator(integer_chain(150), Nx.iota({8}, type: :s32))
    end

    # Each of the two programs takes about 10 s to compile on 2 busy cores.
    @tag :slow
    @tag timeout: 600_000
    test "a 3,000-step chain" do
      assert_like_evaluator(chain(3_000), Nx.broadcast(Nx.tensor(0.0), {8}))
      assert_like_evaluator(integer_chain(3_000), Nx.iota({8}, type: :s32))

      result = EXLA.jit(chain(3_000)).(Nx.iota({8}, type: :f32))
      assert Nx.to_number(Nx.all(Nx.less(Nx.abs(result), 7))) == 1
    end

    # Nested `stablehlo.if`, one per clause: from 28 clauses on, compiling
    # overflowed a dirty scheduler's stack.
    test "a defn cond with 200 clauses" do
      clauses = Enum.map_join(0..198, "\n", &"x < #{&1} -> x * #{&1 + 1}")

      [{module, _}] =
        Code.compile_string("""
        defmodule EXLA.VMSafetyTest.Cond200 do
          import Nx.Defn

          defn pick(x) do
            cond do
              #{clauses}
              true -> x - 1
            end
          end
        end
        """)

      fun = &module.pick/1
      jitted = EXLA.jit(fun)

      for value <- [-1, 5, 150, 198, 1000] do
        x = Nx.tensor(value, type: :s32)
        expected = Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator).(x)
        assert Nx.to_number(jitted.(x)) == Nx.to_number(expected)
      end
    end

    test "attribute arrays 250 deep" do
      nested = String.duplicate("[", 250) <> "1" <> String.duplicate("]", 250)

      mlir = """
      module {
        func.func public @main(%a: tensor<2xf32>) -> tensor<2xf32> {
          %0 = stablehlo.add %a, %a {exla.deep = #{nested}} : tensor<2xf32>
          return %0 : tensor<2xf32>
        }
      }
      """

      assert run_mlir(mlir, [f32([1.0, 2.0])]) == bytes([2.0, 4.0])
    end

    test "a 50-deep chain of private function calls" do
      calls =
        for i <- 0..49 do
          body =
            if i == 49,
              do: "%0 = stablehlo.add %x, %x : tensor<2xf32>",
              else: "%0 = func.call @f#{i + 1}(%x) : (tensor<2xf32>) -> tensor<2xf32>"

          """
            func.func private @f#{i}(%x: tensor<2xf32>) -> tensor<2xf32> {
              #{body}
              return %0 : tensor<2xf32>
            }
          """
        end

      mlir = """
      module {
        func.func public @main(%a: tensor<2xf32>) -> tensor<2xf32> {
          %0 = func.call @f0(%a) : (tensor<2xf32>) -> tensor<2xf32>
          return %0 : tensor<2xf32>
        }
      #{Enum.join(calls)}
      }
      """

      assert run_mlir(mlir, [f32([1.0, 2.0])]) == bytes([2.0, 4.0])
    end

    test "100 nested stablehlo.case" do
      mlir = """
      module {
        func.func public @main(%a: tensor<2xf32>, %i: tensor<i32>) -> tensor<2xf32> {
          #{nested_case(0, 100)}
          return %r0 : tensor<2xf32>
        }
      }
      """

      # Branch 0 descends to the innermost case, which doubles; branch 1
      # returns the input at once.
      assert run_mlir(mlir, [f32([1.0, 2.0]), s32(0)]) == bytes([2.0, 4.0])
      assert run_mlir(mlir, [f32([1.0, 2.0]), s32(1)]) == bytes([1.0, 2.0])
    end

    defp nested_case(level, depth) when level == depth - 1 do
      """
      %r#{level} = "stablehlo.case"(%i) ({
        %s = stablehlo.add %a, %a : tensor<2xf32>
        stablehlo.return %s : tensor<2xf32>
      }, {
        stablehlo.return %a : tensor<2xf32>
      }) : (tensor<i32>) -> tensor<2xf32>
      """
    end

    defp nested_case(level, depth) do
      """
      %r#{level} = "stablehlo.case"(%i) ({
        #{nested_case(level + 1, depth)}
        stablehlo.return %r#{level + 1} : tensor<2xf32>
      }, {
        stablehlo.return %a : tensor<2xf32>
      }) : (tensor<i32>) -> tensor<2xf32>
      """
    end
  end

  describe "no normal scheduler is held by a long run" do
    defmodule Loop do
      import Nx.Defn

      defn spin(x, n) do
        {x, _i, _n} =
          while {x, i = 0, n}, i < n do
            {Nx.sin(x) * 1.5 + 0.25, i + 1, n}
          end

        x
      end
    end

    test "where programs run is decided from what the lowering recorded" do
      tiny = program_of(&Nx.add(&1, &1), [Nx.iota({3}, type: :f32)])
      large = program_of(&Nx.add(&1, &1), [Nx.iota({100_000}, type: :f32)])
      loop = program_of(&Loop.spin/2, [Nx.tensor(0.5), Nx.tensor(10)])

      # x + x reads 3 elements twice and writes 3; the parameter is the
      # largest tensor.
      assert tiny.facts == %EXLA.MLIR.Facts{largest_tensor: 3, total_elements: 9}
      assert large.facts.largest_tensor == 100_000
      assert loop.facts.unbounded == ["stablehlo.while"]

      assert Executable.compile(client(), tiny).run_on == :scheduler
      assert Executable.compile(client(), large).run_on == :dirty
      assert Executable.compile(client(), loop).run_on == :thread
      # Small but declared long by its compiler.
      assert Executable.compile(client(), tiny, run_on: :thread).run_on == :thread
    end

    test "where hand-written programs run is decided from their text" do
      limit = EXLA.Client.max_tensor_bytes(client())
      tiny = mlir_of(&Nx.add(&1, &1), [Nx.iota({3}, type: :f32)])
      loop = mlir_of(&Loop.spin/2, [Nx.tensor(0.5), Nx.tensor(10)])

      assert EXLA.MLIR.Check.read!(tiny, limit).facts.unbounded == []
      assert EXLA.MLIR.Check.read!(loop, limit).facts.unbounded == ["stablehlo.while"]
      assert Executable.compile(client(), tiny).run_on == :scheduler
      assert Executable.compile(client(), loop).run_on == :thread

      # A dynamic dimension tells nothing of the size.
      dynamic =
        EXLA.MLIR.Check.read!(
          String.replace(tiny, "-> tensor<3xf32>\n", "-> tensor<?xf32>\n"),
          limit
        )

      assert dynamic.facts.total_elements == :unknown
      assert EXLA.Placement.run_on(dynamic.facts, 1) == :dirty
    end

    # XLA:CPU ran the loop inline on the caller's normal scheduler: a 10 ms
    # ticker was frozen for the whole run (seconds). The VM's system monitor
    # reports any process that holds a scheduler for 100 ms or more; the
    # ticker's count is only checked loosely, since it also depends on how
    # busy the machine is.
    @tag cpu_only:
           "20 million loop steps take seconds on the CPU; a GPU runs each step's " <>
             "condition from the host, for minutes, and every other program waits for the device"
    test "a ticker keeps ticking while a long while loop runs" do
      spin = EXLA.jit(&Loop.spin/2)
      x = Nx.tensor(0.5)
      spin.(x, Nx.tensor(10))
      parent = self()

      ticker =
        spawn_link(fn ->
          send(parent, :ticking)
          tick(parent, 0)
        end)

      assert_receive :ticking
      previous = :erlang.system_monitor(self(), long_schedule: 100)
      runner = Task.async(fn -> spin.(x, Nx.tensor(20_000_000)) end)
      result = Task.await(runner, 60_000)
      restore_system_monitor(previous)
      send(ticker, :stop)
      assert_receive {:ticks, ticks}, 5_000

      runner_pid = runner.pid
      refute_received {:monitor, ^runner_pid, :long_schedule, _}
      assert ticks > 0

      # The loop converges to a fixed point of x -> 1.5 sin(x) + 0.25.
      fixed = Nx.Defn.jit(&Loop.spin/2, compiler: Nx.Defn.Evaluator).(x, Nx.tensor(200))
      assert_in_delta Nx.to_number(result), Nx.to_number(fixed), 1.0e-5
    end

    defp restore_system_monitor(:undefined), do: :erlang.system_monitor(:undefined)
    defp restore_system_monitor({pid, options}), do: :erlang.system_monitor(pid, options)

    defp tick(parent, ticks) do
      receive do
        :stop -> send(parent, {:ticks, ticks})
      after
        10 -> tick(parent, ticks + 1)
      end
    end

    # An infeed program blocked the scheduler forever, and no process could
    # be killed. Plugins without infeed may refuse it at compile time; if
    # one compiles it, its run waits on a native thread, and the caller can
    # be killed.
    @tag cpu_only:
           "the CPU plugin refuses infeed; a GPU runs the program, which then holds " <>
             "the device until fed, and no other test's program runs again"
    test "a program waiting for infeed never blocks a scheduler" do
      mlir = """
      module {
        func.func public @main(%a: tensor<2xf32>) -> tensor<2xf32> {
          %t = stablehlo.create_token : !stablehlo.token
          %0:2 = "stablehlo.infeed"(%t) {infeed_config = "", layout = [[0]]} : (!stablehlo.token) -> (tensor<2xf32>, !stablehlo.token)
          %1 = stablehlo.add %a, %0#0 : tensor<2xf32>
          return %1 : tensor<2xf32>
        }
      }
      """

      try do
        Executable.compile(client(), mlir)
      rescue
        _ in [ArgumentError, RuntimeError] -> :refused
      else
        exe ->
          a = place(f32([1.0, 2.0]))
          runner = spawn(fn -> Executable.run(exe, [[a]]) end)
          Process.sleep(100)
          # The scheduler is free: this process runs, and kills the runner.
          assert Process.alive?(runner)
          Process.exit(runner, :kill)
          refute Process.alive?(runner)
      end
    end
  end

  describe "native code is checked before it is loaded or run" do
    @describetag :tmp_dir

    # A truncated plugin file died with SIGBUS inside dlopen. Each refusal
    # also logs an integrity warning (EXLA.NativeLog), kept off the console.
    @tag :capture_log
    test "a truncated copy of the plugin or a random file is refused", %{tmp_dir: dir} do
      for size <- [100, 4096, 1_000_000, 40_000_000] do
        path = Path.join(dir, "truncated_#{size}.so")
        {:ok, ^size} = :file.copy(client().plugin_path, path, size)

        assert_raise RuntimeError, ~r/could not load PJRT plugin .*: the file is truncated/, fn ->
          NIF.unwrap!(NIF.plugin_load(path))
        end

        File.rm!(path)
      end

      random = Path.join(dir, "random.so")
      File.write!(random, :crypto.strong_rand_bytes(5000))

      assert_raise RuntimeError, ~r/could not load PJRT plugin .*: it is not an ELF/, fn ->
        NIF.unwrap!(NIF.plugin_load(random))
      end

      # The warnings are logged (and captured) before the test ends.
      EXLA.NativeLog.flush()
    end

    # A C++ exception thrown by the plugin on the calling thread unwound
    # into Rust and aborted the VM: an XLA flag value it cannot handle
    # (xla_cpu_parallel_codegen_split_count=-1), or a shape whose size
    # overflows. Sizes and option values are checked before they get here,
    # so this goes to the NIF directly.
    test "a C++ exception in the plugin becomes a RuntimeError" do
      mlir = """
      module {
        func.func public @main(%a: tensor<f32>) -> tensor<f32> {
          %0 = stablehlo.broadcast_in_dim %a, dims = [] : (tensor<f32>) -> tensor<3000000000x1000000000xf32>
          %c = stablehlo.constant dense<0.0> : tensor<f32>
          %1 = stablehlo.reduce(%0 init: %c) applies stablehlo.add across dimensions = [0, 1] : (tensor<3000000000x1000000000xf32>, tensor<f32>) -> tensor<f32>
          return %1 : tensor<f32>
        }
      }
      """

      spec = Shape.to_spec(Shape.make_shape({:f, 32}, {}))

      assert_raise RuntimeError, ~r/threw a C\+\+ exception in PJRT_Client_Compile/, fn ->
        NIF.async!(&NIF.executable_compile(client().ref, mlir, [spec], 0, 1, 1, false, &1))
      end

      # The client still works.
      assert run_mlir(mlir_of(&Nx.add(&1, &1), [Nx.iota({2}, type: :f32)]), [f32([1.0, 2.0])]) ==
               bytes([2.0, 4.0])
    end
  end

  defp mlir_of(fun, args), do: EXLA.to_mlir_module(fun, args).mlir_module

  defp program_of(fun, args) do
    expr = apply(Nx.Defn.debug_expr(fun), args)
    shapes = Enum.map(args, &EXLA.Shape.make_shape(&1.type, &1.shape))
    EXLA.Defn.Lowering.to_mlir(expr, shapes).program
  end

  defp run_mlir(mlir, args) do
    exe = Executable.compile(client(), mlir)
    [[out]] = Executable.run(exe, [Enum.map(args, &place/1)])
    DeviceBuffer.read(out)
  end

  defp place({data, shape}), do: DeviceBuffer.place_on_device(data, shape, client(), 0)

  defp f32(values) do
    data = for v <- values, into: <<>>, do: <<v::float-32-native>>
    {data, Shape.make_shape({:f, 32}, {length(values)})}
  end

  defp bytes(values), do: values |> f32() |> elem(0)

  defp s32(value), do: {<<value::signed-32-native>>, Shape.make_shape({:s, 32}, {})}
end
