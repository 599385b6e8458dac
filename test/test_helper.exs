# The compile cache of this run lives in a fresh directory, so no run
# depends on the programs an earlier one left, and every program worth
# caching goes through it (written, and loaded back where another jit key
# compiles the same text).
cache_dir = Path.join(System.tmp_dir!(), "exla-test-cache-#{System.unique_integer([:positive])}")
Application.put_env(:exla, :cache_dir, cache_dir)
ExUnit.after_suite(fn _ -> File.rm_rf(cache_dir) end)

# :slow tests take seconds each (run them with --include slow).
# :distributed tests start peer nodes on the loopback interface (run them
# with --include distributed).
# The others are left out where this VM, build or machine lacks what they
# need (EXLA.TestFacts): :halt_hook, :fault_injection, :cargo, :cuda and
# :cpu_only by the fact of the same name, and the tests of what only some
# Nx lines have, tagged with the EXLA.NxVersion fact (`@tag nx: :streams?`)
# or the line (`@tag nx: :v0_7`) they need.
ExUnit.start(exclude: [:slow, :distributed] ++ EXLA.TestFacts.exclusions())
