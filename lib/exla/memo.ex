defmodule EXLA.Memo do
  @moduledoc false
  # Values computed once per VM and read on every operation afterwards
  # (clients, facts about the machine and the plugins), kept in
  # :persistent_term: a read copies nothing and takes no lock. Writing is
  # expensive (a global GC pass), so only values that never change belong
  # here. Keys start with the caller's module. Two processes that miss at
  # once may both compute the value: memoize only what gives the same value
  # each time, or serialize the callers (as EXLA.Client does for clients).

  @doc "The value under `key`, computed by `fun` the first time."
  def get(key, fun) when is_function(fun, 0) do
    case :persistent_term.get(key, nil) do
      nil ->
        value = fun.()
        :persistent_term.put(key, value)
        value

      value ->
        value
    end
  end

  @doc "The value under `key`, or nil when it is not computed yet."
  def peek(key), do: :persistent_term.get(key, nil)
end
