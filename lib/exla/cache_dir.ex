defmodule EXLA.CacheDir do
  @moduledoc false
  # EXLA's cache directory and its layout (internal), written here once:
  #
  #     <root>                  the :cache_dir option, else EXLA_CACHE_DIR,
  #                             else :filename.basedir(:user_cache, "exla")
  #       plugins/<name>-<version>-<arch>/<library>
  #                             the CPU plugins EXLA installs (EXLA.Plugin)
  #       fingerprints/         the remembered SHA-256 of plugin files
  #                             (EXLA.Plugin.Fingerprint)
  #       compiled/             the compile cache, unless :cache_dir of
  #                             :exla names another directory (EXLA.CompileCache)
  #       nif/                  the precompiled NIF archives
  #
  # The NIF compiler (mix/compile_exla_native.exs) finds `nif/` before this
  # module is compiled, so it repeats the root and that folder; a test ties
  # the two. `.ci/run` installs the CPU plugin where `plugin_dir/2` says,
  # before Elixir runs, and is the one other place that knows it.

  @folders [:plugins, :fingerprints, :compiled, :nif]

  @doc """
  The cache directory: the `:cache_dir` option, else `EXLA_CACHE_DIR`, else
  the user cache directory of `exla`.
  """
  def root(opts \\ []) do
    opts[:cache_dir] || EXLA.Env.get("EXLA_CACHE_DIR") ||
      List.to_string(:filename.basedir(:user_cache, ~c"exla"))
  end

  @doc "The folder of the cache directory that holds `kind`, one of #{inspect(@folders)}."
  def folder(kind, opts \\ []) when kind in @folders,
    do: Path.join(root(opts), Atom.to_string(kind))

  @doc "The folder of the installed CPU plugin `name` at `version` for `arch`."
  def plugin_dir(name, version, arch, opts \\ []),
    do: Path.join(folder(:plugins, opts), "#{name}-#{version}-#{arch}")
end
