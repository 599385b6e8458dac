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
  #     form (see `EXLA.Executable`).
  #
  # The memory of a buffer stays on its owner for as long as some process
  # there holds the tensor. A tensor that only other nodes hold is freed on
  # its owner by the garbage collector, and reading it then raises an error
  # that says so; so is one whose owner stopped or is not connected.

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
end
