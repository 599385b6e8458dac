defmodule EXLA.Distributed.RemoteCompileTest do
  # Functions of EXLA.compile/3 sent to another node: they run there from
  # their serialized executable when that node has the same plugin, and
  # are compiled again from their expression when it does not (another
  # plugin, or an executable its owner no longer has).
  use ExUnit.Case, async: false

  alias EXLA.TestPeer
  alias EXLA.TestPeer.Model

  @moduletag :distributed

  setup_all do
    {_peer, node} = TestPeer.start!(:same_plugin)
    %{peer_node: node}
  end

  defp compile_predict(batch) do
    params = Model.params()
    templates = [Nx.to_template(params), Nx.template({batch, 4}, :f32)]
    {params, EXLA.compile(&Model.predict/2, templates)}
  end

  defp expected(params, x), do: Nx.Defn.jit_apply(&Model.predict/2, [params, x])

  defp assert_close(a, b), do: assert(Nx.all_close(a, b, atol: 1.0e-5) |> Nx.to_number() == 1)

  test "runs on a node with the same plugin without compiling", %{peer_node: node} do
    {params, predict} = compile_predict(3)
    x = Model.rows(3)
    params = Nx.backend_copy(params, Nx.BinaryBackend)

    {result, compilations} = :erpc.call(node, TestPeer, :apply_counting, [predict, [params, x]])
    assert compilations == 0
    assert_close(result, expected(params, x))

    # Loaded once: the next call neither compiles nor loads.
    {result, 0} = :erpc.call(node, TestPeer, :apply_counting, [predict, [params, Nx.add(x, 1)]])
    assert_close(result, expected(params, Nx.add(x, 1)))
  end

  test "takes this node's EXLA tensors as arguments there", %{peer_node: node} do
    {params, predict} = compile_predict(2)
    x = Nx.backend_copy(Model.rows(2), EXLA.Backend)
    assert node(x.data.buffer.ref) == node()

    {result, 0} = :erpc.call(node, TestPeer, :apply_counting, [predict, [params, x]])
    assert_close(result, expected(params, x))
  end

  test "a function from another node runs here; compiled again once its owner stops" do
    {peer, node} = TestPeer.start!(:compile_owner)
    templates = [Nx.to_template(Model.params()), Nx.template({2, 4}, :f32)]
    {_holder, predict} = TestPeer.hold(node, EXLA, :compile, [&Model.predict/2, templates])
    params = Model.params()
    x = Model.rows(2)

    {result, 0} = TestPeer.apply_counting(predict, [params, x])
    assert_close(result, expected(params, x))

    # Its owner gone, a function not yet loaded here compiles again.
    templates = [Nx.to_template(Model.params()), Nx.template({3, 4}, :f32)]
    {_holder, other} = TestPeer.hold(node, EXLA, :compile, [&Model.predict/2, templates])
    :peer.stop(peer)
    {result, 1} = TestPeer.apply_counting(other, [params, Model.rows(3)])
    assert_close(result, expected(params, Model.rows(3)))
    # The loaded one needs its owner no more.
    {_result, 0} = TestPeer.apply_counting(predict, [params, x])
  end

  test "compiles again where the executable was freed", %{peer_node: node} do
    templates = [Nx.to_template(Model.params()), Nx.template({2, 4}, :f32)]
    # Without the cache, the function alone holds its executable.
    args = [&Model.predict/2, templates, [cache: false]]
    {holder, predict} = TestPeer.hold(node, EXLA, :compile, args)
    TestPeer.release(holder)
    :erpc.call(node, :erlang, :garbage_collect, [])

    {result, 1} = TestPeer.apply_counting(predict, [Model.params(), Model.rows(2)])
    assert_close(result, expected(Model.params(), Model.rows(2)))
  end

  test "a jitted function made here loads this node's program there", %{peer_node: node} do
    params = Model.params()
    scorer = EXLA.jit(Model.scorer(params))
    x = Model.rows(5)
    expected = scorer.(x)

    {result, 0} = :erpc.call(node, TestPeer, :apply_counting, [scorer, [x]])
    assert_close(result, expected)
    {_result, 0} = :erpc.call(node, TestPeer, :apply_counting, [scorer, [Nx.add(x, 1)]])

    # Not compiled here for these arguments: it compiles there.
    {result, 1} = :erpc.call(node, TestPeer, :apply_counting, [scorer, [Model.rows(6)]])
    assert_close(result, expected(params, Model.rows(6)))
  end

  test "a jitted closure over a term sharing subterms loads this node's program there",
       %{peer_node: node} do
    # 2^16 leaves in 16 tuples: its key is a digest. Sent, the closure
    # arrives with the term unshared (2^17 tuples), whose digest is the
    # same: the program is found here.
    shared = Enum.reduce(1..16, :leaf, fn _, t -> {t, t} end)
    scorer = EXLA.jit(Model.tagged_scorer(Model.params(), shared))
    x = Model.rows(5)
    expected = scorer.(x)

    {result, 0} = :erpc.call(node, TestPeer, :apply_counting, [scorer, [x]])
    assert_close(result, expected)
  end

  describe "on a node with another plugin" do
    # The other plugin is the CPU plugin file of EXLA_OTHER_CPU_PLUGIN
    # when set (another build, such as the one of the lammps-jax-pjrt-cpu
    # wheel); otherwise a copy of EXLA's CPU plugin with one byte appended:
    # the same library, but another file by its hash, which is how EXLA
    # tells plugins apart (a test-only stand-in for another build).
    setup do
      copy =
        case System.get_env("EXLA_OTHER_CPU_PLUGIN") do
          path when path not in [nil, ""] -> path
          _ -> altered_copy()
        end

      {_peer, node} =
        TestPeer.start!(:other_plugin,
          exla: [clients: [host: [platform: :host, plugin: copy]], preferred_clients: [:host]]
        )

      %{other_node: node, copy: copy}
    end

    defp altered_copy do
      plugin = EXLA.Client.fetch!(:host).plugin_path

      dir =
        Path.join(System.tmp_dir!(), "exla_other_plugin_#{System.unique_integer([:positive])}")

      File.mkdir_p!(dir)
      copy = Path.join(dir, Path.basename(plugin))
      File.cp!(plugin, copy)
      File.write!(copy, <<0>>, [:append])
      on_exit(fn -> File.rm_rf!(dir) end)
      copy
    end

    test "compiles the function again", %{other_node: node, copy: copy} do
      assert :erpc.call(node, EXLA.Client, :fetch!, [:host]).plugin_path == copy
      {params, predict} = compile_predict(3)
      x = Model.rows(3)

      {result, compilations} = :erpc.call(node, TestPeer, :apply_counting, [predict, [params, x]])
      assert compilations == 1
      assert_close(result, expected(params, x))
      {_result, 0} = :erpc.call(node, TestPeer, :apply_counting, [predict, [params, x]])
    end

    test "compiles a jitted function made here again", %{other_node: node} do
      params = Model.params()
      scorer = EXLA.jit(Model.scorer(params))
      x = Model.rows(4)
      expected = scorer.(x)
      {result, 1} = :erpc.call(node, TestPeer, :apply_counting, [scorer, [x]])
      assert_close(result, expected)
    end

    test "refuses to load the executable itself", %{other_node: node} do
      mlir = """
      module {
        func.func public @main(%a: tensor<2xf32>) -> tensor<2xf32> {
          %0 = stablehlo.negate %a : tensor<2xf32>
          return %0 : tensor<2xf32>
        }
      }
      """

      exe = EXLA.Executable.compile(EXLA.Client.fetch!(:host), mlir)

      input =
        {<<1.0::float-32-native, 2.0::float-32-native>>, EXLA.Shape.make_shape({:f, 32}, {2})}

      assert_raise ArgumentError, ~r/by another PJRT plugin/, fn ->
        EXLA.Remote.call!(node, EXLA.Executable, :run, [exe, [[input]]])
      end

      sealed = EXLA.Executable.serialize(exe)
      client = :erpc.call(node, EXLA.Client, :fetch!, [:host])

      assert {:error, :other_plugin} =
               :erpc.call(node, EXLA.Executable.Serialized, :load_sealed, [client, sealed])
    end
  end
end
