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
# :fault_injection tests need the NIF built with that cargo feature, which
# the test environment does when cargo is installed (without it, the
# precompiled NIF is installed); :cargo tests run cargo themselves.
{:ok, features} = File.read(Path.join(:code.priv_dir(:exla), "libexla.so.features"))
no_fault_injection = if features =~ "fault-injection", do: [], else: [:fault_injection]
no_cargo = if System.find_executable("cargo"), do: [], else: [:cargo]
# :cuda tests need an NVIDIA device and a CUDA plugin (test/exla/gpu_test.exs);
# where they are found (EXLA.TestPlatform), CUDA is the
# default client, and :cpu_only tests, whose tag's value says why they hold
# only where the default client is the CPU's, are left out.
by_platform = if EXLA.TestPlatform.cuda?(), do: [:cpu_only], else: [:cuda]

# Tests of what only some Nx lines have are tagged with the EXLA.NxVersion
# fact they need (`@tag nx: :streams?`) or with the line they describe
# (`@tag nx: :v0_7`); those the compiled Nx does not meet are left out.
nx_facts =
  [:streams?, :blocks?, :tokens?, :hook_nodes?, :maps?, :runtime_calls?, :small_types?] ++
    [:stack?, :pointers?, :meshes?]

no_nx =
  for(fact <- nx_facts, not apply(EXLA.NxVersion, fact, []), do: {:nx, fact}) ++
    for line <- [:v0_7, :v0_12, :v0_13], line != EXLA.NxVersion.line(), do: {:nx, line}

# OTP 26 and later let the NIF make erlang:halt/1 wait for native work
# (native/exla/src/halt.rs); :halt_hook tests need it.
no_halt_hook =
  if :erlang.system_info(:otp_release) |> List.to_integer() >= 26, do: [], else: [:halt_hook]

# :x86_64 tests cap XLA:CPU's instruction set (xla_cpu_max_isa: "AVX2"),
# which only x86-64 hosts have.
no_x86_64 =
  if :erlang.system_info(:system_architecture) |> to_string() =~ ~r/^x86_64/,
    do: [],
    else: [:x86_64]

ExUnit.start(
  exclude:
    [:slow, :distributed] ++
      no_fault_injection ++ no_cargo ++ by_platform ++ no_nx ++ no_halt_hook ++ no_x86_64
)
