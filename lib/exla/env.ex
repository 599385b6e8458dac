defmodule EXLA.Env do
  @moduledoc false
  # The environment variables of the VM that EXLA reads (its own EXLA_*,
  # and PYTHONPATH, PATH, TPU_LIBRARY_PATH... where it looks for plugins),
  # read one way: a variable set to the empty string counts as unset
  # (`EXLA_CACHE_DIR= mix test` means the default), and a value that cannot
  # be parsed raises `ArgumentError` naming the variable and what it
  # expects, instead of quietly giving the default.
  #
  # Two readings go elsewhere, on purpose: XLA_FLAGS is read by the NIF
  # from the operating-system process's environment (`EXLA.NIF.xla_flags_env/0`),
  # which is what plugins read and which `System.put_env/2` does not
  # change; and `EXLA.NativeLog.plugin_env/2` takes the plugins' log
  # variables (TF_CPP_*) as the whole environment's map, empty values
  # counting as unset there too.

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
