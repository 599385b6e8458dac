defmodule EXLA.CompileTimer do
  @moduledoc false
  # The stopwatch of one compilation: splits its cost into the stages that
  # `[:exla, :compilation]` reports (see "Telemetry" in `EXLA`).
  #
  # `collect/1` runs a compilation and returns the microseconds each stage
  # took; the stages are timed where they happen (the lowering, the
  # plugin's compile, the disk cache) with `measure/2`, which adds to the
  # collection of the calling process. A compilation runs in one process
  # (the caller, or the process that `EXLA.LockedCache` lets compute),
  # so the stages need not be threaded through every function between;
  # outside a collection `measure/2` only runs its function.

  @key {__MODULE__, :times}

  @doc """
  Runs `fun` and returns `{result, times}`, where `times` maps each stage
  measured inside it to its microseconds. A collection inside another one
  (a program compiled while another compiles) keeps its own times.
  """
  def collect(fun) do
    previous = Process.put(@key, %{})

    try do
      result = fun.()
      {result, Process.get(@key)}
    after
      if previous, do: Process.put(@key, previous), else: Process.delete(@key)
    end
  end

  @doc """
  Runs `fun`, adding its duration to `stage` in the current collection.
  """
  def measure(stage, fun) do
    start = System.monotonic_time()
    result = fun.()
    add(stage, System.monotonic_time() - start)
    result
  end

  defp add(stage, native) do
    case Process.get(@key) do
      nil ->
        :ok

      times ->
        micros = System.convert_time_unit(native, :native, :microsecond)
        Process.put(@key, Map.update(times, stage, micros, &(&1 + micros)))
    end
  end
end
