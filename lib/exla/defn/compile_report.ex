defmodule EXLA.Defn.CompileReport do
  @moduledoc false
  # What EXLA says once a compilation is done (internal): its debug lines,
  # its two telemetry events and the recompilation check (see "Telemetry"
  # and "Recompilation" in `EXLA`). Only compilations get here: a call
  # served from the cache reports nothing.
  #
  # `[:exla, :compilation]` is EXLA's own event, with EXLA's measurements
  # and exactly `%{key: key}` as metadata, so that handlers written for
  # EXLA match it; everything this EXLA knows beyond that goes with
  # `[:exla, :compilation, :details]`.

  require Logger

  @event [:exla, :compilation]
  @details_event [:exla, :compilation, :details]

  @doc """
  Reports the compilation of `key` for `vars` into `expr` with `opts` (the
  validated compiler options). `timing` has the microseconds of the
  evaluation (`:eval_time`), of what followed it (`:compile_time`) and of
  each stage of the latter (`:stages`, see `EXLA.CompileTimer`);
  `disk_cache` says where the executable came from (see
  `EXLA.CompileCache`).
  """
  def compiled(key, vars, expr, opts, timing, disk_cache) do
    %{eval_time: eval_time, compile_time: compile_time, stages: stages} = timing
    if opts[:debug], do: log(key, opts, compile_time, disk_cache)

    times = %{
      eval_time: eval_time,
      compile_time: compile_time,
      total_time: eval_time + compile_time
    }

    :telemetry.execute(@event, times, %{key: key})

    :telemetry.execute(
      @details_event,
      measurements(times, stages),
      %{key: key, kind: kind(opts), disk_cache: disk_cache, client: opts[:client]}
    )

    # EXLA.Backend's operations are compiled once per static arguments:
    # only functions are checked, and only those kept in the cache.
    if is_function(key) and opts[:cache] != false and opts[:cache_kind] != :bounded do
      EXLA.Defn.Recompilation.compiled(key, vars, expr)
    end

    :ok
  end

  defp log(key, opts, compile_time, disk_cache) do
    log_file(opts, disk_cache)

    Logger.debug(
      "EXLA compilation #{EXLA.SharedTerm.inspect(key)} cache miss in #{ms(compile_time)}ms" <>
        if(disk_cache == :hit, do: " (loaded from the disk cache)", else: "")
    )
  end

  # EXLA's lines for the file of `cache: path`, where no reader of its own
  # said them: EXLA.Defn.CacheFile reads jit's file (which carries a
  # configuration) and speaks for it; a stream's (EXLA.stream/3) is read
  # only by the compile cache.
  defp log_file(opts, disk_cache) do
    with path when is_binary(path) <- opts[:cache],
         nil <- opts[:cache_configuration] do
      case disk_cache do
        :hit -> Logger.debug("EXLA disk cache found at #{inspect(path)}")
        :miss -> Logger.debug("EXLA disk cache not found at #{inspect(path)}")
        _memory_or_off -> :ok
      end
    end
  end

  # EXLA's three measurements, and the stages of :compile_time.
  defp measurements(times, stages) do
    %{lower_time: 0, xla_compile_time: 0, cache_load_time: 0, cache_write_time: 0}
    |> Map.merge(stages)
    |> Map.merge(times)
  end

  defp kind(opts), do: if(opts[:cache_kind] == :bounded, do: :backend, else: :jit)

  defp ms(us), do: Float.round(us / 1000, 1)
end
