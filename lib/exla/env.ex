defmodule EXLA.Env do
  @moduledoc false
  # The environment variables EXLA reads, read one way: a variable set to
  # the empty string counts as unset (`EXLA_CACHE_DIR= mix test` means the
  # default), and a value that cannot be parsed raises `ArgumentError`
  # naming the variable and what it expects, instead of quietly giving the
  # default.

  @doc "The value of the environment variable `name`, or nil when unset or empty."
  def get(name) do
    case System.get_env(name) do
      nil -> nil
      "" -> nil
      value -> value
    end
  end

  @doc """
  The value of `name` given to `parse` (trimmed), or `default` when the
  variable is unset or empty. `parse` returns `{:ok, value}` or `:error`;
  on `:error` this raises `ArgumentError`, saying that the variable was
  expected to be `expected`.
  """
  def parse!(name, default, parse, expected) do
    with value when is_binary(value) <- get(name),
         {:ok, parsed} <- parse.(String.trim(value)) do
      parsed
    else
      nil ->
        default

      :error ->
        raise ArgumentError,
              "expected the environment variable #{name} to be #{expected}, " <>
                "got: #{inspect(System.get_env(name))}"
    end
  end
end
