defmodule EXLA.DocsTest do
  # Docs that cannot drift from the code: the README's module map names
  # every module and every Rust source file, and nothing that does not
  # exist; the public docs link no hidden module.
  use ExUnit.Case, async: true

  @root Path.expand("../..", __DIR__)

  defp module_map do
    readme = File.read!(Path.join(@root, "README.md"))
    [_, map] = String.split(readme, "\n## Module map\n", parts: 2)
    map
  end

  # The modules the map names, as `EXLA...` alone between backticks.
  defp named_modules(map) do
    for [_, name] <- Regex.scan(~r/`(EXLA(?:\.[A-Z][A-Za-z0-9]*)*)`/, map), uniq: true, do: name
  end

  # The modules this project compiles from lib/ on this Nx line.
  defp lib_modules do
    {:ok, modules} = :application.get_key(:exla, :modules)

    for module <- modules,
        source = to_string(module.module_info(:compile)[:source]),
        String.starts_with?(source, Path.join(@root, "lib") <> "/"),
        do: module
  end

  # Every module that lib/ defines, on any Nx line.
  defp defined_modules do
    for file <- Path.wildcard(Path.join(@root, "lib/**/*.ex")),
        [_, name] <-
          Regex.scan(~r/^\s*def(?:module|protocol) (EXLA[\w.]*) do/m, File.read!(file)),
        uniq: true,
        do: name
  end

  test "the module map names every module of lib/, and only those" do
    named = named_modules(module_map())
    # Protocol implementations are their protocol's.
    compiled = for m <- lib_modules(), not function_exported?(m, :__impl__, 1), do: inspect(m)
    assert compiled -- named == [], "modules the README's map does not name"
    assert named -- defined_modules() == [], "modules the README's map names that lib/ lacks"
  end

  test "the module map names every Rust source file of native/, and only those" do
    map = module_map()

    for dir <- Path.wildcard(Path.join(@root, "native/*/src")) do
      relative = Path.relative_to(dir, @root)
      # The paragraph that starts with the folder's name.
      [_, paragraph] = Regex.run(~r/\(`#{Regex.escape(relative)}`\):(.*?)\n\n/s, map)
      named = for [_, file] <- Regex.scan(~r/`([a-z_]+\.rs)`/, paragraph), uniq: true, do: file
      files = dir |> Path.join("*.rs") |> Path.wildcard() |> Enum.map(&Path.basename/1)

      assert Enum.sort(named) == Enum.sort(files),
             "#{relative}: the README names #{inspect(named)}"
    end
  end

  test "the public modules' docs link no hidden module" do
    docs =
      for module <- lib_modules(),
          {:docs_v1, _, _, _, doc, _, fun_docs} <- [Code.fetch_docs(module)],
          do: {module, doc, fun_docs}

    hidden = for {module, :hidden, _} <- docs, do: inspect(module)

    links =
      for {module, %{"en" => doc}, fun_docs} <- docs,
          text <- [doc | for({_, _, _, %{"en" => text}, _} <- fun_docs, do: text)],
          [_, name] <- Regex.scan(~r/`(EXLA(?:\.[A-Z][A-Za-z0-9]*)*)[`.]/, text),
          name in hidden,
          uniq: true,
          do: {module, name}

    assert links == []
  end
end
