defmodule EXLA.TestScript do
  @moduledoc false
  # Elixir code run in a fresh VM, an operating-system process of its own,
  # for what a process does once: load a plugin (its log levels, XLA_FLAGS,
  # CUDA libraries), or halt.

  @doc """
  Runs `code` with `elixir -e` and this VM's code paths; `opts` are those
  of `System.cmd/3`. Returns `{output, exit_status}`.
  """
  def run(code, opts \\ []) do
    paths = Enum.flat_map(:code.get_path(), &["-pa", List.to_string(&1)])
    System.cmd(System.find_executable("elixir"), paths ++ ["-e", code], opts)
  end
end
