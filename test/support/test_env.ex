defmodule EXLA.TestEnv do
  @moduledoc false
  # Operating-system environment variables for the length of a function.

  @doc """
  Runs `fun` with the variable `name` set to `value` (removed when `value`
  is nil), and puts back what was there before.
  """
  def with_env(name, value, fun) do
    old = System.get_env(name)
    if value, do: System.put_env(name, value), else: System.delete_env(name)

    try do
      fun.()
    after
      if old, do: System.put_env(name, old), else: System.delete_env(name)
    end
  end

  @doc "Runs `fun` with each `{name, value}` of `vars` set as `with_env/3` does."
  def with_envs(vars, fun) do
    Enum.reduce(vars, fun, fn {name, value}, inner -> fn -> with_env(name, value, inner) end end).()
  end
end
