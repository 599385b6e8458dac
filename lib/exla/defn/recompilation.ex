defmodule EXLA.Defn.Recompilation do
  @moduledoc false
  # The `:check_recompilation` setting (see "Recompilation" in `EXLA`,
  # internal): counts the compilations of each function for the same
  # argument and result shapes, and warns once when a count reaches the
  # setting.
  #
  # A function is the same across closures made anew (each is a new cache
  # key, and so a new compilation) when it has the same code and captures
  # the same values, tensors counting by type and shape only: a closure
  # that captures a different tensor at every call is one function
  # compiled again and again, which is what the warning is for. Nothing is
  # counted unless the setting is an integer.

  require Logger

  @table __MODULE__

  @doc """
  Creates the table of counts; its owner is the calling process (EXLA's
  application start, so the table lives as long as the application).
  """
  def create_table do
    :ets.new(@table, [:named_table, :public, :set, write_concurrency: true])
    :ok
  end

  # The `:check_recompilation` setting: a positive integer, or `:infinity`
  # (the default) for no check. Raises `ArgumentError` for other values.
  defp threshold do
    case Application.get_env(:exla, :check_recompilation, :infinity) do
      :infinity ->
        :infinity

      count when is_integer(count) and count > 0 ->
        count

      other ->
        raise ArgumentError,
              "expected :check_recompilation of :exla to be a positive integer or " <>
                ":infinity, got: #{inspect(other)}"
    end
  end

  @doc """
  Counts a compilation of the function `key` for `vars` (its parameters)
  into `expr`, and warns when it makes the count reach the threshold.
  """
  def compiled(key, vars, expr) when is_function(key) do
    case threshold() do
      :infinity -> :ok
      threshold -> count(key, vars, expr, threshold)
    end
  end

  defp count(key, vars, expr, threshold) do
    if :ets.whereis(@table) != :undefined do
      shapes = &EXLA.Defn.Compilation.vars_key/1
      counter = digest({key, shapes.(vars), shapes.([expr])})
      count = :ets.update_counter(@table, counter, 1, {counter, 0})
      if count == threshold, do: warn(key, count)
    end

    :ok
  end

  # The code of the function and what it captures, tensors by type and
  # shape and functions by their own code and captures, as a digest: what
  # a function captures may be large (a closure made in IEx or Livebook
  # captures every binding) or share subterms (see EXLA.SharedTerm).
  defp digest(counter), do: EXLA.SharedTerm.digest(counter, tensors: :by_shape)

  # EXLA 0.13.1's words.
  defp warn(key, count) do
    Logger.warning(
      "EXLA has compiled #{inspect(key)} #{count} times with the same input shapes. " <>
        "This typically means tensor values are being captured inside a closure passed " <>
        "to defn, jit, or value_and_grad. Each distinct captured value forces a full " <>
        "recompilation. Pass changing tensors as explicit function arguments instead."
    )
  end
end
