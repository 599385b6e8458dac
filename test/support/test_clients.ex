defmodule EXLA.TestClients do
  @moduledoc false
  # Clients of their own for tests whose numbers no other test may disturb
  # (memory statistics) or that need several devices.

  import ExUnit.Callbacks, only: [on_exit: 1]

  @doc """
  Adds the client `name` with `options` to the `:clients` configuration,
  unless it is there; it is taken out again when the calling test (or test
  module, from `setup_all`) ends.

  Async modules add theirs at the same time: each change of the
  configuration happens under one lock and touches only its own client,
  so none is lost and none is taken out while another module needs it.
  """
  def add(name, options) do
    added? =
      update(fn clients ->
        if Keyword.has_key?(clients, name),
          do: {false, clients},
          else: {true, clients ++ [{name, options}]}
      end)

    if added?, do: on_exit(fn -> update(&{:ok, Keyword.delete(&1, name)}) end)
    :ok
  end

  @doc """
  The exception with which creating a client in `fun` failed: as EXLA,
  `EXLA.Client.fetch!/1` exits the caller with it (see its docs); fails
  the test when `fun` returns.
  """
  def creation_error(fun) do
    fun.()
    ExUnit.Assertions.flunk("expected creating the client to fail")
  catch
    :exit, {{%_{__exception__: true} = exception, stacktrace}, {GenServer, :call, _}}
    when is_list(stacktrace) ->
      exception
  end

  defp update(fun) do
    :global.trans({__MODULE__, self()}, fn ->
      {result, clients} = fun.(Application.fetch_env!(:exla, :clients))
      Application.put_env(:exla, :clients, clients)
      result
    end)
  end
end
