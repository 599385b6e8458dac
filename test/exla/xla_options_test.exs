defmodule EXLA.XLAOptionsTest do
  # Changes the :exla application environment.
  use ExUnit.Case, async: false

  alias EXLA.XLAOptions

  defp plugin_path, do: EXLA.Client.fetch!(:host).plugin_path

  defp flags_error(flags) do
    assert_raise ArgumentError, fn -> XLAOptions.check_flags!(flags, plugin_path()) end
  end

  describe "parse_flags/1" do
    test "splits entries as XLA does" do
      assert XLAOptions.parse_flags("") == {:ok, []}
      assert XLAOptions.parse_flags(" \t\n") == {:ok, []}

      assert XLAOptions.parse_flags("  --a=1\t--b --c=x=y\n") ==
               {:ok, [{"a", "1"}, {"b", nil}, {"c", "x=y"}]}

      assert XLAOptions.parse_flags(~s(--a="x y" --b='p "q"' --c="\\"z\\"")) ==
               {:ok, [{"a", "x y"}, {"b", ~s(p "q")}, {"c", ~s("z")}]}

      assert XLAOptions.parse_flags("--a=") == {:ok, [{"a", ""}]}
    end

    test "refuses what XLA would not read as flags" do
      assert {:error, message} = XLAOptions.parse_flags("xla_cpu_use_xnnpack=true")
      assert message =~ "name of a file of flags"
      assert {:error, message} = XLAOptions.parse_flags("--a=1 b --c=2")
      assert message =~ ~s("b" does not start with --)
      assert {:error, message} = XLAOptions.parse_flags("-a=1")
      assert message =~ "-a=1 does not start with --"
      assert {:error, _} = XLAOptions.parse_flags("--")
      assert {:error, _} = XLAOptions.parse_flags("--a.b=1")
      assert {:error, _} = XLAOptions.parse_flags("--Upper=1")
    end
  end

  describe "check_flags!/2 on the CPU plugin" do
    test "refuses each flag that aborted or ended the VM, naming it" do
      cases = [
        {"--xla_cpu_parallel_codegen_split_count=-1",
         "--xla_cpu_parallel_codegen_split_count=-1 must be an integer between 1 and 1024"},
        {"--xla_cpu_use_xnnpack=maybe",
         "--xla_cpu_use_xnnpack=maybe expects true, false, 1 or 0"},
        {"--xla_cpu_prefer_vector_width=99999999999",
         "--xla_cpu_prefer_vector_width=99999999999 must be an integer between -2147483648"},
        {"--help", "--help is refused: XLA would print its usage"},
        {"--xla_dump_to", "--xla_dump_to needs a value"},
        {"xla_cpu_use_xnnpack=true", "name of a file of flags"},
        {"--xla_dump_to=/tmp/x later", ~s("later" does not start with --)},
        {"--xla_bogus=1", "--xla_bogus=1 is not an XLA option of this plugin"},
        {"--xla_detailed_logging=true", "is an XLA option without a flag"},
        {"--xla_step_marker_location=STEP_MARK_NONE", "sets an enum"},
        {"--xla_cpu_use_xnnpack=true --xla_backend_optimization_level=x",
         "--xla_backend_optimization_level=x expects an integer"}
      ]

      for {flags, message} <- cases do
        error = flags_error(flags)
        assert error.message =~ "invalid XLA_FLAGS: "
        assert error.message =~ message, "#{flags}: #{error.message}"
      end
    end

    test "accepts well-formed flags of every checked type" do
      flags =
        "--xla_cpu_use_xnnpack --xla_cpu_enable_fast_math=FALSE --xla_cpu_fast_math_honor_nans=1 " <>
          "--xla_backend_optimization_level=2 --xla_cpu_parallel_codegen_split_count=+8 " <>
          ~s(--xla_dump_to="/tmp/a b" --xla_disable_hlo_passes=a,b ) <>
          "--xla_backend_extra_options=k=v,w --xla_force_host_platform_device_count=2"

      assert XLAOptions.check_flags!(flags, plugin_path()) == :ok
      assert XLAOptions.check_flags!(nil, plugin_path()) == :ok
      assert XLAOptions.check_flags!("  ", plugin_path()) == :ok
    end

    test "reads the options from the plugin file" do
      fields = XLAOptions.fields(plugin_path())
      assert fields["xla_cpu_use_xnnpack"] == {:bool, false}
      assert fields["xla_cpu_parallel_codegen_split_count"] == {:int32, false}
      assert fields["xla_disable_hlo_passes"] == {:string, true}
      assert {{:enum, values}, false} = fields["xla_step_marker_location"]
      assert {"STEP_MARK_NONE", _} = List.keyfind(values, "STEP_MARK_NONE", 0)
    end
  end

  describe ":xla_options" do
    defp put_client(name, xla_options) do
      clients = Application.fetch_env!(:exla, :clients)
      Application.put_env(:exla, :clients, clients ++ [{name, [xla_options: xla_options]}])
      on_exit(fn -> Application.put_env(:exla, :clients, clients) end)
    end

    defp fetch_error(xla_options) do
      name = :"xla_options_#{System.unique_integer([:positive])}"
      put_client(name, xla_options)
      %ArgumentError{} = EXLA.TestClients.creation_error(fn -> EXLA.Client.fetch!(name) end)
    end

    test "a value that aborted at the first compile fails when the client is validated" do
      error = fetch_error(xla_cpu_parallel_codegen_split_count: -1)

      assert error.message =~ "invalid :xla_options for EXLA client :xla_options_"

      assert error.message =~
               "xla_cpu_parallel_codegen_split_count must be an integer between 1 and 1024, got: -1"

      assert_raise ArgumentError, ~r/between 1 and 1024/, fn ->
        EXLA.Client.Options.validate!(:a, xla_options: [xla_cpu_parallel_codegen_split_count: 0])
      end
    end

    test "values are checked against the option's type" do
      cases = [
        {[xla_cpu_use_xnnpack: 1], "xla_cpu_use_xnnpack expects a boolean, got: 1"},
        {[xla_backend_optimization_level: "2"], "expects an integer"},
        {[xla_backend_optimization_level: 2 ** 31], "between -2147483648 and 2147483647"},
        {[xla_dump_to: 1], "xla_dump_to expects a string"},
        {[xla_gpu_autotune_gemm_rtol: 1], "expects a float"},
        {[xla_gpu_autotune_gemm_rtol: 1.0e39], "is too large"},
        {[xla_step_marker_location: "NOPE"], "expects one of STEP_MARK_AT_ENTRY"},
        {[xla_step_marker_location: 99], "expects one of STEP_MARK_AT_ENTRY"},
        {[xla_disable_hlo_passes: true], "expects a comma-separated string"},
        {[xla_cpu_experimental_xnn_fusion_type: "LIBRARY_FUSION_TYPE_DOT,NOPE"], ~s(item "NOPE")},
        {[xla_backend_extra_options: "a=b"], "cannot be set as a client option"},
        {%{"xla_no_such_option" => true}, "xla_no_such_option is not an XLA option"}
      ]

      for {options, message} <- cases do
        error = fetch_error(options)
        assert error.message =~ message, "#{inspect(options)}: #{error.message}"
      end
    end

    test "well-typed values of every kind compile and run" do
      name = :xla_options_typed
      fun = fn x -> Nx.multiply(x, 2) end

      put_client(name,
        xla_cpu_use_xnnpack: false,
        xla_backend_optimization_level: 2,
        xla_cpu_parallel_codegen_split_count: 4,
        xla_step_marker_location: "STEP_MARK_AT_ENTRY",
        xla_cpu_experimental_xnn_fusion_type:
          "LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_ELTWISE",
        xla_disable_hlo_passes: "no-such-pass"
      )

      result = EXLA.jit(fun, client: name).(Nx.tensor([1.0, 2.0]))
      assert Nx.to_flat_list(result) == [2.0, 4.0]
    end
  end

  describe "XLA_FLAGS in the process environment" do
    # XLA reads XLA_FLAGS from the environment of the OS process, which
    # System.put_env/2 does not change: a fresh VM gets it.
    defp run_vm(flags) do
      code = """
      Application.ensure_all_started(:exla)

      try do
        EXLA.Client.fetch!(:host)
        x = EXLA.jit(&Nx.add(&1, 1)).(Nx.tensor([1, 2]))
        IO.puts("result: \#{inspect(Nx.to_flat_list(x))}")
      catch
        :exit, {{%ArgumentError{} = e, _}, _} -> IO.puts("raised: " <> Exception.message(e))
      end
      """

      EXLA.TestScript.run(code,
        env: [{"XLA_FLAGS", flags}],
        stderr_to_stdout: true
      )
    end

    test "a bad flag raises naming it, and the VM carries on" do
      assert {output, 0} = run_vm("--xla_cpu_parallel_codegen_split_count=-1")

      assert output =~
               "raised: invalid XLA_FLAGS: --xla_cpu_parallel_codegen_split_count=-1 must be"

      assert {output, 0} =
               run_vm("--xla_cpu_use_xnnpack=false --xla_backend_optimization_level=1")

      assert output =~ "result: [2, 3]"
    end
  end
end
