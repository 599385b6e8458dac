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
ExUnit.start(exclude: [:slow, :distributed])
