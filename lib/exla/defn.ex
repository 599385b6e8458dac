defmodule EXLA.Defn do
  @moduledoc false

  # The `Nx.Defn.Compiler` implementation behind `EXLA` (internal): the
  # edge between Nx and this project's compiler. It answers Nx's callbacks
  # and hands compilation to `EXLA.Defn.Compilation` and calls to
  # `EXLA.Defn.Call` (which documents the per-call path).
  #
  # A cached `__jit__/5` builds the cache key from the argument templates,
  # looks it up in `:persistent_term` and runs the executable: no
  # expression is built and nothing is lowered.

  alias EXLA.Defn.{Call, Compilation, Compiled}
  alias EXLA.SharedTerm
  alias EXLA.LockedCache

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
        cache_key = jit_cache_key(key, vars, opts)

        # A program of `cache: path` reads its file first (EXLA.Defn.CacheFile).
        case LockedCache.get(cache_key) do
          %Compiled{debug?: false, cache_file: nil} = compiled ->
            Call.run_list(compiled, args_list)

          %Compiled{cache_file: nil} = compiled ->
            Call.debug_hit(compiled, args_list)

          _nil_or_file ->
            Call.run_compiled(Compilation.compile(key, cache_key, vars, fun, opts), args_list)
        end

      :cached? ->
        cache_key = jit_cache_key(key, vars, opts)
        throw({@throw_tag, Compilation.cached?(cache_key, opts)})

      :to_mlir ->
        throw({@throw_tag, Compilation.mlir_module(vars, fun, opts)})
    end
  end

  @doc false
  def __compile__(key, vars, fun, opts) do
    cache_key = jit_cache_key(key, vars, opts)
    compiled = Compilation.lookup_or_compile(key, cache_key, vars, fun, opts)
    # How to compile it again, on a node where its executable cannot load.
    recipe = {key, vars, fun, opts}

    if compiled.debug? do
      &Call.debug_run(Compilation.here(compiled, recipe), &1)
    else
      fn
        [args] -> [Call.run_one(Compilation.here(compiled, recipe), args)]
        args_list -> Call.run_list(Compilation.here(compiled, recipe), args_list)
      end
    end
  end

  # The cache key of a function compiled for `key`, `vars` and `opts`. The
  # function and its options are the user's: what they capture may share
  # subterms, and the key stays within a bounded cost (EXLA.SharedTerm;
  # vars_key/1 is made of the arguments' types and shapes).
  defp jit_cache_key(key, vars, opts),
    do: {:jit, SharedTerm.function_key(key), Compilation.vars_key(vars), SharedTerm.key(opts)}

  # Streams exist on Nx 0.7 only (see EXLA.stream/3).
  if EXLA.NxVersion.streams?() do
    @doc false
    def __stream__(key, input, acc, vars, fun, args_list, opts) do
      case Process.get(@mode_key) do
        :cached? ->
          throw({@throw_tag, Compilation.cached?(stream_cache_key(key, vars, opts), opts)})

        _ ->
          stream_executable(key, input, acc, vars, fun, args_list, opts)
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
      [EXLA.Defn.Stream.start(key, cache_key, input, acc, vars, fun, args_list, opts)]
    end

    @doc """
    The cache key of a stream compiled for `key`, `vars` and `opts`.
    """
    def stream_cache_key(key, vars, opts),
      do:
        {:stream, SharedTerm.function_key(key), Compilation.vars_key(vars), SharedTerm.key(opts)}
  end

  ## Modes used by EXLA.cached?/3 and EXLA.to_mlir_module/3

  @doc false
  # The mode EXLA.cached?/3 or EXLA.to_mlir_module/3 set, or nil.
  def __mode__, do: Process.get(@mode_key)

  @doc false
  # Ends the compilation under way with `result`, given to __with_mode__/2.
  def __mode_result__(result), do: throw({@throw_tag, result})

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

  ## Compilation for EXLA.Backend

  @doc false
  defdelegate __compile_op__(cache_key, name, templates, build, opts), to: Compilation

  @doc false
  def __run__(%Compiled{} = compiled, args), do: Call.run_one(compiled, args)

  @doc false
  defdelegate __run_buffers__(compiled, args), to: Call, as: :run_buffers
end
