defmodule EXLA.Defn.Sharded do
  @moduledoc false
  # The compiler behind EXLA.shard_jit/3: one SPMD program over a mesh of
  # the client's devices (see EXLA.Defn.Sharding for meshes and shardings).
  #
  # With a tuple mesh (every Nx line) the expression is lowered as for
  # EXLA.jit/2, with each parameter of @main annotated (`mhlo.sharding`)
  # with its input's sharding and the results replicated, and GSPMD
  # compiles it with one partition per device of the mesh (it splits the
  # program and adds the collectives). A call cuts each input on the host
  # into its partitions' parts, places each part on its partition's device,
  # runs every partition at once and returns the results of the first
  # partition (every partition has them whole), freeing the others.
  #
  # With an `%Nx.Mesh{}` (Nx 0.12 and later, `shard_jit/6`, upstream
  # EXLA's semantics) the inputs come already cut, one list per partition,
  # and each partition returns its part of the results (Shardy).
  #
  # Both forms take one path once their shardings are checked (as dim axes,
  # see EXLA.Defn.Sharding): the same cache, lowering and compilation
  # (`compile/6`, told by a layout what to annotate and how results come
  # back), and the same run (`run_parts/2`), to which a tuple mesh's call
  # hands the parts it cut.
  @behaviour Nx.Defn.Compiler

  alias Nx.Defn.Composite
  alias EXLA.LockedCache
  alias EXLA.Executable
  alias EXLA.Defn.Sharding

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
  # EXLA.__shard_jit__/6, with upstream EXLA's semantics. `mesh` is an
  # `%Nx.Mesh{}` whose partitions are the client's first devices, in the
  # mesh's row-major order; `:input_shardings` (required) has one map per
  # input tensor of its axes to lists of mesh axes; `vars` are the first
  # partition's parts and `args_list` has one flat list of arguments per
  # partition, each that partition's parts. Shardy partitions the program
  # (inputs annotated as given, results left open, so it propagates
  # shardings to them) and the result is one container per partition, on
  # its device, with that device's part of each result.
  def shard_jit(key, mesh, vars, fun, args_list, opts) do
    {shardings, opts} = Keyword.pop(opts, :input_shardings)
    opts = EXLA.Defn.Compilation.validate_options!(opts)
    client = EXLA.Client.fetch!(opts[:client])
    # A module that is only lowered (EXLA.to_mlir_module/3) needs no devices.
    lowered_only? = EXLA.Defn.__mode__() == :to_mlir
    devices = if lowered_only?, do: :any, else: client.device_count
    partitions = Sharding.mesh_partitions!(mesh, devices)

    if length(args_list) != partitions do
      raise ArgumentError,
            "expected one list of arguments per partition of the mesh #{inspect(mesh)} " <>
              "(#{partitions}), got #{length(args_list)}"
    end

    inputs = Composite.flatten_list(vars)
    shardings = mesh_shardings!(shardings, inputs, mesh)
    whole = whole_vars(vars, shardings, mesh.shape)

    if lowered_only? do
      EXLA.Defn.__mode_result__(mesh_mlir_module(client, whole, fun, mesh, shardings, opts))
    end

    build = fn -> build_mesh(key, whole, fun, mesh, partitions, shardings, opts) end
    compiled = cached(:shard_jit_mesh, key, whole, mesh, shardings, opts, build)

    for args <- args_list do
      args = List.to_tuple(args)
      Enum.zip_with(compiled.params, compiled.part_shapes, &part_tensor(elem(args, &1), &2.dtype))
    end
    |> then(&run_parts(compiled, &1))
  end

  defp mesh_shardings!(shardings, inputs, mesh) when is_list(shardings) do
    count_message =
      "expected #{length(inputs)} input sharding configuration(s), one per input " <>
        "tensor, got #{length(shardings)}"

    each_sharding!(
      shardings,
      inputs,
      count_message,
      &Sharding.mesh_sharding!(&1, &2, mesh.shape, &3)
    )
  end

  defp mesh_shardings!(other, _inputs, _mesh) do
    raise ArgumentError,
          "input_shardings are required for sharding in EXLA: a list with one map per " <>
            "input tensor of its axes to lists of mesh axes, got: #{inspect(other)}"
  end

  # The whole inputs of which `vars` are the parts.
  defp whole_vars(vars, shardings, shape) do
    whole = fn t, [dim_axes | rest] ->
      {%{t | shape: Sharding.whole_dims(t.shape, dim_axes, shape)}, rest}
    end

    {vars, []} = Enum.map_reduce(vars, shardings, &Composite.traverse(&1, &2, whole))
    vars
  end

  defp build_mesh(key, vars, fun, mesh, partitions, shardings, opts) do
    client = EXLA.Client.fetch!(opts[:client])
    inputs = Composite.flatten_list(vars)

    layout = %{
      lowering: mesh_lowering(mesh, shardings),
      results: :parts,
      compile: [num_partitions: partitions, partitioner: :shardy]
    }

    EXLA.Defn.Compilation.compilation(key, vars, fun, opts, fn expr ->
      {compile(client, expr, inputs, mesh.shape, shardings, layout, opts), :off}
    end)
  end

  # Each input is annotated with its sharding, the results are left open
  # (Shardy propagates shardings to them, and the plugin tells each
  # device's part's shape).
  defp mesh_lowering(mesh, shardings) do
    annotation = &[{"sdy.sharding", Sharding.sdy_sharding(mesh.name, &1)}]

    [
      arg_attrs: Enum.map(shardings, annotation),
      module_ops: [Sharding.sdy_mesh(mesh.name, mesh.shape)]
    ]
  end

  # What EXLA.to_mlir_module/3 gives for a mesh: the annotated module of the
  # whole inputs, before XLA partitions it.
  defp mesh_mlir_module(client, vars, fun, mesh, shardings, opts) do
    expr = fun.(vars)
    inputs = Composite.flatten_list(vars)
    lowered = lower(client, expr, inputs, mesh_lowering(mesh, shardings), opts)
    EXLA.Defn.Compilation.mlir_module_result(expr, lowered)
  end

  # Runs every partition on its parts (one tensor per parameter), and
  # returns each partition's results. Each part goes to its partition's
  # device as Call.to_buffer/4 sends any argument: a part already there
  # (the results of another call) is used as it is.
  defp run_parts(%__MODULE__{exe: exe} = compiled, parts_list) do
    lists =
      [parts_list, exe.devices, Enum.to_list(0..(length(parts_list) - 1))]
      |> Enum.zip_with(fn [parts, device_id, partition] ->
        [parts, compiled.params, compiled.part_shapes]
        |> Enum.zip_with(fn [t, i, shape] ->
          check_part!(t, shape, i, partition)
          EXLA.Defn.Call.to_buffer(t, shape, exe.client, device_id)
        end)
      end)

    for outputs <- Executable.run(compiled.exe, lists) do
      {result, []} =
        Composite.traverse(compiled.output, outputs, fn template, [buffer | buffers] ->
          part = %{template | shape: buffer.shape.dims}
          {%{part | data: %EXLA.Backend{buffer: buffer}}, buffers}
        end)

      result
    end
  end

  # A partition's argument as a tensor, where it is (numbers are tensors of
  # the input's type).
  defp part_tensor(fun, type) when is_function(fun, 0), do: part_tensor(fun.(), type)
  defp part_tensor(%Nx.Tensor{} = t, _type), do: Nx.devectorize(t)

  defp part_tensor(number, type) when is_number(number),
    do: Nx.tensor(number, type: type, backend: Nx.BinaryBackend)

  # Nx takes the inputs' shapes from the first partition's arguments: the
  # others must have the same.
  defp check_part!(%Nx.Tensor{type: type, shape: dims}, %{dtype: type, dims: dims}, _, _),
    do: :ok

  defp check_part!(t, shape, input, partition) do
    raise ArgumentError,
          "input #{input} of partition #{partition} is a tensor #{type_and_shape(t.type, t.shape)}, " <>
            "but the first partition's is #{type_and_shape(shape.dtype, shape.dims)}: " <>
            "every partition's part of an input has the same type and shape"
  end

  defp type_and_shape(type, dims), do: "#{Nx.Type.to_string(type)}#{inspect(dims)}"

  ## Compilation

  defp lookup_or_compile(key, vars, fun, opts) do
    {mesh, opts} = Keyword.pop(opts, :mesh)
    {shardings, opts} = Keyword.pop(opts, :input_shardings)
    opts = EXLA.Defn.Compilation.validate_options!(opts)
    build = fn -> build(key, vars, fun, mesh, shardings, opts) end
    cached(:shard_jit, key, vars, mesh, shardings, opts, build)
  end

  # The compiled program of either form, built once per function, inputs,
  # mesh, shardings and options.
  defp cached(form, key, vars, mesh, shardings, opts, build) do
    vars_key = EXLA.Defn.Compilation.vars_key(vars)
    # The function and options are the user's (see EXLA.SharedTerm).
    function = EXLA.SharedTerm.function_key(key)
    cache_key = {form, function, vars_key, EXLA.SharedTerm.key({mesh, shardings, opts})}

    {_hit_miss_or_off, compiled} =
      LockedCache.fetch_or_build(opts[:cache], cache_key, :permanent, build)

    compiled
  end

  # EXLA.shard_jit/3 with a tuple mesh: every partition has the whole
  # results.
  defp build(key, vars, fun, mesh, shardings, opts) do
    client = EXLA.Client.fetch!(opts[:client])
    partitions = Sharding.partitions!(mesh, client.device_count)
    inputs = Composite.flatten_list(vars)
    shardings = input_shardings!(shardings, inputs, mesh)

    # The partitioned program is compiled afresh (it skips the disk cache).
    EXLA.Defn.Compilation.compilation(key, vars, fun, opts, fn expr ->
      layout = tuple_layout(expr, mesh, partitions, shardings)
      {compile(client, expr, inputs, mesh, shardings, layout, opts), :off}
    end)
  end

  defp tuple_layout(expr, mesh, partitions, shardings) do
    arg_attrs = Enum.map(shardings, &[{"mhlo.sharding", ~s("#{Sharding.annotation(&1, mesh)}")}])

    result_count = length(Composite.flatten_list([expr]))

    # Each input is annotated with its sharding, each result as replicated,
    # the module with its partition count.
    %{
      lowering: [
        arg_attrs: arg_attrs,
        result_attrs: List.duplicate([{"mhlo.sharding", ~s("{replicated}")}], result_count),
        module_attrs: [
          {"mhlo.num_partitions", "#{partitions} : i32"},
          {"mhlo.num_replicas", "1 : i32"}
        ]
      ],
      results: :whole,
      compile: [num_partitions: partitions]
    }
  end

  # Lowers `expr` with the annotations of `layout` and compiles it for its
  # partitions. Each device's parameters are its parts of the inputs the
  # program reads (without donation, lazy inputs or hooks, none of which
  # is given here, the lowering keeps exactly those as parameters); its
  # results are whole (`results: :whole`) or the parts the partitioner gave
  # it, whose shapes the plugin tells (`:parts`).
  defp compile(client, expr, inputs, shape, shardings, layout, opts) do
    %{program: program, used_inputs: params} = lower(client, expr, inputs, layout.lowering, opts)

    param_shardings = Enum.map(params, &Enum.at(shardings, &1))

    part_shapes =
      Enum.zip_with(params, param_shardings, fn i, dim_axes ->
        t = Enum.at(inputs, i)
        EXLA.Shape.make_shape(t.type, Sharding.part_dims(t.shape, dim_axes, shape))
      end)

    output_shapes = if layout.results == :whole, do: program.output_shapes
    program = %{program | input_shapes: part_shapes, output_shapes: output_shapes}

    %__MODULE__{
      exe: Executable.compile(client, program, layout.compile),
      mesh: shape,
      params: params,
      shardings: param_shardings,
      part_shapes: part_shapes,
      output: Composite.traverse(expr, &%{&1 | data: %Nx.TemplateBackend{}})
    }
  end

  # Lowers `expr` of the whole `inputs` with the sharding annotations of
  # `lowering`, before XLA partitions it.
  defp lower(client, expr, inputs, lowering, opts) do
    no_host_calls!(expr, opts)

    EXLA.Defn.Lowering.to_mlir(
      expr,
      Enum.map(inputs, &EXLA.Defn.Compilation.to_shape/1),
      [precision: opts[:precision]] ++ lowering ++ EXLA.Defn.Lowering.client_options(client)
    )
  end

  defp input_shardings!(nil, inputs, _mesh),
    do: Enum.map(inputs, &List.duplicate([], tuple_size(&1.shape)))

  defp input_shardings!(shardings, inputs, mesh) when is_list(shardings) do
    count_message =
      "expected one sharding per input tensor (#{length(inputs)}), got " <>
        "#{length(shardings)}: #{inspect(shardings)}"

    each_sharding!(shardings, inputs, count_message, fn sharding, t, index ->
      Sharding.sharding!(sharding, EXLA.Defn.Compilation.to_shape(t).dims, mesh, index)
    end)
  end

  defp input_shardings!(other, _inputs, _mesh) do
    raise ArgumentError,
          "expected :input_shardings to be a list of maps, got: #{inspect(other)}"
  end

  # Either form's shardings, one per input, each checked by `check` (with
  # the input and its index) into its dim axes.
  defp each_sharding!(shardings, inputs, count_message, check) do
    if length(shardings) != length(inputs), do: raise(ArgumentError, count_message)
    inputs |> Enum.zip(shardings) |> Enum.with_index(fn {t, s}, index -> check.(s, t, index) end)
  end

  ## Running

  # A call with a tuple mesh: each input is cut on the host into the
  # partitions' parts; every partition has the whole results, of which the
  # first partition's are returned and the others freed.
  defp run(%__MODULE__{exe: exe} = compiled, args) do
    inputs =
      Enum.zip_with(compiled.params, compiled.part_shapes, fn i, shape ->
        host_tensor(Enum.at(args, i), shape.dtype)
      end)

    parts_list =
      for partition <- 0..(length(exe.devices) - 1) do
        [inputs, compiled.shardings, compiled.part_shapes]
        |> Enum.zip_with(fn [tensor, dim_axes, shape] ->
          part(tensor, dim_axes, compiled.mesh, partition, shape)
        end)
      end

    [result | others] = run_parts(compiled, parts_list)
    others |> Composite.flatten_list() |> Enum.each(&Nx.backend_deallocate/1)
    result
  end

  # An input on the host, where it is cut (the arguments of Nx.Defn are
  # functions that build the tensor; numbers are tensors of the input's type).
  defp host_tensor(fun, type) when is_function(fun, 0), do: host_tensor(fun.(), type)

  defp host_tensor(%Nx.Tensor{} = t, _type),
    do: Nx.backend_copy(Nx.devectorize(t), Nx.BinaryBackend)

  defp host_tensor(number, type) when is_number(number),
    do: Nx.tensor(number, type: type, backend: Nx.BinaryBackend)

  defp part(tensor, dim_axes, shape, partition, part_shape) do
    if Enum.all?(dim_axes, &(&1 == [])) do
      tensor
    else
      start = Sharding.part_start(tensor.shape, dim_axes, shape, partition)
      Nx.slice(tensor, start, Tuple.to_list(part_shape.dims))
    end
  end

  # A host callback runs once per call of a program, on its device; a
  # partitioned program runs on every device of the mesh at once, and the
  # partitioner does not place callbacks (upstream EXLA refuses them too).
  # Without this, hooks were dropped and runtime calls failed obscurely.
  defp no_host_calls!(expr, opts) do
    if EXLA.Defn.Lowering.Hooks.active?(expr, opts[:hooks] || %{}) do
      raise ArgumentError,
            "shard_jit does not support host callbacks in the function it shards: " <>
              "hooks, print_value and runtime calls run on the host and cannot be " <>
              "partitioned across the mesh's devices"
    end
  end
end
