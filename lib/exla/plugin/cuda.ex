defmodule EXLA.Plugin.Cuda do
  @moduledoc false
  # Readies the process for a CUDA plugin before it is loaded, as JAX's
  # CUDA plugin package does: the NVIDIA libraries that pip installed
  # (`nvidia/*/lib` in a site-packages folder) are not on the loader's
  # search path, so each is loaded first, from its package's folder, with
  # its symbols global; when the plugin later asks for a library by its
  # name, the loader finds the one already loaded. A library no package
  # provides is looked for by name (a CUDA installed on the system).
  #
  # The driver's libcuda.so.1 is checked first, and every failure says
  # which library is missing and what to install.

  alias EXLA.Platform

  @doc """
  The libraries the CUDA plugin at `plugin` needs loaded, in order, as
  `{file, required?, location}`: `location` is the path of the file in an
  NVIDIA package of one of `site_dirs` (the plugin's own site-packages
  folder is searched first), or `:system` when no package has it.
  """
  def libraries(plugin, site_dirs) do
    sites = Enum.uniq(List.wrap(site_dir(plugin)) ++ site_dirs)

    for {folder, file, required?} <- Platform.cuda_libraries(Platform.cuda_major(plugin)) do
      paths = Enum.map(sites, &Path.join([&1, "nvidia", folder, "lib", file]))
      {file, required?, Enum.find(paths, :system, &File.regular?/1)}
    end
  end

  @doc """
  Loads the driver and the libraries of `libraries/2` for the plugin at
  `plugin`, or raises saying what is missing. `site_dirs` is called for
  more folders when the first ones lack a required library.
  """
  def prepare!(plugin, site_dirs, more_site_dirs) do
    load_driver!(plugin)

    libraries = libraries(plugin, site_dirs)

    libraries =
      if Enum.any?(libraries, &match?({_, true, :system}, &1)),
        do: libraries(plugin, site_dirs ++ more_site_dirs.()),
        else: libraries

    missing =
      for {file, required?, location} <- libraries,
          reason = load_error(location, file),
          required?,
          do: {file, location, reason}

    if missing != [], do: raise(RuntimeError, missing_message(plugin, missing))
    :ok
  end

  defp load_driver!(plugin) do
    driver = Platform.cuda_driver()

    if reason = load_error(:system, driver) do
      raise RuntimeError,
            "EXLA cannot use the CUDA plugin #{plugin}: the NVIDIA driver's library " <>
              "#{driver} could not be loaded (#{reason}). Install the NVIDIA driver " <>
              "(one that supports CUDA #{cuda_version(plugin)}; `nvidia-smi` shows the " <>
              "driver and the CUDA version it supports), or run on another platform, " <>
              "such as the :host client"
    end
  end

  # nil when loaded, else why not.
  defp load_error(location, file) do
    library = if location == :system, do: file, else: location

    case EXLA.NIF.library_load_global(library) do
      {:ok, :ok} -> nil
      {:error, {_kind, reason}} -> reason
    end
  end

  defp missing_message(plugin, missing) do
    major = cuda_version(plugin)

    details =
      Enum.map_join(missing, "\n", fn
        {file, :system, reason} -> "  * #{file}: in no NVIDIA package, and #{reason}"
        {file, path, reason} -> "  * #{file}: #{path} does not load: #{reason}"
      end)

    "EXLA cannot use the CUDA plugin #{plugin}: it needs NVIDIA libraries that are " <>
      "neither in an NVIDIA Python package (nvidia/*/lib in a site-packages folder " <>
      "EXLA sees) nor on the system's library path:\n\n#{details}\n\n" <>
      "Install them in the Python environment of the plugin with " <>
      ~s|`pip install "jax[cuda#{major}]"` (it brings the NVIDIA packages the plugin | <>
      "needs), or install CUDA #{major} and cuDNN on the system"
  end

  defp cuda_version(plugin) do
    Platform.cuda_major(plugin) || "12 or 13"
  end

  # The site-packages folder of a plugin installed by pip
  # (<site>/jax_plugins/xla_cudaNN/xla_cuda_plugin.so), or nil.
  defp site_dir(plugin) do
    package_root = plugin |> Path.dirname() |> Path.dirname()
    if Path.basename(package_root) == "jax_plugins", do: Path.dirname(package_root)
  end
end
