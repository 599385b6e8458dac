defmodule EXLA.Application do
  @moduledoc false
  use Application

  @impl true
  def start(_type, _args) do
    children = [
      # First: it logs what the native code reports from then on.
      EXLA.NativeLog,
      {EXLA.Client, []},
      EXLA.LockedCache,
      EXLA.CompileCache.Memory,
      {Task, &preload_code/0}
    ]

    # Owned by the application's process: it lives as long as EXLA.
    EXLA.Defn.Recompilation.create_table()

    # The end of a script (mix run, elixir, mix test) waits too.
    System.at_exit(fn _status -> await_native_work() end)
    Supervisor.start_link(children, strategy: :one_for_one, name: EXLA.Supervisor)
  end

  @impl true
  # A release stops its applications before the VM exits.
  def prep_stop(state) do
    await_native_work()
    state
  end

  @doc false
  # An orderly exit waits, for at most `timeout` milliseconds each, for the
  # native work the VM must not exit under: C++ exit handlers free global
  # tables of the plugin that a compile, or oneDNN's code generation in a
  # plugin warm-up (EXLA.Client.WarmUp), is using, and the VM crashes
  # (segfault). Runs are not waited for (a run may wait for a BEAM
  # process, as host callbacks do). `System.halt/1` skips all this; on OTP
  # 26+ the NIF makes it wait instead (native/exla/src/halt.rs).
  def await_native_work(timeout \\ 10_000) do
    EXLA.Client.WarmUp.await(timeout)
    EXLA.NIF.compiles_wait_idle(timeout)
    :ok
  end

  @doc false
  # Outside releases (mix, iex, Livebook) the VM loads each module when it
  # is first called: the first compile of a VM loads about a hundred
  # modules of Nx and EXLA (about 25 ms of a first call, the whole cost of
  # evaluating and lowering a cached training step). They are loaded here,
  # in the background, as the VM starts. Releases load every module at
  # boot, and then this does nothing.
  def preload_code do
    if :code.get_mode() == :interactive do
      modules =
        for app <- [:complex, :nx, :exla],
            {:ok, modules} <- [:application.get_key(app, :modules)],
            module <- modules,
            do: module

      :code.ensure_modules_loaded(modules)
    end

    :ok
  end
end
