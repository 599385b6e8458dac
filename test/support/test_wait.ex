defmodule EXLA.TestWait do
  @moduledoc false
  # For what happens soon after a call but not within it (a buffer freed by
  # the NIF's drop thread, a session closed by its owner's exit).

  @doc """
  Calls `fun` every `interval` ms until it returns a truthy value, at most
  `tries` times; returns that value, or the last one.
  """
  def until(fun, tries \\ 100, interval \\ 10) do
    case fun.() do
      result when result not in [nil, false] or tries <= 1 ->
        result

      _ ->
        Process.sleep(interval)
        until(fun, tries - 1, interval)
    end
  end
end
