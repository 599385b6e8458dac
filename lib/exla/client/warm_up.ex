defmodule EXLA.Client.WarmUp do
  @moduledoc false
  # Work a CPU plugin does once per operating-system process, done in the
  # background when the first client of a plugin file is created, so that
  # the first program a user runs does not pay it.
  #
  # XLA:CPU computes matrix products with Eigen on top of oneDNN, and
  # oneDNN generates the machine code of its small-product kernels the
  # first time the process needs one (about 16 kernels, 30 ms on the
  # machines this was measured on): the first run of the first program with
  # a small product took 45-53 ms instead of 4 ms for a 784-512-512-10 MLP
  # training step. The first compilation of a process also initializes
  # XLA's and LLVM's registries (10-15 ms more than a later one). A tiny
  # program with one 4x4 product, compiled and run once, does both: a
  # product that small takes oneDNN's path without copies, whose table of
  # kernels is the slow part to generate (the kernels of the copying path,
  # generated on the first product too, take 3 ms).
  #
  # Its run lasts as long as the generation, so it runs on a native thread
  # (see EXLA.Executable's "Where programs run"); a user's run that needs
  # the kernels meanwhile waits for the same generation instead of doing
  # it again. The operands are constants behind an optimization barrier, so
  # XLA cannot fold the product away and no argument is transferred; the
  # result (64 bytes) is freed right after the run.

  require Logger

  @program """
  module {
    func.func public @main() -> tensor<4x4xf32> {
      %0 = "stablehlo.constant"() {value = dense<1.0> : tensor<4x4xf32>} : () -> tensor<4x4xf32>
      %1:2 = "stablehlo.optimization_barrier"(%0, %0) : (tensor<4x4xf32>, tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>)
      %2 = "stablehlo.dot_general"(%1#0, %1#1) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>} : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
      "func.return"(%2) : (tensor<4x4xf32>) -> ()
    }
  }
  """

  @doc """
  Starts the warm-up of `client`'s plugin in the background, unless one
  was started for the same plugin file already. Returns the pid of the
  process doing it, or nil.

  An exit while the plugin generates code crashes the VM (the C++ exit
  handlers free the code generator's tables under it), so the end of a
  script and the application's stop wait for it (see
  `EXLA.Application.await_native_work/1`).
  """
  def start(%EXLA.Client{plugin_path: path} = client) do
    started = started()

    if Map.has_key?(started, path) do
      nil
    else
      {:ok, pid} = Task.start(fn -> run(client) end)
      :persistent_term.put({__MODULE__, :started}, Map.put(started, path, pid))
      pid
    end
  end

  # Plugin file => the process warming it up (or that did). Client creation
  # is serialized, so the read and the write of start/1 do not race.
  defp started, do: :persistent_term.get({__MODULE__, :started}, %{})

  @doc """
  Waits until every warm-up started has ended, for at most `timeout`
  milliseconds in all. Returns `:ok` or `:timeout`.
  """
  def await(timeout) do
    deadline = System.monotonic_time(:millisecond) + timeout

    Enum.reduce(Map.values(started()), :ok, fn pid, result ->
      ref = Process.monitor(pid)
      left = max(deadline - System.monotonic_time(:millisecond), 0)

      receive do
        {:DOWN, ^ref, :process, ^pid, _} -> result
      after
        left ->
          Process.demonitor(ref, [:flush])
          :timeout
      end
    end)
  end

  @doc """
  Compiles and runs the warm-up program on `client`. Returns `:ok`, or
  `:error` (logged at debug level) if the plugin refused it: it only
  costs speed.
  """
  def run(client) do
    exe = EXLA.Executable.compile(client, @program, run_on: :thread)
    [[result]] = EXLA.Executable.run(exe, [[]])
    EXLA.DeviceBuffer.deallocate(result)
    :ok
  rescue
    error ->
      Logger.debug(
        "EXLA could not warm up plugin #{client.plugin_path}: " <> Exception.message(error)
      )

      :error
  end
end
