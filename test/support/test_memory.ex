defmodule EXLA.TestMemory do
  @moduledoc false
  # The memory of this operating-system process, for tests that check that
  # repeated work leaves it flat (Linux: /proc/self/status).

  @doc "The process's resident memory, in KiB."
  def rss_kb do
    [_, kib] = Regex.run(~r/VmRSS:\s+(\d+) kB/, File.read!("/proc/self/status"))
    String.to_integer(kib)
  end

  @doc """
  Calls `fun` `warm_up` times, then `rounds` times more, and returns how
  much the BEAM's memory (bytes) and the process's resident memory (KiB)
  grew over those rounds, each measured after a garbage collection:
  `{beam_bytes, rss_kb}`.
  """
  def growth(fun, warm_up, rounds) do
    for _ <- 1..warm_up//1, do: fun.()
    :erlang.garbage_collect()
    {beam, rss} = {:erlang.memory(:total), rss_kb()}
    for _ <- 1..rounds//1, do: fun.()
    :erlang.garbage_collect()
    {:erlang.memory(:total) - beam, rss_kb() - rss}
  end
end
