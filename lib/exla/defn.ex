defmodule EXLA.Defn do
  @moduledoc false

  # The `Nx.Defn.Compiler` implementation behind `EXLA` (internal).
  #
  # ## Compilation
  #
  # On a cache miss, the defn function is evaluated with `Nx.Defn.Expr`
  # parameters (the *evaluation*), the expression is lowered to a StableHLO
  # module by `EXLA.Defn.Lowering` and compiled by the PJRT plugin (the
  # *compilation*). The result is an `EXLA.Defn.Compiled` struct holding the
  # executable, the shapes of the inputs, the output templates and a function
  # that turns the output buffers into the result container. Compilation emits
  # the telemetry events (see EXLA.CompileReport).
  #
  # The cache key is the function's key (given by `Nx.Defn`), the type, shape,
  # names and vectorized axes of every argument, and the options (which
  # include the client and device). Caches are `EXLA.Defn.LockedCache`:
  # concurrent callers of the same key wait for one compilation.
  #
  # ## Per-call path
  #
  # A cached call does, in order:
  #
  #   1. builds the cache key from the argument templates (a short list of
  #      `{type, shape, names, vectorized_axes}` tuples);
  #   2. looks the key up in `:persistent_term` (no copy, no message);
  #   3. for each argument the program uses, takes the device buffer of a
  #      tensor already on the executable's client and device as is, copies
  #      buffers from other EXLA devices, and sends any other tensor's binary
  #      to the device; arguments the program does not use are skipped
  #      without being read (a template or an unused `Nx.LazyContainer` is
  #      never built), as in EXLA 0.7;
  #   4. runs the executable once;
  #   5. wraps each output buffer in the precomputed output template.
  #
  # No expression is built, nothing is lowered, no program text is hashed and
  # no tensor data is copied for arguments already on the device. Functions
  # returned by `EXLA.compile/3` skip steps 1 and 2 entirely.

  require Logger

  alias Nx.Tensor, as: T
  alias Nx.Defn.Composite
  alias EXLA.Defn.{Compiled, LockedCache}

  @mode_key {__MODULE__, :mode}
  @throw_tag {__MODULE__, :result}

  ## Nx.Defn.Compiler callbacks

  @doc false
  def __partitions_options__(opts) do
    client = EXLA.Client.fetch!(Keyword.get_lazy(opts, :client, &EXLA.Client.default_name/0))
    Enum.map(0..(client.device_count - 1)//1, &Keyword.put(opts, :device_id, &1))
  end

  @doc false
  def __to_backend__(opts) do
    client = EXLA.Client.fetch!(Keyword.get_lazy(opts, :client, &EXLA.Client.default_name/0))
    {EXLA.Backend, [client: client.name, device_id: opts[:device_id] || client.default_device_id]}
  end

  @doc false
  def __jit__(key, vars, fun, args_list, opts) do
    case Process.get(@mode_key) do
      nil ->
        cache_key = {:jit, key, vars_key(vars), opts}

        case LockedCache.get(cache_key) do
          %Compiled{debug?: false} = compiled -> run_list(compiled, args_list)
          %Compiled{} = compiled -> debug_hit(compiled, args_list)
          nil -> run_compiled(compile(key, cache_key, vars, fun, opts), args_list)
        end

      :cached? ->
        throw({@throw_tag, cached?({:jit, key, vars_key(vars), opts}, opts)})

      :to_mlir ->
        throw({@throw_tag, mlir_module(vars, fun, opts)})
    end
  end

  @doc false
  def __compile__(key, vars, fun, opts) do
    compiled = lookup_or_compile(key, {:jit, key, vars_key(vars), opts}, vars, fun, opts)
    # How to compile it again, on a node where its executable cannot load.
    recipe = {key, vars, fun, opts}

    if compiled.debug? do
      &debug_run(here(compiled, recipe), &1)
    else
      fn
        [args] -> [run_one(here(compiled, recipe), args)]
        args_list -> run_list(here(compiled, recipe), args_list)
      end
    end
  end

  # The function of EXLA.compile/3 runs where it is called. Sent to another
  # node, its executable is loaded there from its owner's serialized form
  # when both have the same plugin; otherwise (another plugin, or an owner
  # that stopped or freed it) it is compiled there from its expression.
  # Once per function and node: the result is cached under the executable.
  defp here(%Compiled{exe: %{ref: ref}} = compiled, _recipe) when node(ref) == node(),
    do: compiled

  defp here(%Compiled{exe: exe} = compiled, {key, vars, fun, opts}) do
    localize = fn ->
      case EXLA.Executable.load_remote(exe) do
        {:ok, local} ->
          if compiled.callbacks, do: EXLA.HostCallback.install!(local.client)

          if compiled.debug?,
            do: Logger.debug("EXLA loaded #{inspect(key)} from #{node(exe.ref)}")

          %{compiled | exe: local, client: local.client}

        {:error, message} ->
          if compiled.debug?, do: Logger.debug("EXLA compiles #{inspect(key)} again: #{message}")
          build(key, vars, fun, validate_options!(opts))
      end
    end

    {_hit_or_miss, local} = LockedCache.run({:remote_compiled, exe.ref}, localize, :bounded)
    local
  end

  @doc false
  def __stream__(key, input, acc, vars, fun, args_list, opts) do
    case Process.get(@mode_key) do
      :cached? -> throw({@throw_tag, cached?(stream_cache_key(key, vars, opts), opts)})
      _ -> stream_executable(key, input, acc, vars, fun, args_list, opts)
    end
  end

  @doc """
  Compiles and starts a stream for `EXLA.stream/3` (see `EXLA.Defn.Stream`).
  The stream program is cached under `stream_cache_key/3`.
  """
  def stream_executable(key, input, acc, vars, fun, args_list, opts) do
    if Keyword.get(opts, :donate, []) != [] do
      raise ArgumentError, "EXLA.stream/3 does not support the :donate option"
    end

    cache_key = stream_cache_key(key, vars, opts)
    [EXLA.Defn.Stream.start(cache_key, input, acc, vars, fun, args_list, opts)]
  end

  @doc """
  The cache key of a stream compiled for `key`, `vars` and `opts`.
  """
  def stream_cache_key(key, vars, opts), do: {:stream, key, vars_key(vars), opts}

  ## Modes used by EXLA.cached?/3 and EXLA.to_mlir_module/3

  @doc false
  def __with_mode__(mode, fun) when mode in [:cached?, :to_mlir] do
    previous = Process.put(@mode_key, mode)

    try do
      fun.()
      raise "#{inspect(__MODULE__)} expected the compiler to be invoked"
    catch
      :throw, {@throw_tag, result} -> result
    after
      if previous, do: Process.put(@mode_key, previous), else: Process.delete(@mode_key)
    end
  end

  defp cached?(cache_key, opts) do
    Keyword.get(opts, :cache, true) != false and LockedCache.get(cache_key) != nil
  end

  defp mlir_module(vars, fun, opts) do
    opts = validate_options!(opts)
    expr = fun.(vars)
    lowered = lower(expr, vars, opts)

    %{
      mlir_module: lowered.program.text,
      used_inputs: lowered.used_inputs,
      output_container: Composite.traverse(expr, &Nx.to_template/1)
    }
  end

  ## Compilation for EXLA.Backend

  @doc false
  # Compiles (or fetches from the cache) a function of `templates` built by
  # `build`, a function that receives the list of parameter expressions.
  def __compile_op__(cache_key, name, templates, build, opts) do
    vars = templates |> Enum.with_index() |> Enum.map(fn {t, i} -> param(t, i) end)
    fun = fn vars -> as_expr(fn -> build.(vars) end) end
    lookup_or_compile(name, cache_key, vars, fun, opts)
  end

  @doc false
  def __run__(%Compiled{} = compiled, args), do: run_one(compiled, args)

  @doc false
  # Runs `compiled` on `args` and returns the list of output buffers.
  def __run_buffers__(%Compiled{exe: exe} = compiled, args) do
    buffers = to_buffers(args, compiled.input_shapes, compiled.client, compiled.device_id)
    [outputs] = EXLA.Executable.run(exe, [buffers])
    outputs
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

  defp lookup_or_compile(key, cache_key, vars, fun, opts) do
    case LockedCache.get(cache_key, Keyword.get(opts, :cache_kind, :permanent)) do
      nil ->
        compile(key, cache_key, vars, fun, opts)

      compiled ->
        if compiled.debug?, do: log_hits(key, 0)
        compiled
    end
  end

  defp compile(key, cache_key, vars, fun, opts) do
    # :cache_kind is internal (EXLA.Backend's ops), not a jit option
    {internal, opts} = Keyword.split(opts, [:cache_kind])
    opts = validate_options!(opts) ++ internal
    kind = Keyword.get(opts, :cache_kind, :permanent)
    build = fn -> from_origin(key, cache_key, opts) || build(key, vars, fun, opts) end

    case LockedCache.fetch_or_build(opts[:cache], cache_key, kind, build) do
      {:hit, compiled} ->
        if opts[:debug], do: log_hits(key, 0)
        compiled

      {_miss_or_off, compiled} ->
        compiled
    end
  end

  # An anonymous function remembers the process that made it. Made on
  # another node that is connected, it may be compiled and cached there
  # already: then its executable is loaded from there (same plugin, same
  # client name and device), which spares compiling it here.
  defp from_origin(key, cache_key, opts) when is_function(key) do
    with true <- opts[:cache] != false,
         {:pid, pid} when is_pid(pid) and node(pid) != node() <- :erlang.fun_info(key, :pid),
         true <- node(pid) in Node.list(),
         %Compiled{exe: exe, client_name: client, device_id: device} = compiled <-
           cached_on(node(pid), cache_key),
         true <- client == opts[:client] and device == opts[:device_id],
         {:ok, local} <- EXLA.Executable.load_remote(exe) do
      if compiled.callbacks, do: EXLA.HostCallback.install!(local.client)
      if opts[:debug], do: Logger.debug("EXLA loaded #{inspect(key)} from #{node(pid)}")
      %{compiled | exe: local, client: local.client}
    else
      _ -> nil
    end
  end

  defp from_origin(_key, _cache_key, _opts), do: nil

  # A node that does not answer soon is not waited for: compiling is.
  @origin_timeout 10_000

  defp cached_on(node, cache_key) do
    :erpc.call(node, LockedCache, :get, [cache_key], @origin_timeout)
  catch
    _kind, _reason -> nil
  end

  defp build(key, vars, fun, opts) do
    compilation(key, vars, fun, opts, &compile_expr(key, &1, vars, opts))
  end

  @doc false
  # The one path of a compilation (of jit, compile, stream and shard_jit):
  # evaluates `fun` on `vars` to an expression, gives it to `compile`
  # (which returns `{compiled, disk_cache}`, see EXLA.CompileCache.compile/4),
  # logs the evaluation with `debug: true` and reports the compilation
  # (EXLA.CompileReport). Returns what `compile` compiled.
  def compilation(key, vars, fun, opts, compile) do
    {eval_time, expr} = :timer.tc(fn -> fun.(vars) end)

    if opts[:debug] do
      Logger.debug("EXLA defn evaluation #{inspect(key)} cache miss in #{ms(eval_time)}ms")
    end

    {compile_time, {{compiled, disk_cache}, stages}} =
      :timer.tc(fn -> EXLA.CompileTimer.collect(fn -> compile.(expr) end) end)

    EXLA.CompileReport.compiled(
      key,
      vars,
      expr,
      opts,
      eval_time,
      compile_time,
      stages,
      disk_cache
    )

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

    {exe, disk_cache} =
      EXLA.CompileCache.Memory.compile(client, program, compile_opts, opts[:cache])

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
      key: key,
      debug?: opts[:debug],
      callbacks: callbacks
    }

    {compiled, disk_cache}
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

  defp lower(expr, vars, opts) do
    input_shapes = Enum.map(Composite.flatten_list(vars), &to_shape/1)
    client = EXLA.Client.fetch!(opts[:client])

    EXLA.Defn.Lowering.to_mlir(
      expr,
      input_shapes,
      [
        precision: opts[:precision],
        hooks: opts[:hooks] || %{},
        lazy_inputs: lazy_inputs(vars, opts),
        donate: donated_inputs(vars, opts[:donate])
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
      opts = Keyword.put(opts, :device_inputs, device)
      build = fn -> key |> compile_expr(expr, vars, opts) |> elem(0) end
      cache_key = {:lazy_variant, key, vars_key(vars), opts}

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
  @precisions [:default, :high, :highest, :packed_nibble]

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
            "expected the compiler options to be a keyword list, got: #{inspect(opts)}"
    end

    opts = Keyword.merge(@defaults, opts)
    client_name = opts[:client] || EXLA.Client.default_name()

    unless is_atom(client_name) do
      raise ArgumentError, ":client must be an atom, got: #{inspect(client_name)}"
    end

    {_client, device_id} = EXLA.Client.fetch_device!(client_name, opts[:device_id])

    unless opts[:precision] in @precisions do
      raise ArgumentError,
            "expected precision configuration to be one of :default, :high, :highest, " <>
              "or :packed_nibble, got: #{inspect(opts[:precision])}"
    end

    check_cache!(opts[:cache])
    check_option!(opts, :debug, [true, false])
    check_option!(opts, :lazy_transfers, [:always, :never, :opt_in])
    check_compiler_mode!(Keyword.get_lazy(opts, :compiler_mode, &default_compiler_mode/0))

    unless is_list(opts[:donate]) and Enum.all?(opts[:donate], &(is_integer(&1) and &1 >= 0)) do
      raise ArgumentError,
            "expected :donate to be a list of argument positions (non-negative integers), " <>
              "got: #{inspect(opts[:donate])}"
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
    raise ArgumentError, "expected :compiler_mode to be :mlir, got: #{inspect(other)}"
  end

  defp check_cache!(cache) when is_boolean(cache), do: :ok
  defp check_cache!(path) when is_binary(path) and path != "", do: :ok

  defp check_cache!(other) do
    raise ArgumentError,
          "expected :cache to be true, false or a file path, got: #{inspect(other)}"
  end

  defp check_option!(opts, key, allowed) do
    value = opts[key]

    unless value in allowed do
      raise ArgumentError,
            "expected #{inspect(key)} to be one of #{inspect(allowed)}, got: #{inspect(value)}"
    end
  end

  ## Running

  defp run_list(compiled, [args]), do: [run_one(compiled, args)]
  defp run_list(compiled, args_list), do: Enum.map(args_list, &run_one(compiled, &1))

  defp run_one(%Compiled{exe: exe, build: build, callbacks: nil} = compiled, args) do
    buffers = to_buffers(args, compiled.input_shapes, compiled.client, compiled.device_id)
    [outputs] = EXLA.Executable.run(exe, [buffers], run_options(compiled.donate))
    build.(outputs)
  end

  defp run_one(%Compiled{callbacks: %{lazy: lazy}} = c, args) do
    inputs = List.to_tuple(args)
    shapes = List.to_tuple(c.input_shapes)

    if tuple_size(inputs) != tuple_size(shapes) do
      raise ArgumentError,
            "expected #{tuple_size(shapes)} arguments for the compiled function, " <>
              "got: #{tuple_size(inputs)}"
    end

    # Inputs already on a device are passed as parameters.
    resident = Enum.map(args, &resident/1)
    device = for {%T{}, i} <- Enum.with_index(resident), do: i
    c = if device == lazy.device, do: c, else: lazy.variant.(device)

    buffers =
      for {%T{} = tensor, i} <- Enum.with_index(resident),
          do: to_buffer(tensor, elem(shapes, i), c.client, c.device_id)

    fetch = fn i -> lazy_binary(elem(inputs, i), elem(shapes, i)) end
    # Parameters are the device inputs, in order.
    donate = for {i, position} <- Enum.with_index(device), i in c.donate, do: position
    opts = [fetch_input: fetch, donate: donate]
    c.build.(EXLA.HostCallback.run!(c.exe, buffers, c.callbacks, opts))
  end

  defp run_one(%Compiled{exe: exe, build: build, callbacks: sites} = compiled, args) do
    buffers = to_buffers(args, compiled.input_shapes, compiled.client, compiled.device_id)
    build.(EXLA.HostCallback.run!(exe, buffers, sites, donate: compiled.donate))
  end

  # No options at all for the usual run: EXLA.Executable.run/3 skips them.
  defp run_options([]), do: []
  defp run_options(donate), do: [donate: donate]

  # The EXLA tensor a lazy input already is, or nil. Nx hands lazy inputs
  # as functions; only those of Nx.Tensor's Nx.LazyContainer implementation
  # are called here (they return a tensor that already exists), so other
  # lazy containers are only built when the program needs them.
  defp resident(fun) when is_function(fun, 0) do
    case Function.info(fun, :module) do
      {:module, Nx.LazyContainer.Nx.Tensor} -> resident(fun.())
      _ -> nil
    end
  end

  defp resident(%T{data: %EXLA.Backend{}} = tensor), do: tensor
  defp resident(_arg), do: nil

  # The binary of a lazy input, read when the program asks for it.
  defp lazy_binary(fun, shape) when is_function(fun, 0), do: lazy_binary(fun.(), shape)
  defp lazy_binary(%T{} = tensor, _shape), do: Nx.to_binary(tensor)

  defp lazy_binary(number, shape) when is_number(number),
    do: number |> Nx.tensor(type: shape.dtype) |> Nx.to_binary()

  # An input the program does not take (its shape is nil) is skipped
  # without being looked at: a template or a lazy container stays unbuilt.
  defp to_buffers([_arg | args], [nil | shapes], client, device_id),
    do: to_buffers(args, shapes, client, device_id)

  defp to_buffers([arg | args], [shape | shapes], client, device_id),
    do: [to_buffer(arg, shape, client, device_id) | to_buffers(args, shapes, client, device_id)]

  defp to_buffers([], [], _client, _device_id), do: []

  defp to_buffers(args, shapes, _client, _device_id) do
    raise ArgumentError,
          "expected #{length(shapes)} arguments for the compiled function, got: #{length(args)}"
  end

  @doc false
  # The one path from an argument of a compiled function (a tensor, a
  # number, or a function that returns one) to a run's argument (see
  # EXLA.Executable.run/3) on `device_id` of `client`: a tensor's device
  # buffer as it is when it is there already, copied from other EXLA
  # devices (and nodes, see EXLA.Remote), and any other data as
  # `{binary, shape}`, which the run sends to the device.
  def to_buffer(fun, shape, client, device_id) when is_function(fun, 0),
    do: to_buffer(fun.(), shape, client, device_id)

  def to_buffer(
        %T{data: %EXLA.Backend{buffer: %{ref: ref, client_name: name, device_id: id} = buffer}},
        _shape,
        %{name: name},
        id
      )
      when node(ref) == node(),
      do: buffer

  def to_buffer(%T{data: %EXLA.Backend{buffer: buffer}}, _shape, client, device_id),
    do: EXLA.DeviceBuffer.copy_to_device(buffer, client, device_id)

  def to_buffer(%T{} = tensor, shape, _client, _device_id), do: {Nx.to_binary(tensor), shape}

  def to_buffer(number, shape, _client, _device_id) when is_number(number),
    do: {number |> Nx.tensor(type: shape.dtype) |> Nx.to_binary(), shape}

  defp run_compiled(%Compiled{debug?: false} = compiled, args_list),
    do: run_list(compiled, args_list)

  defp run_compiled(compiled, args_list), do: debug_run(compiled, args_list)

  ## Debug

  defp debug_hit(compiled, args_list) do
    log_hits(compiled.key, 0)
    debug_run(compiled, args_list)
  end

  defp debug_run(compiled, args_list) do
    log_device_wait(compiled.device_id, System.monotonic_time(:microsecond))
    {time, result} = :timer.tc(fn -> run_list(compiled, args_list) end)
    Logger.debug("EXLA execution on device #{compiled.device_id} in #{ms(time)}ms")
    result
  end

  @doc false
  # EXLA 0.7 serializes the runs of a device with a lock and, with debug:
  # true, logs the wait for it. This EXLA takes no lock: the plugin queues
  # the executions of a device itself, and concurrent calls (and streams)
  # hand theirs over without waiting for each other. The line keeps EXLA's
  # words, with the real time from the run request (`requested`, in
  # monotonic microseconds) to the start of the run, which nothing delays
  # here (0.0ms but for scheduling noise). What a run may still wait for
  # (a free dirty scheduler or a run thread, see EXLA.Executable, and the
  # plugin's queue) cannot be told apart from the run: it is part of the
  # execution time logged next.
  def log_device_wait(device_id, requested) do
    waited = System.monotonic_time(:microsecond) - requested
    Logger.debug("EXLA device #{device_id} lock in #{ms(waited)}ms")
  end

  defp log_hits(key, time) do
    Logger.debug("EXLA defn evaluation #{inspect(key)} cache hit in #{ms(time)}ms")
    Logger.debug("EXLA compilation #{inspect(key)} cache hit in #{ms(time)}ms")
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

  defp var_key(container), do: Composite.traverse(container, &var_key/1)
end
