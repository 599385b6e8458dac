# A block struct with an EXLA.CustomCall implementation, for
# test/exla/nx_line_test.exs (implementations must be compiled before the
# protocol is consolidated, so they live in test/support). Nx 0.12 and
# later only.
if EXLA.NxVersion.blocks?() do
  defmodule EXLA.Test.CustomCallBlock do
    @moduledoc false
    defstruct [:target]
  end

  defimpl EXLA.CustomCall, for: EXLA.Test.CustomCallBlock do
    def call(%{target: nil}, _out, _args, _client), do: :skip

    def call(%{target: target}, _out, [_x], %EXLA.Client{}) do
      {:ok,
       %EXLA.CustomCall.Spec{
         call_target_name: target,
         attributes: [{"scale", "2 : i64"}],
         operand_element_types: [{:f, 64}]
       }}
    end
  end
end
