defmodule EXLA.NxVersionTest do
  use ExUnit.Case, async: true

  alias EXLA.NxVersion

  test "facts/0 has every fact, which the suite excludes by when it is false" do
    facts = NxVersion.facts()
    assert facts[:streams?] == NxVersion.streams?()
    assert facts[:small_types?] == NxVersion.small_types?()
    assert Enum.all?(Map.values(facts), &is_boolean/1)

    for {fact, false} <- facts, do: assert({:nx, fact} in EXLA.TestFacts.exclusions())
  end

  test "every nx: tag of the suite names a fact or a line of EXLA.NxVersion" do
    known = Map.keys(NxVersion.facts()) ++ [:v0_7, :v0_12, :v0_13]
    root = Path.expand("../..", __DIR__)

    tags =
      for file <- Path.wildcard(Path.join(root, "test/**/*.exs")),
          [_, name] <- Regex.scan(~r/tag nx: :([a-z0-9_]+\??)/, File.read!(file)),
          uniq: true,
          do: String.to_atom(name)

    assert tags != []
    assert tags -- known == []
  end
end
