defmodule EXLA.Backend do
  @moduledoc """
  An `Nx.Backend` whose tensors live in the memory of an XLA device (the
  CPU, a GPU or a TPU) and whose operations run on that device.

  A tensor lands here when it is created with `backend: EXLA.Backend` (or
  `backend: {EXLA.Backend, options}`), when this is the default backend, or
  when `Nx.backend_transfer/2` or `Nx.backend_copy/2` moves it here. The
  backend options are:

    * `:client` - the name of the `EXLA.Client` that holds the data.
      When absent, `EXLA.Client.default_name/0` picks it.

    * `:device_id` - which of that client's devices holds the data. When
      absent, the client's `:default_device_id`.

  `Nx.backend_transfer(tensor, Nx.BinaryBackend)` moves the data back to
  the host (and frees the device memory); `Nx.to_binary/1` and the other
  readers copy it.

  Operations on tensors of this backend are compiled with XLA, one small
  executable per operation, and cached per operation, argument types and
  shapes, options, client and device: repeating an operation on tensors of
  the same shape reuses its executable. Optional operations (such as
  `Nx.LinAlg.qr/2` or `Nx.cumulative_sum/2`) are compiled as a whole.

  A repeated operation builds its cache key (the operation, the output's
  type and shape, the static arguments, each tensor argument's type and
  shape, the client and the device), looks it up, runs the executable on
  the arguments' device buffers and puts the output buffers into the output
  tensors Nx gave: no expression is built and nothing is lowered or
  compiled.

  The cache holds at most 1024 of these executables (each holds about
  100 KB of native memory on the CPU); set another bound with
  `config :exla, :backend_cache_size, n` (read when `:exla` starts). The
  first quarter compiled stays for the life of the VM and is read without
  a copy (`:persistent_term`); the others live in an ETS table, and past
  the bound the least recently used one is dropped (and compiled again if
  it is needed again). The programs of `EXLA.jit/2` are not bounded.

  ## Tensors on several devices

  When the arguments of an operation live on different clients or devices,
  it runs where EXLA runs it: on the device of the last argument that is
  not on the default device of a client with `:automatic_transfers` (see
  `EXLA.Client`), else on that of the last argument on such a default
  device, so that a GPU tensor's device wins over a host tensor's. The
  other arguments are copied there if their client has
  `:automatic_transfers` (the default of `:host` clients); otherwise the
  operation raises `ArgumentError`, as a jitted function does (move the
  tensor with `Nx.backend_transfer/2`). On Nx 0.12 and later,
  `Nx.concatenate/2` and `Nx.stack/2` are the exception: they copy their
  tensors there whatever their clients say, as EXLA 0.12 and later do.
  Tensors of other backends are sent to that device.

  `Nx.backend_deallocate/1` frees the device memory at once; using the
  tensor afterwards raises an error.

  ## Pointers (Nx 0.12 and later)

  `Nx.to_pointer/2` takes these options:

    * `:mode` - `:local` (the default) gives the address of the tensor's
      buffer in this process, valid while the tensor is neither
      deallocated nor donated. `:ipc` copies the tensor into a new POSIX
      shared memory object (Linux, `/dev/shm`) and gives its name as the
      pointer's `:handle`; the object lives until the tensor is freed or
      the VM exits. Both need a tensor in this node's host memory: device
      memory (CUDA IPC included) raises an `ArgumentError`. Sub-byte
      integers (`:s2`, `:s4`, `:u2`, `:u4`) are packed in device memory, so
      `:local` refuses them; an `:ipc` object holds them a byte each.

    * `:permissions` - the mode bits of an `:ipc` object, exactly (the
      umask does not apply): an integer in `0..0o7777`, `0o400` (read for
      the owner only) by default.

  `Nx.from_pointer/5` takes `:client` and `:device_id` as backend options.
  A `:local` pointer's memory is copied into a new tensor; an `:ipc`
  pointer's object is mapped, by any process of the machine, as a tensor
  that shares its pages, writable where the object's mode lets that
  process write, else read-only (and then it cannot be donated); sub-byte
  integers are copied in. Only host clients import `:ipc` pointers.

  ## Tensors of other nodes

  A tensor sent to another node of the cluster keeps its data on the node
  that made it (its owner). Any node can read it (`Nx.to_binary/1`,
  `Kernel.inspect/2`), copy it (`Nx.backend_copy/2`), transfer it
  (`Nx.backend_transfer/2` to this backend, which brings the data to this
  node, or to another backend) and deallocate it: the data is read or freed
  by its owner (see `EXLA.DeviceBuffer`). An operation on it, here or in
  `EXLA.jit/2`, first copies it to this node's device, as it copies any
  tensor from another device. The owner keeps the data while one of its
  processes holds the tensor; once it has freed it, or when it is not
  connected, these raise a `RuntimeError` naming the owner.

  ## Numerics

  Each operation is the expression `Nx.Defn.Expr` builds for it, compiled
  as `EXLA.jit/2` compiles it: an eager result has the same bits as the same
  operation inside a jitted function on the same client, and takes as long
  for large inputs. Optional operations whose implementation is Nx's default
  expression (`Nx.LinAlg.eigh/2`, `Nx.LinAlg.svd/2`, cumulative ops, ...)
  run that expression, as jit does; `Nx.LinAlg.qr/2` and `Nx.LinAlg.lu/2`
  run EXLA's own lowerings in both modes.

  Floats are computed in their own precision, as XLA computes them, so
  results may differ from `Nx.BinaryBackend`'s (which works with f64 and
  rounds once) in the last bits. Where EXLA 0.7.2 and the reference differ,
  this backend follows EXLA 0.7.2:

    * `Nx.LinAlg.triangular_solve/3` with a zero on the diagonal returns
      XLA's result (infinities and NaN) instead of raising.
    * `Nx.LinAlg.eigh/2` of a complex matrix raises `ArgumentError` on
      Nx 0.7 (Nx's default implementation returns real eigenvalues, which
      do not match the complex output Nx expects), eagerly and in jit
      alike; Nx 0.12 and later compute it.
    * `Nx.round/1` keeps the sign of a zero result (`round(-0.3)` is -0.0).

  ## Examples

      iex> t = Nx.tensor([1.0, 2.0, 3.0], backend: EXLA.Backend)
      iex> Nx.add(t, t)
      #Nx.Tensor<
        f32[3]
        [2.0, 4.0, 6.0]
      >

      iex> t = Nx.tensor([1.0, 2.0], backend: {EXLA.Backend, client: :host})
      iex> Nx.backend_transfer(t)
      #Nx.Tensor<
        f32[2]
        [1.0, 2.0]
      >

  Inspecting a tensor on this backend also prints a line such as
  `EXLA.Backend<host:0, 0.1234.5678.90>` with the client, device and
  buffer reference, unless `config :exla, :add_backend_on_inspect, false`.
  """

  @behaviour Nx.Backend

  @enforce_keys [:buffer]
  defstruct [:buffer]

  alias Nx.Tensor, as: T
  alias EXLA.Backend, as: B
  alias EXLA.Defn.Compiled
  alias EXLA.{LockedCache, SharedTerm}

  ## Creation

  @impl true
  def init(opts) do
    opts = Keyword.validate!(opts, [:client, :device_id])

    case opts[:client] do
      nil -> :ok
      client when is_atom(client) -> :ok
      other -> raise ArgumentError, ":client must be an atom, got: #{inspect(other)}"
    end

    case opts[:device_id] do
      nil ->
        :ok

      id when is_integer(id) and id >= 0 ->
        :ok

      other ->
        raise ArgumentError, ":device_id must be a non-negative integer, got: #{inspect(other)}"
    end

    opts
  end

  @impl true
  def from_binary(%T{type: type, shape: shape} = out, binary, opts) do
    {client, device_id} = client_and_device!(opts)
    exla_shape = EXLA.Shape.make_shape(type, shape)
    buffer = EXLA.DeviceBuffer.place_on_device(binary, exla_shape, client, device_id)
    %{out | data: %B{buffer: buffer}}
  end

  @impl true
  def constant(out, number, opts) do
    binary = out |> Nx.BinaryBackend.constant(number, []) |> Nx.to_binary()
    from_binary(out, binary, opts)
  end

  @impl true
  def eye(out, opts), do: create(:eye, out, [[]], opts)

  @impl true
  def iota(out, axis, opts), do: create(:iota, out, [axis, []], opts)

  defp create(op, out, args, opts) do
    {client, device_id} = client_and_device!(opts)
    jit(op, out, args, {client.name, device_id})
  end

  # Nx does not call init/1 for every allocation (Nx.tensor/2 does not),
  # so the options are validated here too.
  defp client_and_device!(opts) do
    opts = init(opts)
    EXLA.Client.fetch_device!(opts[:client] || EXLA.Client.default_name(), opts[:device_id])
  end

  ## Transfers and lifetime

  @impl true
  def to_binary(%T{type: type, data: %B{buffer: buffer}}, limit) do
    count = Tuple.product(buffer.shape.dims)

    if limit >= count do
      EXLA.DeviceBuffer.read(buffer)
    else
      EXLA.DeviceBuffer.read(buffer, limit * EXLA.Shape.element_bytes(type))
    end
  end

  @impl true
  def backend_copy(%T{data: %B{buffer: buffer}} = tensor, B, opts) do
    {client, device_id} = client_and_device!(opts)
    %{tensor | data: %B{buffer: EXLA.DeviceBuffer.copy_to_device(buffer, client, device_id)}}
  end

  def backend_copy(tensor, Nx.Tensor, opts), do: backend_copy(tensor, Nx.BinaryBackend, opts)

  def backend_copy(%T{data: %B{buffer: buffer}} = tensor, backend, opts) do
    backend.from_binary(tensor, EXLA.DeviceBuffer.read(buffer), opts)
  end

  @impl true
  def backend_transfer(%T{data: %B{buffer: buffer}} = tensor, B, opts) do
    {client, device_id} = client_and_device!(opts)

    if buffer.client_name == client.name and buffer.device_id == device_id and
         EXLA.DeviceBuffer.local?(buffer) do
      tensor
    else
      copy = backend_copy(tensor, B, opts)
      EXLA.DeviceBuffer.deallocate(buffer)
      copy
    end
  end

  def backend_transfer(%T{data: %B{buffer: buffer}} = tensor, backend, opts) do
    copy = backend_copy(tensor, backend, opts)
    EXLA.DeviceBuffer.deallocate(buffer)
    copy
  end

  @impl true
  def backend_deallocate(%T{data: %B{buffer: buffer}}) do
    EXLA.DeviceBuffer.deallocate(buffer)
  end

  @impl true
  def to_batched(out, %T{type: {_, bits}, data: %B{buffer: buffer}}, batch_opts) do
    # Sizes are in bits: Nx packs sub-byte types.
    # The batches of another node's tensor are made on this node's default.
    opts =
      if EXLA.DeviceBuffer.local?(buffer),
        do: [client: buffer.client_name, device_id: buffer.device_id],
        else: []

    binary = EXLA.DeviceBuffer.read(buffer)
    batch_bits = Nx.size(out) * bits
    total = bit_size(binary)
    full = div(total, batch_bits)
    rest = total - full * batch_bits

    last =
      if rest > 0 and batch_opts[:leftover] == :repeat,
        do: full,
        else: full - 1

    Stream.map(0..last//1, fn
      ^full ->
        missing = batch_bits - rest

        batch =
          <<bits_part(binary, full * batch_bits, rest)::bitstring,
            bits_part(binary, 0, missing)::bitstring>>

        from_binary(out, batch, opts)

      i ->
        from_binary(out, bits_part(binary, i * batch_bits, batch_bits), opts)
    end)
  end

  defp bits_part(bits, start, size) do
    <<_::bitstring-size(start), part::bitstring-size(size), _::bitstring>> = bits
    part
  end

  ## Inspect

  @impl true
  def inspect(%T{data: %B{buffer: buffer}} = tensor, inspect_opts) do
    count = Tuple.product(buffer.shape.dims)

    limit =
      case inspect_opts.limit do
        :infinity -> count
        limit -> min(limit + 1, count)
      end

    binary = to_binary(tensor, limit)
    doc = Nx.Backend.inspect(tensor, binary, inspect_opts)

    if Application.get_env(:exla, :add_backend_on_inspect, true) do
      Inspect.Algebra.concat([signature(buffer), Inspect.Algebra.line(), doc])
    else
      doc
    end
  end

  defp signature(buffer) do
    "EXLA.Backend<#{buffer.client_name}:#{buffer.device_id}, #{ref_string(buffer.ref)}>"
  end

  defp ref_string(ref) when is_reference(ref) do
    case :erlang.ref_to_list(ref) do
      ~c"#Ref<" ++ rest -> rest |> List.delete_at(-1) |> List.to_string()
      other -> List.to_string(other)
    end
  end

  defp ref_string(other), do: inspect(other)

  ## Operations compiled with XLA

  # Every callback that is an op EXLA lowers (EXLA.Defn.OpTable) runs as
  # that op compiled; these are the ones written by hand below.
  # EXLA 0.12 and later (Nx 0.12 and later, where stack/3 came) gather the
  # tensors of concatenate and stack (see gather/2); EXLA 0.7.2 runs
  # concatenate as every other op.
  @gathering if EXLA.NxVersion.stack?(), do: [:concatenate, :stack], else: []
  @by_hand [:eye, :iota, :optional, :block] ++ @gathering

  for {op, arity} <- EXLA.Defn.OpTable.backend_ops(), op not in @by_hand do
    args = Macro.generate_arguments(arity, __MODULE__)

    @impl true
    def unquote(op)(out, unquote_splicing(args)) do
      jit(unquote(op), out, unquote(args), nil)
    end
  end

  # Concatenate and stack take their tensors wherever they are (see
  # gather/2).
  for {op, 2} <- EXLA.Defn.OpTable.backend_ops(), op in @gathering do
    @impl true
    def unquote(op)(out, tensors, axis) do
      place = place(tensors) || default_place()
      jit(unquote(op), out, [gather(tensors, place), axis], place)
    end
  end

  if EXLA.NxVersion.blocks?() do
    # A block (Nx 0.12 and later) runs as one program: EXLA's lowering of
    # its struct where it has one (see EXLA.CustomCall), else the default
    # implementation, compiled. The struct is part of the key: its fields
    # are the block's static options.
    @impl true
    def block(struct, _output, args, fun) do
      run_whole(:block, {struct, fun}, args, fn filled ->
        Nx.Defn.Expr.block(struct, filled, fun)
      end)
    end
  else
    @impl true
    def optional(name, args, fun) do
      run_whole(:optional, name, args, fn filled -> Nx.Defn.Expr.optional(name, filled, fun) end)
    end

    # Nx 0.7's evaluator runs an `:optional` node through the backend only
    # where it exports the op itself (`svd/3`, ...), else it evaluates the
    # default implementation op by op: so a defn run by the evaluator on
    # EXLA.Backend tensors (`Nx.LinAlg.pinv/2` called eagerly, for one) got
    # Nx's Jacobi SVD instead of the native one (pinv of [[1, 1], [3, 4]]:
    # 4.004 where the exact value is 4 and jit gives 3.9999983). These run
    # what `optional/3` runs (Nx.Backend's optional callbacks), checked
    # against Nx's template as `Nx.Shared.optional/4` checks it. (solve and
    # determinant have no public default implementation to give.)
    for {name, default} <- [
          cholesky: &Nx.LinAlg.Cholesky.cholesky/1,
          qr: &Nx.LinAlg.QR.qr/2,
          eigh: &Nx.LinAlg.Eigh.eigh/2,
          svd: &Nx.LinAlg.SVD.svd/2
        ] do
      args = Macro.generate_arguments(if(name == :cholesky, do: 1, else: 2), nil)

      @impl true
      def unquote(name)(out, unquote_splicing(args)) do
        unquote(name)
        |> optional(unquote(args), unquote(Macro.escape(default)))
        |> optional_compatible!(out)
      end
    end

    defp optional_compatible!(result, out) when is_tuple(out) do
      result
      |> Tuple.to_list()
      |> Enum.zip_with(Tuple.to_list(out), &optional_compatible!/2)
      |> List.to_tuple()
    end

    defp optional_compatible!(%T{} = result, %T{} = out)
         when {result.shape, result.type, result.names} == {out.shape, out.type, out.names},
         do: result

    defp optional_compatible!(result, out) do
      raise ArgumentError,
            "expected default implementation to match template #{inspect(out)}, got: #{inspect(result)}"
    end
  end

  if EXLA.NxVersion.pointers?() do
    # Pointers (Nx 0.12 and later), to tensors in host memory. A `:local`
    # pointer is the address of the tensor's buffer, valid while the buffer
    # is neither deallocated nor donated; a tensor from one is a copy of the
    # memory there, which the caller vouches for. An `:ipc` pointer names a
    # POSIX shared memory object holding a copy of the tensor, which any
    # process of the machine may import while the exported tensor lives; a
    # tensor from one is a view of that memory, not a copy (see
    # EXLA.DeviceBuffer.export_ipc/2). Device memory (CUDA IPC) is not shared.
    @impl true
    def to_pointer(%T{data: %B{buffer: buffer}}, opts) do
      opts = Keyword.validate!(opts, mode: :local, permissions: 0o400)
      permissions = opts[:permissions]

      unless is_integer(permissions) and permissions in 0..0o7777 do
        raise ArgumentError,
              ":permissions must be an integer in the range 0..0o7777 " <>
                "(typically an octal literal like 0o400), got: #{inspect(permissions)}"
      end

      case opts[:mode] do
        :local ->
          packed_on_device!(buffer.shape.dtype)
          address = EXLA.DeviceBuffer.host_address(buffer) || not_in_host_memory!(buffer, :local)
          size = EXLA.Shape.byte_size(buffer.shape)
          %Nx.Pointer{kind: :local, address: address, data_size: size, handle: nil}

        :ipc ->
          EXLA.DeviceBuffer.host_address(buffer) || not_in_host_memory!(buffer, :ipc)
          {handle, size} = EXLA.DeviceBuffer.export_ipc(buffer, permissions)
          %Nx.Pointer{kind: :ipc, address: nil, data_size: size, handle: handle}

        mode ->
          raise ArgumentError, "expected :mode to be one of :local, :ipc, got: #{inspect(mode)}"
      end
    end

    # The device packs sub-byte integers (two s4 or four s2 per byte), so
    # the memory at the address is not what Nx.from_pointer/5 takes (a
    # byte per element); :ipc exports copy them out a byte per element.
    defp packed_on_device!({kind, bits} = type) when bits < 8 and kind in [:s, :u] do
      raise ArgumentError,
            "Nx.to_pointer/2 with mode: :local does not support #{inspect(type)}: the device " <>
              "packs sub-byte integers, #{div(8, bits)} per byte; use mode: :ipc"
    end

    defp packed_on_device!(_type), do: :ok

    defp not_in_host_memory!(buffer, mode) do
      platform = EXLA.Client.fetch!(buffer.client_name).platform

      raise ArgumentError,
            "Nx.to_pointer/2 with mode: #{inspect(mode)} needs a tensor in this node's " <>
              "host memory, got one on the #{inspect(buffer.client_name)} client " <>
              "(platform #{inspect(platform)})" <> device_ipc_note(platform, mode)
    end

    defp device_ipc_note(:host, _mode), do: " of another node"
    defp device_ipc_note(_platform, :ipc), do: ": EXLA does not share device memory (CUDA IPC)"
    defp device_ipc_note(_platform, _mode), do: ""

    @impl true
    def from_pointer(%Nx.Pointer{} = pointer, type, shape, backend_opts, opts) do
      {client, device_id} = client_and_device!(backend_opts)
      exla_shape = EXLA.Shape.make_shape(type, shape)
      size = EXLA.Shape.byte_size(exla_shape)

      if pointer.data_size not in [nil, size] do
        raise ArgumentError,
              "the pointer holds #{pointer.data_size} bytes, but #{inspect(type)} " <>
                "#{inspect(shape)} takes #{size}"
      end

      buffer =
        case pointer do
          %Nx.Pointer{kind: :local, address: address} when is_integer(address) and address >= 0 ->
            EXLA.DeviceBuffer.from_address(address, exla_shape, client, device_id)

          %Nx.Pointer{kind: :ipc, handle: handle} when is_binary(handle) ->
            unless EXLA.Platform.cpu_name?(client.platform_name) do
              raise ArgumentError,
                    "Nx.from_pointer/5 with an :ipc pointer needs a client in host memory, " <>
                      "got the #{inspect(client.name)} client (platform #{inspect(client.platform)})" <>
                      ": EXLA does not share device memory (CUDA IPC)"
            end

            EXLA.DeviceBuffer.import_ipc(handle, exla_shape, client, device_id)

          _ ->
            raise ArgumentError,
                  "expected a :local pointer with an address or an :ipc pointer with a handle, " <>
                    "got: #{inspect(pointer)}"
        end

      names = opts[:names] || List.duplicate(nil, tuple_size(shape))
      %T{type: type, shape: shape, names: names, data: %B{buffer: buffer}}
    end
  end

  # Runs an operation with a default implementation (a block or an optional
  # op) as one cached program; `expr` builds its expression from the
  # arguments with parameters in place of the tensors.
  defp run_whole(kind, name, args, expr) do
    {skeleton, tensors} = scan(args, [], true)
    tensors = Enum.reverse(tensors)
    {client_name, device_id} = place(tensors) || default_place()
    # A block's struct and function, and an optional op's arguments, are
    # the user's: the key stays within a bounded cost (EXLA.SharedTerm).
    key = SharedTerm.key({__MODULE__, kind, name, skeleton, client_name, device_id})

    compiled =
      LockedCache.get(key, :bounded) ||
        compile(key, name, tensors, client_name, device_id, fn params ->
          {filled, []} = fill(skeleton, params)
          expr.(filled)
        end)

    EXLA.Defn.__run__(compiled, tensors)
  end

  ## Compile-and-run machinery

  # Runs `op` of `Nx.Defn.Expr` on `args` as a cached XLA executable: the
  # same expression, lowered the same way, as the op inside `EXLA.jit/2`.
  # The key replaces every tensor in `args` by its type and shape, so it
  # holds the static arguments (axes, options, functions) as they are.
  defp jit(op, out, args, place) do
    {skeleton, tensors} = scan(args, [], false)
    tensors = Enum.reverse(tensors)
    {client_name, device_id} = place || place(tensors) || default_place()
    key = op_key({__MODULE__, op, out_key(out), skeleton, client_name, device_id})

    compiled =
      case LockedCache.get(key, :bounded) do
        nil ->
          template = out_template(out)

          compile(key, op, tensors, client_name, device_id, fn params ->
            {filled, []} = fill(skeleton, params)
            apply(Nx.Defn.Expr, op, [template | filled])
          end)

        compiled ->
          compiled
      end

    attach(out, EXLA.Defn.__run_buffers__(compiled, tensors))
  end

  # The static arguments of most operations are numbers, atoms and lists
  # and tuples of them, which Nx validates. Those of the operations that
  # take a function hold the user's function and what it captures, which
  # may be large or share subterms: their key stays within a bounded cost
  # (EXLA.SharedTerm).
  @function_ops [:reduce, :window_reduce, :map]

  defp op_key({_, op, _, _, _, _} = key) when op in @function_ops, do: SharedTerm.key(key)
  defp op_key(key), do: key

  defp compile(key, name, tensors, client_name, device_id, build) do
    templates = Enum.map(tensors, &Nx.to_template/1)
    opts = [client: client_name, device_id: device_id, cache_kind: :bounded]
    %Compiled{} = EXLA.Defn.__compile_op__(key, name, templates, build, opts)
  end

  defp default_place do
    client = EXLA.Client.fetch!(EXLA.Client.default_name())
    {client.name, client.default_device_id}
  end

  # Replaces tensors by {:"$t", type, shape} (plus names when asked),
  # collecting them (reversed).
  defp scan(%T{type: type, shape: shape} = tensor, tensors, names?) do
    marker = if names?, do: {:"$t", type, shape, tensor.names}, else: {:"$t", type, shape}
    {marker, [tensor | tensors]}
  end

  defp scan([head | tail], acc, names?) do
    {head, acc} = scan(head, acc, names?)
    {tail, acc} = scan(tail, acc, names?)
    {[head | tail], acc}
  end

  defp scan(tuple, acc, names?) when is_tuple(tuple) do
    {list, acc} = scan(Tuple.to_list(tuple), acc, names?)
    {List.to_tuple(list), acc}
  end

  defp scan(other, acc, _names?), do: {other, acc}

  # Where an operation on `tensors` runs, as EXLA chooses, or nil when no
  # tensor is on a device of this node: the last tensor on a device that
  # is not the default one of a client with :automatic_transfers, else the
  # last one on such a default device (a host tensor gives way to a GPU's,
  # but runs where it is when it is alone). The other tensors are copied
  # there (EXLA.Defn.Call.to_buffer/4 raises for a client without
  # :automatic_transfers). Tensors all in one place run there.
  defp place(tensors) do
    case for(%T{data: data} <- tensors, place = place_of(data), do: place) do
      [] ->
        nil

      [first | rest] = places ->
        if Enum.all?(rest, &(&1 == first)), do: first, else: chosen_place(places)
    end
  end

  defp chosen_place(places) do
    {priority, fallback} =
      Enum.reduce(places, {nil, nil}, fn
        place, {place, fallback} ->
          {place, fallback}

        {name, id} = place, {priority, fallback} ->
          case EXLA.Client.fetch!(name) do
            %{automatic_transfers: true, default_device_id: ^id} -> {priority, place}
            _ -> {place, fallback}
          end
      end)

    priority || fallback
  end

  # Another node's tensor is no place to run: it is copied to this node.
  defp place_of(%B{buffer: %{ref: ref, client_name: name, device_id: id}})
       when node(ref) == node(),
       do: {name, id}

  defp place_of(_), do: nil

  if @gathering != [] do
    # EXLA 0.12 and later gather the tensors of concatenate and stack
    # through the host, whatever their clients' :automatic_transfers: here
    # they are copied, device to device, to where the operation runs.
    defp gather(tensors, {client_name, device_id}) do
      Enum.map(tensors, fn
        %T{data: %B{buffer: %{client_name: ^client_name, device_id: ^device_id}}} = t ->
          t

        %T{data: %B{buffer: %{ref: ref} = buffer}} = t when node(ref) == node() ->
          client = EXLA.Client.fetch!(client_name)
          %{t | data: %B{buffer: EXLA.DeviceBuffer.copy_to_device(buffer, client, device_id)}}

        t ->
          t
      end)
    end
  end

  defp fill({:"$t", _, _}, [param | params]), do: {param, params}
  defp fill({:"$t", _, _, _}, [param | params]), do: {param, params}

  defp fill([head | tail], params) do
    {head, params} = fill(head, params)
    {tail, params} = fill(tail, params)
    {[head | tail], params}
  end

  defp fill(tuple, params) when is_tuple(tuple) do
    {list, params} = fill(Tuple.to_list(tuple), params)
    {List.to_tuple(list), params}
  end

  defp fill(other, params), do: {other, params}

  defp out_key(%T{type: type, shape: shape}), do: {type, shape}
  defp out_key(tuple) when is_tuple(tuple), do: tuple |> Tuple.to_list() |> Enum.map(&out_key/1)

  defp out_template(%T{} = out),
    do: %{out | data: nil, names: Enum.map(out.names, fn _ -> nil end)}

  defp out_template(tuple) when is_tuple(tuple),
    do: tuple |> Tuple.to_list() |> Enum.map(&out_template/1) |> List.to_tuple()

  defp attach(%T{} = out, [buffer]), do: %{out | data: %B{buffer: buffer}}

  defp attach(tuple, buffers) when is_tuple(tuple) do
    {list, []} =
      tuple
      |> Tuple.to_list()
      |> Enum.map_reduce(buffers, fn out, [buffer | rest] -> {attach(out, [buffer]), rest} end)

    List.to_tuple(list)
  end
end
