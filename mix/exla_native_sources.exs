defmodule Mix.ExlaNative.Sources do
  @moduledoc false
  # The files a source build of the NIF reads: the Cargo workspace, its lock
  # file and the crates under native/ (Rust, the C++ guard shim, build
  # scripts). The package ships exactly these (see `package/0` in mix.exs),
  # and their digest tells whether a tree still holds the sources the
  # precompiled archives were built from.

  @patterns [
    "Cargo.toml",
    "Cargo.lock",
    "native/*/Cargo.toml",
    "native/*/build.rs",
    "native/*/src/**/*.rs",
    "native/*/cpp/**/*.{cc,h}"
  ]

  @doc "The glob patterns of the native sources, relative to the project root."
  def patterns, do: @patterns

  @doc "The native source files under `root`, relative and sorted."
  def files(root) do
    @patterns
    |> Enum.flat_map(&Path.wildcard(Path.join(root, &1)))
    |> Enum.map(&Path.relative_to(&1, root))
    |> Enum.uniq()
    |> Enum.sort()
  end

  @doc """
  `"sha256:<hex>"` over the native sources under `root`: each file's
  relative path and contents, in path order.
  """
  def digest(root) do
    state =
      Enum.reduce(files(root), :crypto.hash_init(:sha256), fn file, state ->
        contents = File.read!(Path.join(root, file))
        header = "#{file}\0#{byte_size(contents)}\0"
        state |> :crypto.hash_update(header) |> :crypto.hash_update(contents)
      end)

    "sha256:" <> Base.encode16(:crypto.hash_final(state), case: :lower)
  end
end
