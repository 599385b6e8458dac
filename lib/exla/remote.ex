defmodule EXLA.Remote do
  @moduledoc false

  # EXLA's native resources across the nodes of a cluster (internal).
  #
  # A device buffer, an executable or a client is a NIF resource, and its
  # term is a reference that only the node that made it, its *owner*, can
  # resolve. Sent to another node, the term still prints, compares equal and
  # can be sent back to its owner, where it resolves again; but it keeps
  # nothing alive on its way, and the NIF of another node cannot use it.
  #
  # So EXLA never gives the NIF a resource of another node. Every function
  # that takes one first checks where it comes from (`local?/1`, a guard
  # on `node/1` of the reference):
  #
  #   * a buffer of another node is read, waited for or freed by its owner
  #     (`call!/4`), and copied through the host into this node's memory
  #     where a program or a copy needs it (see `EXLA.DeviceBuffer`);
  #
  #   * a client of another node stands for this node's client of the same
  #     name (`EXLA.Client.local/1`);
  #
  #   * an executable of another node is loaded from its owner's serialized
  #     form (`local_executable!/1`, see `EXLA.Executable`).
  #
  # The memory of a buffer stays on its owner for as long as some process
  # there holds the tensor. A tensor that only other nodes hold is freed on
  # its owner by the garbage collector, and reading it then raises an error
  # that says so; so is one whose owner stopped or is not connected.

  alias EXLA.Executable.Serialized

  @doc "Whether `ref` (a resource's reference) belongs to this node."
  defguard local?(ref) when node(ref) == node()

  @doc """
  Calls `module.function(args)` on `owner`, the node that owns a resource
  used in `args`, and returns its result. What it raises there is raised
  here; an owner that cannot be reached raises `RuntimeError` naming it.
  """
  def call!(owner, module, function, args) when is_atom(owner) do
    :erpc.call(owner, module, function, args)
  catch
    :error, {:erpc, :noconnection} ->
      raise RuntimeError,
            "the data lives on node #{inspect(owner)}, which cannot be reached " <>
              "(it stopped or is not connected)"

    :error, {:erpc, reason} ->
      raise RuntimeError,
            "could not reach node #{inspect(owner)}, where the data lives: #{inspect(reason)}"

    :error, {:exception, exception, stacktrace} when is_exception(exception) ->
      reraise exception, stacktrace

    :error, {:exception, reason, stacktrace} ->
      :erlang.raise(:error, reason, stacktrace)

    :exit, {:exception, reason} ->
      exit(reason)
  end

  @doc """
  Raises unless `ref` is a live resource of `kind` on this node: the check
  an owner makes on a reference that came back from another node.
  """
  def alive!(ref, kind) do
    if EXLA.NIF.resource_kind(ref) != kind do
      raise RuntimeError,
            "the #{kind} was freed on node #{inspect(node())}, where it lived: no process " <>
              "there holds it any longer. Other nodes do not keep it alive; keep a reference " <>
              "to it on #{inspect(node())} while they use it, or send them a copy " <>
              "(such as Nx.backend_copy(tensor, Nx.BinaryBackend))"
    end

    :ok
  end

  ## Executables

  @doc false
  # The executable itself, or this node's copy of another node's.
  def local_executable!(%{ref: ref} = executable) when local?(ref), do: executable
  def local_executable!(executable), do: load_executable!(executable)

  @doc false
  # This node's copy of an executable made on another node (see
  # "Executables of other nodes" in EXLA.Executable): loaded once, and kept
  # under the owner's reference with the programs of EXLA.Backend
  # (bounded). Raises when it cannot be loaded.
  def load_executable!(%{ref: ref} = executable) do
    load = fn ->
      case load_executable(executable) do
        {:ok, local} -> local
        {:error, message} -> raise ArgumentError, message
      end
    end

    {_hit_or_miss, local} = EXLA.LockedCache.run({__MODULE__, :executable, ref}, load, :bounded)
    local
  end

  @doc false
  # Loads an executable of another node from the sealed form its owner
  # serializes: `{:ok, executable}`, or `{:error, message}` when the owner
  # cannot be reached, has freed it, or this node's plugin differs.
  def load_executable(%{ref: ref, client: client} = executable) do
    owner = node(ref)
    client = EXLA.Client.local(client)

    with {:ok, sealed} <- serialize_on_owner(executable),
         {:error, :other_plugin} <- Serialized.load_sealed(client, sealed) do
      {:error,
       "the executable was compiled on node #{inspect(owner)} by another PJRT plugin than " <>
         "the one of client #{inspect(client.name)} on #{inspect(node())}"}
    end
  end

  defp serialize_on_owner(executable) do
    {:ok, Serialized.serialize(executable)}
  rescue
    e in RuntimeError -> {:error, Exception.message(e)}
  end
end
