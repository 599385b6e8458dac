defmodule EXLA.Executable.Sealed do
  @moduledoc false

  # The sealed form of a serialized executable (internal): the plugin's
  # executable blob with EXLA's metadata about it, and a SHA-256 checksum of
  # all of it.
  #
  # A plugin loads whatever bytes it is given: a blob with one flipped byte
  # can load and run native garbage. `open/1` verifies the checksum before
  # anything is decoded, so a blob damaged on disk or on the wire raises
  # instead. The checksum protects against damage, not against someone who
  # rewrites the blob on purpose (they can recompute it).
  #
  # Layout (big-endian sizes):
  #
  #     "EXLA_EXE"           8 bytes, the magic
  #     version              16 bits
  #     metadata size        32 bits
  #     metadata             :erlang.term_to_binary/1 of a map
  #     blob size            64 bits
  #     blob                 the plugin's serialized executable
  #     checksum             SHA-256 of every byte above
  #
  # The version changes whenever the layout or the metadata's meaning does;
  # other versions are refused. Version 3 records the executable's whole
  # target (see `EXLA.Executable.load_binary/3`) where version 2 had the plugin's
  # hash alone; version 4 records the program's `EXLA.MLIR.Facts` where
  # version 3 had the placement decided from them.

  @magic "EXLA_EXE"
  @version 4
  @checksum_bytes 32
  # magic, version, the two sizes and the checksum.
  @overhead byte_size(@magic) + 2 + 4 + 8 + @checksum_bytes

  @doc "The version `seal/2` writes."
  def version, do: @version

  @doc """
  The metadata of the sealed executable in the file at `path`, read without
  its blob and without checking the checksum: for comparing it with what
  is expected before the whole file is opened (`open/1`), never for
  loading. Returns `{:ok, metadata}`, `{:error, :other_version}` for a
  sealed executable of another format version, `{:error, :unknown}` when
  the file is not one (or its metadata names atoms this VM has never
  made, so it cannot describe this VM's program), or `{:error, posix}`.
  """
  def peek_metadata(path) do
    with {:ok, file} <- File.open(path, [:read, :binary, :raw]) do
      try do
        peek(file)
      after
        File.close(file)
      end
    end
  end

  defp peek(file) do
    header = byte_size(@magic) + 2 + 4

    with {:ok, <<@magic, version::16, meta_size::32>>} <- :file.read(file, header),
         true <- version == @version or {:error, :other_version},
         {:ok, <<meta::binary-size(meta_size)>>} <- :file.read(file, meta_size),
         %{} = metadata <- :erlang.binary_to_term(meta, [:safe]) do
      {:ok, metadata}
    else
      {:error, reason} when is_atom(reason) -> {:error, reason}
      _ -> {:error, :unknown}
    end
  rescue
    ArgumentError -> {:error, :unknown}
  end

  @doc """
  Seals `blob` with `metadata` (a map).
  """
  def seal(metadata, blob) when is_map(metadata) and is_binary(blob) do
    meta = :erlang.term_to_binary(metadata)

    body = [
      @magic,
      <<@version::16, byte_size(meta)::32>>,
      meta,
      <<byte_size(blob)::64>>,
      blob
    ]

    IO.iodata_to_binary([body, :crypto.hash(:sha256, body)])
  end

  @doc """
  Opens a sealed binary: returns `{:ok, metadata, blob}`, or
  `{:error, :damaged, message}` when it does not match its checksum and
  `{:error, :invalid, message}` when it is not one or is of another
  version.

  It logs nothing: whoever opens the binary knows what it is and where it
  came from, and reports it (see `EXLA.Executable.deserialize/2`).
  """
  def open(<<@magic, version::16, _::binary>> = sealed) when byte_size(sealed) >= @overhead do
    body_size = byte_size(sealed) - @checksum_bytes
    <<body::binary-size(body_size), checksum::binary>> = sealed

    cond do
      version != @version ->
        {:error, :invalid,
         "the executable was serialized in format #{version}, but this EXLA reads " <>
           "format #{@version}; compile it again"}

      :crypto.hash(:sha256, body) != checksum ->
        {:error, :damaged,
         "the serialized executable is damaged (its checksum does not match); " <>
           "nothing was loaded"}

      true ->
        decode(body)
    end
  end

  def open(sealed) when is_binary(sealed) do
    {:error, :invalid, "not an executable serialized by EXLA.Executable.serialize/1"}
  end

  # The checksum matched, so the sizes are the ones seal/2 wrote. The
  # metadata is decoded without `:safe`: it names atoms (of EXLA.Shape, of
  # the cache) that a fresh VM may not have created yet, and a checksummed
  # binary only carries the terms seal/2 was given.
  defp decode(
         <<@magic, @version::16, meta_size::32, meta::binary-size(meta_size), blob_size::64,
           blob::binary-size(blob_size)>>
       ) do
    case :erlang.binary_to_term(meta) do
      %{} = metadata -> {:ok, metadata, blob}
      _other -> malformed()
    end
  rescue
    ArgumentError -> malformed()
  end

  # Only a binary sealed on purpose with a wrong layout gets here.
  defp decode(_body), do: malformed()

  defp malformed,
    do: {:error, :invalid, "the serialized executable is malformed; nothing was loaded"}
end
