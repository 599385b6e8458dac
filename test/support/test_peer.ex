defmodule EXLA.TestPeer do
  @moduledoc false
  # Peer nodes for the :distributed tests, started with OTP's :peer. All
  # distribution stays on the loopback interface: epmd and every node,
  # this one included, listen on 127.0.0.1 only.
  #
  # Functions of a test module cannot run on a peer (test modules are
  # compiled in memory), so what a test runs there is a function of this
  # module (compiled into the test build, whose code paths peers load).

  @loopback ~c"{127,0,0,1}"

  @doc """
  Makes this node distributed (on loopback, starting epmd there if needed)
  unless it already is.
  """
  def distribute! do
    unless Node.alive?() do
      {_, 0} = System.cmd("epmd", ["-daemon", "-address", "127.0.0.1"])
      Application.put_env(:kernel, :inet_dist_use_interface, {127, 0, 0, 1})
      name = :"exla_test_#{System.unique_integer([:positive])}@127.0.0.1"
      {:ok, _} = Node.start(name, :longnames)
    end

    :ok
  end

  @doc """
  Starts a peer node running EXLA with this node's code paths and `:exla`
  settings, and returns `{peer, node}`. The peer stops with the calling
  process.

  Options: `:exla` - settings of the `:exla` application to use instead of
  this node's; `:env` - OS environment variables of the peer, as
  `{name, value}` strings.
  """
  def start!(name, opts \\ []) do
    distribute!()
    cookie = Atom.to_charlist(Node.get_cookie())
    env = for {key, value} <- opts[:env] || [], do: {to_charlist(key), to_charlist(value)}

    {:ok, peer, node} =
      :peer.start_link(%{
        name: :"#{name}_#{System.unique_integer([:positive])}",
        host: ~c"127.0.0.1",
        # An orderly stop (init:stop) rather than a halt, so that the peer's
        # applications stop first: EXLA waits for a plugin warm-up still
        # under way (EXLA.Client.WarmUp), which a halt would crash.
        shutdown: 10_000,
        args: [
          ~c"-setcookie",
          cookie,
          ~c"-kernel",
          ~c"inet_dist_use_interface",
          @loopback,
          # A stopped peer is a node gone, not a partition to heal.
          ~c"-kernel",
          ~c"prevent_overlapping_partitions",
          ~c"false"
        ],
        env: env
      })

    :ok = :erpc.call(node, :code, :add_paths, [:code.get_path()])
    exla = Keyword.merge(Application.get_all_env(:exla), opts[:exla] || [])
    logger = [level: Logger.level()]
    # Loaded first, so that the settings replace the application's defaults.
    :ok = :erpc.call(node, Application, :load, [:exla])
    :ok = :erpc.call(node, Application, :put_all_env, [[exla: exla, logger: logger]])
    {:ok, _} = :erpc.call(node, Application, :ensure_all_started, [:exla])
    {peer, node}
  end

  @doc """
  Calls `module.function(args)` in a new process of `node` that keeps the
  result (and so its tensors) alive until `release/1`. Returns `{holder,
  result}`.
  """
  def hold(node, module, function, args) do
    :erpc.call(node, __MODULE__, :__hold__, [self(), module, function, args])

    receive do
      {__MODULE__, :held, holder, result} -> {holder, result}
    after
      30_000 -> raise "the peer did not answer"
    end
  end

  @doc false
  def __hold__(caller, module, function, args) do
    spawn(fn ->
      result = apply(module, function, args)
      send(caller, {__MODULE__, :held, self(), result})

      receive do
        :release -> :ok
      end
    end)

    :ok
  end

  @doc "Lets the holder of `hold/4` end, which frees what it held."
  def release(holder) do
    ref = Process.monitor(holder)
    send(holder, :release)

    receive do
      {:DOWN, ^ref, _, _, _} -> :ok
    end
  end

  @doc """
  Starts an `Nx.Serving` process on `node` with `opts` (of
  `Nx.Serving.start_link/1`), kept by a process of its own until
  `release/1`, and waits until this node sees it. Returns that process.
  """
  def start_serving(node, opts) do
    {holder, {:ok, _pid}} = hold(node, Nx.Serving, :start_link, [opts])
    wait_for_serving(node, Keyword.fetch!(opts, :name))
    holder
  end

  # Servings join the process group Nx.Serving on Nx 0.7 and one named
  # after them on Nx 0.12 and later.
  defp wait_for_serving(node, name) do
    there? = fn group -> Enum.any?(:pg.get_members(Nx.Serving.PG, group), &(node(&1) == node)) end
    joined? = EXLA.TestWait.until(fn -> there?.(Nx.Serving) or there?.(name) end, 100, 50)

    joined? || raise "no serving of #{node} joined the cluster's group"
  end

  @doc """
  Starts a serving with `opts` (of `Nx.Serving.start_link/1`, `:name`
  included), sends it every batch of `batches` at once from as many
  processes, stops it, and returns each result's `places/1` with the
  result copied to `Nx.BinaryBackend`.
  """
  def serve_concurrently(opts, batches) do
    {:ok, supervisor} = Nx.Serving.start_link(opts)

    try do
      batches
      |> Task.async_stream(
        fn batch ->
          result = Nx.Serving.batched_run(opts[:name], batch)
          {places(result), to_binary_backend(result)}
        end,
        max_concurrency: length(batches),
        ordered: true
      )
      |> Enum.map(fn {:ok, answer} -> answer end)
    after
      Process.unlink(supervisor)
      ref = Process.monitor(supervisor)
      Process.exit(supervisor, :shutdown)

      receive do
        {:DOWN, ^ref, _, _, _} -> :ok
      end
    end
  end

  @doc """
  Applies `fun` to `args` and returns the result with its tensors copied
  to `Nx.BinaryBackend` (so that it outlives the process, when this runs
  on a peer through `:erpc`), together with the number of
  `[:exla, :compilation]` events the call emitted.
  """
  def apply_counting(fun, args) do
    ref = make_ref()
    handler = {__MODULE__, ref}
    :telemetry.attach(handler, [:exla, :compilation], &__MODULE__.__count__/4, {self(), ref})

    try do
      result = fun |> apply(args) |> to_binary_backend()
      {result, count_messages(ref, 0)}
    after
      :telemetry.detach(handler)
    end
  end

  @doc false
  def __count__(_event, _measurements, _metadata, {pid, ref}) do
    if pid == self(), do: send(pid, {ref, :compiled})
  end

  defp count_messages(ref, count) do
    receive do
      {^ref, :compiled} -> count_messages(ref, count + 1)
    after
      0 -> count
    end
  end

  @doc "Copies every tensor of a container to `Nx.BinaryBackend`."
  def to_binary_backend(container) do
    Nx.Defn.Composite.traverse(container, &Nx.backend_copy(&1, Nx.BinaryBackend))
  end

  @doc """
  Where the tensors of a container live: a list of `{node, client, device}`
  of their buffers.
  """
  def places(container) do
    [container]
    |> Nx.Defn.Composite.flatten_list()
    |> Enum.map(fn %Nx.Tensor{data: %EXLA.Backend{buffer: buffer}} ->
      {node(buffer.ref), buffer.client_name, buffer.device_id}
    end)
  end
