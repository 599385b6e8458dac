defmodule EXLA.TestFacts do
  @moduledoc false
  # What this VM, build and machine can do, as facts named after the test
  # tags that need them (as `EXLA.NxVersion` names the Nx facts): the suite
  # leaves out the tests whose fact is false (see `exclusions/0`).

  @doc """
  The facts, by tag:

    * `:halt_hook` - the NIF makes `erlang:halt/1` wait for native work
      (native/exla/src/halt.rs): OTP 26 and later have the hook it needs;
    * `:fault_injection` - the NIF was built with that cargo feature,
      which the test environment does where cargo is installed (without
      it, the precompiled NIF is installed);
    * `:cargo` - cargo is installed, for tests that run it;
    * `:cuda` - an NVIDIA device and a CUDA plugin are found
      (`EXLA.TestPlatform.cuda?/0`): CUDA is then the default client;
    * `:cpu_only` - the default client is the CPU's (the tag's value says
      why the test holds only there);
    * `:x86_64` - the machine is an x86-64 one, whose XLA:CPU code a client
      can cap at an instruction set (`xla_cpu_max_isa: "AVX2"`).
  """
  def facts do
    cuda? = EXLA.TestPlatform.cuda?()

    %{
      halt_hook: List.to_integer(:erlang.system_info(:otp_release)) >= 26,
      fault_injection: nif_features() =~ "fault-injection",
      cargo: System.find_executable("cargo") != nil,
      cuda: cuda?,
      cpu_only: not cuda?,
      x86_64: to_string(:erlang.system_info(:system_architecture)) =~ ~r/^x86_64/
    }
  end

  defp nif_features do
    File.read!(Path.join(:code.priv_dir(:exla), "libexla.so.features"))
  end

  @doc """
  The tags the suite leaves out: those of the facts above that are false,
  and `{:nx, fact}` for each `EXLA.NxVersion` fact that is false and each
  Nx line (`{:nx, :v0_7}`) that is not the compiled one.
  """
  def exclusions do
    for({tag, false} <- facts(), do: tag) ++
      for({fact, false} <- EXLA.NxVersion.facts(), do: {:nx, fact}) ++
      for line <- [:v0_7, :v0_12, :v0_13], line != EXLA.NxVersion.line(), do: {:nx, line}
  end
end
