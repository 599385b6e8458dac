defmodule EXLA.Test.LazyLoader do
  @moduledoc """
  A test aid: an `Nx.LazyContainer` holding one tensor that sends
  `:loaded` to `notify` when its tensor is built (lazy transfer tests).
  It lives in test/support so that it is compiled before protocols are
  consolidated.
  """
  defstruct [:notify, :tensor]

  defimpl Nx.LazyContainer do
    def traverse(%{notify: notify, tensor: tensor}, acc, fun) do
      template = Nx.to_template(tensor)

      fun.(
        template,
        fn ->
          send(notify, :loaded)
          tensor
        end,
        acc
      )
    end
  end
end
