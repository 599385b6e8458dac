defmodule EXLA.Defn.CacheFile do
  @moduledoc false
  # The `cache: path` option of EXLA.jit/2 and EXLA.compile/3, as EXLA 0.9
  # and later behave (internal). Every call with a path reads the file
  # first, before any cache in memory, and says what it finds in EXLA's
  # words:
  #
  #   * no file: "EXLA disk cache not found at PATH" (debug);
  #   * a file for this configuration: "EXLA disk cache found at PATH"
  #     (debug), and the program is the file's;
  #   * a file for another configuration: EXLA's warning "EXLA disk cache
  #     does not match configuration." with the differing entries
  #     ("Expected: ...", "Found: ..."), and the file is replaced;
  #   * a file of another format version: EXLA's warning "Discarding EXLA
  #     disk cache at PATH because it is for an older EXLA version", and
  #     the file is replaced.
  #
  # The configuration is EXLA's: the client's name, the arguments' types,
  # shapes, names and vectorized axes, `:lazy_transfers`, the names of the
  # hooks and the other options given. Unlike EXLA, a file whose
  # configuration matches but which holds another program (another
  # function given the same path, a function edited since, or a program
  # compiled for another plugin or CPU) is not run: EXLA warns, compiles
  # this one and replaces the file. The file is an `EXLA.Executable.Sealed`
  # executable whose metadata holds its configuration and the compile
  # cache's key of its program (see EXLA.CompileCache).

  require Logger

  alias EXLA.Defn.Compiled

  @doc """
  EXLA's configuration of a function compiled for `vars` with `opts`
  (the options given, before their defaults are filled in) on `client`
  (a name).
  """
  def configuration(vars, opts, client) do
    {given, options} = Keyword.split(opts, [:hooks, :lazy_transfers])
    options = Keyword.drop(options, [:cache, :debug, :client, :cache_kind])

    %{
      client: client,
      args: EXLA.Defn.Compilation.vars_key(vars),
      lazy_transfers: Keyword.get(given, :lazy_transfers, :opt_in),
      hooks: given |> Keyword.get(:hooks, %{}) |> Map.keys(),
      # the user's: compared at each call and written, at a bounded cost
      options: EXLA.SharedTerm.key(options)
    }
  end

  @doc """
  Reads `path` for `configuration`, logging what it finds (`debug?` for
  the debug lines), then gets the compiled program from `fetch` (a
  function returning `{:hit | :miss | :off, compiled}`, from the cache in
  memory or compiled, which loads the file's executable when it holds this
  program). Writes the file unless it holds this program already.
  """
  def through(path, configuration, debug?, fetch) do
    found = read(path, configuration, debug?)
    {hit_or_miss, %Compiled{program_key: program_key} = compiled} = fetch.()

    case found do
      {:found, ^program_key} ->
        compiled

      found ->
        if match?({:found, _}, found), do: warn_other_program(path)
        if hit_or_miss == :hit and debug?, do: EXLA.Defn.Call.log_hits(compiled.name, 0)
        # A program compiled just now wrote the file already.
        if hit_or_miss == :hit, do: write(path, configuration, compiled)
        compiled
    end
  end

  defp write(path, configuration, %Compiled{exe: exe, program_key: key}),
    do: EXLA.CompileCache.write_file(path, exe, key, configuration)

  # {:found, program_key}, or :absent when the file is to be (re)written.
  # Only the file's metadata is read: a call whose program is in memory
  # reads no more of it (the executable is read, and checked, where a
  # program is loaded from it, see EXLA.CompileCache).
  defp read(path, configuration, debug?) do
    case EXLA.Executable.Sealed.peek_metadata(path) do
      {:ok, %{configuration: ^configuration, cache_key: key}} ->
        if debug?, do: Logger.debug("EXLA disk cache found at #{inspect(path)}")
        {:found, key}

      {:ok, metadata} ->
        warn_mismatch(configuration, Map.get(metadata, :configuration) || %{})
        :absent

      {:error, :enoent} ->
        if debug?, do: Logger.debug("EXLA disk cache not found at #{inspect(path)}")
        :absent

      {:error, :other_version} ->
        Logger.warning(
          "Discarding EXLA disk cache at #{inspect(path)} because it is for an older " <>
            "EXLA version"
        )

        :absent

      {:error, :unknown} ->
        unknown(path, configuration)

      {:error, reason} ->
        Logger.warning(
          "EXLA disk cache at #{inspect(path)} could not be read " <>
            "(#{:file.format_error(reason)}): the program is compiled and written there"
        )

        :absent
    end
  end

  # Not a file of this EXLA, or one whose metadata names atoms this VM has
  # not made (another configuration, which the whole file, checked, shows).
  defp unknown(path, configuration) do
    with {:ok, binary} <- File.read(path),
         {:ok, metadata, _blob} <- EXLA.Executable.Sealed.open(binary) do
      warn_mismatch(configuration, Map.get(metadata, :configuration) || %{})
    else
      _ ->
        Logger.warning(
          "EXLA disk cache at #{inspect(path)} is not a file of this EXLA (or is damaged): " <>
            "the program is compiled and written there"
        )
    end

    :absent
  end

  # EXLA's warning, with the entries that differ.
  defp warn_mismatch(expected, found) do
    differ = for {key, value} <- expected, Map.get(found, key) != value, do: key

    Logger.warning("""
    EXLA disk cache does not match configuration.

    Expected: #{EXLA.SharedTerm.inspect(Map.take(expected, differ))}

    Found: #{EXLA.SharedTerm.inspect(Map.take(found, differ))}
    """)
  end

  defp warn_other_program(path) do
    Logger.warning(
      "EXLA disk cache at #{inspect(path)} matches the configuration but holds another " <>
        "program (another function, or one compiled by another plugin or for another " <>
        "CPU): it is compiled and the file replaced"
    )
  end
end
