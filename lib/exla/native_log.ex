defmodule EXLA.NativeLog do
  @moduledoc """
  Forwards the diagnostics of EXLA's native code to `Logger`, and sets
  the levels of the lines that PJRT plugins log themselves.

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

      config :exla, :plugin_log_level, :fatal

  The level of the lines that PJRT plugins write to stderr themselves:
  `:fatal`, `:error`, `:warning`, `:info` or `{:verbose, n}`. Defaults to
  `:fatal`. See "Plugin logs".

  ## Delivery

  Events come from any native thread (schedulers, compile and run threads,
  the plugin's threads). Each is put in a queue of 1,024 events without
  waiting; the first one after the queue was emptied wakes this process,
  which logs them. When this process falls behind and the queue is full,
  new events are dropped rather than make a native thread wait: `dropped/0`
  counts them, and this process logs a warning with how many it missed.

  ## Plugin logs

  A plugin built from XLA logs with Abseil, straight to the VM's stderr
  (lines such as `W0000 00:00:1795768066.921216 6380 file.cc:123] ...`);
  EXLA cannot route those lines through `Logger`. The plugin reads its
  levels from the environment once, when it is loaded:

    * `TF_CPP_MIN_LOG_LEVEL` - the lowest severity written: `0` info,
      `1` warning, `2` error, `3` fatal;
    * `TF_CPP_MAX_VLOG_LEVEL` - the most verbose `VLOG(n)` lines written
      (they are info lines, so they need `TF_CPP_MIN_LOG_LEVEL=0`);
    * `TF_CPP_VMODULE` - verbose levels per source file, such as
      `algebraic_simplifier=2,cpu_compiler=1`.

  Before it loads a plugin, EXLA sets these variables in the environment
  of the operating-system process (which is what the plugin reads; the
  BEAM's `System.put_env/2` changes only the VM's own copy) from
  `:plugin_log_level`:

  | `:plugin_log_level` | the plugin writes                          | `TF_CPP_MIN_LOG_LEVEL` | `TF_CPP_MAX_VLOG_LEVEL` |
  | :------------------ | :----------------------------------------- | :--------------------- | :---------------------- |
  | `:fatal` (default)  | only the message of a fatal error          | `3`                    | not set                 |
  | `:error`            | errors too                                 | `2`                    | not set                 |
  | `:warning`          | warnings too                               | `1`                    | not set                 |
  | `:info`             | everything but verbose lines               | `0`                    | not set                 |
  | `{:verbose, n}`     | everything, verbose lines up to `VLOG(n)`  | `0`                    | `n`                     |

  A variable that is already set, in the shell or with `System.put_env/2`
  before the plugin is loaded, is the user's choice: EXLA passes its value
  to the plugin instead of its own (so `TF_CPP_VMODULE` needs no
  configuration). An empty value counts as unset.

  By default only a fatal error's message is written: the plugin writes it
  just before it aborts the VM, and it is the only one that does not also
  reach you as an exception. Everything else a plugin fails at (a program
  it cannot compile or run, a bad option) raises an exception with the
  plugin's message, and the `:error` and `:warning` lines of a working
  plugin are mostly advice to XLA's own developers (such as
  `Algebraic simplifier is likely stuck in a circular simplification
  loop`, written while a program compiles correctly).

  The setting applies to the plugins loaded after it is set: configure it
  in your config files, or in `Mix.install/2`'s `:config`, or put it with
  `Application.put_env/3` before the first client is created. Each plugin
  keeps the levels it was loaded with.
  """

  use GenServer
  require Logger

  @type plugin_level :: :fatal | :error | :warning | :info | {:verbose, pos_integer()}

  alias EXLA.NIF

  @levels [off: 0, error: 1, warning: 2, info: 3, debug: 4, trace: 5]

  # Abseil's severities, as TF_CPP_MIN_LOG_LEVEL numbers them.
  @plugin_levels [fatal: 3, error: 2, warning: 1, info: 0]
  @plugin_variables ~w(TF_CPP_MIN_LOG_LEVEL TF_CPP_MAX_VLOG_LEVEL TF_CPP_VMODULE)

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
  The level of the plugins' own log lines (see "Plugin logs").
  """
  @spec plugin_level() :: plugin_level()
  def plugin_level, do: Application.get_env(:exla, :plugin_log_level, :fatal)

  @doc """
  The environment that a plugin loaded now reads its log levels from, as
  `{name, value}` pairs (see "Plugin logs"): the user's value of each
  variable where one is set, else the one that `level` (by default
  `plugin_level/0`) gives.

  `user` maps the variables the user set to their values (by default the
  VM's environment, `System.get_env/0`).

      iex> EXLA.NativeLog.plugin_env(:fatal, %{})
      [{"TF_CPP_MIN_LOG_LEVEL", "3"}]
      iex> EXLA.NativeLog.plugin_env({:verbose, 2}, %{})
      [{"TF_CPP_MIN_LOG_LEVEL", "0"}, {"TF_CPP_MAX_VLOG_LEVEL", "2"}]
      iex> EXLA.NativeLog.plugin_env(:error, %{"TF_CPP_MIN_LOG_LEVEL" => "0", "TF_CPP_VMODULE" => "cpu_compiler=1"})
      [{"TF_CPP_MIN_LOG_LEVEL", "0"}, {"TF_CPP_VMODULE", "cpu_compiler=1"}]

  """
  @spec plugin_env(plugin_level(), %{optional(String.t()) => String.t()}) :: [
          {String.t(), String.t()}
        ]
  def plugin_env(level \\ plugin_level(), user \\ System.get_env()) do
    ours = plugin_variables(level)

    Enum.flat_map(@plugin_variables, fn name ->
      case user_value(user, name) || ours[name] do
        nil -> []
        value -> [{name, value}]
      end
    end)
  end

  @doc false
  # Called before each plugin is loaded: puts `plugin_env/0` in the
  # operating-system process's environment, which the plugin reads.
  def prepare_plugin_env do
    Enum.each(plugin_env(), fn {name, value} -> NIF.unwrap!(NIF.os_env_put(name, value)) end)
  end

  defp user_value(user, name) do
    case Map.get(user, name) do
      empty when empty in [nil, ""] -> nil
      value -> value
    end
  end

  defp plugin_variables({:verbose, n}) when is_integer(n) and n > 0,
    do: %{"TF_CPP_MIN_LOG_LEVEL" => "0", "TF_CPP_MAX_VLOG_LEVEL" => Integer.to_string(n)}

  defp plugin_variables(level) do
    case List.keyfind(@plugin_levels, level, 0) do
      {_level, min} ->
        %{"TF_CPP_MIN_LOG_LEVEL" => Integer.to_string(min)}

      nil ->
        raise ArgumentError,
              "expected :plugin_log_level to be one of #{inspect(Keyword.keys(@plugin_levels))} " <>
                "or {:verbose, n} with n a positive integer, got: #{inspect(level)}"
    end
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
