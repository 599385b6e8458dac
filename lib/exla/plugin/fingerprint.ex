defmodule EXLA.Plugin.Fingerprint do
  @moduledoc false
  # The SHA-256 of a plugin file, which tells serialized and cached
  # executables which plugin made them (see `EXLA.Plugin.fingerprint/1`).
  #
  # Plugins are large (the CPU plugin is 259 MB): hashing one takes about a
  # second, which a VM that loads its programs from the compile cache must
  # not pay at every start. So the hash is remembered in a small file of
  # EXLA's cache directory (`fingerprints/`), named after the plugin's path
  # and what `stat` says of it (device, inode, size, modification and
  # change times). The file also holds the hash of the plugin's first and
  # last 64 KiB, checked at every use: a plugin replaced in place within the
  # same second by a file of the same size still differs there (its ELF
  # headers and build notes are at the start). Within a VM the answer is
  # kept in `:persistent_term`.

  import Bitwise

  # Bytes hashed at each end of the file to check a remembered hash: the
  # ELF header, program headers and notes are in the first few KiB, and
  # hashing stays well under a millisecond.
  @sample_bytes 64 <<< 10

  @doc "The SHA-256 (lowercase hex) of the plugin file at `path`."
  def get(path) do
    path = Path.expand(path)
    EXLA.Memo.get({__MODULE__, path}, fn -> compute(path, EXLA.Plugin.cache_dir()) end)
  end

  @doc """
  Records that the file at `path` has SHA-256 `sha256` (known by whoever
  just checked it, such as the installer), so no VM needs to compute it.
  The memo goes to the `fingerprints` folder of `cache_dir`, which `get/1`
  reads when it is EXLA's cache directory.
  """
  def remember(path, sha256, cache_dir \\ EXLA.Plugin.cache_dir()) do
    path = Path.expand(path)

    with {:ok, memo} <- memo_path(path, cache_dir),
         {:ok, sample} <- sample(path) do
      # A memo that cannot be written only costs the next VM a full hash.
      EXLA.AtomicFile.write(memo, sample <> "\n" <> sha256 <> "\n")
    end

    :ok
  end

  @doc """
  The SHA-256 of the file at `path`: the one remembered in `cache_dir`
  when it still applies, else computed (and remembered).
  """
  def compute(path, cache_dir) do
    with {:ok, memo} <- memo_path(path, cache_dir),
         {:ok, content} <- File.read(memo),
         [sample, sha256] <- String.split(content, "\n", trim: true),
         {:ok, ^sample} <- sample(path) do
      sha256
    else
      _ ->
        sha256 = EXLA.Plugin.Install.sha256_file(path)
        remember(path, sha256, cache_dir)
        sha256
    end
  end

  # The memo of a plugin file is named after everything stat says changes
  # when the file does.
  defp memo_path(path, cache_dir) do
    case File.stat(path, time: :posix) do
      {:ok, stat} ->
        identity = {path, stat.major_device, stat.inode, stat.size, stat.mtime, stat.ctime}
        name = :crypto.hash(:sha256, :erlang.term_to_binary(identity))
        dir = EXLA.CacheDir.folder(:fingerprints, cache_dir: cache_dir)
        {:ok, Path.join(dir, Base.encode16(name, case: :lower) <> ".sha256")}

      {:error, _} = error ->
        error
    end
  end

  # The hash of the first and last @sample_bytes of the file.
  defp sample(path) do
    with {:ok, file} <- :file.open(path, [:read, :raw, :binary]) do
      try do
        {:ok, size} = :file.position(file, :eof)
        head = pread(file, 0, min(size, @sample_bytes))
        tail = pread(file, max(size - @sample_bytes, 0), min(size, @sample_bytes))
        hash = :crypto.hash(:sha256, [<<size::64>>, head, tail])
        {:ok, Base.encode16(hash, case: :lower)}
      after
        :file.close(file)
      end
    end
  end

  defp pread(file, position, bytes) do
    case :file.pread(file, position, bytes) do
      {:ok, data} -> data
      :eof -> ""
    end
  end
end
