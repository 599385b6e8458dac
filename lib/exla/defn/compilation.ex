defmodule EXLA.Defn.Compilation do
  @moduledoc false

  # The compilation of defn functions (jit, compile, stream, shard_jit and
  # EXLA.Backend's ops), behind EXLA.Defn's compiler callbacks: on a cache
  # miss, the defn function is evaluated with `Nx.Defn.Expr` parameters (the
  # *evaluation*), the expression is lowered to a StableHLO module by
  # `EXLA.Defn.Lowering` and compiled by the PJRT plugin (the *compilation*).
  # The result is an `EXLA.Defn.Compiled` struct holding the executable, the
  # shapes of the inputs, the output templates and a function that turns the
  # output buffers into the result container. Compilation emits the
  # telemetry events (see EXLA.Defn.CompileReport).
  #
  # The cache key is the function's key (given by `Nx.Defn`), the type,
  # shape, names and vectorized axes of every argument, and the options
  # (which include the client and device). Caches are
  # `EXLA.LockedCache`: concurrent callers of the same key wait for one
  # compilation. Running a compiled function is `EXLA.Defn.Call`'s business.
  #
  # A cache miss (`compile/5`) does, in order:
  #
  #   1. checks the options (`validate_options!/1`) and takes the key's
  #      lock in `EXLA.LockedCache`: one caller compiles, the others wait
  #      for its result;
  #   2. for an anonymous function made on another connected node, loads
  #      the executable that node has cached for the same key, client and
  #      device, if any (`from_origin/3`), and stops there;
  #   3. evaluates the function on its parameters to an `Nx.Defn.Expr`
  #      (`compilation/5`, timed);
  #   4. lowers the expression to an `EXLA.MLIR.Program`
  #      (`EXLA.Defn.Lowering`), with its host calls' sites, and with lazy
  #      transfers one program per set of device inputs (`lazy_variants/4`);
  #      registers the host-callback handler where the program calls the
  #      host;
  #   5. compiles it through the caches of programs by text, in this VM and
  #      on disk (`EXLA.CompileCache`), the plugin compiling only on a miss
  #      of both;
  #   6. builds the `EXLA.Defn.Compiled`: the executable, the parameters'
  #      shapes and donations (`parameters/4`), the output template and its
  #      builder;
  #   7. reports the compilation (`EXLA.Defn.CompileReport`: debug lines,
  #      the telemetry events, the recompilation count) and stores the
  #      result under the key.

  require Logger

  alias Nx.Tensor, as: T
  alias Nx.Defn.Composite
  alias EXLA.Defn.{Call, Compiled}
  alias EXLA.{LockedCache, SharedTerm}

  ## Compilation for EXLA.Backend

  @doc false
  # Compiles (or fetches from the cache) a function of `templates` built by
  # `build`, a function that receives the list of parameter expressions.
  def __compile_op__(cache_key, name, templates, build, opts) do
    vars = templates |> Enum.with_index() |> Enum.map(fn {t, i} -> param(t, i) end)
    fun = fn vars -> as_expr(fn -> build.(vars) end) end
    lookup_or_compile(name, cache_key, vars, fun, opts)
  end

  defp param(%T{} = t, i), do: Nx.Defn.Expr.parameter(t, :root, i)

  defp as_expr(fun) do
    previous_backend = Process.put(Nx.Shared.backend_pdict_key(), {Nx.Defn.Expr, []})
    previous_compiler = Process.put(Nx.Defn.Compiler, EXLA)

    try do
      Composite.traverse(fun.(), &Nx.Defn.Expr.tensor/1)
    after
      restore(Nx.Shared.backend_pdict_key(), previous_backend)
      restore(Nx.Defn.Compiler, previous_compiler)
    end
  end

  defp restore(key, nil), do: Process.delete(key)
  defp restore(key, value), do: Process.put(key, value)

  ## Cache and compilation

  @doc false
  # A program of `cache: path` is never served from memory without reading
  # its file first (see EXLA.Defn.CacheFile).
  def lookup_or_compile(key, cache_key, vars, fun, opts) do
    case LockedCache.get(cache_key, Keyword.get(opts, :cache_kind, :permanent)) do
      %Compiled{cache_file: nil} = compiled ->
        if compiled.debug?, do: Call.log_hits(SharedTerm.inspect(key), 0)
        compiled

      _nil_or_file ->
        compile(key, cache_key, vars, fun, opts)
    end
  end

  @doc false
  def compile(key, cache_key, vars, fun, opts) do
    # :cache_kind is internal (EXLA.Backend's ops), not a jit option
    {internal, given} = Keyword.split(opts, [:cache_kind])
    opts = validate_options!(given) ++ internal
    fetch = fn opts -> fetch(key, cache_key, vars, fun, opts) end

    case opts[:cache] do
      path when is_binary(path) ->
        configuration = EXLA.Defn.CacheFile.configuration(vars, given, opts[:client])
        opts = opts ++ [cache_configuration: configuration]
        EXLA.Defn.CacheFile.through(path, configuration, opts[:debug], fn -> fetch.(opts) end)

      _true_or_false ->
        case fetch.(opts) do
          {:hit, compiled} ->
            if opts[:debug], do: Call.log_hits(SharedTerm.inspect(key), 0)
            compiled

          {_miss_or_off, compiled} ->
            compiled
        end
    end
  end

  defp fetch(key, cache_key, vars, fun, opts) do
    kind = Keyword.get(opts, :cache_kind, :permanent)
    build = fn -> from_origin(key, cache_key, opts) || build(key, vars, fun, opts) end
    LockedCache.fetch_or_build(opts[:cache], cache_key, kind, build)
  end

  # An anonymous function made on another node that is connected may be
  # compiled and cached there already: then its executable is loaded from
  # there (same plugin, same client name and device), which spares
  # compiling it here.
  defp from_origin(key, cache_key, opts) when is_function(key) do
    with true <- opts[:cache] != false,
         [_ | _] = nodes <- origins(key),
         %Compiled{exe: exe} = compiled <- cached_on(nodes, cache_key, opts),
         {:ok, local} <- EXLA.Remote.load_executable(exe) do
      if compiled.callbacks, do: EXLA.HostCallback.install!(local.client)

      if opts[:debug],
        do: Logger.debug("EXLA loaded #{SharedTerm.inspect(key)} from #{node(exe.ref)}")

      %{compiled | exe: local, client: local.client}
    else
      _ -> nil
    end
  end

  defp from_origin(_key, _cache_key, _opts), do: nil

  # The nodes that may have made `fun`. Up to OTP 26 a function remembers
  # the process that made it: its node, when that is another one and
  # connected. From OTP 27 on, functions no longer record it (their
  # process reads as #PID<0.0.0>, as a function without an environment's
  # did before): every connected node may have.
  defp origins(fun) do
    case :erlang.fun_info(fun, :pid) do
      {:pid, pid} when is_pid(pid) ->
        cond do
          pid == :erlang.list_to_pid(~c"<0.0.0>") -> Node.list()
          node(pid) in Node.list() -> [node(pid)]
          true -> []
        end

      {:pid, :undefined} ->
        []
    end
  end

  # A node that does not answer soon is not waited for: compiling is.
  @origin_timeout 10_000

  # The first program that one of `nodes` has cached under `cache_key` for
  # the same client name and device.
  defp cached_on(nodes, cache_key, opts) do
    {client, device} = {opts[:client], opts[:device_id]}

    nodes
    |> :erpc.multicall(LockedCache, :get, [cache_key], @origin_timeout)
    |> Enum.find_value(fn
      {:ok, %Compiled{client_name: ^client, device_id: ^device} = compiled} -> compiled
      _other -> nil
    end)
  end

  defp build(key, vars, fun, opts) do
    compilation(key, vars, fun, opts, &compile_expr(key, &1, vars, opts))
  end

  @doc false
  # The one path of a compilation (of jit, compile, stream and shard_jit):
  # evaluates `fun` on `vars` to an expression, gives it to `compile`
  # (which returns `{compiled, disk_cache}`, see EXLA.CompileCache.compile/4),
  # logs the evaluation with `debug: true` and reports the compilation
  # (EXLA.Defn.CompileReport). Returns what `compile` compiled.
  def compilation(key, vars, fun, opts, compile) do
    {eval_time, expr} = :timer.tc(fn -> fun.(vars) end)

    if opts[:debug] do
      Logger.debug(
        "EXLA defn evaluation #{SharedTerm.inspect(key)} cache miss in #{ms(eval_time)}ms"
      )
    end

    {compile_time, {{compiled, disk_cache}, stages}} =
      :timer.tc(fn -> EXLA.CompileTimer.collect(fn -> compile.(expr) end) end)

    timing = %{eval_time: eval_time, compile_time: compile_time, stages: stages}
    EXLA.Defn.CompileReport.compiled(key, vars, expr, opts, timing, disk_cache)

    compiled
  end

  # Returns the compiled program and where its executable came from (see
  # EXLA.CompileCache.compile/4).
  defp compile_expr(key, expr, vars, opts) do
    client = EXLA.Client.fetch!(opts[:client])

    %{program: program} =
      lowered = EXLA.CompileTimer.measure(:lower_time, fn -> lower(expr, vars, opts) end)

    # A lazy program's sites carry `:lazy` (see lazy_variants/4).
    callbacks =
      cond do
        opts[:lazy_transfers] == :always ->
          Map.put(lowered.hook_sites, :lazy, lazy_variants(key, expr, vars, opts))

        lowered.chain? ->
          lowered.hook_sites

        true ->
          nil
      end

    if callbacks, do: EXLA.HostCallback.install!(client)

    compile_opts = [device_id: opts[:device_id]]
    disk = disk(opts)
    {exe, disk_cache} = EXLA.CompileCache.Memory.compile(client, program, compile_opts, disk)

    output = Composite.traverse(expr, &%{&1 | data: %Nx.TemplateBackend{}})
    donated = donated_inputs(vars, opts[:donate])
    {input_shapes, donate} = parameters(vars, lowered.used_inputs, donated, opts)

    compiled = %Compiled{
      exe: exe,
      client: client,
      client_name: client.name,
      device_id: opts[:device_id],
      donate: donate,
      input_shapes: input_shapes,
      output: output,
      build: output_builder(output),
      name: SharedTerm.inspect(key),
      debug?: opts[:debug],
      callbacks: callbacks
    }

    compiled =
      case disk do
        {path, _configuration} ->
          program_key = EXLA.CompileCache.key(client, program, compile_opts)
          %{compiled | cache_file: path, program_key: program_key}

        _ ->
          compiled
      end

    {compiled, disk_cache}
  end

  # The :cache given to EXLA.CompileCache: the file of `cache: path` with
  # its configuration (see EXLA.Defn.CacheFile). The file holds the
  # function's first program: a lazy variant (which has no
  # configuration) keeps its own in memory only.
  defp disk(opts) do
    case opts[:cache] do
      path when is_binary(path) ->
        if configuration = opts[:cache_configuration], do: {path, configuration}, else: false

      true_or_false ->
        true_or_false
    end
  end

  # One shape per flattened input, nil for an input the program does not
  # take (runs neither transfer nor build it), and the positions of the
  # donated inputs among the program's parameters. The program takes the
  # inputs it reads and the donated ones (a donated buffer is given up by
  # the run, read or not), as EXLA.Defn.Lowering.to_mlir/3 lays them out.
  # A lazy program decides per call which inputs are parameters: every
  # shape is kept and the donated inputs stay input positions.
  defp parameters(vars, used, donated, opts) do
    shapes = Enum.map(Composite.flatten_list(vars), &to_shape/1)

    if opts[:lazy_transfers] == :always do
      {shapes, donated}
    else
      taken = MapSet.new(used ++ donated)
      shapes = shapes |> Enum.with_index() |> Enum.map(fn {s, i} -> if i in taken, do: s end)
      params = for {%EXLA.Shape{}, i} <- Enum.with_index(shapes), do: i
      {shapes, for({i, p} <- Enum.with_index(params), i in donated, do: p)}
    end
  end

  # `run_checks?`: whether the loops of the program check that their run
  # is still wanted, where the client can (not in the text that
  # EXLA.to_mlir_module/3 gives, which is EXLA's).
  defp lower(expr, vars, opts, run_checks? \\ true) do
    input_shapes = Enum.map(Composite.flatten_list(vars), &to_shape/1)
    client = EXLA.Client.fetch!(opts[:client])

    EXLA.Defn.Lowering.to_mlir(
      expr,
      input_shapes,
      [
        precision: opts[:precision],
        hooks: opts[:hooks] || %{},
        lazy_inputs: lazy_inputs(vars, opts),
        donate: donated_inputs(vars, opts[:donate]),
        run_checks: run_checks? and EXLA.Client.run_checks?(client)
      ] ++ EXLA.Defn.Lowering.client_options(client)
    )
  end

  # The positions, among the flattened inputs, of the tensors of the
  # donated arguments (positions in `vars`).
  defp donated_inputs(_vars, nil), do: []
  defp donated_inputs(_vars, []), do: []

  defp donated_inputs(vars, donate) do
    sizes = Enum.map(vars, &length(Composite.flatten_list([&1])))
    starts = Enum.scan([0 | sizes], &+/2)

    for position <- Enum.sort(Enum.uniq(donate)) do
      if position >= length(vars) do
        raise ArgumentError,
              ":donate refers to argument #{position}, but the function takes " <>
                "#{length(vars)} tensor argument(s)"
      end

      start = Enum.at(starts, position)
      Enum.to_list(start..(start + Enum.at(sizes, position) - 1)//1)
    end
    |> List.flatten()
  end

  # With lazy transfers, every input but the :device_inputs (an internal
  # option of lazy variants) is fetched lazily.
  defp lazy_inputs(vars, opts) do
    if opts[:lazy_transfers] == :always do
      device = opts[:device_inputs] || []
      count = length(Composite.flatten_list(vars))
      Enum.reject(0..(count - 1)//1, &(&1 in device))
    else
      false
    end
  end

  # The program of a lazy call depends on which inputs are already on a
  # device: those are parameters, the others are fetched when needed. The
  # first program takes no parameters (`device: []`); `variant` gives the
  # program for other device inputs (compiled once per list, and cached
  # like the first one).
  defp lazy_variants(key, expr, vars, opts) do
    variant = fn device ->
      opts = opts |> Keyword.put(:device_inputs, device) |> Keyword.delete(:cache_configuration)
      build = fn -> key |> compile_expr(expr, vars, opts) |> elem(0) end
      function = SharedTerm.function_key(key)
      cache_key = {:lazy_variant, function, vars_key(vars), SharedTerm.key(opts)}

      {_hit_miss_or_off, compiled} =
        LockedCache.fetch_or_build(opts[:cache], cache_key, :permanent, build)

      compiled
    end

    %{device: opts[:device_inputs] || [], variant: variant}
  end

  @doc false
  def to_shape(%T{type: type, shape: shape, vectorized_axes: []}),
    do: EXLA.Shape.make_shape(type, shape)

  def to_shape(%T{type: type, shape: shape, vectorized_axes: axes}) do
    dims = Enum.map(axes, &elem(&1, 1)) ++ Tuple.to_list(shape)
    EXLA.Shape.make_shape(type, List.to_tuple(dims))
  end

  defp output_builder(%T{} = template) do
    fn [buffer] -> %{template | data: %EXLA.Backend{buffer: buffer}} end
  end

  defp output_builder(container) do
    fn buffers ->
      {result, []} =
        Composite.traverse(container, buffers, fn template, [buffer | buffers] ->
          {%{template | data: %EXLA.Backend{buffer: buffer}}, buffers}
        end)

      result
    end
  end

  ## Options

  @defaults [precision: :default, cache: true, debug: false, lazy_transfers: :opt_in, donate: []]
  @precisions EXLA.NxVersion.precisions()
  # EXLA's words: ":default, :high, or :highest" (with ", or :packed_nibble"
  # last on Nx 0.7.2).
  @precisions_text Enum.map_join(Enum.drop(@precisions, -1), ", ", &inspect/1) <>
                     ", or #{inspect(List.last(@precisions))}"

  @doc false
  # Validates the values of the compiler options EXLA knows (of jit,
  # compile and stream); returns the options with the defaults, :client
  # and :device_id resolved. Options EXLA does not know pass through
  # untouched, as in EXLA 0.7: Nx.Serving adds :batch_keys, Axon :mode,
  # and other compilers' options may be given to every compiler. They stay
  # in the cache key, as in EXLA 0.7.
  def validate_options!(opts) do
    unless Keyword.keyword?(opts) do
      raise ArgumentError,
            "expected the compiler options to be a keyword list, got: #{SharedTerm.inspect(opts)}"
    end

    opts = Keyword.merge(@defaults, opts)
    client_name = opts[:client] || EXLA.Client.default_name()

    unless is_atom(client_name) do
      raise ArgumentError, ":client must be an atom, got: #{SharedTerm.inspect(client_name)}"
    end

    {_client, device_id} = EXLA.Client.fetch_device!(client_name, opts[:device_id])

    unless opts[:precision] in @precisions do
      raise ArgumentError,
            "expected precision configuration to be one of #{@precisions_text}, " <>
              "got: #{SharedTerm.inspect(opts[:precision])}"
    end

    check_cache!(opts[:cache])
    check_option!(opts, :debug, [true, false])
    check_option!(opts, :lazy_transfers, [:always, :never, :opt_in])
    check_compiler_mode!(Keyword.get_lazy(opts, :compiler_mode, &default_compiler_mode/0))

    unless is_list(opts[:donate]) and Enum.all?(opts[:donate], &(is_integer(&1) and &1 >= 0)) do
      raise ArgumentError,
            "expected :donate to be a list of argument positions (non-negative integers), " <>
              "got: #{SharedTerm.inspect(opts[:donate])}"
    end

    opts
    |> Keyword.put(:client, client_name)
    |> Keyword.put(:device_id, device_id)
  end

  defp default_compiler_mode, do: Application.get_env(:exla, :compiler_mode, :mlir)

  # EXLA 0.7 had a legacy XLA-builder compiler (:xla) beside MLIR.
  defp check_compiler_mode!(:mlir), do: :ok

  defp check_compiler_mode!(:xla) do
    raise ArgumentError,
          "compiler_mode: :xla is not supported: this EXLA compiles every function " <>
            "to StableHLO (MLIR) for PJRT plugins, use compiler_mode: :mlir (the default)"
  end

  defp check_compiler_mode!(other) do
    raise ArgumentError, "expected :compiler_mode to be :mlir, got: #{SharedTerm.inspect(other)}"
  end

  defp check_cache!(cache) when is_boolean(cache), do: :ok
  defp check_cache!(path) when is_binary(path) and path != "", do: :ok

  defp check_cache!(other) do
    raise ArgumentError,
          "expected :cache to be true, false or a file path, got: #{SharedTerm.inspect(other)}"
  end

  defp check_option!(opts, key, allowed) do
    value = opts[key]

    unless value in allowed do
      raise ArgumentError,
            "expected #{inspect(key)} to be one of #{inspect(allowed)}, " <>
              "got: #{SharedTerm.inspect(value)}"
    end
  end

  @doc false
  # The function of EXLA.compile/3 runs where it is called. Sent to another
  # node, its executable is loaded there from its owner's serialized form
  # when both have the same plugin; otherwise (another plugin, or an owner
  # that stopped or freed it) it is compiled there from its expression.
  # Once per function and node: the result is cached under the executable.
  def here(%Compiled{exe: %{ref: ref}} = compiled, _recipe) when node(ref) == node(),
    do: compiled

  def here(%Compiled{exe: exe} = compiled, {key, vars, fun, opts}) do
    localize = fn ->
      case EXLA.Remote.load_executable(exe) do
        {:ok, local} ->
          if compiled.callbacks, do: EXLA.HostCallback.install!(local.client)

          if compiled.debug?,
            do: Logger.debug("EXLA loaded #{compiled.name} from #{node(exe.ref)}")

          %{compiled | exe: local, client: local.client}

        {:error, message} ->
          if compiled.debug?,
            do: Logger.debug("EXLA compiles #{compiled.name} again: #{message}")

          build(key, vars, fun, validate_options!(opts))
      end
    end

    {_hit_or_miss, local} = LockedCache.run({:remote_compiled, exe.ref}, localize, :bounded)
    local
  end

  ## Modes of EXLA.cached?/3 and EXLA.to_mlir_module/3

  @doc false
  def cached?(cache_key, opts) do
    Keyword.get(opts, :cache, true) != false and LockedCache.get(cache_key) != nil
  end

  @doc false
  def mlir_module(vars, fun, opts) do
    opts = validate_options!(opts)
    expr = fun.(vars)
    mlir_module_result(expr, lower(expr, vars, opts, false))
  end

  @doc false
  # What EXLA.to_mlir_module/3 returns for `expr`, lowered into `lowered`
  # (see EXLA.Defn.Lowering.to_mlir/3).
  def mlir_module_result(expr, lowered) do
    %{
      mlir_module: lowered.program.text,
      used_inputs: lowered.used_inputs,
      output_container: Composite.traverse(expr, &Nx.to_template/1)
    }
  end

  defp ms(us), do: Float.round(us / 1000, 1)

  ## Keys

  @doc false
  # The part of a cache key that describes the arguments.
  def vars_key([]), do: []
  def vars_key([var | vars]), do: [var_key(var) | vars_key(vars)]

  defp var_key(%T{type: type, shape: shape, names: names, vectorized_axes: axes}),
    do: {type, shape, names, axes}

  defp var_key(tuple) when is_tuple(tuple),
    do: tuple |> Tuple.to_list() |> vars_key() |> List.to_tuple()

  # Another container (a map, a struct) may keep terms of the user's.
  defp var_key(container), do: SharedTerm.key(Composite.traverse(container, &var_key/1))
end
