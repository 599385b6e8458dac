defmodule EXLA.CacheFileTest do
  # The `cache: path` option as EXLA 0.9 and later behave: every call reads
  # the file first and logs what it finds. Sets the Logger's level.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  @moduletag :tmp_dir
  @moduletag :capture_log

  setup do
    level = Logger.level()
    Logger.configure(level: :debug)
    on_exit(fn -> Logger.configure(level: level) end)
  end

  defp logged(fun), do: capture_log([level: :debug], fun)

  # One function, the same term at every call (an in-memory cache hit
  # after the first): only the file tells the calls apart.
  defp call(path, args, opts \\ []),
    do: EXLA.jit_apply(&Nx.subtract/2, args, [cache: path, debug: true] ++ opts)

  defp scalars(a, b), do: [Nx.tensor(a, type: :f32), Nx.tensor(b, type: :f32)]

  # EXLA's warning for a file of another configuration, with the entries
  # that differ.
  defp assert_mismatch(log, expected, found) do
    assert log =~ "[warning] EXLA disk cache does not match configuration."
    assert log =~ "Expected: #{expected}\n"
    assert log =~ "Found: #{found}\n"
  end

  test "each call reads the file, even when the program is in memory", %{tmp_dir: dir} do
    path = Path.join(dir, "sub.exla")

    log = logged(fn -> assert Nx.to_number(call(path, scalars(5, 3))) == 2.0 end)
    assert log =~ "EXLA disk cache not found at #{inspect(path)}"
    assert File.exists?(path)

    for {a, b} <- [{7, 3}, {1, 3}] do
      log = logged(fn -> assert Nx.to_number(call(path, scalars(a, b))) == a - b end)
      assert log =~ "EXLA disk cache found at #{inspect(path)}"
      refute log =~ "not found"
      # As in EXLA, a call served by the file logs no cache lines.
      refute log =~ "cache hit"
      refute log =~ "warning"
    end

    # Gone: the program from memory writes it again.
    File.rm!(path)
    log = logged(fn -> assert Nx.to_number(call(path, scalars(2, 3))) == -1.0 end)
    assert log =~ "EXLA disk cache not found at #{inspect(path)}"
    assert log =~ "EXLA compilation &Nx.subtract/2 cache hit"
    assert File.exists?(path)
    assert logged(fn -> call(path, scalars(2, 3)) end) =~ "EXLA disk cache found"
  end

  test "a file of another configuration is warned about, with EXLA's words, and replaced",
       %{tmp_dir: dir} do
    path = Path.join(dir, "sub.exla")
    call(path, scalars(5, 3))
    vectors = [Nx.tensor([4.0]), Nx.tensor([1.0])]

    log = logged(fn -> assert Nx.to_flat_list(call(path, vectors)) == [3.0] end)
    scalar = inspect({{:f, 32}, {}, [], []})
    vector = inspect({{:f, 32}, {1}, [nil], []})
    assert_mismatch(log, "%{args: [#{vector}, #{vector}]}", "%{args: [#{scalar}, #{scalar}]}")

    assert logged(fn -> call(path, vectors) end) =~ "EXLA disk cache found"

    # Only the entries that differ are shown; the warning needs no debug.
    log = capture_log(fn -> EXLA.jit_apply(&Nx.subtract/2, vectors, cache: path, mode: :x) end)
    assert_mismatch(log, "%{options: [mode: :x]}", "%{options: []}")
    refute log =~ "EXLA disk cache found"
  end

  test "a file of the same program for another configuration is replaced at the first call",
       %{tmp_dir: dir} do
    path = Path.join(dir, "sub.exla")
    named = fn name -> [Nx.tensor([4.0], names: [name]), Nx.tensor([1.0], names: [name])] end
    call(path, named.(:a))

    # The axis names are in the configuration, not in the program.
    log = logged(fn -> assert Nx.to_flat_list(call(path, named.(:b))) == [3.0] end)
    assert log =~ "does not match configuration"

    log = logged(fn -> call(path, named.(:b)) end)
    assert log =~ "EXLA disk cache found"
    refute log =~ "warning"
  end

  test "without debug: true, a file found or not says nothing", %{tmp_dir: dir} do
    path = Path.join(dir, "quiet.exla")

    for _ <- 1..2 do
      assert logged(fn -> EXLA.jit_apply(&Nx.subtract/2, scalars(1, 1), cache: path) end) == ""
    end
  end

  test "a file holding another program for the same configuration is not run",
       %{tmp_dir: dir} do
    path = Path.join(dir, "shared.exla")
    call(path, scalars(5, 3))

    # EXLA would run the file's subtraction.
    log =
      logged(fn ->
        result = EXLA.jit_apply(&Nx.add/2, scalars(5, 3), cache: path, debug: true)
        assert Nx.to_number(result) == 8.0
      end)

    assert log =~ "EXLA disk cache found at #{inspect(path)}"
    assert log =~ "[warning] EXLA disk cache at #{inspect(path)} matches the configuration"

    assert logged(fn ->
             result = EXLA.jit_apply(&Nx.add/2, scalars(5, 3), cache: path, debug: true)
             assert Nx.to_number(result) == 8.0
           end) =~ "EXLA disk cache found"

    # The subtraction, in memory, finds the addition's file and replaces it.
    log = logged(fn -> assert Nx.to_number(call(path, scalars(5, 3))) == 2.0 end)
    assert log =~ "matches the configuration but holds another program"
    refute logged(fn -> call(path, scalars(5, 3)) end) =~ "warning"
  end

  test "a file of another format version is discarded with EXLA's words", %{tmp_dir: dir} do
    path = Path.join(dir, "old.exla")
    call(path, scalars(5, 3))
    <<magic::binary-size(8), _version::16, rest::binary>> = File.read!(path)
    File.write!(path, <<magic::binary, 1::16, rest::binary>>)

    log = logged(fn -> assert Nx.to_number(call(path, scalars(5, 3))) == 2.0 end)

    assert log =~
             "[warning] Discarding EXLA disk cache at #{inspect(path)} because it is for " <>
               "an older EXLA version"

    assert logged(fn -> call(path, scalars(5, 3)) end) =~ "EXLA disk cache found"

    File.write!(path, "not a cache file")
    log = logged(fn -> assert Nx.to_number(call(path, scalars(5, 3))) == 2.0 end)
    assert log =~ "[warning] EXLA disk cache at #{inspect(path)} is not a file of this EXLA"
    assert logged(fn -> call(path, scalars(5, 3)) end) =~ "EXLA disk cache found"
  end

  test "a file whose configuration names an atom this VM never made is another configuration",
       %{tmp_dir: dir} do
    path = Path.join(dir, "atom.exla")
    EXLA.jit_apply(&Nx.subtract/2, scalars(5, 3), cache: path, mode: :ab12cd34)
    # The same file, resealed, as another VM would have written it.
    # An atom of the same length (the term's encoding keeps it), never made.
    digits = System.unique_integer([:positive]) |> rem(1_000_000) |> Integer.to_string()
    fresh = "zz" <> String.pad_leading(digits, 6, "0")

    binary = File.read!(path)
    body = binary_part(binary, 0, byte_size(binary) - 32)
    [before, rest] = :binary.split(body, "ab12cd34")
    body = before <> fresh <> rest
    File.write!(path, body <> :crypto.hash(:sha256, body))

    result = fn -> EXLA.jit_apply(&Nx.subtract/2, scalars(5, 3), cache: path, mode: :ab12cd34) end
    log = capture_log(fn -> assert Nx.to_number(result.()) == 2.0 end)
    assert_mismatch(log, "%{options: [mode: :ab12cd34]}", "%{options: [mode: :#{fresh}]}")
  end

  test "EXLA.compile/3 reads the file when it compiles", %{tmp_dir: dir} do
    path = Path.join(dir, "compiled.exla")
    opts = [cache: path, debug: true]
    args = scalars(5, 3)

    log = logged(fn -> EXLA.compile(&Nx.subtract/2, args, opts) end)
    assert log =~ "EXLA disk cache not found"

    log =
      logged(fn ->
        assert Nx.to_number(EXLA.compile(&Nx.subtract/2, args, opts).(9.0, 3.0)) == 6
      end)

    assert log =~ "EXLA disk cache found"
  end
end
