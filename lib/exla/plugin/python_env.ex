defmodule EXLA.Plugin.PythonEnv do
  @moduledoc false
  # The site-packages folders of the Python environments EXLA can see,
  # where pip installs plugin packages (`jax_plugins/...`, `libtpu/`) and
  # NVIDIA's library packages (`nvidia/*/lib`).
  #
  # `site_dirs/0` looks at the file system alone, without starting Python:
  # PYTHONPATH, the active environment (VIRTUAL_ENV, CONDA_PREFIX), the
  # environment of every Python on the PATH (`<dir>/../lib/python3.*/...`),
  # and the user site (PYTHONUSERBASE, else ~/.local). `asked_site_dirs/1`
  # asks one interpreter instead, for layouts the file system does not show
  # (version managers' shims, such as pyenv's).

  @doc "The site-packages folders that exist, most specific first."
  def site_dirs do
    prefixes =
      Enum.map(env_list(["VIRTUAL_ENV", "CONDA_PREFIX"]), &Path.expand/1) ++ python_prefixes()

    (pythonpath() ++ Enum.flat_map(prefixes, &prefix_site_dirs/1) ++ user_site_dirs())
    |> Enum.flat_map(&with_identity/1)
    |> Enum.uniq_by(&elem(&1, 1))
    |> Enum.map(&elem(&1, 0))
  end

  # A folder that exists, with what makes it one folder whatever the path
  # (/lib and /usr/lib are one on merged-/usr systems).
  defp with_identity(dir) do
    case File.stat(dir) do
      {:ok, %File.Stat{type: :directory, major_device: device, inode: inode}} ->
        [{dir, {device, inode}}]

      _ ->
        []
    end
  end

  defp env_list(names),
    do: Enum.flat_map(names, &List.wrap(EXLA.Env.get(&1)))

  defp pythonpath do
    case EXLA.Env.get("PYTHONPATH") do
      nil -> []
      value -> value |> String.split(":", trim: true) |> Enum.map(&Path.expand/1)
    end
  end

  # The prefix of every folder on the PATH that holds a Python: /usr for
  # /usr/bin, the environment for <venv>/bin.
  defp python_prefixes do
    for dir <- String.split(EXLA.Env.get("PATH") || "", ":", trim: true),
        Path.wildcard(Path.join(dir, "python3*")) != [] or
          File.exists?(Path.join(dir, "python")),
        do: dir |> Path.expand() |> Path.dirname()
  end

  # pip installs into lib/python3.X/site-packages; Debian's Pythons use
  # dist-packages, and its pip puts system-wide installs under /usr/local.
  @prefix_globs [
    "lib/python3*/site-packages",
    "lib64/python3*/site-packages",
    "lib/python3*/dist-packages",
    "local/lib/python3*/dist-packages",
    "local/lib/python3*/site-packages"
  ]

  defp prefix_site_dirs(prefix) do
    Enum.flat_map(@prefix_globs, &newest_first(Path.wildcard(Path.join(prefix, &1))))
  end

  defp user_site_dirs do
    base =
      EXLA.Env.get("PYTHONUSERBASE") ||
        Path.join(System.user_home() || "/nonexistent", ".local")

    newest_first(Path.wildcard(Path.join(base, "lib/python3*/site-packages"))) ++
      newest_first(Path.wildcard(Path.join(base, "lib/python/site-packages")))
  end

  # python3.12 before python3.9.
  defp newest_first(dirs) do
    Enum.sort_by(dirs, &python_minor/1, :desc)
  end

  defp python_minor(dir) do
    case Regex.run(~r{python3\.(\d+)}, dir) do
      [_, minor] -> String.to_integer(minor)
      nil -> -1
    end
  end

  # Asks Python where the packages EXLA looks for are, without importing
  # them (a plugin package's __init__ needs jax); each answer's parent is
  # a site-packages folder.
  @locations_script """
  import importlib.util
  for name in ("jax_plugins", "libtpu", "nvidia"):
      try:
          spec = importlib.util.find_spec(name)
      except Exception:
          spec = None
      for path in (spec and spec.submodule_search_locations) or []:
          print(path)
  """

  @doc """
  The site-packages folders that hold a plugin or NVIDIA package, as the
  interpreter `python` (a path) sees them. Asked once per VM: asking costs
  a Python start-up (a few hundred milliseconds with some version managers).
  """
  def asked_site_dirs(nil), do: []

  def asked_site_dirs(python),
    do: EXLA.Memo.get({__MODULE__, :asked_site_dirs, python}, fn -> ask(python) end)

  defp ask(python) do
    case System.cmd(python, ["-c", @locations_script], stderr_to_stdout: true) do
      {output, 0} ->
        output
        |> String.split("\n", trim: true)
        |> Enum.filter(&String.starts_with?(&1, "/"))
        |> Enum.map(&Path.dirname/1)
        |> Enum.uniq()

      {_output, _status} ->
        []
    end
  rescue
    _ in ErlangError -> []
  end
end
