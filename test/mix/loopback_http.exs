# The tests run the server in the test VM, whose project does not declare
# inets: since Elixir 1.15, Mix keeps it off the code path (see
# Mix.ExlaNative.Artifact's download, which does the same before starting it).
if function_exported?(Mix, :ensure_application!, 1),
  do: apply(Mix, :ensure_application!, [:inets])

defmodule EXLA.LoopbackHTTP do
  @moduledoc false
  # A static file server on 127.0.0.1 (inets' httpd) standing in for a
  # release page in the tests of the NIF compiler. A script the tests
  # require, not test/support: the project itself does not use inets.

  @doc "Serves `dir`; returns its base URL and a function that stops it."
  def serve(dir) do
    {:ok, _} = Application.ensure_all_started(:inets)

    {:ok, pid} =
      :inets.start(:httpd,
        port: 0,
        bind_address: {127, 0, 0, 1},
        server_name: ~c"exla-test",
        server_root: String.to_charlist(dir),
        document_root: String.to_charlist(dir)
      )

    {"http://127.0.0.1:#{:httpd.info(pid)[:port]}", fn -> :inets.stop(:httpd, pid) end}
  end
end
