defmodule EXLA.CompileCache do
  @moduledoc """
  The persistent cache of compiled programs: executables kept on disk so
  that a new VM (a test run, a notebook restart, a deploy) loads them
  instead of compiling them again.

  `EXLA.jit/2`, `EXLA.compile/3`, `EXLA.stream/3` and `EXLA.Backend` go
  through it on every compilation that misses the in-memory cache. XLA's
  compile is almost all of a first call (about 99% of it for an MLP
  training step), and loading a cached executable costs a few
  milliseconds, so a VM that finds its programs here starts in a fraction
  of the time (`bench/first_call_bench.exs`). Looking for a program that
  is not there costs about 15 µs (its key and a failed open), against
  20 ms for compiling the smallest program; `EXLA.Backend`'s per-operation
  programs compile faster than `:cache_min_compile_time` and so are
  looked for but not written, except the slow ones (decompositions,
  sorts of large tensors).

  ## Configuration

      config :exla,
        cache_dir: "/var/cache/my_app/exla",
        cache_max_size: 1_073_741_824,
        cache_min_compile_time: 100

    * `:cache_dir` - the directory of the cache, or `false` to turn it
      off. Defaults to the `compiled` folder of EXLA's cache directory
      (`EXLA_CACHE_DIR`, else the user cache directory, usually
      `~/.cache/exla/compiled`, see `EXLA.Plugin.cache_dir/1`).

      The cache is on by default because every new VM would otherwise pay
      for all its compiles again, and a file from the cache is never run
      unless it provably is the program asked for, compiled by the same
      plugin for the same device (see "Safety" below). Turn it off where
      the disk must not be written, or where programs should always be
      compiled afresh.

    * `:cache_max_size` - the most bytes the directory's executables may
      take. When a new one would exceed it, the least recently used ones
      (by the modification time of their files, which a hit refreshes)
      are removed. Defaults to the environment variable
      `EXLA_CACHE_MAX_SIZE` (bytes, or a number followed by `K`, `M`, `G`
      or `T` for KiB, MiB, GiB or TiB: `EXLA_CACHE_MAX_SIZE=512M`), else
      1 GiB.

    * `:cache_min_compile_time` - in milliseconds: programs that compile
      faster than this are not written (as JAX's
      `jax_persistent_cache_min_compile_time_secs`). Defaults to the
      environment variable `EXLA_CACHE_MIN_COMPILE_TIME` (milliseconds),
      else 100: the per-operation programs of `EXLA.Backend` and other tiny
      programs compile in 10 to 50 ms, and writing them all would fill the
      directory with files whose loading saves little. `0` writes every
      program.

  How large it grows: Scholar's test suite (about 950 distinct
  programs, a third of them `EXLA.Backend` operations) wrote 623 files,
  57.6 MB, into an empty directory on a 2-core machine, and a second run
  24 more (programs whose compile time crossed `:cache_min_compile_time`
  this time); a run loads the programs of the run before. On a loaded
  machine compiles take longer, more of them cross the limit and more are
  written (853 files, 56.5 MB, in one such run). The directory grows with
  the distinct programs a machine compiles, up to `:cache_max_size`; past
  it, the programs not used for the longest time go first, so those every
  session asks for stay (a hit refreshes its file's time). A write lists
  the directory only when it may be over the limit (or every 64 writes, to
  see other VMs' files).

  Both limits are read at each write, so the environment variables set
  them without touching the application's configuration
  (`EXLA_CACHE_MAX_SIZE=200M mix test`); an empty value counts as unset,
  and a value that is not a non-negative integer (with a unit, for the
  size) raises `ArgumentError` at the first compilation that needs it.

  The `:cache` option of `EXLA.jit/2` and friends chooses per call:
  `true` (the default) uses the directory above, `false` compiles afresh
  (and keeps nothing, in memory or on disk), and a path (a string) keeps
  the program in that one file, as EXLA 0.9 and later do (see `:cache` in
  `EXLA`): the file is read at every call, used when it holds this very
  program and written (replaced) otherwise, whatever the compile time and
  outside the directory's size cap. A file holds one program, so a
  function called with several argument shapes should use the directory
  instead.

  ## In memory

  Within a VM, a program whose MLIR text is one compiled (or loaded)
  before for the same client, device, replicas and partitions gets that
  executable, with neither a compile nor a look on disk: the jit, stream
  and `EXLA.Backend` caches are keyed by what a program is made from (the
  function, which is new for every closure made anew, the operation and
  its static arguments), and different keys often lower to the same text.
  The executable is the one the compile would give. The last 512 are kept;
  only `cache: true` (the default) uses them.

  ## The key

  A cached executable is found by a SHA-256 of everything that changes
  what the compiler produces:

    * the program's MLIR text (which is all the lowering produced, so it
      covers the function, its argument types and shapes, and the
      options that shape the program, such as `:precision`);
    * the target: the plugin file's sha256 (`EXLA.Plugin.fingerprint/1`)
      and PJRT API version, the platform's name and version, the kind of
      the device, and for the CPU the CPU's feature flags (XLA:CPU
      generates code for the CPU that compiles);
    * the compile options: the device, the numbers of replicas and
      partitions, the partitioner, the client's `:xla_options` and the `XLA_FLAGS` of the
      operating-system process;
    * the version of EXLA and of the file format.

  ## Safety

  Every file is a binary of `EXLA.Executable.serialize/1`: its last 32 bytes are
  a SHA-256 of all the others, checked before anything is decoded, and its
  metadata repeats the key and the target. A file that is damaged,
  truncated, of another format, made for another target or holding another
  key is never given to the plugin: EXLA logs a warning, compiles the
  program and replaces the file.

  Files are written to a temporary name in the same directory and renamed
  into place, which replaces atomically: several VMs compiling the same
  program at once each write a whole file, and a reader sees either none
  or one of them. The checksum protects against damage, not against
  someone who can write to the directory on purpose: keep the directory
  private to the user that runs EXLA.
  """

  require Logger

  alias EXLA.Executable
  alias EXLA.Executable.Serialized
  alias EXLA.CompileCache.{Config, Usage}
  @suffix ".exla"
  # Temporary files older than this are left over by VMs that died while
  # writing, and are removed when the directory is trimmed.
  @stale_tmp_seconds 3600

  @doc """
  The cache directory in use, or `nil` when the cache is off (see
  "Configuration").
  """
  @spec dir() :: Path.t() | nil
  def dir, do: Config.dir()

  @doc false
  # Compiles `program` (an EXLA.MLIR.Program) for `client` with `opts`
  # (those of `EXLA.Executable.compile/3`), or loads it from the cache that
  # `cache` (the `:cache` option) names. Returns `{executable, status}`,
  # where status is `:hit` (loaded from disk), `:miss` (compiled, and
  # looked for on disk first) or `:off` (compiled; no disk cache for this
  # call). The key hashes the program's text, which its shapes and facts
  # are made from: a file with this key has them. A loaded executable keeps
  # the facts it was sealed with and is placed by this VM's policy (see
  # EXLA.Placement).
  #
  # `cache` is `true`, `false`, a file path (`EXLA.stream/3`'s `cache:
  # path`) or `{path, configuration}` (jit's, see EXLA.Defn.CacheFile,
  # which reads the file first and says what it finds): a file is loaded
  # when it holds this very program, and written otherwise, with the
  # configuration; only a file without a reader of its own is warned about
  # here, as the directory's files are.
  def compile(client, %EXLA.MLIR.Program{} = program, opts, cache) do
    case location(cache) do
      nil ->
        {xla_compile(client, program, opts), :off}

      location ->
        key = key(client, program, opts)
        path = entry_path(location, key)

        case EXLA.CompileTimer.measure(:cache_load_time, fn ->
               read(location, client, path, key)
             end) do
          {:ok, executable} ->
            if match?({:dir, _}, location), do: File.touch(path)
            {executable, :hit}

          {:miss, write_always?} ->
            {time, executable} = :timer.tc(fn -> xla_compile(client, program, opts) end)

            if write_always? or match?({:file, _, _}, location) or
                 time >= Config.min_compile_time() * 1000,
               do:
                 EXLA.CompileTimer.measure(:cache_write_time, fn ->
                   write(location, path, executable, key)
                 end)

            {executable, :miss}
        end
    end
  end

  defp xla_compile(client, program, opts) do
    EXLA.CompileTimer.measure(:xla_compile_time, fn ->
      Executable.compile(client, program, opts)
    end)
  end

  defp location(false), do: nil
  defp location(true), do: if(dir = dir(), do: {:dir, dir})
  defp location(path) when is_binary(path), do: {:file, path, nil}
  defp location({path, configuration}) when is_binary(path), do: {:file, path, configuration}

  defp entry_path({:dir, dir}, key), do: Path.join(dir, key <> @suffix)
  defp entry_path({:file, path, _configuration}, _key), do: path

  @doc false
  # The key of `program` compiled for `client` with `opts` (see "The
  # key"), as lowercase hex.
  def key(client, %EXLA.MLIR.Program{text: mlir}, opts) do
    device_id = opts[:device_id] || client.default_device_id

    material = {
      :exla_compile_cache,
      Application.spec(:exla, :vsn),
      EXLA.Executable.Sealed.version(),
      :crypto.hash(:sha256, mlir),
      Serialized.target(client, device_id),
      device_id,
      opts[:num_replicas] || 1,
      opts[:num_partitions] || 1,
      opts[:partitioner] || :gspmd,
      client.xla_options,
      EXLA.NIF.xla_flags_env()
    }

    :sha256
    |> :crypto.hash(:erlang.term_to_binary(material, [:deterministic]))
    |> Base.encode16(case: :lower)
  end

  # {:ok, executable}, or {:miss, write_always?}: a file that was there but
  # could not be used is replaced whatever the compile time. The file of
  # jit's `cache: path` is replaced in any case, and its reader
  # (EXLA.Defn.CacheFile) has reported it. It is used only for the same
  # configuration: one that differs (such as the axis names, which the
  # program does not hold) is compiled and written now.
  defp read({:file, _path, configuration}, client, path, key) when configuration != nil do
    expected = %{cache_key: key, configuration: configuration}

    with {:ok, binary} <- File.read(path),
         {:ok, executable, _metadata} <- Executable.load_binary(client, binary, expected) do
      {:ok, executable}
    else
      _ -> {:miss, true}
    end
  end

  defp read(_dir_or_file, client, path, key) do
    case File.read(path) do
      {:ok, binary} ->
        case Executable.load_binary(client, binary, %{cache_key: key}) do
          {:ok, executable, _metadata} -> {:ok, executable}
          {:error, message} -> ignore(path, message)
        end

      {:error, :enoent} ->
        {:miss, false}

      {:error, reason} ->
        warn_once(path, "could not read #{path}: #{:file.format_error(reason)}")
        {:miss, false}
    end
  end

  defp ignore(path, message) do
    Logger.warning(
      "EXLA's compile cache ignores #{path}: #{message}. The program is compiled " <>
        "again and the file replaced"
    )

    {:miss, true}
  end

  defp write({:dir, dir}, path, executable, key) do
    with binary when is_binary(binary) <- seal(executable, %{cache_key: key}, path) do
      max_size = Config.max_size()

      if byte_size(binary) <= max_size do
        write_atomically(path, binary)

        if Usage.written?(dir, byte_size(binary), max_size),
          do: Usage.scanned(dir, trim(dir, max_size, path))
      end
    end

    :ok
  end

  defp write({:file, path, configuration}, path, executable, key),
    do: write_file(path, executable, key, configuration)

  @doc false
  # Writes the file of `cache: path`: `executable` with its key and the
  # configuration it was compiled for (see EXLA.Defn.CacheFile).
  def write_file(path, executable, key, configuration) do
    metadata = %{cache_key: key, configuration: configuration}

    with binary when is_binary(binary) <- seal(executable, metadata, path),
         do: write_atomically(path, binary)

    :ok
  end

  # The sealed executable, or nil when the plugin cannot serialize it (the
  # program runs all the same).
  defp seal(executable, metadata, path) do
    Serialized.seal(executable, metadata)
  rescue
    e in [ArgumentError, RuntimeError] ->
      warn_once(path, "could not serialize a program for #{path}: #{Exception.message(e)}")
      nil
  end

  defp write_atomically(path, binary) do
    with {:error, reason} <- EXLA.AtomicFile.write(path, binary) do
      dir = Path.dirname(path)
      warn_once(dir, "could not write to #{dir}: #{:file.format_error(reason)}")
    end
  end

  @doc """
  Removes the least recently used executables of the cache directory `dir`
  until they take at most `max_size` bytes, and the temporary files that
  VMs which died while writing left there. Returns the bytes the
  executables left there take.

  EXLA trims the directory to `:cache_max_size` whenever it writes to it;
  call this to shrink a cache further, for example before packing it into
  a release or an image:

      EXLA.CompileCache.trim(EXLA.CompileCache.dir(), 100_000_000)
  """
  @spec trim(Path.t(), non_neg_integer()) :: non_neg_integer()
  def trim(dir, max_size), do: trim(dir, max_size, nil)

  # File times have a resolution of one second, so the executable written
  # last can tie with older ones: `newest` (the one just written) goes last
  # whatever its time says.
  defp trim(dir, max_size, newest) do
    now = System.os_time(:second)

    entries =
      for name <- list(dir),
          path = Path.join(dir, name),
          {:ok, %{type: :regular} = stat} <- [File.stat(path, time: :posix)],
          entry = classify(name, path, stat, now),
          entry != nil,
          do: entry

    total = entries |> Enum.map(fn {_mtime, size, _path} -> size end) |> Enum.sum()

    entries
    |> Enum.sort_by(fn {mtime, size, path} -> {path == newest, mtime, size, path} end)
    |> Enum.reduce_while(total, fn {_mtime, size, path}, total ->
      if total > max_size do
        File.rm(path)
        {:cont, total - size}
      else
        {:halt, total}
      end
    end)
  end

  defp list(dir) do
    case File.ls(dir) do
      {:ok, names} -> names
      {:error, _} -> []
    end
  end

  # {mtime, size, path} of an executable; stale temporary files are removed.
  defp classify(name, path, stat, now) do
    cond do
      String.starts_with?(name, EXLA.AtomicFile.tmp_prefix()) ->
        if now - stat.mtime > @stale_tmp_seconds, do: File.rm(path)
        nil

      String.ends_with?(name, @suffix) ->
        {stat.mtime, stat.size, path}

      true ->
        nil
    end
  end

  # Problems with the directory itself would repeat at every compile: they
  # are logged once per VM.
  defp warn_once(place, message) do
    key = {__MODULE__, :warned, place}

    unless :persistent_term.get(key, false) do
      :persistent_term.put(key, true)
      Logger.warning("EXLA's compile cache " <> message <> "; programs are compiled as usual")
    end

    :ok
  end
end
