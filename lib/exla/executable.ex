defmodule EXLA.Executable do
  @moduledoc """
  A program compiled by a PJRT plugin for one client.

  Programs are StableHLO MLIR text whose entry point is `@main`. Every run
  checks its arguments against the parameter shapes, since the plugins do
  not. Hand-written programs are checked before they are compiled:
  tensors that do not fit the client (see `EXLA.Client.max_tensor_bytes/1`),
  over-long FFTs, recursive calls and infeed, outfeed, send or recv raise
  `ArgumentError`.

  ## Where programs run

  No program runs long on a normal scheduler of the VM. Each executable
  keeps the facts known about its program (the ops that may run for
  unbounded time, its largest tensor, the elements its ops touch) and
  EXLA's placement policy decides from them where its runs happen
  (`:run_on`; the README's "Where native calls run"): on the calling process's scheduler for small straight-line
  programs, on a dirty CPU scheduler for larger ones, and on a native
  thread of EXLA, replying by message, for programs with loops, host
  callbacks or collectives and for programs of several devices. A loaded
  executable (from `deserialize/2` or the compile cache) is placed again
  by the policy of the VM that loads it.

  Compiling, serializing and deserializing always run on native threads
  with a large stack (XLA recurses per op and per nesting level).

  ## Several devices

  A program compiled with more than one replica or partition runs on
  `num_replicas * num_partitions` devices of its client at once (at most
  the client's device count): `:devices` lists them, and `run/3` takes one
  list of arguments per device, in that order, and runs them together on
  a native thread. With several partitions, XLA's SPMD partitioner splits
  the program following its sharding annotations: `mhlo.sharding` for
  GSPMD (the default), `sdy.mesh` and `sdy.sharding` for Shardy (`partitioner:
  :shardy`), which also gives each result the sharding it propagates to it
  where the program leaves it open (GSPMD replicates such results). Each
  device's parameters and results are its part's (see `EXLA.shard_jit/3`). The
  parameter shapes read from a hand-written program's `@main` are the
  whole tensors', so such a program needs each device's part's shapes as
  `:input_shapes` (otherwise its runs are refused: their arguments do not
  match).

  ## Executables of other nodes

  An executable sent to another node is loaded there on its first run:
  that node asks the executable's own node for its serialized form and
  loads it as `deserialize/2` does (integrity and plugin checked), once,
  and keeps it. Its client there is the one of the same name. A node whose
  plugin differs cannot load it and raises; `EXLA.compile/3`'s functions
  compile their program again instead.
  """

  require EXLA.Remote, as: Remote
  alias EXLA.{DeviceBuffer, NIF, Placement, Shape}
  alias EXLA.Executable.{Options, Serialized}
  alias EXLA.MLIR.Program

  @enforce_keys [:ref, :client, :device_id, :input_shapes, :output_shapes, :facts]
  defstruct [
    :ref,
    :client,
    :device_id,
    :input_shapes,
    :output_shapes,
    :devices,
    :facts,
    num_replicas: 1,
    num_partitions: 1,
    run_on: :thread
  ]

  @doc """
  Compiles a program on `client`: StableHLO MLIR text, or the program
  struct of EXLA's own lowering (internal).

  The parameter shapes and the facts that place its runs are read from
  hand-written text, and the text is checked (see the module's docs),
  before the plugin sees it. A program of EXLA's lowering carries them
  (its lowering checks its sizes and emits no feeds or calls): its text is
  neither read nor checked, and the plugin is not asked for its output
  shapes.

  The plugin compiles on a native thread with a large stack (see "Where
  programs run"); the calling process waits for it in `receive`.

  ## Options

    * `:device_id` - the device the executable is compiled for and runs on
      (defaults to the client's default device)

    * `:num_replicas` - number of replicas, at least 1 (defaults to 1)

    * `:num_partitions` - number of partitions, at least 1 (defaults to 1)

    * `:partitioner` - `:gspmd` or `:shardy`, which of XLA's partitioners
      splits a program of several partitions (see "Several devices");
      defaults to `:gspmd`

    * `:input_shapes` - the `EXLA.Shape`s of each device's parameters,
      for a partitioned program (see "Several devices"); defaults to the
      program's

  A caller that knows its program's runs to be long although it is small
  gives `run_on: :thread` (internal; recorded as a fact, see "Where
  programs run").
  """
  def compile(client, program, opts \\ [])

  def compile(client, mlir, opts) when is_binary(mlir) do
    client = EXLA.Client.local(client)
    program = EXLA.MLIR.Check.read!(mlir, EXLA.Client.max_tensor_bytes(client))
    compile(client, program, opts)
  end

  def compile(client, %Program{} = program, opts) do
    client = EXLA.Client.local(client)
    o = Options.compile!(client, program, opts)
    specs = Enum.map(o.input_shapes, &Shape.to_spec/1)
    {replicas, partitions} = {o.num_replicas, o.num_partitions}

    ref =
      NIF.async!(
        &NIF.executable_compile(
          client.ref,
          program.text,
          specs,
          o.device_id,
          replicas,
          partitions,
          o.shardy?,
          &1
        )
      )

    %__MODULE__{
      ref: ref,
      client: client,
      device_id: o.device_id,
      input_shapes: o.input_shapes,
      output_shapes: program.output_shapes || plugin_output_shapes(ref),
      facts: o.facts,
      num_replicas: replicas,
      num_partitions: partitions
    }
    |> place()
  end

  defp plugin_output_shapes(ref) do
    ref |> NIF.executable_output_shapes() |> Enum.map(&Shape.from_spec/1)
  end

  @doc false
  # The devices an executable runs on and where its runs happen, decided
  # from its facts by this VM's policy (see "Where programs run"); also
  # for an executable just loaded (EXLA.Executable.Serialized).
  def place(%__MODULE__{num_replicas: replicas, num_partitions: partitions} = executable) do
    devices =
      if replicas * partitions == 1,
        do: [executable.device_id],
        else: NIF.executable_devices(executable.ref)

    %{
      executable
      | devices: devices,
        run_on: Placement.run_on(executable.facts, length(devices))
    }
  end

  # A run does, in order:
  #
  #   1. an executable of another node is replaced by this node's copy
  #      (`EXLA.Remote.local_executable!/1`, loaded once);
  #   2. checks the options (`:donate`; none on the per-call path);
  #   3. turns each argument into a native buffer of the run's device
  #      (`argument_refs/3`): a buffer there as it is, another EXLA
  #      buffer copied, a `{binary, shape}` pair placed;
  #   4. calls the NIF that `:run_on` names (`run_native/3`): on this
  #      scheduler, on a dirty one, or on a native thread while the caller
  #      waits in `receive`; a run on several devices always takes a thread;
  #   5. wraps each output in an `EXLA.DeviceBuffer` of its shape.
  #
  # The NIF checks the arguments' count, types, shapes and devices before
  # the plugin sees them.

  @doc """
  Runs the executable and returns its outputs as `[[%EXLA.DeviceBuffer{}]]`:
  one list of outputs per device it runs on.

  `inputs` has one list of arguments per device of the executable (see
  "Several devices"): `[args]` for a program of one device. Each argument
  is an `EXLA.DeviceBuffer` on the run's device or a `{binary,
  %EXLA.Shape{}}` pair, which is copied to the device first. A buffer of
  another node is copied to the device too.

  It runs on the device(s) it was compiled for.

  ## Options

    * `:donate` - positions of arguments the run takes over: the program
      reuses the buffer of each for the output it aliases it to (see
      `tf.aliasing_output`), and frees those it does not alias, so each
      reads as deleted afterwards. Defaults to `[]`
  """
  def run(executable, inputs, opts \\ [])

  def run(%__MODULE__{ref: ref, devices: [device_id]} = executable, [args], opts)
      when Remote.local?(ref) and is_list(args) do
    donate = donate_option(opts)
    refs = argument_refs(args, executable.client, device_id)
    outputs = run_native(executable, refs, donate)
    [wrap_outputs(executable, device_id, outputs)]
  end

  def run(%__MODULE__{ref: ref} = executable, inputs, opts) when not Remote.local?(ref),
    do: executable |> Remote.local_executable!() |> run(inputs, opts)

  def run(%__MODULE__{devices: devices} = executable, lists, opts)
      when is_list(lists) and length(lists) == length(devices) and length(devices) > 1 do
    donate = donate_option(opts)
    %{client: client, ref: ref} = executable

    refs =
      Enum.zip_with(lists, devices, fn args, device_id when is_list(args) ->
        argument_refs(args, client, device_id)
      end)

    checked = executable.facts.run_checks
    outputs = NIF.async!(&NIF.executable_run_devices(ref, refs, donate, &1, checked))
    Enum.zip_with(devices, outputs, &wrap_outputs(executable, &1, &2))
  end

  def run(%__MODULE__{devices: devices}, inputs, _opts) do
    raise ArgumentError,
          "expected #{length(devices)} list(s) of arguments (one per device the executable " <>
            "runs on), got: #{inspect(inputs, limit: 5)}"
  end

  # The run options, checked; most runs give none (the per-call path).
  defp donate_option([]), do: []
  defp donate_option(opts), do: Keyword.validate!(opts, donate: [])[:donate]

  defp wrap_outputs(executable, device_id, refs) do
    Enum.zip_with(refs, executable.output_shapes, fn ref, shape ->
      DeviceBuffer.from_ref(ref, executable.client, device_id, shape)
    end)
  end

  defp run_native(%{run_on: :scheduler, ref: ref}, refs, donate),
    do: NIF.unwrap!(NIF.executable_run(ref, refs, donate))

  defp run_native(%{run_on: :dirty, ref: ref}, refs, donate),
    do: NIF.unwrap!(NIF.executable_run_dirty(ref, refs, donate))

  # A program whose loops check that their run is still wanted (a fact)
  # gets the run's id from the NIF, which stops the run when the calling
  # process is gone.
  defp run_native(%{run_on: :thread, ref: ref, facts: facts}, refs, donate),
    do: NIF.async!(&NIF.executable_run_async(ref, refs, donate, &1, facts.run_checks))

  @doc false
  # The one path from run arguments (see run/3) to the native buffers of
  # `device_id` of `client`; EXLA.HostCallback's runs take it too.
  def argument_refs([], _client, _device_id), do: []

  def argument_refs([arg | args], client, device_id),
    do: [argument_ref(arg, client, device_id) | argument_refs(args, client, device_id)]

  defp argument_ref(%DeviceBuffer{ref: ref}, _client, _device_id) when Remote.local?(ref),
    do: ref

  defp argument_ref(%DeviceBuffer{} = buffer, client, device_id),
    do: DeviceBuffer.copy_to_device(buffer, client, device_id).ref

  defp argument_ref({data, %Shape{} = shape}, client, device_id),
    do: DeviceBuffer.place_on_device(data, shape, client, device_id).ref

  defp argument_ref(other, _client, _device_id) do
    raise ArgumentError,
          "expected an EXLA.DeviceBuffer or a {binary, EXLA.Shape} pair, got: #{inspect(other)}"
  end

  @doc """
  Serializes the executable into a binary for `deserialize/2`.

  The binary carries a checksum of all of it (a SHA-256 of every byte):
  a damaged binary raises when it is loaded instead of running garbage. It
  also records what the executable was compiled for (see `load_binary/3`): plugins
  can load each other's executables and silently compute wrong results,
  and XLA:CPU compiles for the features of the CPU it runs on, so it only
  loads back into a client of the same plugin file, platform and kind of
  device, on a CPU with the same features for the host.
  """
  defdelegate serialize(executable), to: Serialized

  @doc """
  Loads an executable made by `serialize/1` into `client`.

  Raises `ArgumentError` when the binary is not one, is damaged, or was
  made for another target (see `load_binary/3`); nothing is loaded then.
  """
  defdelegate deserialize(client, binary), to: Serialized

  @doc """
  Dumps the executable into a map that `load/2` loads back, as EXLA 0.13
  does. The map holds only terms, so it survives `:erlang.term_to_binary/1`
  and can be written to a file or sent to another node:

    * `:serialized` - the executable, as `serialize/1` makes it (checksummed,
      and loadable only for the target it was compiled for);
    * `:device_id`, `:num_replicas` and `:num_partitions` - what it was
      compiled for, to read (`load/2` takes them from `:serialized`, which
      records them too).

  An executable of another node is dumped by that node.

  ## Examples

      iex> client = EXLA.Client.fetch!(:host)
      iex> x = Nx.template({2}, :f32)
      iex> %{mlir_module: mlir} = EXLA.to_mlir_module(&Nx.negate/1, [x])
      iex> exe = EXLA.Executable.compile(client, mlir)
      iex> dumped = exe |> EXLA.Executable.dump() |> :erlang.term_to_binary()
      iex> loaded = EXLA.Executable.load(client, :erlang.binary_to_term(dumped))
      iex> input = {<<1.0::float-32-native, -2.0::float-32-native>>, EXLA.Shape.make_shape({:f, 32}, {2})}
      iex> [[y]] = EXLA.Executable.run(loaded, [[input]])
      iex> EXLA.DeviceBuffer.read(y) == <<-1.0::float-32-native, 2.0::float-32-native>>
      true

  """
  defdelegate dump(executable), to: Serialized

  @doc """
  Loads into `client` an executable that `dump/1` dumped (or the binary
  of `serialize/1`), and returns it.

  Raises `ArgumentError`, loading nothing, when `data` is neither, when it
  is damaged, or when it was made for another target (see
  `load_binary/3`).
  """
  defdelegate load(client, data), to: Serialized

  @doc """
  Loads an executable made by `serialize/1` into `client`, returning
  `{:ok, executable, metadata}` or `{:error, message}`; never raises.

  Nothing reaches the plugin unless the binary's checksum matches (see
  `serialize/1`) and it was made for the same target as the
  client's: the same plugin file (by its sha256, see
  `EXLA.Plugin.fingerprint/1`) and PJRT API version, the same platform and
  kind of device, and for the CPU, the same CPU features. `metadata` is
  the map sealed with the executable; `expected` lists entries it must
  have (the compile cache checks its key this way), checked before the
  plugin sees anything too.

  Unlike `deserialize/2` and `load/2`, it logs nothing: the caller has the
  error and says where the binary came from (the compile cache warns
  naming its file).
  """
  defdelegate load_binary(client, binary, expected \\ %{}), to: Serialized
end
