defmodule EXLA.Defn.LockedCache do
  @moduledoc false
  # A cache where each value is computed exactly once.
  #
  # Values live in `:persistent_term`, so a hit is a single lookup that
  # neither copies the value nor talks to a process. Only a miss talks to
  # this server, which hands out one lock per key: the first caller gets
  # `:compute`, the callers that arrive while it computes wait, and they
  # are all told to look again once the value is stored (or once the
  # computing process fails or dies, in which case one of them computes).
  use GenServer

  @name __MODULE__

  @doc "Starts the lock server."
  def start_link(_opts \\ []) do
    GenServer.start_link(__MODULE__, :ok, name: @name)
  end

  @doc "Returns the cached value for `key` or `nil`."
  def get(key), do: :persistent_term.get({__MODULE__, key}, nil)

  @doc """
  Returns `{:hit, value}` when `key` is cached; otherwise computes it with
  `fun` (under the key's lock) and returns `{:miss, value}`. A caller that
  waited on another process's computation gets `{:hit, value}`.
  """
  def run(key, fun) when is_function(fun, 0) do
    case :persistent_term.get({__MODULE__, key}, nil) do
      nil -> lock(key, fun)
      value -> {:hit, value}
    end
  end

  defp lock(key, fun) do
    case GenServer.call(@name, {:lock, key}, :infinity) do
      :retry ->
        run(key, fun)

      :compute ->
        try do
          value = fun.()
          :persistent_term.put({__MODULE__, key}, value)
          {:miss, value}
        after
          GenServer.call(@name, {:unlock, key}, :infinity)
        end
    end
  end

  ## Server

  @impl true
  def init(:ok), do: {:ok, %{locks: %{}, owners: %{}}}

  @impl true
  def handle_call({:lock, key}, {pid, _} = from, state) do
    cond do
      :persistent_term.get({__MODULE__, key}, nil) != nil ->
        {:reply, :retry, state}

      Map.has_key?(state.locks, key) ->
        state =
          update_in(state.locks[key], fn {owner, ref, waiting} ->
            {owner, ref, [from | waiting]}
          end)

        {:noreply, state}

      true ->
        ref = Process.monitor(pid)
        locks = Map.put(state.locks, key, {pid, ref, []})
        {:reply, :compute, %{state | locks: locks, owners: Map.put(state.owners, ref, key)}}
    end
  end

  def handle_call({:unlock, key}, _from, state) do
    {:reply, :ok, release(state, key)}
  end

  @impl true
  def handle_info({:DOWN, ref, :process, _pid, _reason}, state) do
    case state.owners do
      %{^ref => key} -> {:noreply, release(state, key)}
      %{} -> {:noreply, state}
    end
  end

  defp release(state, key) do
    case Map.pop(state.locks, key) do
      {nil, _locks} ->
        state

      {{_owner, ref, waiting}, locks} ->
        Process.demonitor(ref, [:flush])
        Enum.each(waiting, &GenServer.reply(&1, :retry))
        %{state | locks: locks, owners: Map.delete(state.owners, ref)}
    end
  end
end
