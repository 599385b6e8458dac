defmodule EXLA.TestScript do
  @moduledoc false
  # Elixir code run in a fresh VM, an operating-system process of its own,
  # for what a process does once: load a plugin (its log levels, XLA_FLAGS,
  # CUDA libraries), or halt; or for what may freeze a VM.

  @doc """
  Runs `code` with `elixir -e` and this VM's code paths. Returns
  `{output, exit_status}`.

  Options: `:erl` (flags for the VM, such as `"+S 1"`), `:kill_after`
  (seconds after which the VM is killed, with SIGKILL: a VM frozen in a
  call that does not yield ignores SIGTERM; the status is then 137), and
  those of `System.cmd/3`.
  """
  def run(code, opts \\ []) do
    {erl, opts} = Keyword.pop(opts, :erl)
    {kill_after, opts} = Keyword.pop(opts, :kill_after)
    paths = Enum.flat_map(:code.get_path(), &["-pa", List.to_string(&1)])
    erl = if erl, do: ["--erl", erl], else: []
    command = [System.find_executable("elixir") | erl ++ paths ++ ["-e", code]]

    command =
      if kill_after,
        do: [System.find_executable("timeout"), "--signal=KILL", "#{kill_after}" | command],
        else: command

    System.cmd(hd(command), tl(command), opts)
  end
end
