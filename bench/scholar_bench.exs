# Many small programs: a client library's whole test suite (Scholar's),
# under EXLA and under Nx's reference implementation, in one run, and where
# EXLA's time goes.
#
# Scholar stays outside this repository. Put Scholar v0.3.1, nimble_options
# v1.1.1 and Polaris v0.1.0 side by side in one folder, and make Scholar's
# `mix.exs` take them, Nx and this project by path:
#
#     {:nx, path: "<Nx 0.7.2's nx folder>", override: true},
#     {:nimble_options, path: "../nimble_options"},
#     {:exla, path: "<this project>", only: :test},
#     {:polaris, path: "../polaris"}
#
# (and drop the docs/dev-only dependencies of the three). This script
# replaces Scholar's `test/test_helper.exs` with
# `bench/support/client_test_helper.exs` (which starts EXLA as Scholar's
# does, sets the defaults of the mode and collects the telemetry), then runs
# `mix test --seed 0` there, each case in a fresh operating-system process:
#
#   * `reference` - Nx.BinaryBackend and Nx.Defn.Evaluator (Nx's defaults);
#   * `exla` - `EXLA.Backend` and `compiler: EXLA` as the defaults, disk
#     compile cache off;
#   * `exla cold cache` - the same with an empty compile cache directory;
#   * `exla warm cache` - again, with the directory the cold run filled;
#   * `preload` (not run by default) - as `exla`, with another malloc
#     preloaded into the process (`LD_PRELOAD` set to BENCH_PRELOAD, for
#     example Debian's `libjemalloc.so.2`).
#
# It prints each case's suite time (from the test helper's start to the end
# of the suite), the ratio to the reference measured in the same run, the
# size of the cache directory, and the split of EXLA's compiles (from
# `[:exla, :compilation, :details]`): per kind (jit, EXLA.Backend) and disk cache
# status, how many and the seconds of tracing, lowering, the plugin's
# compile and the disk cache, and the eager operations whose compiles took
# the most time. Compiles of concurrent tests overlap, so the sums can
# exceed the suite's time.
#
# With BENCH_DUMP=1 it also runs the `exla` case with an XLA dump
# (`--xla_dump_to`) and splits the plugin's compile into HLO passes (from
# the dump of the program before optimization to the one after) and code
# generation (from then to the last object file), and counts the kernels
# (one LLVM module per kernel), in all and in programs with while loops.
# Dumping slows the compile down, so these are shares, not times to
# compare with the other cases.
#
#     SCHOLAR_DIR=/path/to/scholar NX_PATH=/path/to/nx elixir bench/scholar_bench.exs
#
# Environment: SCHOLAR_DIR (required), BENCH_CASES (comma-separated, default
# `reference,exla,cold,warm`), BENCH_PRELOAD (for the `preload` case),
# BENCH_DUMP (`1` for the dump case),
# BENCH_TEST_ARGS (extra `mix test` arguments, such as a file to run a part),
# BENCH_LOG_DIR (a folder that receives each case's `mix test` output,
# `<case>.log`, and the names of its failing tests, sorted, `<case>.failures`,
# to compare two trees' failures by name).
# The machine should be otherwise idle; the ratios come from one run.
defmodule ScholarBench do
  @helper Path.expand("support/client_test_helper.exs", __DIR__)

  def main do
    dir = System.get_env("SCHOLAR_DIR") || raise "set SCHOLAR_DIR to a Scholar checkout"
    install_helper!(dir)
    cases = String.split(System.get_env("BENCH_CASES", "reference,exla,cold,warm"), ",")
    cache = Path.join(System.tmp_dir!(), "exla_scholar_bench_cache_#{System.os_time()}")
    File.rm_rf!(cache)

    # Built once first, so no case pays for compiling Scholar or EXLA.
    {_, 0} = System.cmd("mix", ["compile"], cd: dir, env: [{"MIX_ENV", "test"}])

    results =
      for name <- cases do
        {mode, cache_env, env} =
          case name do
            "reference" -> {"reference", "off", []}
            "exla" -> {"exla", "off", []}
            "cold" -> {"exla", cache, []}
            "warm" -> {"exla", cache, []}
            "preload" -> {"exla", "off", [{"LD_PRELOAD", preload!()}]}
          end

        report = run(dir, name, mode, cache_env, env)
        {name, Map.put(report, :cache_bytes, if(cache_env != "off", do: dir_bytes(cache)))}
      end

    print(results)
    if System.get_env("BENCH_DUMP") == "1", do: dump_split(dir)
    File.rm_rf!(cache)
  end

  defp preload! do
    System.get_env("BENCH_PRELOAD") ||
      raise "set BENCH_PRELOAD to the allocator library for the preload case"
  end

  defp install_helper!(dir) do
    target = Path.join([dir, "test", "test_helper.exs"])
    File.cp!(@helper, target)
  end

  defp run(dir, name, mode, cache, extra_env) do
    out = Path.join(System.tmp_dir!(), "exla_scholar_bench_#{name}_#{System.os_time()}.bin")
    args = ["test", "--seed", "0"] ++ OptionParser.split(System.get_env("BENCH_TEST_ARGS", ""))

    env =
      [
        {"MIX_ENV", "test"},
        {"EXLA_BENCH_MODE", mode},
        {"EXLA_BENCH_CACHE", cache},
        {"EXLA_BENCH_OUT", out}
      ] ++ extra_env

    IO.puts(:stderr, "running #{name} ...")
    {output, status} = System.cmd("mix", args, cd: dir, env: env, stderr_to_stdout: true)
    summary = Regex.run(~r/\d+ doctests?, \d+ tests?, \d+ failures?.*/, output)
    keep_log(name, output)
    report = out |> File.read!() |> :erlang.binary_to_term()
    File.rm(out)
    Map.merge(report, %{status: status, summary: summary && hd(summary)})
  end

  defp keep_log(name, output) do
    if dir = System.get_env("BENCH_LOG_DIR") do
      File.mkdir_p!(dir)
      File.write!(Path.join(dir, "#{name}.log"), output)

      failures =
        for [_, test] <- Regex.scan(~r/^\s+\d+\) ((?:test|doctest) .*)$/m, output),
            do: test <> "\n"

      File.write!(Path.join(dir, "#{name}.failures"), failures |> Enum.sort() |> Enum.join())
    end
  end

  defp dir_bytes(dir) do
    files = Path.wildcard(Path.join(dir, "*.exla"))
    {length(files), files |> Enum.map(&File.stat!(&1).size) |> Enum.sum()}
  end

  defp print(results) do
    reference = Enum.find_value(results, fn {n, r} -> n == "reference" && r.wall_us end)

    IO.puts("\ncase               suite s   × reference   cache files   cache MB   tests")

    for {name, r} <- results do
      ratio = if reference, do: :io_lib.format("~.2f", [r.wall_us / reference]), else: "-"

      {files, mb} =
        case r.cache_bytes do
          {n, bytes} -> {n, :io_lib.format("~.1f", [bytes / 1.0e6])}
          nil -> {"-", "-"}
        end

      IO.puts(
        pad(name, 18) <>
          pad(secs(r.wall_us), 10) <>
          pad(ratio, 14) <> pad(files, 14) <> pad(mb, 11) <> to_string(r.summary)
      )
    end

    IO.puts(
      "\nEXLA's compiles (seconds summed over compiles; compile = lower + XLA + cache + rest)"
    )

    IO.puts(
      "case              kind     disk    count   trace   lower   XLA compile  cache load  cache write  compile"
    )

    for {name, r} <- results, {{kind, disk}, m} <- Enum.sort(r.compiles) do
      IO.puts(
        pad(name, 18) <>
          pad(kind, 9) <>
          pad(disk, 8) <>
          pad(m[:count], 8) <>
          pad(secs(m[:eval_time]), 8) <>
          pad(secs(m[:lower_time]), 8) <>
          pad(secs(m[:xla_compile_time]), 13) <>
          pad(secs(m[:cache_load_time]), 12) <>
          pad(secs(m[:cache_write_time]), 13) <> secs(m[:compile_time])
      )
    end

    print_ops(results)
  end

  # The eager operations whose compiles took the most XLA time, per case.
  defp print_ops(results) do
    for {name, r} <- results, ops = Map.get(r, :ops, %{}), ops != %{} do
      top =
        ops
        |> Enum.group_by(fn {op, _m} -> op_name(op) end, fn {_op, m} -> m end)
        |> Enum.map(fn {op, ms} ->
          {op, Enum.sum(Enum.map(ms, & &1[:count])),
           Enum.sum(Enum.map(ms, & &1[:xla_compile_time]))}
        end)
        |> Enum.sort_by(fn {_op, _count, time} -> -time end)
        |> Enum.take(8)
        |> Enum.map_join(", ", fn {op, count, time} -> "#{op} #{count} (#{secs(time)} s)" end)

      IO.puts("\n#{name}: eager operations compiled by XLA, most compile time first: #{top}")
    end
  end

  # An eager program's key is its operation's name, or for a block (Nx 0.12
  # and later) `{struct, fun}`: named (and summed) by the struct's module.
  defp op_name({%module{}, _fun}), do: inspect(module)
  defp op_name(op) when is_atom(op), do: Atom.to_string(op)
  defp op_name(op), do: inspect(op)

  # The plugin's compile split from the mtimes of an XLA dump: per module,
  # HLO passes from `before_optimizations` to `cpu_after_optimizations`,
  # code generation from there to its last file; kernels are LLVM modules.
  defp dump_split(dir) do
    dump = Path.join(System.tmp_dir!(), "exla_scholar_bench_dump_#{System.os_time()}")
    flags = String.trim("#{System.get_env("XLA_FLAGS", "")} --xla_dump_to=#{dump}")
    run(dir, "dump", "exla", "off", [{"XLA_FLAGS", flags}])

    # The mtime of every file, in microseconds, in one call.
    {listing, 0} = System.cmd("find", [dump, "-type", "f", "-printf", "%f %T@\\n"])

    modules =
      for line <- String.split(listing, "\n", trim: true),
          [name, time] = String.split(line, " "),
          do: {name, round(String.to_float(time) * 1.0e6)}

    modules = Enum.group_by(modules, fn {name, _} -> name |> String.split(".") |> hd() end)

    zero = %{modules: 0, hlo: 0, codegen: 0, kernels: 0, loop_modules: 0, loop_kernels: 0}

    totals =
      Enum.reduce(modules, zero, fn {_m, names}, acc ->
        times = Map.new(names)
        before = find_time(times, "before_optimizations.txt")
        after_opt = find_time(times, "cpu_after_optimizations.txt")

        kernels =
          Enum.count(names, fn {name, _} -> String.ends_with?(name, ".ir-with-opt.ll") end)

        if before && after_opt do
          last = times |> Map.values() |> Enum.max()
          loop = if loops?(dump, names), do: 1, else: 0

          %{
            acc
            | modules: acc.modules + 1,
              hlo: acc.hlo + (after_opt - before),
              codegen: acc.codegen + (last - after_opt),
              kernels: acc.kernels + kernels,
              loop_modules: acc.loop_modules + loop,
              loop_kernels: acc.loop_kernels + loop * kernels
          }
        else
          acc
        end
      end)

    File.rm_rf!(dump)
    total = max(totals.hlo + totals.codegen, 1)

    IO.puts("""

    The plugin's compile, from an XLA dump of the `exla` case (dumping slows it; shares only):
    #{totals.modules} programs, #{totals.kernels} kernels (#{Float.round(totals.kernels / max(totals.modules, 1), 1)} per program)
    HLO passes       #{secs(totals.hlo)} s (#{round(100 * totals.hlo / total)}%)
    code generation  #{secs(totals.codegen)} s (#{round(100 * totals.codegen / total)}%)
    programs with while loops: #{totals.loop_modules}, with #{totals.loop_kernels} kernels (#{round(100 * totals.loop_kernels / max(totals.kernels, 1))}%)
    """)
  end

  # Whether a dumped program has a while loop (Nx's linear algebra, while
  # in defn), from its HLO before XLA's passes.
  defp loops?(dump, names) do
    Enum.any?(names, fn {name, _} ->
      String.ends_with?(name, ".before_optimizations.txt") and
        dump |> Path.join(name) |> File.read!() |> String.contains?(" while(")
    end)
  end

  defp find_time(times, suffix) do
    Enum.find_value(times, fn {name, t} -> String.ends_with?(name, "." <> suffix) && t end)
  end

  defp secs(nil), do: "0.00"
  defp secs(us), do: :io_lib.format("~.2f", [us / 1.0e6]) |> to_string()

  defp pad(value, width), do: String.pad_trailing(to_string(value), width)
end

ScholarBench.main()
