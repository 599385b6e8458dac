defmodule EXLA.HostCallback do
  @moduledoc false

  # Runs programs that call back into the BEAM, and serves their calls
  # (internal). The only user of the `callback_*` NIFs.
  #
  # A program with host callbacks (hooks, lazy inputs, streams; emitted by
  # `EXLA.Defn.Lowering.HostCalls`) takes a *chain* as its last parameter: the id
  # of a native *session* owned by the process that runs it. Each call site
  # of the program has a number, and the lowering describes each site with a
  # *payload*; `sites` maps one to the other:
  #
  #   * `{:hook, name, fun, template}` - the program hands over hooked
  #     values: `fun` is called, in the owner, with them rebuilt after
  #     `template` (see `container/2`);
  #
  #   * `{:runtime_call, fun, template, out, opts}` - the program hands over
  #     the input of `Nx.runtime_call/4` and waits (at the `:recv` site
  #     that follows) for `fun.(input, opts)`, checked against `out`;
  #
  #   * `{:input, index}` - the program needs lazy input `index`: the run's
  #     `:fetch_input` function gives its binary, which is pushed to the
  #     session (and `[:exla, :lazy_transfer]` is emitted);
  #
  #   * `:recv` - the program waits for data pushed with `push!/2` or for the
  #     done marker queued by `finish/1`; such sites never message the owner;
  #
  #   * `:send` - the program hands an output to the owner (a stream's
  #     output): `next/1` returns it.
  #
  # ## A run
  #
  # `start!/4` opens the session, places the chain on the device and hands
  # the program to a native thread (programs with callbacks never run on a
  # scheduler: they may wait for the host). The calls and, last, the run's
  # result arrive as messages to the owner, which `next/1` serves in program
  # order. `run!/4` is a whole run for programs without `:send` sites.
  #
  # Errors take one path: native errors become exceptions through
  # `EXLA.NIF.unwrap!/1`, whether a NIF returns them or the run ends with
  # one. When the owner raises while a run is in flight (a hook or a lazy
  # input raised), `abort/1` closes the session, so the program fails at its
  # next call, and waits for the run to end, dropping its messages: nothing
  # is left running and no message is left behind. If the owner dies, the
  # native side closes its sessions.

  alias EXLA.NIF
  alias Nx.Defn.Composite

  @enforce_keys [:session, :id, :exe, :sites, :fetch_input, :counters]
  defstruct @enforce_keys

  @typedoc "A run in flight, as `start!/4` returns it."
  @type t :: %__MODULE__{}

  # Slots of `:counters`: outputs taken by `next/1`, and whether the run's
  # result has been taken (the run has ended).
  @taken 1
  @ended 2

  # The chain: the session's id, a u64 scalar (the NIF reads it so).
  @chain_type {:u, 64}
  @chain_shape EXLA.Shape.make_shape(@chain_type, {})

  @doc "The type of the chain, the last parameter of a program with host callbacks."
  def chain_type, do: @chain_type

  @doc """
  Registers the callback handler with the plugin of `client`; needed once
  before compiling a program with callbacks.
  """
  def install!(client), do: NIF.unwrap!(NIF.callback_install(EXLA.Client.local(client).ref))

  @doc """
  How many host-callback sessions are open in the VM: one per run of a
  program with host callbacks (hooks, lazy inputs, a stream) that has not
  ended and been taken. A diagnostic: a count that stays above zero while
  nothing runs shows runs that were started and never finished nor
  aborted (each holds its buffers and its owner's messages).
  """
  def session_count, do: NIF.callback_session_count()

  @doc """
  Runs `exe` on `buffers` (run arguments as `EXLA.Executable.run/3` takes
  them, before the chain) to the end and returns the output buffers,
  serving every call meanwhile.

  Options:

    * `:fetch_input` - a function from a lazy input's index to its binary
      (required when the program has `{:input, index}` sites)

    * `:donate` - the positions of the buffers the run may donate.
      Defaults to `[]`
  """
  def run!(exe, buffers, sites, opts \\ []) do
    run = start!(exe, buffers, sites, opts)

    try do
      {:done, outputs} = next(run)
      outputs
    catch
      kind, reason ->
        abort(run)
        :erlang.raise(kind, reason, __STACKTRACE__)
    end
  end

  @doc """
  Starts `exe` on `buffers` with a new session owned by the calling process
  and returns the run. Takes the options of `run!/4`.
  """
  def start!(exe, buffers, sites, opts \\ []) do
    # Resources of other nodes are brought here first (see EXLA.Remote).
    %{client: client, device_id: device_id} = exe = EXLA.Remote.local_executable!(exe)
    # Arguments are placed as a run's are, before the session opens.
    refs = EXLA.Executable.argument_refs(buffers, client, device_id)
    {session, id} = NIF.callback_session(self())
    chain = EXLA.DeviceBuffer.place_on_device(<<id::64-native>>, @chain_shape, client, device_id)
    refs = refs ++ [chain.ref]

    checked = exe.facts.run_checks

    with {:error, _} = error <-
           NIF.callback_run(exe.ref, session, refs, opts[:donate] || [], checked) do
      NIF.callback_close(session)
      NIF.unwrap!(error)
    end

    %__MODULE__{
      session: session,
      id: id,
      exe: exe,
      sites: sites,
      fetch_input: opts[:fetch_input] || (&no_lazy_inputs/1),
      counters: :atomics.new(2, signed: false)
    }
  end

  @doc """
  Serves the run's calls, in the owner, until the next output or the end:

    * `{:output, binaries}` - a `:send` site's values, one binary each;
    * `{:done, buffers}` - the run ended; its output buffers;
    * `:ended` - the run's end was already taken by an earlier call.

  The session is closed once the run's end is taken. Raises when the run
  fails (the run is then ended) and lets exceptions of hooks and of
  `:fetch_input` through (the run goes on: see `abort/1`).
  """
  def next(%__MODULE__{id: id, counters: counters} = run) do
    if :atomics.get(counters, @ended) == 1 do
      :ended
    else
      receive do
        {:exla_callback, ^id, site, binaries} ->
          case Map.fetch!(run.sites, site) do
            :send ->
              :atomics.add(counters, @taken, 1)
              {:output, binaries}

            payload ->
              serve(payload, binaries, run)
              next(run)
          end

        {:exla_run, ^id, result} ->
          :atomics.put(counters, @ended, 1)
          close(run)
          {:done, outputs(NIF.unwrap!(result), run.exe)}
      end
    end
  end

  defp serve({:hook, _name, fun, template}, binaries, _run) do
    fun.(container(template, binaries))
  end

  defp serve({:runtime_call, fun, template, out, opts}, binaries, run) do
    result = fun.(container(template, binaries), opts)
    outputs = runtime_call_outputs!(result, out)
    # A closed session means the run already failed; its result says why.
    binaries = Enum.map(outputs, &EXLA.Shape.to_packed(Nx.to_binary(&1), &1.type))
    _ = NIF.callback_push(run.session, binaries)
    :ok
  end

  defp serve({:input, index}, [], run) do
    binary = run.fetch_input.(index)

    unless is_binary(binary) do
      raise ArgumentError, "lazy input #{index} must be a binary, got: #{inspect(binary)}"
    end

    :telemetry.execute([:exla, :lazy_transfer], %{bytes: byte_size(binary)}, %{input: index})
    # A closed session means the run already failed; its result says why.
    _ = NIF.callback_push(run.session, [binary])
    :ok
  end

  # The tensors of a runtime call's result, checked against its template
  # (as Nx.Defn.Evaluator checks them).
  defp runtime_call_outputs!(result, out) do
    expected = Composite.flatten_list([out])
    got = Composite.flatten_list([result])

    compatible? =
      length(got) == length(expected) and
        Enum.all?(Enum.zip(got, expected), fn {g, e} ->
          match?(%Nx.Tensor{}, g) and g.type == e.type and g.shape == e.shape and
            g.vectorized_axes == e.vectorized_axes
        end)

    unless compatible? do
      raise ArgumentError,
            "expected the runtime_call function to match the given output template " <>
              "#{inspect(out)}, got: #{inspect(result)}"
    end

    got
  end

  defp no_lazy_inputs(index) do
    raise ArgumentError, "the program requested input #{index}, but it has no lazy inputs"
  end

  defp outputs(refs, %{client: client, device_id: device_id, output_shapes: shapes}) do
    Enum.zip_with(refs, shapes, &EXLA.DeviceBuffer.from_ref(&1, client, device_id, &2))
  end

  @doc """
  Queues `binaries` (one per tensor) for the run's next `:recv` site. Any
  process may push. Raises when the run takes no more data.
  """
  def push!(%__MODULE__{session: session}, binaries) do
    NIF.unwrap!(NIF.callback_push(session, binaries))
  end

  @doc """
  Queues the done marker for the run's next `:recv` site, unless a pushed
  chunk has not had its output taken by `next/1` yet. Returns `:ok`,
  `{:pending, count}` (nothing is queued) or `:ended`.
  """
  def finish(%__MODULE__{counters: counters} = run) do
    if :atomics.get(counters, @ended) == 1 do
      :ended
    else
      case NIF.unwrap!(NIF.callback_done(run.session, :atomics.get(counters, @taken))) do
        0 -> :ok
        pending -> {:pending, pending}
      end
    end
  end

  @doc "Closes the run's session: a program still running fails at its next call."
  def close(%__MODULE__{session: session}) do
    NIF.callback_close(session)
    :ok
  end

  @doc """
  Closes the session and, unless its end was taken, waits for the run to
  end, dropping its messages. For owners that stop serving a run.
  """
  def abort(%__MODULE__{id: id, counters: counters} = run) do
    close(run)
    if :atomics.get(counters, @ended) == 0, do: drain(id)
    :atomics.put(counters, @ended, 1)
    :ok
  end

  defp drain(id) do
    receive do
      {:exla_callback, ^id, _site, _binaries} -> drain(id)
      {:exla_run, ^id, _result} -> :ok
    end
  end

  ## Values

  @doc """
  Rebuilds a container after `template` (tensor templates) from one binary
  per tensor, on `Nx.BinaryBackend`. Vectorized templates give vectorized
  tensors.
  """
  def container(template, binaries) do
    tensors = template |> List.wrap() |> Composite.flatten_list()

    datas =
      Enum.zip_with(binaries, tensors, fn binary, t ->
        %Nx.BinaryBackend{state: EXLA.Shape.from_device(binary, t.type, Nx.size(t))}
      end)

    fill(template, datas)
  end

  @doc """
  Puts one backend data struct per tensor (in order) in the tensors of
  `template`, a container of templates.
  """
  def fill(template, datas) do
    {container, []} =
      Composite.traverse(template, datas, fn t, [data | rest] -> {%{t | data: data}, rest} end)

    container
  end
end
