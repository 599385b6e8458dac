defmodule EXLA.DeviceBuffer do
  @moduledoc """
  An array in a device's memory.

  `ref` holds the native buffer. The device memory is freed when the
  buffer is garbage collected, or at once with `deallocate/1`.

  Any number of processes may read, copy, run programs on and deallocate
  the same buffer at once. Once it is deallocated (or donated), reading it
  raises `RuntimeError` "called on deleted or donated buffer"; a read that
  races the deallocation either gets the data or raises that error.

  ## Buffers of other nodes

  A buffer sent to another node stays in the memory of the node that made
  it (its *owner*). On any node, `read/2`, `await/1` and `deallocate/1`
  work on it through its owner (with `:erpc`), and `copy_to_device/3`
  reads it from its owner and places the data on this node's device. The
  memory lives as long as a process of the owner holds the buffer: other
  nodes do not keep it alive. When the owner has freed it, or cannot be
  reached, these functions raise a `RuntimeError` naming the owner.
  """

  require EXLA.Remote, as: Remote
  import EXLA.Placement, only: [small_transfer?: 1, small_read?: 1, small_delete?: 1]
  alias EXLA.{NIF, Shape}

  @enforce_keys [:ref, :client_name, :device_id, :shape]
  defstruct [:ref, :client_name, :device_id, :shape]

  @type t :: %__MODULE__{ref: reference(), client_name: atom(), device_id: non_neg_integer()}

  @doc false
  def from_ref(ref, client, device_id, %Shape{} = shape) when is_reference(ref) do
    %__MODULE__{ref: ref, client_name: client.name, device_id: device_id, shape: shape}
  end

  @doc """
  Copies `data` to a new buffer of `shape` on `device_id` of `client`.
  """
  def place_on_device(data, %Shape{} = shape, client, device_id)
      when is_bitstring(data) and is_integer(device_id) do
    data = Shape.to_device(data, shape.dtype)

    # Small transfers take microseconds (see EXLA.Placement).
    place =
      if small_transfer?(byte_size(data)),
        do: &NIF.buffer_from_binary/5,
        else: &NIF.buffer_from_binary_dirty/5

    new_buffer(shape, client, device_id, &place.(&1, data, &2, &3, device_id))
  end

  def place_on_device(data, %Shape{}, _client, _device_id) when not is_bitstring(data) do
    raise ArgumentError, "expected a binary to place on the device, got: #{inspect(data)}"
  end

  @doc """
  The address of the buffer's data in this process's host memory (waiting
  for it to be computed), or `nil` when the buffer lives on a device. It
  stays valid while the buffer is neither deallocated nor donated.
  """
  def host_address(%__MODULE__{ref: ref}) when Remote.local?(ref),
    do: NIF.unwrap!(NIF.buffer_host_address(ref))

  def host_address(%__MODULE__{}), do: nil

  @doc """
  A new buffer of `shape` on `device_id` of `client` with a copy of the
  bytes at `address` in this process's memory, which the caller vouches
  for (see `Nx.from_pointer/5`).
  """
  def from_address(address, %Shape{} = shape, client, device_id)
      when is_integer(address) and address >= 0 do
    new_buffer(shape, client, device_id, &NIF.buffer_from_address(&1, address, &2, &3, device_id))
  end

  @doc """
  Exports a buffer in this process's host memory for other processes of
  the machine (`Nx.to_pointer(t, mode: :ipc)`): copies it into a new POSIX
  shared memory object whose permission bits are `permissions`, and
  returns `{name, byte_size}`. The object lives until the buffer is
  deallocated, donated or garbage collected, or this OS process exits
  (a crash leaves it in `/dev/shm`); processes that imported it keep their
  mappings after that. Needs `/dev/shm` (Linux).
  """
  def export_ipc(%__MODULE__{ref: ref}, permissions) when Remote.local?(ref) do
    NIF.unwrap!(NIF.buffer_export_ipc(ref, permissions))
  end

  @doc """
  A buffer of `shape` on `device_id` of a host `client` that is a view of
  the shared memory object `name` (see `export_ipc/2`), not a copy: it is
  mapped writable when its permissions let this process write, else
  read-only (and such a buffer cannot be donated). Sub-byte integers,
  which the object holds one per byte and the device packs, are copied.
  """
  def import_ipc(name, %Shape{} = shape, client, device_id) when is_binary(name) do
    new_buffer(shape, client, device_id, &NIF.buffer_import_ipc(&1, name, &2, &3, device_id))
  end

  # The buffer of `shape` that `make`, a NIF given the client's reference,
  # the shape's type code and its dimensions, creates on `device_id` of
  # `client` (through this node's copy of the client).
  defp new_buffer(%Shape{} = shape, client, device_id, make) do
    {code, dims} = Shape.to_spec(shape)
    client = EXLA.Client.local(client)
    ref = NIF.unwrap!(make.(client.ref, code, dims))
    from_ref(ref, client, device_id, shape)
  end

  @doc """
  Copies the buffer to `device_id` of `client`, going through the host when
  the client is another one or the buffer lives on another node.
  """
  def copy_to_device(%__MODULE__{ref: ref} = buffer, client, device_id)
      when Remote.local?(ref) and buffer.client_name == client.name do
    client = EXLA.Client.local(client)
    ref = NIF.unwrap!(NIF.buffer_copy_to_device(ref, device_id))
    from_ref(ref, client, device_id, buffer.shape)
  end

  def copy_to_device(%__MODULE__{} = buffer, client, device_id) do
    buffer |> read() |> place_on_device(buffer.shape, client, device_id)
  end

  @doc """
  Whether the buffer lives on this node (see "Buffers of other nodes").
  """
  def local?(%__MODULE__{ref: ref}), do: Remote.local?(ref)

  @doc """
  Reads the buffer's data, waiting for it to be computed.

  `size` limits how many bytes are read; -1 reads all of them. Sub-byte
  integers count a byte each here (PJRT gives them back so; the device
  packs them), and are packed as Nx packs them when read (see `EXLA.Shape`).
  """
  def read(buffer, size \\ -1)

  def read(%__MODULE__{ref: ref, shape: shape}, size)
      when Remote.local?(ref) and is_integer(size) do
    bytes = Shape.byte_size(shape)
    bytes = if size >= 0, do: min(size, bytes), else: bytes

    # A small read of ready data copies on this scheduler; a large one, or
    # one that waits for its data, on a dirty scheduler (see EXLA.Placement).
    data =
      with true <- small_read?(bytes),
           {:ok, data} when is_binary(data) <- NIF.buffer_read(ref, size) do
        data
      else
        waits when waits in [false, {:ok, nil}] -> NIF.unwrap!(NIF.buffer_read_dirty(ref, size))
        error -> NIF.unwrap!(error)
      end

    Shape.from_host(data, shape.dtype)
  end

  def read(%__MODULE__{} = buffer, size) when is_integer(size),
    do: on_owner(buffer, :read, [buffer, size])

  @doc """
  Waits until the buffers' data is computed, raising the error of a failed
  computation.
  """
  def await([]), do: :ok

  def await(buffers) when is_list(buffers) do
    case local_refs(buffers, []) do
      {:ok, refs} -> await_local(refs)
      :remote -> await_anywhere(buffers)
    end
  end

  defp local_refs([%__MODULE__{ref: ref} | buffers], refs) when Remote.local?(ref),
    do: local_refs(buffers, [ref | refs])

  defp local_refs([], refs), do: {:ok, refs}
  defp local_refs(_buffers, _refs), do: :remote

  # Each owner waits for its own buffers.
  defp await_anywhere(buffers) do
    {local, remote} = Enum.split_with(buffers, &local?/1)

    for {_owner, [buffer | _] = owned} <- Enum.group_by(remote, &node(&1.ref)) do
      on_owner(buffer, :await, [owned])
    end

    await_local(Enum.map(local, & &1.ref))
  end

  defp await_local([]), do: :ok

  defp await_local(refs) do
    if Enum.all?(refs, &NIF.unwrap!(NIF.buffer_ready(&1))) do
      :ok
    else
      NIF.unwrap!(NIF.buffer_await(refs))
    end
  end

  @doc """
  Frees the device memory now.

  Returns `:ok`, or `:already_deallocated` if it was freed (or donated)
  before.
  """
  def deallocate(%__MODULE__{ref: ref, shape: shape}) when Remote.local?(ref) do
    # :busy: a run on several devices is taking the buffer; deletion waits
    # for it on a dirty scheduler, as does a large buffer (see EXLA.Placement).
    with true <- small_delete?(Shape.byte_size(shape)),
         result when result != :busy <- NIF.unwrap!(NIF.buffer_delete(ref)) do
      result
    else
      _ -> NIF.unwrap!(NIF.buffer_delete_dirty(ref))
    end
  end

  def deallocate(%__MODULE__{} = buffer), do: on_owner(buffer, :deallocate, [buffer])

  # Runs `function` of this module on the node that owns `buffer`.
  defp on_owner(%__MODULE__{ref: ref}, function, args),
    do: Remote.call!(node(ref), __MODULE__, :__on_owner__, [function, args])

  @doc false
  # The owner's side of `on_owner/3`: every buffer in `args` must still be
  # alive here (a freed one comes back as a plain reference).
  def __on_owner__(function, args) when function in [:read, :await, :deallocate] do
    for %__MODULE__{ref: ref} <- List.flatten(args), do: Remote.alive!(ref, :buffer)
    apply(__MODULE__, function, args)
  end
end