end

defmodule EXLA.TestPeer.Model do
  @moduledoc false
  # A small model for the :distributed tests: its functions exist on every
  # peer (test modules do not).
  import Nx.Defn

  @doc "Random parameters of a 4-8-3 perceptron."
  def params do
    key = Nx.Random.key(42)
    {w1, key} = Nx.Random.normal(key, shape: {4, 8})
    {w2, _key} = Nx.Random.normal(key, shape: {8, 3})
    %{w1: w1, b1: Nx.broadcast(0.1, {8}), w2: w2, b2: Nx.broadcast(-0.2, {3})}
  end

  @doc "Class scores of a batch of rows of 4 features."
  defn predict(params, x) do
    x
    |> Nx.dot(params.w1)
    |> Nx.add(params.b1)
    |> Nx.tanh()
    |> Nx.dot(params.w2)
    |> Nx.add(params.b2)
  end

  @doc """
  A serving of `predict/2` with `params`, compiled by EXLA. Its results
  leave the serving's node as `Nx.BinaryBackend` tensors: an EXLA tensor
  only lives while a process of its node holds it.
  """
  def serving(params) do
    Nx.Serving.new(fn opts -> Nx.Defn.jit(&predict(params, &1), opts) end, compiler: EXLA)
    |> Nx.Serving.distributed_postprocessing(&Nx.backend_transfer(&1, Nx.BinaryBackend))
  end

  @doc "`predict/2` with `params`, as an anonymous function of the rows."
  def scorer(params), do: fn x -> predict(params, x) end

  @doc """
  `scorer/1` that also captured `tag` (any term; for a tag that shares
  subterms, the key of the jit is a digest, see EXLA.SharedTerm).
  """
  def tagged_scorer(params, tag), do: fn x -> if tag, do: predict(params, x) end

  @doc "A batch of `n` rows of 4 features."
  def rows(n), do: Nx.iota({n, 4}, type: :f32) |> Nx.divide(10)
end
