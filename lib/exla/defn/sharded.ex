defmodule EXLA.Defn.Sharded do
  @moduledoc false
  # The Nx.Defn.Compiler behind EXLA.shard_jit/3: one SPMD program over a
  # mesh of the client's devices (see EXLA.Sharding for meshes and
  # shardings).
  #
  # The expression is lowered as for EXLA.jit/2, with each parameter of
  # @main annotated with its input's sharding and replicated results, and the
  # plugin compiles it with one partition per device of the mesh (XLA's
  # SPMD partitioner splits the program and adds the collectives). A call
  # cuts each input on the host into its partitions' parts, places each
  # part on its partition's device, runs every partition at once and
  # returns the results of the first partition (every partition has them
  # whole), freeing the others.
  @behaviour Nx.Defn.Compiler

  alias Nx.Defn.Composite
  alias EXLA.Defn.LockedCache
  alias EXLA.{Executable, Sharding}

  @enforce_keys [:exe, :mesh, :params, :shardings, :part_shapes, :output]
  defstruct [:exe, :mesh, :params, :shardings, :part_shapes, :output]

  @impl true
  def __jit__(key, vars, fun, args_list, opts) do
    compiled = lookup_or_compile(key, vars, fun, opts)
    Enum.map(args_list, &run(compiled, &1))
  end

  @impl true
  def __compile__(key, vars, fun, opts) do
    compiled = lookup_or_compile(key, vars, fun, opts)
    fn args_list -> Enum.map(args_list, &run(compiled, &1)) end
  end

  if EXLA.NxVersion.streams?() do
    @impl true
    def __stream__(_key, _input, _acc, _vars, _fun, _args_list, _opts) do
      raise ArgumentError, "EXLA.shard_jit/3 functions cannot be streamed"
    end
  end

  @impl true
  def __partitions_options__(opts), do: [opts]

  @impl true
  def __to_backend__(opts),
    do: EXLA.Defn.__to_backend__(Keyword.drop(opts, [:mesh, :input_shardings]))

  ## Nx.Defn.shard_jit/3 (Nx 0.12 and later)

  @doc false
  # EXLA.__shard_jit__/6, with upstream EXLA's semantics: `mesh` is an
  # `%Nx.Mesh{}`, `:input_shardings` (required) has one map per input
  # tensor of its axes (integers or names) to lists of mesh axes, `vars`
  # and each list of `args_list` (one per partition, in the mesh's
  # row-major order) are the partitions' parts, and the result is one
  # container per partition, each the partition's part of the results as
  # XLA's partitioner lays them out. One mesh axis per tensor axis.
  def shard_jit(key, %{shape: shape} = mesh, vars, fun, args_list, opts) do
    {shardings, opts} = Keyword.pop(opts, :input_shardings)
    inputs = Composite.flatten_list(vars)
    shardings = mesh_shardings!(shardings, inputs, mesh)
    whole = whole_vars(vars, shardings, shape)
    opts = EXLA.Defn.Compilation.validate_options!(opts)
    build = fn -> build(key, whole, fun, shape, shardings, opts, :parts) end
    vars_key = EXLA.Defn.Compilation.vars_key(whole)
    cache_key = {:shard_jit_parts, key, vars_key, shape, shardings, opts}

    {_hit_miss_or_off, compiled} =
      LockedCache.fetch_or_build(opts[:cache], cache_key, :permanent, build)

    run_parts(compiled, args_list)
  end

  defp mesh_shardings!(shardings, inputs, mesh) when is_list(shardings) do
    if length(shardings) != length(inputs) do
      raise ArgumentError,
            "expected #{length(inputs)} input sharding configuration(s), got #{length(shardings)}"
    end

    Enum.zip_with(inputs, shardings, fn t, sharding ->
      unless is_map(sharding) do
        raise ArgumentError,
              "expected each input sharding to be a map of tensor axes to lists of mesh " <>
                "axes, got: #{inspect(sharding)}"
      end

      for {axis, mesh_axes} <- sharding, mesh_axes != [], into: %{} do
        axis = if is_atom(axis), do: Nx.axis_index(t, axis), else: axis

        case mesh_axes do
          [mesh_axis] when is_integer(mesh_axis) ->
            {axis, mesh_axis}

          _ ->
            raise ArgumentError,
                  "EXLA splits a tensor axis over one mesh axis, got #{inspect(mesh_axes)} " <>
                    "for axis #{inspect(axis)} of mesh #{inspect(mesh)}"
        end
      end
    end)
  end

  defp mesh_shardings!(other, _inputs, _mesh) do
    raise ArgumentError,
          "input_shardings are required for sharding in EXLA (a list of maps), got: " <>
            inspect(other)
  end

  # The whole inputs of which `vars` are the parts.
  defp whole_vars(vars, shardings, shape) do
    whole = fn t, [sharding | rest] ->
      dims =
        Enum.reduce(sharding, t.shape, fn {axis, mesh_axis}, dims ->
          put_elem(dims, axis, elem(dims, axis) * elem(shape, mesh_axis))
        end)

      {%{t | shape: dims}, rest}
    end

    {vars, []} = Enum.map_reduce(vars, shardings, &Composite.traverse(&1, &2, whole))
    vars
  end

  defp run_parts(%__MODULE__{exe: exe} = compiled, args_list) do
    if length(args_list) != length(exe.devices) do
      raise ArgumentError,
            "expected one list of arguments per partition (#{length(exe.devices)}), got " <>
              "#{length(args_list)}"
    end

    lists =
      for args <- args_list do
        Enum.zip_with(compiled.params, compiled.part_shapes, fn i, shape ->
          {Nx.to_binary(host_tensor(Enum.at(args, i), shape.dtype)), shape}
        end)
      end

    for outputs <- Executable.run(exe, lists) do
      {result, []} =
        Composite.traverse(compiled.output, outputs, fn template, [buffer | buffers] ->
          part = %{template | shape: buffer.shape.dims, names: part_names(buffer.shape.dims)}
          {%{part | data: %EXLA.Backend{buffer: buffer}}, buffers}
        end)

      result
    end
  end

  defp part_names(dims), do: List.duplicate(nil, tuple_size(dims))

  ## Compilation

  defp lookup_or_compile(key, vars, fun, opts) do
    {mesh, opts} = Keyword.pop(opts, :mesh)
    {shardings, opts} = Keyword.pop(opts, :input_shardings)
    opts = EXLA.Defn.Compilation.validate_options!(opts)
    build = fn -> build(key, vars, fun, mesh, shardings, opts, :whole) end
    cache_key = {:shard_jit, key, EXLA.Defn.Compilation.vars_key(vars), mesh, shardings, opts}

    {_hit_miss_or_off, compiled} =
      LockedCache.fetch_or_build(opts[:cache], cache_key, :permanent, build)

    compiled
  end

  # `results` is :whole (EXLA.shard_jit/3 with a tuple mesh: every
  # partition has the whole results) or :parts (Nx.Defn.shard_jit/3: XLA's
  # partitioner lays the results out, each partition returns its part).
  defp build(key, vars, fun, mesh, shardings, opts, results) do
    client = EXLA.Client.fetch!(opts[:client])
    partitions = Sharding.partitions!(mesh, client.device_count)
    inputs = Composite.flatten_list(vars)
    shardings = input_shardings!(shardings, inputs, mesh)

    # The partitioned program is compiled afresh (it skips the disk cache).
    EXLA.Defn.Compilation.compilation(key, vars, fun, opts, fn expr ->
      {compile(client, expr, inputs, mesh, partitions, shardings, opts, results), :off}
    end)
  end

  defp compile(client, expr, inputs, mesh, partitions, shardings, opts, results) do
    # Each parameter is annotated with its input's sharding, each result as
    # replicated for whole results, the module with its partition count.
    arg_attrs =
      Enum.zip_with(inputs, shardings, fn t, sharding ->
        [{"mhlo.sharding", ~s("#{Sharding.annotation(sharding, tuple_size(t.shape), mesh)}")}]
      end)

    result_count = length(Composite.flatten_list([expr]))

    %{program: program, used_inputs: params} =
      EXLA.Defn.Lowering.to_mlir(
        expr,
        Enum.map(inputs, &EXLA.Defn.Compilation.to_shape/1),
        [
          precision: opts[:precision],
          arg_attrs: arg_attrs,
          result_attrs: result_attrs(results, result_count),
          module_attrs: [
            {"mhlo.num_partitions", "#{partitions} : i32"},
            {"mhlo.num_replicas", "1 : i32"}
          ]
        ] ++ EXLA.Defn.Lowering.client_options(client)
      )

    # The inputs the program reads are its parameters: without donation,
    # lazy inputs or hooks (none is given above), the lowering keeps exactly
    # those.
    param_shardings = Enum.map(params, &Enum.at(shardings, &1))
    param_inputs = Enum.map(params, &Enum.at(inputs, &1))

    part_shapes =
      Enum.zip_with(param_inputs, param_shardings, fn t, sharding ->
        EXLA.Shape.make_shape(t.type, Sharding.part_dims(t.shape, sharding, mesh))
      end)

    # Each device's parameters are its parts of the inputs; its results
    # are the whole results (replicated), or the parts the partitioner
    # gave it, whose shapes the plugin tells.
    output_shapes = if results == :whole, do: program.output_shapes
    program = %{program | input_shapes: part_shapes, output_shapes: output_shapes}
    exe = Executable.compile(client, program, num_partitions: partitions)

    %__MODULE__{
      exe: exe,
      mesh: mesh,
      params: params,
      shardings: param_shardings,
      part_shapes: part_shapes,
      output: Composite.traverse(expr, &%{&1 | data: %Nx.TemplateBackend{}})
    }
  end

  defp result_attrs(:whole, count),
    do: List.duplicate([{"mhlo.sharding", ~s("{replicated}")}], count)

  defp result_attrs(:parts, _count), do: []

  defp input_shardings!(nil, inputs, _mesh), do: Enum.map(inputs, fn _ -> %{} end)

  defp input_shardings!(shardings, inputs, mesh) when is_list(shardings) do
    if length(shardings) != length(inputs) do
      raise ArgumentError,
            "expected one sharding per input tensor (#{length(inputs)}), got " <>
              "#{length(shardings)}: #{inspect(shardings)}"
    end

    inputs
    |> Enum.zip(shardings)
    |> Enum.with_index(fn {t, sharding}, index ->
      Sharding.sharding!(sharding, EXLA.Defn.Compilation.to_shape(t).dims, mesh, index)
    end)
  end

  defp input_shardings!(other, _inputs, _mesh) do
    raise ArgumentError,
          "expected :input_shardings to be a list of maps, got: #{inspect(other)}"
  end

  ## Running

  defp run(%__MODULE__{exe: exe} = compiled, args) do
    inputs =
      Enum.zip_with(compiled.params, compiled.part_shapes, fn i, shape ->
        host_tensor(Enum.at(args, i), shape.dtype)
      end)

    lists =
      for partition <- 0..(length(exe.devices) - 1) do
        [inputs, compiled.shardings, compiled.part_shapes]
        |> Enum.zip_with(fn [tensor, sharding, shape] ->
          {part(tensor, sharding, compiled.mesh, partition, shape), shape}
        end)
      end

    [outputs | others] = Executable.run(exe, lists)
    Enum.each(List.flatten(others), &EXLA.DeviceBuffer.deallocate/1)

    {result, []} =
      Composite.traverse(compiled.output, outputs, fn template, [buffer | buffers] ->
        {%{template | data: %EXLA.Backend{buffer: buffer}}, buffers}
      end)

    result
  end

  # An input on the host, where it is cut (the arguments of Nx.Defn are
  # functions that build the tensor; numbers are tensors of the input's type).
  defp host_tensor(fun, type) when is_function(fun, 0), do: host_tensor(fun.(), type)

  defp host_tensor(%Nx.Tensor{} = t, _type),
    do: Nx.backend_copy(Nx.devectorize(t), Nx.BinaryBackend)

  defp host_tensor(number, type) when is_number(number), do: Nx.tensor(number, type: type)

  defp part(tensor, sharding, _mesh, _partition, _shape) when map_size(sharding) == 0,
    do: Nx.to_binary(tensor)

  defp part(tensor, sharding, mesh, partition, shape) do
    start = Sharding.part_start(tensor.shape, sharding, mesh, partition)
    tensor |> Nx.slice(start, Tuple.to_list(shape.dims)) |> Nx.to_binary()
  end
end
