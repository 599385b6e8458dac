defmodule EXLA.Client do
  @moduledoc """
  The handles through which EXLA compiles and runs programs.

  A client drives the devices of one platform (the CPU, CUDA or ROCm GPUs,
  TPUs) through that platform's PJRT plugin, which `EXLA.Plugin` finds
  (and, for the CPU, installs).

  There is one client per configured name: it is created the first time
  that name is fetched and every process uses that same client until the VM
  stops.

  ## Configuration

  The `:clients` setting of the `:exla` application names the clients and
  gives each its options. Its default has a client for every platform:

      config :exla, :clients,
        cuda: [platform: :cuda, memory_fraction: 0.8],
        rocm: [platform: :rocm, memory_fraction: 0.8],
        tpu: [platform: :tpu],
        host: [platform: :host]

  Setting it replaces the whole list, so it may name clients as you like
  and give them the options listed below. Two more settings choose among
  them: `:default_client` names the client used when a call names none,
  and `:preferred_clients` is the order in which they are considered when
  `:default_client` is unset:

      config :exla, :default_client, :host
      config :exla, :preferred_clients, [:cuda, :rocm, :tpu, :host]

  Without `:default_client`, the default is the first of the
  `:preferred_clients` whose platform is supported on this machine (see
  `get_supported_platforms/0`). The CPU is always supported where its
  plugin is installed or can be installed.

  Two clients on one device would both claim its memory: give each device
  one client, and pick among a client's devices with `:default_device_id`.

  ## Client options

  The keyword list of a client takes:

    * `:platform` - the kind of device the client drives: `:host` (the
      CPU, the default), `:cuda`, `:rocm`, `:tpu`, or `:pjrt_plugin` for
      any other PJRT plugin (see "Other PJRT plugins" below).

    * `:default_device_id` - the device that programs and tensors use when
      they name none, a number from 0 (the default) to the client's device
      count minus one; on a machine with two GPUs, 1 picks the second.

    * `:automatic_transfers` - whether a tensor of this client is copied,
      when needed, to a device it is not on: to another device or client
      that a jitted function runs on, and, for `EXLA.Backend`'s
      operations, to where the operation runs (see "Tensors on several
      devices" in `EXLA.Backend`). Without them, such a use raises
      `ArgumentError` ("EXLA computation (defn) is allocated on client
      ... but one of the input tensors are allocated on ..."), and the
      tensor must be moved with `Nx.backend_transfer/2` or
      `Nx.backend_copy/2`. Defaults to `true` for `:host` clients and
      `false` for the others, as in EXLA: a tensor in host memory is
      cheap to copy anywhere, a GPU's is not. On Nx 0.12 and later,
      `Nx.concatenate/2` and `Nx.stack/2` gather their tensors whatever
      this option says, as EXLA 0.12 and later do.

    * `:preallocate` - whether a GPU client reserves its share of each
      device's memory (see `:memory_fraction`) up front instead of
      allocating as it goes. Defaults to `true`.

    * `:memory_fraction` - the share of each GPU's memory the client may
      use, greater than 0 and at most 1. Defaults to `0.9`.

    * `:plugin` - the path of the PJRT plugin library to use, instead of the
      platform's default one (see `EXLA.Plugin`). `:pjrt_plugin` clients
      take `:plugin_path` instead.

    * `:device_type` and `:plugin_path` - only for `:pjrt_plugin`
      clients, and required there (see "Other PJRT plugins").

    * `:cpu_plugin` - the name of the CPU plugin of a `:host` client, one of
      `EXLA.Plugin.cpu_plugins/0` (EXLA installs it the first time it is
      needed, see "CPU plugins" in `EXLA.Plugin`). Defaults to the
      application setting `config :exla, :cpu_plugin, name`, else to
      `"xla-cpu-pjrt"`. Only for `:host` clients, and not with `:plugin`.

    * `:device_count` - the number of devices of a `:host` client (the CPU
      is split into that many devices), from 1 to 1024. Only for `:host`
      clients. Defaults to the `XLA_FLAGS` setting below, else 1.

    * `:warm_up` - whether creating a CPU client also does, in the
      background, the work the plugin otherwise does on the first program
      the process compiles and on its first matrix product (XLA's
      one-time initialization; oneDNN generating its small-product
      kernels, about 30 ms): a tiny program is compiled and run once, for
      the first client of each plugin file. The end of a script and the
      application's stop wait for it (at most 10 seconds): a VM exiting
      while the plugin generates code would crash. Other platforms ignore
      it. Defaults to `true`.

    * `:xla_options` - XLA compiler options (fields of XLA's `DebugOptions`,
      the ones `XLA_FLAGS` sets) that every compilation on the client uses,
      as a keyword list or map of booleans, integers, floats or strings.
      They are merged over the platform's defaults: `:host` clients compile
      with `xla_cpu_use_xnnpack: false`, because XNNPACK repacks a dot's
      weights whenever they change, which costs a training step (where the
      weights change every step) more than it saves (about 20% of an MLP
      training step). They take precedence over `XLA_FLAGS`. Names and
      values are checked when the client is created (see "XLA options and
      XLA_FLAGS" below).

  ## Other PJRT plugins

  The `:pjrt_plugin` platform, as in EXLA 0.13, runs on a PJRT plugin that
  EXLA does not know by name (a vendor's accelerator, a build of your own):

      config :exla, :clients,
        tt: [platform: :pjrt_plugin, device_type: "tt", plugin_path: "/opt/tt/pjrt_plugin_tt.so"]

    * `:device_type` - the plugin's device type, a non-empty string or an
      atom (stored as a string in the client's `:device_type`), such as
      `"tt"`. EXLA loads plugins by path and keeps no registry of them, so
      it only names the client's devices in messages.

    * `:plugin_path` - the path of the plugin library (a `.so` file). It
      must exist when the client is created.

  Both are required; a missing or invalid one raises `ArgumentError` when
  the client is created. EXLA gives such a plugin no create options (so
  `:memory_fraction` and `:preallocate` do not reach it, and
  `:device_count` is refused, as for every platform but `:host`) and no
  XLA option defaults (the `:host` client's `xla_cpu_use_xnnpack: false`
  is not applied, even to a CPU plugin). `get_supported_platforms/0`
  reports `:pjrt_plugin` when a configured client of that platform can be
  created and finds devices.

  ## XLA options and XLA_FLAGS

  XLA's compiler options are the fields of its `DebugOptions` message. XLA
  ends the process on an `XLA_FLAGS` entry it cannot parse and aborts on
  some values, so EXLA checks both `XLA_FLAGS` and `:xla_options` before a
  plugin sees them, and raises `ArgumentError` naming the entry it refuses.
  The names and types of the options are read from the plugin file itself
  (it carries the protobuf description of `DebugOptions`), so they follow
  the XLA version that built the plugin.

  `XLA_FLAGS` (read from the environment of the operating-system process,
  which is what plugins read; `System.put_env/2` does not change it) is
  checked when a client is created, before its plugin is loaded:

    * it is a list of `--name` or `--name=value` entries separated by
      whitespace; a value may be quoted (`--name="a b"`). Entries that do
      not start with `--` are refused (XLA would read a first such word as
      the name of a file of flags, and ignore the others), and so is `--help`;

    * each name must be an option of the plugin that the plugin also
      registers as a flag;

    * boolean options take no value or `true`, `false`, `1`, `0`; integer
      options take a decimal integer within their type (32 or 64 bits);
      float options take a finite decimal number; string options, lists of
      strings and maps take any value but need one;

    * enum options are refused in `XLA_FLAGS` (XLA reads each one with its
      own syntax): set them with `:xla_options`, as a value name.

  `:xla_options` must be options of the plugin, with booleans for boolean
  options, integers within their type for integer ones, floats for float
  ones, strings for string ones, a value name (string) or number for enums,
  and a comma-separated string for lists.

  In both, a few options that XLA accepts by type but that crash or stall
  it must lie in a range: `xla_cpu_parallel_codegen_split_count` and
  `xla_force_host_platform_device_count` between 1 and 1024 (the
  `:device_count` option too).

  ## Host memory

  The CPU plugin allocates tensors with the C library's `malloc`. The Erlang
  VM turns off glibc's adaptive `mmap` threshold, so that every execution
  would map and page-fault its large buffers afresh; creating a `:host`
  client therefore lets the C heap serve and keep blocks up to 32 MiB, as
  glibc does by default (about 1,500 page faults and 3 ms of kernel time
  less per step of a 784-512-512-10 MLP). Set the environment variable
  `EXLA_HOST_MALLOC_TUNING=false` to keep the VM's settings.

  ## Host devices

  A `:host` client has a single device, unless `:device_count` is given or
  the environment variable `XLA_FLAGS` (of the operating-system process, as
  above) sets XLA's `--xla_force_host_platform_device_count` flag when the
  client is created (the last such entry counts, as in XLA):

      XLA_FLAGS=--xla_force_host_platform_device_count=4 mix test

  ## Examples

      iex> client = EXLA.Client.fetch!(:host)
      iex> client.platform
      :host
      iex> client.platform_name
      "cpu"
      iex> client.default_device_id
      0

  """

  use GenServer
  require EXLA.Remote
  alias EXLA.Client.{Builder, Options, WarmUp}

  alias EXLA.Platform
  alias EXLA.Platform.Discovery

  @enforce_keys [:ref, :name, :platform, :device_count, :default_device_id]
  defstruct [
    :ref,
    :name,
    :platform,
    :device_count,
    :default_device_id,
    :platform_name,
    :platform_version,
    :plugin_path,
    :device_type,
    xla_options: [],
    automatic_transfers: true,
    run_checks: false
  ]

  @typedoc """
  A client. `:device_count` devices have the ids `0..device_count - 1`;
  `:platform_name` and `:platform_version` are what the plugin reports, and
  `:plugin_path` is the plugin library in use and `:xla_options` the XLA
  options every compilation on it uses (typed, sorted by name).
  `:device_type` is the `:device_type` of a `:pjrt_plugin` client, else nil.
  `:automatic_transfers` is the option of that name (with its default).
  """
  @type t :: %__MODULE__{
          ref: reference(),
          name: atom(),
          platform: :host | :cuda | :rocm | :tpu | :pjrt_plugin,
          device_count: pos_integer(),
          default_device_id: non_neg_integer(),
          platform_name: String.t() | nil,
          platform_version: String.t() | nil,
          plugin_path: Path.t() | nil,
          device_type: String.t() | nil,
          xla_options: [{String.t(), {atom(), term()}}],
          automatic_transfers: boolean()
        }

  @doc """
  Starts the process that creates clients one at a time.

  EXLA's application starts it; `fetch!/1` works without it too, but then
  serializes creation with a `:global` lock.
  """
  def start_link(opts \\ []) do
    GenServer.start_link(__MODULE__, opts, name: __MODULE__)
  end

  @doc """
  The name of the client used when a call names none.

  It is the `:default_client` configuration if set. Otherwise it is the first
  of the `:preferred_clients` whose platform is supported on this machine
  (as given by `get_supported_platforms/0`); that choice is made once.
  """
  @spec default_name() :: atom()
  def default_name do
    case Application.fetch_env(:exla, :default_client) do
      {:ok, name} ->
        name

      :error ->
        EXLA.Memo.get({__MODULE__, :default_name}, fn ->
          Discovery.choose_default(
            Application.fetch_env!(:exla, :clients),
            Application.fetch_env!(:exla, :preferred_clients),
            get_supported_platforms()
          )
        end)
    end
  end

  @doc false
  # The client named `name` and one of its devices (`device_id`, or the
  # client's default device when nil); raises for a device it lacks.
  def fetch_device!(name, device_id) do
    client = fetch!(name)
    device_id = device_id || client.default_device_id

    unless is_integer(device_id) and device_id >= 0 and device_id < client.device_count do
      raise ArgumentError,
            "invalid :device_id #{inspect(device_id)} for client #{inspect(name)} " <>
              "with #{client.device_count} device(s)"
    end

    {client, device_id}
  end

  @doc """
  The client configured under `name`.

  The client is created on the first call (for the `:host` platform, this
  may first install the CPU plugin, see `EXLA.Plugin`) and the same client
  is returned afterwards. Raises `ArgumentError` if no client has this name.

  As in EXLA, where clients are created by a server process, a client that
  cannot be created (invalid options, a plugin that is missing or fails,
  no devices) exits the caller: the exit reason is
  `{{exception, stacktrace}, {GenServer, :call, [EXLA.Client, {:client, name, options}, :infinity]}}`
  (`options` as configured), as EXLA's call to its server that raised
  `exception` gives, so code written for EXLA that catches the exit
  catches it here too. Nothing is kept: the next call tries again. (Without EXLA's application started, there is no
  such server and the exception is raised.)

      # on a machine without CUDA
      try do
        EXLA.Client.fetch!(:cuda)
      catch
        :exit, {{%RuntimeError{} = error, _stacktrace}, {GenServer, :call, _}} ->
          Exception.message(error)
      end
      #=> "no PJRT plugin for :cuda was found ..."

  """
  @spec fetch!(atom()) :: t()
  def fetch!(name) when is_atom(name) do
    EXLA.Memo.peek({__MODULE__, :client, name}) || create(name)
  end

  # EXLA's words for a name not configured, raised in the caller. The
  # request named in an exit is EXLA's call, `{:client, name, options}`.
  defp create(name) do
    clients = Application.fetch_env!(:exla, :clients)

    options =
      client_config(clients, name) ||
        raise ArgumentError,
              "could not find EXLA client named #{inspect(name)}, the clients specified " <>
                "in your config files are: #{inspect(Keyword.keys(clients))}"

    serialize(fn -> fetch_serialized(name, options) end, {:client, name, options})
  end

  @doc """
  This node's client for `client`: `client` itself, or, for a client made
  on another node (a client's handle only works on its own node), this
  node's client of the same name.
  """
  @spec local(t()) :: t()
  def local(%__MODULE__{ref: ref} = client) when EXLA.Remote.local?(ref), do: client
  def local(%__MODULE__{name: name}), do: fetch!(name)

  @doc """
  The platforms this machine can run programs on, with their device counts.

  The answer maps each platform to its number of devices, for example
  `%{host: 1, cuda: 2}`. A GPU or TPU platform is supported when its
  plugin is found and finds devices; the host when its plugin is installed
  or can be installed. The answer is computed once.

  On Linux, a GPU or TPU platform whose plugin is not given (by a client's
  `:plugin` option or the environment, see `EXLA.Plugin`) is only looked
  for when its driver's device files exist (`/dev/nvidiactl`,
  `/dev/nvidia0`... or WSL2's `/dev/dxg` for CUDA, `/dev/kfd` for ROCm,
  `/dev/accel0`... or `/dev/vfio/0`... for TPUs): without them no plugin
  can find a device, and looking means starting Python to find its
  packages (100 to 400 ms).
  """
  @spec get_supported_platforms() :: %{optional(atom()) => pos_integer()}
  def get_supported_platforms do
    Discovery.peek() || serialize(&Discovery.supported/0, :supported_platforms)
  end

  @doc """
  The most bytes one tensor may take on `client`; programs with a larger
  tensor are refused before they are compiled.

  For `:host` clients it is the host's physical memory (where the operating
  system reports it: Linux's `/proc/meminfo`); for other clients, whose
  plugins do not report their devices' memory, and where the host's is not
  known, it is 128 TiB, the address space of 64-bit hosts.
  """
  @spec max_tensor_bytes(t()) :: pos_integer()
  def max_tensor_bytes(%__MODULE__{platform: platform}),
    do: Discovery.max_tensor_bytes(platform)

  @doc false
  # Whether the programs compiled for `client` check, at the head of their
  # loops, that their run is still wanted (see "Runs nobody waits for" in
  # the README): the client's plugin has the check (the host platform),
  # and `config :exla, :stop_abandoned_runs, false` does not turn it off.
  def run_checks?(%__MODULE__{run_checks: checks}),
    do: checks and Application.get_env(:exla, :stop_abandoned_runs, true) != false

  @doc """
  Returns the memory statistics of `client` (a client or its name).

  Returns a map with:

    * `:allocated` - the bytes allocated on the client's devices now
    * `:peak` - the most bytes allocated at once since the client was
      created or `reset_peak_memory/1` was last called
    * `:per_device` - a map of device id to the bytes allocated on it now

  Where the plugin reports its devices' memory (PJRT's
  `PJRT_Device_MemoryStats`, as GPU plugins do), these are the plugin's
  numbers: everything its allocator holds, including programs' temporary
  buffers, and the peak is the plugin's own, since the client was created.

  Where it does not (the CPU plugin), EXLA counts the tensors it holds on
  the client: each transfer to a device, program output and copy adds the
  bytes of its data (its type's size times its number of elements), and
  deallocating it (`Nx.backend_deallocate/1`), donating it to a program
  (see the `:donate` option in `EXLA`) or its garbage collection removes
  them. Programs' temporary buffers are not counted.

  ## Examples

      client = EXLA.Client.fetch!(:host)
      EXLA.Client.get_memory_statistics(client)
      #=> %{allocated: 0, peak: 0, per_device: %{0 => 0}}

  """
  @spec get_memory_statistics(t() | atom()) :: %{
          allocated: non_neg_integer(),
          peak: non_neg_integer(),
          per_device: %{non_neg_integer() => non_neg_integer()}
        }
  def get_memory_statistics(name) when is_atom(name), do: get_memory_statistics(fetch!(name))

  def get_memory_statistics(%__MODULE__{} = client),
    do: EXLA.NIF.unwrap!(EXLA.NIF.client_memory_statistics(local(client).ref))

  @doc """
  Resets the peak of `client`'s memory statistics (see
  `get_memory_statistics/1`) to the bytes allocated now.

  A plugin that reports its own statistics keeps its own peak, which this
  does not reset.

  ## Examples

      iex> client = EXLA.Client.fetch!(:host)
      iex> EXLA.Client.reset_peak_memory(client)
      :ok

  """
  @spec reset_peak_memory(t() | atom()) :: :ok
  def reset_peak_memory(name) when is_atom(name), do: reset_peak_memory(fetch!(name))

  def reset_peak_memory(%__MODULE__{} = client),
    do: EXLA.NIF.client_reset_peak_memory(local(client).ref)

  ## Serialized creation

  @impl true
  def init(_opts), do: {:ok, nil}

  @impl true
  def handle_call({:serialize, fun}, _from, state) do
    {:reply, run(fun), state}
  end

  # Runs `fun` in this server, one at a time. What `fun` raises exits the
  # caller as EXLA's client server, which crashes on it, makes its callers
  # exit (`request` stands for the call in the reason); the server itself
  # carries on. Called from the server, or with no server, it is raised.
  defp serialize(fun, request) do
    case Process.whereis(__MODULE__) do
      nil ->
        :global.trans({__MODULE__, self()}, fn -> run(fun) end, [node()]) |> value()

      pid when pid == self() ->
        fun |> run() |> value()

      pid ->
        case GenServer.call(pid, {:serialize, fun}, :infinity) do
          {:raise, kind, reason, stacktrace} ->
            exit(
              {exit_reason(kind, reason, stacktrace),
               {GenServer, :call, [__MODULE__, request, :infinity]}}
            )

          result ->
            value(result)
        end
    end
  end

  defp value({:ok, value}), do: value
  defp value({:raise, kind, reason, stacktrace}), do: :erlang.raise(kind, reason, stacktrace)

  # The reason a GenServer stops with when its callback fails so.
  defp exit_reason(:error, reason, stacktrace),
    do: {Exception.normalize(:error, reason, stacktrace), stacktrace}

  defp exit_reason(:exit, reason, _stacktrace), do: reason
  defp exit_reason(:throw, value, stacktrace), do: {{:nocatch, value}, stacktrace}

  # Runs `fun`, bringing back what it raised so the caller raises it.
  defp run(fun) do
    {:ok, fun.()}
  catch
    kind, reason -> {:raise, kind, reason, __STACKTRACE__}
  end

  @doc false
  # The client named `name`, created from its configured `options` if
  # needed; only ever called one caller at a time (see `fetch!/1`, and
  # `EXLA.Platform.Discovery`, which counts a configured client's devices
  # with it).
  def fetch_serialized(name, options) do
    EXLA.Memo.get({__MODULE__, :client, name}, fn ->
      options = Options.validate!(name, options)
      client = Builder.build!(name, options)
      if options[:warm_up] and cpu_platform?(client.platform_name), do: WarmUp.start(client)
      client
    end)
  end

  defp client_config(clients, name) do
    case List.keyfind(clients, name, 0) do
      {^name, options} -> options
      nil -> nil
    end
  end

  @doc false
  # Whether a plugin's platform name is the CPU's: the one test wherever
  # EXLA treats the CPU apart (its heap, its compile target).
  defdelegate cpu_platform?(platform_name), to: Platform, as: :cpu_name?
end
