defmodule EXLA.LockedCache do
  @moduledoc false
  # The in-memory cache of compiled programs (those of the compiler, of
  # EXLA.Backend, and this node's copies of other nodes' executables, see
  # EXLA.Remote), where each value is computed exactly once: the first caller of a missing key computes it, the callers that
  # arrive meanwhile wait for it, and they are all told to look again once
  # the value is stored (or once the computing process fails or dies, in
  # which case one of them computes). This process is the only writer.
  #
  # Where a value lives decides what a hit costs. A `:persistent_term`
  # read copies nothing, but each write copies the table's index, and
  # erasing a term makes every process scan its heap; an ETS read copies
  # the entry (for a cached `EXLA.Defn.Compiled`, about 270 words, that
  # adds a fifth to the time of a tiny operation on EXLA.Backend), but
  # entries come and go freely. So:
  #
  #   * `:permanent` entries (the programs of `EXLA.jit/2`, `EXLA.compile/3`
  #     and `EXLA.stream/3`) are written once to `:persistent_term` and
  #     never removed;
  #
  #   * `:bounded` entries (`EXLA.Backend`'s programs, one per operation
  #     and shape, and copies of other nodes' executables) are at most `capacity/0`. The first quarter of them is
  #     pinned like permanent entries, which serves the operations a
  #     program repeats without a copy; the others live in an ETS table
  #     (read concurrency on), where storing one more past the capacity
  #     evicts the least recently used one, approximately (the CLOCK
  #     algorithm: a hit sets the entry's bit in an atomics array, and
  #     eviction walks the entries in insertion order, sparing once those
  #     whose bit is set). Eviction runs after the caller got its value,
  #     and an evicted program is freed once no running call holds it.
  #
  # So `:persistent_term` holds one term per jitted program plus at most a
  # quarter of the capacity, and never has a term replaced or erased.
  use GenServer

  @name __MODULE__
  @table __MODULE__

  @default_capacity 1024

  @doc """
  How many `:bounded` entries are kept: the application environment's
  `:backend_cache_size` (read when the cache starts), by default
  #{@default_capacity}.
  """
  def capacity do
    case Application.get_env(:exla, :backend_cache_size, @default_capacity) do
      size when is_integer(size) and size > 0 ->
        size

      other ->
        raise ArgumentError,
              "expected :backend_cache_size of :exla to be a positive integer, got: " <>
                inspect(other)
    end
  end

  @doc "Starts the cache process, which owns the table of bounded entries."
  def start_link(_opts \\ []) do
    GenServer.start_link(__MODULE__, capacity(), name: @name)
  end

  @doc "Returns the value cached for `key` (of `kind`) or `nil`."
  def get(key, kind \\ :permanent)

  def get(key, :permanent), do: :persistent_term.get({__MODULE__, key}, nil)

  def get(key, :bounded) do
    :persistent_term.get({__MODULE__, :pinned, key}, nil) || lookup(key)
  end

  defp lookup(key) do
    case :ets.lookup(@table, key) do
      [{_key, value, clock, slot}] ->
        # Reading first keeps hits on a hot entry from bouncing its line.
        if :atomics.get(clock, slot) == 0, do: :atomics.put(clock, slot, 1)
        value

      [] ->
        nil
    end
  rescue
    # The table is gone while the process restarts: a miss.
    ArgumentError -> nil
  end

  @doc """
  Returns `{:hit, value}` when `key` is cached; otherwise computes it with
  `fun` (under the key's lock), stores it as an entry of `kind` and returns
  `{:miss, value}`. A caller that waited on another process's computation
  gets `{:hit, value}`.

  Keys and values are copied as trees into the table, the persistent term
  and this process's messages, so both must be bounded (see
  `EXLA.SharedTerm`): callers give keys made by `EXLA.SharedTerm.key/1`
  (or their own bounded terms), and a value whose tree is larger than
  `EXLA.SharedTerm.budget/0` words (a program that holds a hook's function
  which captured a large or shared term) is not stored: it is returned as
  `{:off, value}`, and the next caller computes it again.
  """
  def run(key, fun, kind \\ :permanent) when is_function(fun, 0) do
    case get(key, kind) do
      nil -> lock(key, fun, kind)
      value -> {:hit, value}
    end
  end

  @doc """
  The one path from a program's cache key to the program: with `cache`
  (the `:cache` option) on, `run/3` under `key` as an entry of `kind`;
  with `cache: false`, `{:off, value}` computed by `fun` and not stored.
  """
  def fetch_or_build(false, _key, _kind, fun) when is_function(fun, 0), do: {:off, fun.()}
  def fetch_or_build(_cache, key, kind, fun), do: run(key, fun, kind)

  defp lock(key, fun, kind) do
    case GenServer.call(@name, {:lock, key, kind}, :infinity) do
      :retry ->
        run(key, fun, kind)

      :compute ->
        value = compute(key, fun)

        if EXLA.SharedTerm.bounded?(value) do
          :ok = GenServer.call(@name, {:store, key, kind, value}, :infinity)
          {:miss, value}
        else
          :ok = GenServer.call(@name, {:unlock, key}, :infinity)
          {:off, value}
        end
    end
  end

  # On failure the lock is released (by the DOWN message when the process
  # dies instead).
  defp compute(key, fun) do
    fun.()
  catch
    kind, reason ->
      GenServer.call(@name, {:unlock, key}, :infinity)
      :erlang.raise(kind, reason, __STACKTRACE__)
  end

  ## Server

  @impl true
  def init(capacity) do
    :ets.new(@table, [:named_table, :set, :protected, read_concurrency: true])
    evictable = capacity - div(capacity, 4)

    state = %{
      locks: %{},
      owners: %{},
      pinned: pinned_count(),
      pinned_limit: div(capacity, 4),
      evictable: 0,
      evictable_limit: evictable,
      # One slot more than the limit: a new entry goes in before the
      # eviction it causes (and joins `order` after it).
      clock: :atomics.new(evictable + 1, signed: false),
      free: Enum.to_list(1..(evictable + 1)),
      # {key, slot} of the evictable entries, oldest first
      order: :queue.new()
    }

    {:ok, state}
  end

  # Pinned entries outlive this process: count those of a previous one.
  defp pinned_count do
    Enum.count(:persistent_term.get(), &match?({{__MODULE__, :pinned, _}, _}, &1))
  end

  @impl true
  def handle_call({:lock, key, kind}, {pid, _} = from, state) do
    cond do
      stored?(key, kind) ->
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

  def handle_call({:store, key, kind, value}, from, state) do
    {state, entry} = store(state, key, kind, value)
    state = release(state, key)
    # Freeing an evicted executable takes a while: nobody waits for it.
    GenServer.reply(from, :ok)
    state = trim(state)
    {:noreply, if(entry, do: %{state | order: :queue.in(entry, state.order)}, else: state)}
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

  defp stored?(key, kind), do: get(key, kind) != nil

  # Returns the state and the {key, slot} of a new evictable entry, which
  # joins the eviction order once the eviction it causes is done.
  defp store(state, key, :permanent, value) do
    :persistent_term.put({__MODULE__, key}, value)
    {state, nil}
  end

  defp store(%{pinned: pinned, pinned_limit: limit} = state, key, :bounded, value)
       when pinned < limit do
    :persistent_term.put({__MODULE__, :pinned, key}, value)
    {%{state | pinned: pinned + 1}, nil}
  end

  defp store(state, key, :bounded, value) do
    [slot | free] = state.free
    :atomics.put(state.clock, slot, 0)
    true = :ets.insert_new(@table, {key, value, state.clock, slot})
    {%{state | free: free, evictable: state.evictable + 1}, {key, slot}}
  end

  defp trim(%{evictable: count, evictable_limit: limit} = state) when count > limit,
    do: evict(state)

  defp trim(state), do: state

  # Evicts the oldest entry whose bit is clear, clearing the bits of the
  # older ones and moving them to the back (their second chance).
  defp evict(state) do
    {{:value, {key, slot} = entry}, order} = :queue.out(state.order)

    if :atomics.exchange(state.clock, slot, 0) == 1 do
      evict(%{state | order: :queue.in(entry, order)})
    else
      :ets.delete(@table, key)
      %{state | order: order, free: [slot | state.free], evictable: state.evictable - 1}
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
