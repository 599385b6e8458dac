defmodule EXLA.TestPlatform do
  @moduledoc false
  # The platform the suite's default client runs on, for tests whose
  # expectations differ by platform.

  @doc """
  Whether an NVIDIA device and a CUDA plugin are found, so that CUDA is
  the default client (the first of the default `:preferred_clients`).
  Looking for them creates no client.
  """
  def cuda? do
    EXLA.Plugin.may_have_devices?(:cuda) and match?({:ok, _}, EXLA.Plugin.find(:cuda))
  end

  @doc "`list` where `cuda?/0`, else `[]`: exclusions that only a GPU needs."
  def on_cuda(list), do: if(cuda?(), do: list, else: [])
end
