# Streams exist on Nx 0.7 only (see EXLA.stream/3).
if EXLA.NxVersion.streams?() do
  defmodule EXLA.Defn.Stream do
    @moduledoc false

    # `EXLA.stream/3` on host callbacks; implements `Nx.Stream`.
    #
    # A stream compiles the step function `fun(input, acc, ...) -> {output, acc}`
    # into one program that loops on the device:
    #
    #     chunk = receive_input()            # host callback, waits for send/2
    #     while chunk.present:
    #       {output, acc} = fun(chunk.data, acc, ...)
    #       send_output(output)              # host callback, to the recv/1 side
    #       chunk = receive_input()
    #     return acc
    #
    # The step is lowered by `EXLA.Defn.Lowering` as any jitted function is, so
    # every op and hook works inside it. The program runs (see
    # `EXLA.HostCallback`) for the life of the stream, so the accumulator stays
    # on the device between chunks. `send/2` queues a chunk (any process may
    # send); `recv/1` waits for the next output and `done/1` ends the loop and
    # returns the accumulator on the device (only the process that started the
    # stream may call them; hooks of the step run in that process, during
    # `recv/1` and `done/1`).
    #
    # The errors users see are documented in `EXLA.stream/3`.
    #
    # Unlike EXLA 0.7.2, which ran streams on infeed and outfeed and locked the
    # device while a stream was open, other programs run on the device while a
    # stream is open, and any process may send.

    require Logger

    alias EXLA.HostCallback
    alias EXLA.MLIR.{Builder, Ops}
    alias EXLA.Defn.Lowering
    alias EXLA.LockedCache
    alias EXLA.Defn.Lowering.HostCalls
    alias Nx.Defn.Composite

    @enforce_keys [:pid, :run, :input, :read_input, :output, :acc, :client, :device_id]
    defstruct @enforce_keys

    @doc false
    # Compiles (or fetches) the stream program of the function `key`,
    # cached under `cache_key` (EXLA.Defn.stream_cache_key/3), and starts it.
    def start(key, cache_key, input, _acc, vars, fun, [args], opts) do
      opts = EXLA.Defn.Compilation.validate_options!(opts)
      client = EXLA.Client.fetch!(opts[:client])
      device_id = opts[:device_id]
      compile = &compile(client, device_id, input, vars, &1, opts)
      build = fn -> EXLA.Defn.Compilation.compilation(key, vars, fun, opts, compile) end

      {_hit_miss_or_off, program} =
        LockedCache.fetch_or_build(opts[:cache], cache_key, :permanent, build)

      if opts[:debug],
        do: EXLA.Defn.Call.log_device_wait(device_id, System.monotonic_time(:microsecond))

      {time, stream} = :timer.tc(fn -> run(program, input, args, client, device_id) end)

      if opts[:debug] do
        Logger.debug(
          "EXLA stream start on device #{device_id} in #{Float.round(time / 1000, 1)}ms"
        )
      end

      stream
    end

    defp run(program, input, args, client, device_id) do
      n_in = Composite.count(input)

      # Only the state the program takes: arguments it does not use are not
      # built nor transferred. They are its parameters, in order, before the
      # chain.
      kept =
        for {arg, i} <- args |> Enum.drop(n_in) |> Enum.with_index(), i in program.state, do: arg

      params =
        Enum.zip_with(
          kept,
          program.exe.input_shapes,
          &EXLA.Defn.Call.to_buffer(&1, &2, client, device_id)
        )

      %__MODULE__{
        pid: self(),
        run: HostCallback.start!(program.exe, params, program.sites),
        input: program.input,
        read_input: program.read_input,
        output: program.output,
        acc: program.acc,
        client: client,
        device_id: device_id
      }
    end

    ## Compilation

    # Returns the stream's program and where its executable came from (see
    # EXLA.CompileCache.Memory.compile/4).
    defp compile(client, device_id, input, vars, expr, opts) do
      {output, new_acc} = expr
      n_in = Composite.count(input)
      types = vars |> Composite.flatten_list() |> Enum.map(&Lowering.type_of/1)
      {in_types, state_types} = Enum.split(types, n_in)

      # Only the input fields the step reads are received, so send/2 builds
      # and sends only those.
      read = Lowering.read_inputs(expr)
      read_input = for i <- 0..(n_in - 1)//1, i in read, do: i

      step = %{
        expr: expr,
        in_types: in_types,
        read_input: read_input,
        outputs: Composite.flatten_list([output]),
        accs: Composite.flatten_list([new_acc])
      }

      # The accumulator is always taken (it is the result when no chunk
      # comes), the other arguments only when the step reads them.
      n_acc = length(step.accs)
      kept = for i <- 0..(length(state_types) - 1)//1, i < n_acc or (n_in + i) in read, do: i
      kept_set = MapSet.new(kept)
      step = Map.put(step, :kept, kept_set)

      state =
        Lowering.new_state(
          [precision: opts[:precision], hooks: opts[:hooks] || %{}] ++
            Lowering.client_options(client)
        )

      main = &main(&1, &2, step)
      # The kept parameters (and the chain, last) are known before lowering,
      # so the builder the :kept function is given is not needed.
      kept_params = kept ++ [length(state_types)]

      {program, b} =
        Builder.module("main", state_types ++ [HostCalls.chain_type()], main, state,
          kept: fn _b -> kept_params end
        )

      HostCallback.install!(client)
      compile_opts = [device_id: device_id]
      # As jit's: a stream whose program is the text of one compiled before
      # takes its executable (the sites, kept beside it, are this stream's).
      {exe, disk_cache} =
        EXLA.CompileCache.Memory.compile(client, program, compile_opts, opts[:cache])

      stream_program = %{
        exe: exe,
        state: kept_set,
        read_input: MapSet.new(read_input),
        sites: Map.new(b.assigns.hook_sites),
        input: Composite.traverse(input, &Nx.to_template/1),
        output: Composite.traverse(output, &Nx.to_template/1),
        acc: Composite.traverse(new_acc, &Nx.to_template/1)
      }

      {stream_program, disk_cache}
    end

    # The loop carries the step's parameters (input, then state: the
    # accumulator and the other arguments), the chain and the flag of the
    # last receive, in that order: the body region's arguments are the
    # step's parameters by position. The module returns the accumulator.
    defp main(b, args, step) do
      {state, [chain]} = Enum.split(args, -1)
      {state, b} = unread_as_zeros(state, step.kept, b)
      {[flag | inputs], b} = recv_input(HostCalls.put_chain(b, chain), step)
      inits = inputs ++ state ++ [HostCalls.chain(b), flag]
      types = Enum.map(inits, & &1.type)

      {cond_region, b} =
        Lowering.region(b, types, :isolated, fn b, args ->
          {pred, b} = Lowering.to_pred(b, List.last(args))
          {[pred], b}
        end)

      {body_region, b} = Lowering.region(b, types, :isolated, &loop_body(&1, &2, step))
      {results, b} = Ops.while(b, inits, cond_region, body_region)
      {results |> Enum.drop(length(inputs)) |> Enum.take(length(step.accs)), b}
    end

    # One step: computes the output and the new accumulator, hands the
    # output to the host and receives the next chunk.
    defp loop_body(b, args, step) do
      {params, [chain, _flag]} = Enum.split(args, -2)
      {values, b} = Lowering.lower_container(step.expr, HostCalls.put_chain(b, chain))
      {outs, accs} = Enum.split(values, length(step.outputs))
      {outs, b} = Lowering.convert_each(outs, step.outputs, b)
      {accs, b} = Lowering.convert_each(accs, step.accs, b)
      b = HostCalls.emit_send(b, outs)
      {[flag | inputs], b} = recv_input(b, step)
      rest = Enum.drop(params, length(inputs) + length(accs))
      {inputs ++ accs ++ rest ++ [HostCalls.chain(b), flag], b}
    end

    # Receives a chunk: the input fields the step reads, in order, and zeros
    # in place of the others (the loop carries every field; XLA drops the
    # unread ones). Returns `{[flag | inputs], b}`.
    defp recv_input(b, step) do
      read_types = for i <- step.read_input, do: Enum.at(step.in_types, i)
      {[flag | read], b} = HostCalls.emit_recv(b, read_types)
      fields = Enum.zip(step.read_input, read) |> Map.new()

      {inputs, b} =
        step.in_types
        |> Enum.with_index()
        |> Enum.map_reduce(b, fn {{elem, dims}, i}, b ->
          case fields do
            %{^i => value} -> {value, b}
            %{} -> Lowering.const(b, elem, 0, dims)
          end
        end)

      {[flag | inputs], b}
    end

    # The arguments the program does not take still have their place in the
    # loop (the step's parameters are positional): zeros of their type,
    # which XLA drops as the loop never reads them.
    defp unread_as_zeros(state, kept, b) do
      state
      |> Enum.with_index()
      |> Enum.map_reduce(b, fn {%{type: {elem, dims}} = value, i}, b ->
        if i in kept, do: {value, b}, else: Lowering.const(b, elem, 0, dims)
      end)
    end

    ## Nx.Stream

    @doc false
    def send(%__MODULE__{} = stream, data) do
      {template, funs} = traverse_input!(stream, data)

      unless Nx.compatible?(stream.input, template) do
        raise ArgumentError, """
        Nx stream expected a tensor of type, shape, and names on send:

        #{inspect(stream.input)}

        But got tensor:

        #{inspect(template)}
        """
      end

      # Only the fields the step reads are built (a lazy container's others
      # are never called).
      binaries =
        for {fun, i} <- funs |> Enum.reverse() |> Enum.with_index(),
            i in stream.read_input,
            do: fun.() |> Nx.devectorize() |> Nx.to_binary()

      HostCallback.push!(stream.run, binaries)
    end

    # The templates and the functions that build the data's tensors. Data
    # that is not a container of tensors (a list, an atom, a string) matches
    # no input either: it raises the same ArgumentError as a mismatch, not
    # the protocol's error.
    defp traverse_input!(stream, data) do
      Nx.LazyContainer.traverse(data, [], fn template, fun, funs -> {template, [fun | funs]} end)
    rescue
      e in Protocol.UndefinedError ->
        if e.protocol in [Nx.LazyContainer, Nx.Container] do
          reraise ArgumentError,
                  """
                  Nx stream expected a tensor of type, shape, and names on send:

                  #{inspect(stream.input)}

                  But got #{inspect(e.value)}, which is not a tensor or a container \
                  of tensors.#{if e.description not in [nil, ""], do: " " <> e.description}
                  """,
                  __STACKTRACE__
        else
          reraise e, __STACKTRACE__
        end
    end

    @doc false
    def recv(%__MODULE__{} = stream) do
      owner!(stream, "recv")

      case HostCallback.next(stream.run) do
        {:output, binaries} ->
          HostCallback.container(stream.output, binaries)

        _ended ->
          raise RuntimeError, "cannot recv from stream because it has been terminated"
      end
    end

    @doc false
    def done(%__MODULE__{run: run} = stream) do
      owner!(stream, "done")

      case HostCallback.finish(run) do
        :ok ->
          {:done, buffers} = HostCallback.next(run)
          HostCallback.fill(stream.acc, Enum.map(buffers, &%EXLA.Backend{buffer: &1}))

        {:pending, _count} ->
          raise RuntimeError, "cannot mark stream as done when there are recv messages pending"

        :ended ->
          raise RuntimeError, "cannot mark stream as done because it has been terminated"
      end
    end

    defp owner!(%{pid: pid}, what) do
      if pid != self() do
        raise RuntimeError,
              "EXLA streams require #{what} to be called from the process that started " <>
                "the stream (#{inspect(pid)}), called from #{inspect(self())}"
      end
    end

    defimpl Nx.Stream do
      def send(stream, data), do: EXLA.Defn.Stream.send(stream, data)
      def recv(stream), do: EXLA.Defn.Stream.recv(stream)
      def done(stream), do: EXLA.Defn.Stream.done(stream)
    end
  end
end
