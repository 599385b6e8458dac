defmodule EXLA.Placement do
  @moduledoc false

  # Where EXLA's native work runs (internal): the one place that decides,
  # from what is known about the work, between the calling process's
  # scheduler, a dirty scheduler of the VM and a native thread of EXLA. No
  # work that can take more than about a millisecond runs on a normal
  # scheduler.
  #
  # ## Program runs
  #
  # `run_on/2` places the runs of a program from its `EXLA.MLIR.Facts`:
  #
  #   * `:thread` - programs of several devices, and programs that may run
  #     for unbounded time (loops, host callbacks, collectives; see
  #     `EXLA.MLIR.Facts`), run on a native thread of EXLA that replies by
  #     message; the calling process waits in `receive`;
  #
  #   * `:scheduler` - straight-line programs whose ops read and write at
  #     most `:scheduler_max_elements` elements in all run on the calling
  #     process's scheduler: XLA:CPU runs them inline in microseconds;
  #
  #   * `:dirty` - other straight-line programs run on a dirty CPU scheduler.
  #
  # Executables keep their facts, not their placement: one loaded from the
  # compile cache or deserialized is placed by the policy of the VM that
  # loads it.
  #
  #     config :exla, scheduler_max_elements: 65_536
  #
  #   * `:scheduler_max_elements` - the most elements a program's ops may
  #     read and write in all for its runs to stay on the calling process's
  #     scheduler. Defaults to 65,536; `0` sends every program to a dirty
  #     scheduler or a thread (for a machine where small programs run slowly)
  #
  # ## Transfers, reads and deletions
  #
  # Copying a binary of at most 64 KiB to a device
  # (`small_transfer?/1`), reading at most 1 MiB of a buffer
  # whose data is ready (`small_read?/1`, a copy well under a millisecond)
  # and freeing a buffer under 1 MiB (`small_delete?/1`; a
  # larger one may unmap memory, about 50 µs per MiB on the host) run on the
  # calling scheduler; larger ones on a dirty scheduler. These are guards,
  # so the per-call path pays no call for them. The NIF applies the last
  # rule too, to the buffers the garbage collector frees: it is given the
  # size (`large_buffer_bytes/0`) when it loads, and destroys larger
  # buffers on its drop thread.

  alias EXLA.MLIR.Facts

  @default_scheduler_elements 64 * 1024
  @small_transfer 64 * 1024
  @small_read 1024 * 1024
  @large_buffer 1024 * 1024

  @doc """
  Where the runs of a program with `facts` on `device_count` devices
  happen: `:scheduler`, `:dirty` or `:thread` (see "Program runs").

      iex> facts = %EXLA.MLIR.Facts{total_elements: 12}
      iex> EXLA.Placement.run_on(facts, 1)
      :scheduler
      iex> EXLA.Placement.run_on(%{facts | unbounded: ["stablehlo.while"]}, 1)
      :thread
      iex> EXLA.Placement.run_on(%{facts | total_elements: :unknown}, 1)
      :dirty
      iex> EXLA.Placement.run_on(facts, 2)
      :thread
  """
  def run_on(%Facts{}, device_count) when device_count > 1, do: :thread
  def run_on(%Facts{unbounded: [_ | _]}, _device_count), do: :thread

  def run_on(%Facts{total_elements: elements}, _device_count) do
    if is_integer(elements) and elements <= scheduler_max_elements(),
      do: :scheduler,
      else: :dirty
  end

  defp scheduler_max_elements do
    case Application.get_env(:exla, :scheduler_max_elements, @default_scheduler_elements) do
      elements when is_integer(elements) and elements >= 0 ->
        elements

      other ->
        raise ArgumentError,
              "expected :scheduler_max_elements of :exla to be a non-negative integer, " <>
                "got: #{inspect(other)}"
    end
  end

  @doc "Whether copying `bytes` to a device runs on the calling scheduler."
  defguard small_transfer?(bytes) when bytes <= @small_transfer

  @doc "Whether reading `bytes` of a ready buffer runs on the calling scheduler."
  defguard small_read?(bytes) when bytes <= @small_read

  @doc "Whether freeing a buffer of `bytes` runs on the calling scheduler."
  defguard small_delete?(bytes) when bytes < @large_buffer

  @doc """
  The size from which a buffer is large: deleting it runs on a dirty
  scheduler (`small_delete?/1`), and when its last reference goes the NIF
  destroys it on its drop thread. `EXLA.NIF` hands it to the NIF as it
  loads, so the two rules cannot drift apart.
  """
  def large_buffer_bytes, do: @large_buffer
end
