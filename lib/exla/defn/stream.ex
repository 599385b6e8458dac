defmodule EXLA.Defn.Stream do
  @moduledoc """
  `EXLA.stream/3` on the host-callback bridge; implements `Nx.Stream`.

  A stream compiles the step function `fun(input, acc, ...) -> {output, acc}`
  into one program that loops on the device:

      chunk = receive_input()            # host callback, waits for send/2
      while chunk.present:
        {output, acc} = fun(chunk.data, acc, ...)
        send_output(output)              # host callback, to the recv/1 side
        chunk = receive_input()
      return acc

  The program runs on a native thread for the life of the stream, so the
  accumulator stays on the device between chunks. `send/2` queues a chunk
  (any process may send); `recv/1` waits for the next output (only the
  process that started the stream); `done/1` ends the loop and returns the
  accumulator (only that process too).

  Errors: sending data of the wrong shape or type raises `ArgumentError`
  and the stream goes on; `done/1` with outputs not received yet ends the
  stream and raises; if the starting process dies, the native side closes
  the session and the program ends. In every case the client stays usable.
  """

  alias EXLA.MLIR.{Builder, Ops}
  alias EXLA.Defn.{Hooks, Lowering, LockedCache}
  alias Nx.Defn.Composite

  @enforce_keys [:pid, :id, :session, :input, :output, :acc, :sites, :client, :device_id]
  defstruct @enforce_keys

  @flag_type {{:u, 8}, {}}

  @doc false
  # Compiles (or fetches) the stream program and starts it.
  def start(cache_key, input, acc, vars, fun, [args], opts) do
    opts = EXLA.Defn.validate_options!(opts)
    client = EXLA.Client.fetch!(opts[:client])
    device_id = opts[:device_id]
    build = fn -> compile(client, device_id, input, acc, vars, fun, opts) end

    program =
      if opts[:cache] do
        {_, program} = LockedCache.run(cache_key, build)
        program
      else
        build.()
      end

    n_in = Composite.count(input)
    params = args |> Enum.drop(n_in) |> Enum.map(&to_buffer(&1.(), client, device_id))
    {session, id} = EXLA.NIF.callback_session(self())
    chain = <<id::64-native>>
    chain = EXLA.DeviceBuffer.place_on_device(chain, Hooks.chain_shape(), client, device_id)
    refs = Enum.map(params ++ [chain], & &1.ref)
    EXLA.NIF.unwrap!(EXLA.NIF.callback_run(program.exe.ref, session, refs, []))

    %__MODULE__{
      pid: self(),
      id: id,
      session: session,
      input: program.input,
      output: program.output,
      acc: program.acc,
      sites: program.sites,
      client: client,
      device_id: device_id
    }
  end

  defp to_buffer(
         %Nx.Tensor{data: %EXLA.Backend{buffer: %{client_name: name, device_id: id} = buffer}},
         %{name: name},
         id
       ),
       do: buffer

  defp to_buffer(%Nx.Tensor{} = t, client, device_id) do
    shape = EXLA.Defn.to_shape(t)
    EXLA.DeviceBuffer.place_on_device(Nx.to_binary(t), shape, client, device_id)
  end

  defp to_buffer(number, client, device_id) when is_number(number),
    do: to_buffer(Nx.tensor(number), client, device_id)

  ## Compilation

  defp compile(client, device_id, input, acc, vars, fun, opts) do
    expr = fun.(vars)
    {output, new_acc} = expr

    flat = Composite.flatten_list(vars)
    n_in = Composite.count(input)
    n_acc = Composite.count(acc)
    {in_params, state_params} = Enum.split(flat, n_in)
    in_types = Enum.map(in_params, &Lowering.type_of/1)
    state_types = Enum.map(state_params, &Lowering.type_of/1)
    out_tensors = Composite.flatten_list([output])
    acc_tensors = Composite.flatten_list([new_acc])

    assigns = %{
      cache: %{},
      params: {},
      used: %{},
      top: false,
      precision: opts[:precision],
      hooks: opts[:hooks] || %{},
      chain: nil,
      hook_sites: []
    }

    {mlir, b} =
      Builder.module(
        "main",
        state_types ++ [Hooks.chain_type()],
        fn b, args ->
          {state, [chain]} = Enum.split(args, -1)
          b = %{b | assigns: %{b.assigns | chain: chain}}
          {[flag | inputs], b} = Hooks.emit(b, :recv, [], [@flag_type | in_types])
          inits = [b.assigns.chain, flag | inputs ++ state]
          types = Enum.map(inits, & &1.type)

          {cond_region, b} = loop_cond(b, types)
          {body_region, b} = loop_body(b, types, n_in, expr, out_tensors, acc_tensors)
          {results, b} = Ops.while(b, inits, cond_region, body_region)
          {results |> Enum.drop(2 + n_in) |> Enum.take(n_acc), b}
        end,
        assigns
      )

    EXLA.NIF.unwrap!(EXLA.NIF.callback_install(client.ref))
    exe = EXLA.Executable.compile(client, mlir, device_id: device_id)

    %{
      exe: exe,
      sites: Map.new(b.assigns.hook_sites),
      input: Composite.traverse(input, &Nx.to_template/1),
      output: Composite.traverse(output, &Nx.to_template/1),
      acc: Composite.traverse(new_acc, &Nx.to_template/1)
    }
  end

  defp loop_cond(b, types) do
    {[_chain, flag | _], saved, b} = Builder.begin_region(b, types)
    {pred, b} = Lowering.to_pred(b, flag)
    Builder.end_region(b, saved, [pred])
  end

  defp loop_body(b, types, n_in, expr, out_tensors, acc_tensors) do
    {[chain, _flag | params], saved, b} = Builder.begin_region(b, types)
    outer = b.assigns
    b = %{b | assigns: %{outer | chain: chain, cache: %{}, params: List.to_tuple(params)}}
    {values, b} = Lowering.lower_container(expr, b)
    {outs, accs} = Enum.split(values, length(out_tensors))
    {outs, b} = convert(outs, out_tensors, b)
    {accs, b} = convert(accs, acc_tensors, b)
    {[], b} = Hooks.emit(b, :send, outs)
    in_types = params |> Enum.take(n_in) |> Enum.map(& &1.type)
    {[flag | inputs], b} = Hooks.emit(b, :recv, [], [@flag_type | in_types])
    rest = Enum.drop(params, n_in + length(accs))
    results = [b.assigns.chain, flag | inputs ++ accs ++ rest]
    b = %{b | assigns: %{outer | hook_sites: b.assigns.hook_sites}}
    Builder.end_region(b, saved, results)
  end

  defp convert(values, tensors, b) do
    Enum.zip(values, tensors)
    |> Enum.map_reduce(b, fn {v, t}, b -> Ops.convert(b, v, t.type) end)
  end

  ## Nx.Stream

  @doc false
  def send(%__MODULE__{} = stream, data) do
    binaries = input_binaries!(stream.input, data)

    case EXLA.NIF.callback_push(stream.session, binaries) do
      {:ok, :ok} -> :ok
      {:error, {_, message}} -> raise RuntimeError, "cannot send to the stream: #{message}"
    end
  end

  defp input_binaries!(template, data) do
    templates = Composite.flatten_list([template])

    tensors =
      try do
        Composite.flatten_list([data])
      rescue
        _ ->
          raise ArgumentError, "cannot send #{inspect(data)} to a stream of #{inspect(template)}"
      end

    if length(tensors) != length(templates) do
      raise ArgumentError,
            "expected the stream data to match #{inspect(template)}, got: #{inspect(data)}"
    end

    Enum.zip_with(tensors, templates, fn tensor, t ->
      tensor = Nx.to_tensor(tensor)

      if tensor.type != t.type or tensor.shape != t.shape do
        raise ArgumentError,
              "expected the stream data to have type #{inspect(t.type)} and shape " <>
                "#{inspect(t.shape)}, got type #{inspect(tensor.type)} and shape " <>
                "#{inspect(tensor.shape)}"
      end

      Nx.to_binary(tensor)
    end)
  end

  @doc false
  def recv(%__MODULE__{id: id} = stream) do
    owner!(stream, "recv")

    receive do
      {:exla_callback, ^id, site, binaries} ->
        case Map.fetch!(stream.sites, site) do
          :send ->
            Hooks.to_container(stream.output, binaries)

          {:hook, _name, fun, template} ->
            fun.(Hooks.to_container(template, binaries))
            recv(stream)
        end

      {:exla_run, ^id, result} ->
        raise RuntimeError, "the stream ended before recv/1: #{describe(result)}"
    end
  end

  @doc false
  def done(%__MODULE__{id: id} = stream) do
    owner!(stream, "done")
    EXLA.NIF.callback_done(stream.session)
    {pending, result} = await_end(id, 0)
    EXLA.NIF.callback_close(stream.session)

    case result do
      {:ok, refs} when pending == 0 ->
        shapes = Enum.map(Composite.flatten_list([stream.acc]), &EXLA.Defn.to_shape/1)

        buffers =
          Enum.zip_with(refs, shapes, fn ref, shape ->
            EXLA.DeviceBuffer.from_ref(ref, stream.client, stream.device_id, shape)
          end)

        {acc, []} =
          Composite.traverse(stream.acc, buffers, fn t, [buffer | rest] ->
            {%{t | data: %EXLA.Backend{buffer: buffer}}, rest}
          end)

        acc

      {:ok, _} ->
        raise RuntimeError,
              "done/1 was called on a stream with #{pending} result(s) not received " <>
                "with recv/1; the stream is ended and they were discarded"

      other ->
        raise RuntimeError, "the stream failed: #{describe(other)}"
    end
  end

  defp await_end(id, pending) do
    receive do
      {:exla_callback, ^id, _site, _binaries} -> await_end(id, pending + 1)
      {:exla_run, ^id, result} -> {pending, result}
    end
  end

  defp describe({:error, {_kind, message}}), do: message
  defp describe(other), do: inspect(other)

  defp owner!(%{pid: pid}, what) do
    if pid != self() do
      raise ArgumentError,
            "EXLA streams can only #{what} in the process that started them " <>
              "(#{inspect(pid)}), called from #{inspect(self())}"
    end
  end

  defimpl Nx.Stream do
    def send(stream, data), do: EXLA.Defn.Stream.send(stream, data)
    def recv(stream), do: EXLA.Defn.Stream.recv(stream)
    def done(stream), do: EXLA.Defn.Stream.done(stream)
  end
end
