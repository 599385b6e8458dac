defmodule EXLA.Defn.Call do
  @moduledoc false

  # The per-call path of compiled defn functions. A cached call does, in
  # order:
  #
  #   1. builds the cache key from the argument templates (a short list of
  #      `{type, shape, names, vectorized_axes}` tuples, EXLA.Defn);
  #   2. looks the key up in `:persistent_term` (no copy, no message);
  #   3. for each argument the program uses, takes the device buffer of a
  #      tensor already on the executable's client and device as is, copies
  #      buffers from other EXLA devices, and sends any other tensor's binary
  #      to the device; arguments the program does not use are skipped
  #      without being read (a template or an unused `Nx.LazyContainer` is
  #      never built), as in EXLA 0.7;
  #   4. runs the executable once;
  #   5. wraps each output buffer in the precomputed output template.
  #
  # No expression is built, nothing is lowered, no program text is hashed
  # and no tensor data is copied for arguments already on the device.
  # Functions returned by `EXLA.compile/3` skip steps 1 and 2 entirely.
  # Nothing here depends on the Nx line: it adds no work per call.

  require Logger

  alias Nx.Tensor, as: T
  alias EXLA.Defn.Compiled

  ## Running

  @doc false
  def run_list(compiled, [args]), do: [run_one(compiled, args)]
  def run_list(compiled, args_list), do: Enum.map(args_list, &run_one(compiled, &1))

  @doc false
  def run_one(%Compiled{exe: exe, build: build, callbacks: nil} = compiled, args) do
    buffers = to_buffers(args, compiled.input_shapes, compiled.client, compiled.device_id)
    [outputs] = EXLA.Executable.run(exe, [buffers], run_options(compiled.donate))
    build.(outputs)
  end

  def run_one(%Compiled{callbacks: %{lazy: lazy}} = c, args) do
    inputs = List.to_tuple(args)
    shapes = List.to_tuple(c.input_shapes)

    if tuple_size(inputs) != tuple_size(shapes) do
      raise ArgumentError,
            "expected #{tuple_size(shapes)} arguments for the compiled function, " <>
              "got: #{tuple_size(inputs)}"
    end

    # Inputs already on a device are passed as parameters.
    resident = Enum.map(args, &resident/1)
    device = for {%T{}, i} <- Enum.with_index(resident), do: i
    c = if device == lazy.device, do: c, else: lazy.variant.(device)

    buffers =
      for {%T{} = tensor, i} <- Enum.with_index(resident),
          do: to_buffer(tensor, elem(shapes, i), c.client, c.device_id)

    fetch = fn i -> lazy_binary(elem(inputs, i), elem(shapes, i)) end
    # Parameters are the device inputs, in order.
    donate = for {i, position} <- Enum.with_index(device), i in c.donate, do: position
    opts = [fetch_input: fetch, donate: donate]
    c.build.(EXLA.HostCallback.run!(c.exe, buffers, c.callbacks, opts))
  end

  def run_one(%Compiled{exe: exe, build: build, callbacks: sites} = compiled, args) do
    buffers = to_buffers(args, compiled.input_shapes, compiled.client, compiled.device_id)
    build.(EXLA.HostCallback.run!(exe, buffers, sites, donate: compiled.donate))
  end

  # No options at all for the usual run: EXLA.Executable.run/3 skips them.
  defp run_options([]), do: []
  defp run_options(donate), do: [donate: donate]

  # The EXLA tensor a lazy input already is, or nil. Nx hands lazy inputs
  # as functions; only those of Nx.Tensor's Nx.LazyContainer implementation
  # are called here (they return a tensor that already exists), so other
  # lazy containers are only built when the program needs them.
  defp resident(fun) when is_function(fun, 0) do
    case Function.info(fun, :module) do
      {:module, Nx.LazyContainer.Nx.Tensor} -> resident(fun.())
      _ -> nil
    end
  end

  defp resident(%T{data: %EXLA.Backend{}} = tensor), do: tensor
  defp resident(_arg), do: nil

  # The binary of a lazy input, read when the program asks for it.
  defp lazy_binary(fun, shape) when is_function(fun, 0), do: lazy_binary(fun.(), shape)

  defp lazy_binary(%T{} = tensor, shape),
    do: tensor |> Nx.to_binary() |> EXLA.Shape.to_packed(shape.dtype)

  defp lazy_binary(number, shape) when is_number(number),
    do: lazy_binary(Nx.tensor(number, type: shape.dtype), shape)

  # An input the program does not take (its shape is nil) is skipped
  # without being looked at: a template or a lazy container stays unbuilt.
  defp to_buffers([_arg | args], [nil | shapes], client, device_id),
    do: to_buffers(args, shapes, client, device_id)

  defp to_buffers([arg | args], [shape | shapes], client, device_id),
    do: [to_buffer(arg, shape, client, device_id) | to_buffers(args, shapes, client, device_id)]

  defp to_buffers([], [], _client, _device_id), do: []

  defp to_buffers(args, shapes, _client, _device_id) do
    raise ArgumentError,
          "expected #{length(shapes)} arguments for the compiled function, got: #{length(args)}"
  end

  @doc false
  # The one path from an argument of a compiled function (a tensor, a
  # number, or a function that returns one) to a run's argument (see
  # EXLA.Executable.run/3) on `device_id` of `client`: a tensor's device
  # buffer as it is when it is there already, copied from other EXLA
  # devices (and nodes, see EXLA.Remote), and any other data as
  # `{binary, shape}`, which the run sends to the device.
  def to_buffer(fun, shape, client, device_id) when is_function(fun, 0),
    do: to_buffer(fun.(), shape, client, device_id)

  def to_buffer(
        %T{data: %EXLA.Backend{buffer: %{ref: ref, client_name: name, device_id: id} = buffer}},
        _shape,
        %{name: name},
        id
      )
      when node(ref) == node(),
      do: buffer

  def to_buffer(%T{data: %EXLA.Backend{buffer: %{ref: ref} = buffer}}, _shape, client, device_id)
      when node(ref) == node() do
    transferable!(buffer, client, device_id)
    EXLA.DeviceBuffer.copy_to_device(buffer, client, device_id)
  end

  def to_buffer(%T{data: %EXLA.Backend{buffer: buffer}}, _shape, client, device_id),
    do: EXLA.DeviceBuffer.copy_to_device(buffer, client, device_id)

  def to_buffer(%T{} = tensor, shape, _client, _device_id), do: {Nx.to_binary(tensor), shape}

  def to_buffer(number, shape, _client, _device_id) when is_number(number),
    do: {number |> Nx.tensor(type: shape.dtype) |> Nx.to_binary(), shape}

  # A tensor of another device of this node is copied where the program
  # runs only when its client has :automatic_transfers (see EXLA.Client);
  # otherwise EXLA raises, with these words first. (Another node's tensor
  # is read through its owner, as EXLA reads it.)
  defp transferable!(buffer, client, device_id) do
    source = EXLA.Client.fetch!(buffer.client_name)

    unless source.automatic_transfers do
      default = EXLA.Client.fetch!(EXLA.Client.default_name())

      raise ArgumentError, """
      EXLA computation (defn) is allocated on client #{client.name} ##{device_id} \
      (#{client.platform}) but one of the input tensors are allocated on \
      #{source.name} ##{buffer.device_id} (#{source.platform}).

      Client #{inspect(source.name)} has automatic_transfers: false (the default of \
      clients of other platforms than :host), so its tensors are not copied to other \
      devices implicitly. Move the tensor with Nx.backend_transfer/2 or \
      Nx.backend_copy/2, create it on the client and device that run the computation \
      (the default client and device are #{default.name} ##{default.default_device_id}, \
      #{default.platform}), or give #{inspect(source.name)} automatic_transfers: true \
      in its configuration.
      """
    end
  end

  @doc false
  def run_compiled(%Compiled{debug?: false} = compiled, args_list),
    do: run_list(compiled, args_list)

  def run_compiled(compiled, args_list), do: debug_run(compiled, args_list)

  ## Debug

  @doc false
  def debug_hit(compiled, args_list) do
    log_hits(compiled.name, 0)
    debug_run(compiled, args_list)
  end

  @doc false
  def debug_run(compiled, args_list) do
    log_device_wait(compiled.device_id, System.monotonic_time(:microsecond))
    {time, result} = :timer.tc(fn -> run_list(compiled, args_list) end)
    Logger.debug("EXLA execution on device #{compiled.device_id} in #{ms(time)}ms")
    result
  end

  @doc false
  # EXLA 0.7 serializes the runs of a device with a lock and, with debug:
  # true, logs the wait for it. This EXLA takes no lock: the plugin queues
  # the executions of a device itself, and concurrent calls (and streams)
  # hand theirs over without waiting for each other. The line keeps EXLA's
  # words, with the real time from the run request (`requested`, in
  # monotonic microseconds) to the start of the run, which nothing delays
  # here (0.0ms but for scheduling noise). What a run may still wait for
  # (a free dirty scheduler or a run thread, see EXLA.Executable, and the
  # plugin's queue) cannot be told apart from the run: it is part of the
  # execution time logged next.
  def log_device_wait(device_id, requested) do
    waited = System.monotonic_time(:microsecond) - requested
    Logger.debug("EXLA device #{device_id} lock in #{ms(waited)}ms")
  end

  @doc false
  # `name` is the function's key, inspected (EXLA.SharedTerm.inspect/2).
  def log_hits(name, time) do
    Logger.debug("EXLA defn evaluation #{name} cache hit in #{ms(time)}ms")
    Logger.debug("EXLA compilation #{name} cache hit in #{ms(time)}ms")
  end

  defp ms(us), do: Float.round(us / 1000, 1)

  @doc false
  # Runs `compiled` on `args` and returns the list of output buffers.
  def run_buffers(%Compiled{exe: exe} = compiled, args) do
    buffers = to_buffers(args, compiled.input_shapes, compiled.client, compiled.device_id)
    [outputs] = EXLA.Executable.run(exe, [buffers])
    outputs
  end
end
