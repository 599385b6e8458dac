defmodule EXLA.NativeLog do
  @moduledoc """
  Forwards the diagnostics of EXLA's native code to `Logger`.

  EXLA's NIF reports what happens on its side (plugins, clients,
  compilations, host callbacks, integrity checks) as events with a level,
  a target, a message and fields. This process, started by EXLA's
  application, logs each one with `Logger`.

  ## Events

  | target            | level   | when                                          | fields                                         |
  | :---------------- | :------ | :-------------------------------------------- | :--------------------------------------------- |
  | `exla::plugin`    | info    | a PJRT plugin is loaded                       | `path`, `api_major`, `api_minor`, `duration_ms` |
  | `exla::client`    | info    | a client is created                           | `platform`, `version`, `devices`, `duration_ms` |
  | `exla::compile`   | info    | a program is compiled                         | `device`, `mlir_bytes`, `duration_ms`          |
  | `exla::compile`   | info    | a serialized executable is loaded             | `device`, `bytes`, `duration_ms`               |
  | `exla::callback`  | warning | a host callback fails (its run fails)         | `site`, `error`                                |
  | `exla::integrity` | warning | a file fails an integrity check               | `subject`, `path`, `reason`                    |
  | `exla::run`       | trace   | a program runs (once per call)                | `arguments`, `donated`, `outputs`              |
  | `exla::run`       | warning | a donated argument fails to free after a run  | `position`, `error`                            |
  | `exla::panic`     | error   | EXLA's native code panics (a bug in EXLA)     | `reason`, `location`, `backtrace`              |

  A panic never reaches the VM: it is caught where it happens and the
  operation fails with an exception. The event says where it happened;
  its `backtrace` field is there when `RUST_BACKTRACE=1` is set.

  At the debug level, failures that also raise (loading a plugin,
  creating a client, compiling) are reported with their `error`, as are
  host callbacks refused because their session was closed and run results
  dropped because their process is gone.

  Each event is logged as `"[target] message (field: value, ...)"`, at the
  event's level (trace events at `:debug`), with the metadata
  `exla_target` (the target, a string) and one key per field. Logger's own
  level applies as to any other message.

  `integrity_failure/3` logs an integrity failure found by Elixir code in
  the same shape as the native ones (a damaged serialized executable, or
  one made by another plugin).

  ## Configuration

      config :exla, :native_log_level, :warning

  The level of the native events that are reported: `:off`, `:error`,
  `:warning`, `:info`, `:debug` or `:trace`. Defaults to `:warning`.
  `put_level/1` changes it at run time.

  An event below the level is disabled where it is written: the native
  code compares its level with the current one (one atomic load) and does
  nothing else, so disabled events cost nothing measurable, on the per-call
  path either (see `bench/call_cpu_bench.exs`).

  ## Delivery

  Events come from any native thread (schedulers, compile and run threads,
  the plugin's threads). Each is put in a queue of 1,024 events without
  waiting; the first one after the queue was emptied wakes this process,
  which logs them. When this process falls behind and the queue is full,
  new events are dropped rather than make a native thread wait: `dropped/0`
  counts them, and this process logs a warning with how many it missed.
  """

  use GenServer
  require Logger

  alias EXLA.NIF

  @levels [off: 0, error: 1, warning: 2, info: 3, debug: 4, trace: 5]

  @doc false
  def start_link(opts \\ []) do
    GenServer.start_link(__MODULE__, opts, name: __MODULE__)
  end

  @doc """
  The level of the native events that are reported (see "Configuration").
  """
  @spec level() :: :off | :error | :warning | :info | :debug | :trace
  def level, do: Application.get_env(:exla, :native_log_level, :warning)

  @doc """
  Sets the level of the native events that are reported, for the whole VM.
  """
  @spec put_level(:off | :error | :warning | :info | :debug | :trace) :: :ok
  def put_level(level) do
    code = level_code!(level)
    Application.put_env(:exla, :native_log_level, level)
    NIF.native_log_set_level(code)
  end

  @doc """
  The number of native events dropped because the queue was full, since
  the VM started.
  """
  @spec dropped() :: non_neg_integer()
  def dropped, do: NIF.native_log_dropped()

  @doc """
  Logs every native event emitted so far; returns when they are logged.
  """
  @spec flush() :: :ok
  def flush do
    if Process.whereis(__MODULE__), do: GenServer.call(__MODULE__, :flush, :infinity), else: :ok
  end

  @doc """
  Logs a warning that data failed an integrity check, in the shape of the
  native `exla::integrity` events: `subject` says what it is (such as
  "serialized executable"), `reason` why it failed, and `fields` add
  metadata (such as `path: path`).

  `EXLA.Executable.deserialize/2` reports a damaged serialized executable
  and one made by another plugin with it.
  """
  @spec integrity_failure(String.t(), String.t(), keyword()) :: :ok
  def integrity_failure(subject, reason, fields \\ []) do
    fields = [subject: subject] ++ fields ++ [reason: reason]
    log({:warning, "exla::integrity", "integrity check failed", fields})
  end

  defp level_code!(level) do
    Keyword.get(@levels, level) ||
      raise ArgumentError,
            "expected the native log level to be one of #{inspect(Keyword.keys(@levels))}, " <>
              "got: #{inspect(level)}"
  end

  ## Receiver

  @impl true
  def init(_opts) do
    code = level_code!(level())
    NIF.native_log_attach(self(), code)
    {:ok, %{dropped: NIF.native_log_dropped()}}
  end

  @impl true
  def handle_info(:exla_native_log, state) do
    {more?, state} = drain(state)
    if more?, do: send(self(), :exla_native_log)
    {:noreply, state}
  end

  @impl true
  def handle_call(:flush, _from, state), do: {:reply, :ok, drain_all(state)}

  defp drain_all(state) do
    case drain(state) do
      {true, state} -> drain_all(state)
      {false, state} -> state
    end
  end

  defp drain(state) do
    {records, more?, dropped} = NIF.native_log_drain()
    Enum.each(records, &log/1)

    if dropped > state.dropped do
      Logger.warning(
        "EXLA dropped #{dropped - state.dropped} native log event(s): " <>
          "#{inspect(__MODULE__)} could not keep up"
      )
    end

    {more?, %{state | dropped: dropped}}
  end

  defp log({level, target, message, fields}) do
    Logger.bare_log(
      logger_level(level),
      fn -> text(target, message, fields) end,
      [exla_target: target] ++ fields
    )
  end

  defp logger_level(:trace), do: :debug
  defp logger_level(level), do: level

  defp text(target, message, []), do: "[#{target}] #{message}"

  defp text(target, message, fields) do
    "[#{target}] #{message} (" <>
      Enum.map_join(fields, ", ", fn {key, value} -> "#{key}: #{value}" end) <> ")"
  end
end
