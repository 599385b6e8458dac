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

  @impl true
  def __stream__(_key, _input, _acc, _vars, _fun, _args_list, _opts) do
    raise ArgumentError, "EXLA.shard_jit/3 functions cannot be streamed"
  end

  @impl true
  def __partitions_options__(opts), do: [opts]

  @impl true
  def __to_backend__(opts),
    do: EXLA.Defn.__to_backend__(Keyword.drop(opts, [:mesh, :input_shardings]))

  ## Compilation

  defp lookup_or_compile(key, vars, fun, opts) do
    {mesh, opts} = Keyword.pop(opts, :mesh)
    {shardings, opts} = Keyword.pop(opts, :input_shardings)
    opts = EXLA.Defn.validate_options!(opts)
    build = fn -> build(key, vars, fun, mesh, shardings, opts) end
    cache_key = {:shard_jit, key, EXLA.Defn.vars_key(vars), mesh, shardings, opts}

    {_hit_miss_or_off, compiled} =
      LockedCache.fetch_or_build(opts[:cache], cache_key, :permanent, build)

    compiled
  end

  defp build(key, vars, fun, mesh, shardings, opts) do
    client = EXLA.Client.fetch!(opts[:client])
    partitions = Sharding.partitions!(mesh, client.device_count)
    inputs = Composite.flatten_list(vars)
    shardings = input_shardings!(shardings, inputs, mesh)

    # The partitioned program is compiled afresh (it skips the disk cache).
    EXLA.Defn.compilation(key, vars, fun, opts, fn expr ->
      {compile(client, expr, inputs, mesh, partitions, shardings, opts), :off}
    end)
  end

  defp compile(client, expr, inputs, mesh, partitions, shardings, opts) do
    # Each parameter is annotated with its input's sharding, each result as
    # replicated (every partition returns the whole results), the module
    # with its partition count.
    arg_attrs =
      Enum.zip_with(inputs, shardings, fn t, sharding ->
        [{"mhlo.sharding", ~s("#{Sharding.annotation(sharding, tuple_size(t.shape), mesh)}")}]
      end)

    result_count = length(Composite.flatten_list([expr]))

    %{program: program, used_inputs: params} =
      EXLA.Defn.Lowering.to_mlir(
        expr,
        Enum.map(inputs, &EXLA.Defn.to_shape/1),
        [
          precision: opts[:precision],
          arg_attrs: arg_attrs,
          result_attrs: List.duplicate([{"mhlo.sharding", ~s("{replicated}")}], result_count),
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

    # Each device's results are the whole results (replicated), and its
    # parameters its parts of the inputs.
    exe =
      Executable.compile(client, %{program | input_shapes: part_shapes},
        num_partitions: partitions
      )

    %__MODULE__{
      exe: exe,
      mesh: mesh,
      params: params,
      shardings: param_shardings,
      part_shapes: part_shapes,
      output: Composite.traverse(expr, &%{&1 | data: %Nx.TemplateBackend{}})
    }
  end

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
      Sharding.sharding!(sharding, EXLA.Defn.to_shape(t).dims, mesh, index)
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
