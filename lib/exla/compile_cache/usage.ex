defmodule EXLA.CompileCache.Usage do
  @moduledoc false
  # What this VM knows of the bytes in a cache directory, so that a write
  # lists and stats the whole directory (`EXLA.CompileCache.trim/2`) only
  # when the directory may be over its size limit: a suite that writes
  # hundreds of programs into a directory of a thousand files otherwise
  # stats every file at each write.
  #
  # Per directory, two counters: the bytes found at the last scan plus
  # those written since, and the writes since that scan. Other VMs may
  # write to the same directory, which this VM does not see: it scans again
  # after `@rescan_every` writes whatever its estimate, so the directory
  # exceeds its limit by at most what the others wrote meanwhile.

  @rescan_every 64

  @doc """
  Counts a write of `bytes` into `dir`: whether `dir` must be scanned now
  (never scanned by this VM, possibly over `max_size`, or due).
  """
  def written?(dir, bytes, max_size) do
    case counters(dir) do
      nil ->
        true

      counters ->
        :counters.add(counters, 1, bytes)
        :counters.add(counters, 2, 1)
        :counters.get(counters, 1) > max_size or :counters.get(counters, 2) >= @rescan_every
    end
  end

  @doc "Records that a scan of `dir` left `total` bytes in it."
  def scanned(dir, total) do
    counters = counters(dir) || create(dir)
    :counters.put(counters, 1, total)
    :counters.put(counters, 2, 0)
    :ok
  end

  # The first scans of a directory may finish at once in several
  # processes: the lock makes them share one set of counters, so that no
  # scan's record lands in a set that is then dropped.
  defp create(dir) do
    :global.trans(
      {key(dir), self()},
      fn -> EXLA.Memo.get(key(dir), fn -> :counters.new(2, [:write_concurrency]) end) end,
      [node()]
    )
  end

  defp counters(dir), do: EXLA.Memo.peek(key(dir))
  defp key(dir), do: {__MODULE__, dir}
end
