defmodule EXLA.Application do
  @moduledoc false
  use Application

  @impl true
  def start(_type, _args) do
    children = [
      # First: it logs what the native code reports from then on.
      EXLA.NativeLog,
      {EXLA.Client, []},
      EXLA.Defn.LockedCache,
      {Task, &preload_code/0}
    ]

    Supervisor.start_link(children, strategy: :one_for_one, name: EXLA.Supervisor)
  end

  @impl true
  # A release stops its applications before the VM exits: a plugin
  # warm-up still under way must end first (see EXLA.Client.WarmUp).
  def prep_stop(state) do
    EXLA.Client.WarmUp.await()
    state
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
