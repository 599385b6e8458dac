defmodule EXLA.CompileCache.Config do
  @moduledoc false
  # The configuration of the compile cache (see "Configuration" in
  # `EXLA.CompileCache`): its directory, and the directory's limits, each
  # the application environment's value, else its environment variable's,
  # else the default. All are read where they are used (the limits at
  # every write), so a change applies to the next use.
  import Bitwise, only: [<<<: 2]

  @default_max_size 1 <<< 30
  @default_min_compile_time 100

  @units %{"" => 1, "K" => 1 <<< 10, "M" => 1 <<< 20, "G" => 1 <<< 30, "T" => 1 <<< 40}

  @doc "The cache directory, or `nil` when the cache is off."
  def dir do
    case Application.get_env(:exla, :cache_dir) do
      nil -> EXLA.CacheDir.folder(:compiled)
      false -> nil
      dir when is_binary(dir) and dir != "" -> dir
      other -> raise ArgumentError, bad_config(:cache_dir, "a path or false", other)
    end
  end

  @doc "The most bytes the directory's executables may take."
  def max_size do
    case Application.fetch_env(:exla, :cache_max_size) do
      {:ok, size} when is_integer(size) and size >= 0 ->
        size

      {:ok, other} ->
        raise ArgumentError, bad_config(:cache_max_size, "a number of bytes", other)

      :error ->
        EXLA.Env.parse!(
          "EXLA_CACHE_MAX_SIZE",
          @default_max_size,
          &parse_size/1,
          "a number of bytes"
        )
    end
  end

  @doc "Programs that compile faster than this (milliseconds) are not written."
  def min_compile_time do
    case Application.fetch_env(:exla, :cache_min_compile_time) do
      {:ok, ms} when is_integer(ms) and ms >= 0 ->
        ms

      {:ok, other} ->
        raise ArgumentError,
              bad_config(:cache_min_compile_time, "milliseconds (integer)", other)

      :error ->
        EXLA.Env.parse!(
          "EXLA_CACHE_MIN_COMPILE_TIME",
          @default_min_compile_time,
          &parse_ms/1,
          "milliseconds"
        )
    end
  end

  # Bytes, or a number of KiB, MiB, GiB or TiB ("512M", "2G").
  defp parse_size(value) do
    with {number, unit} when number >= 0 <- Integer.parse(value),
         {:ok, factor} <- Map.fetch(@units, String.upcase(unit)) do
      {:ok, number * factor}
    else
      _ -> :error
    end
  end

  defp parse_ms(value) do
    case Integer.parse(value) do
      {ms, ""} when ms >= 0 -> {:ok, ms}
      _ -> :error
    end
  end

  defp bad_config(key, expected, value) do
    "expected #{inspect(key)} of :exla to be #{expected}, got: #{inspect(value)}"
  end
end
