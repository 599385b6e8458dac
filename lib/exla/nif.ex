defmodule EXLA.NIF do
  @moduledoc false
  # The native functions of `native/exla`. Every function that can fail
  # returns `{:ok, value}` or `{:error, {kind, message}}`; `unwrap!/1` is the
  # one place where those errors become exceptions.

  @on_load :__on_load__

  # The rules of EXLA.Placement that the NIF applies too, given to it as it
  # loads (a constant here: no other module may be called while this one
  # loads).
  @load_info %{large_buffer_bytes: EXLA.Placement.large_buffer_bytes()}

  def __on_load__ do
    path = :filename.join(:code.priv_dir(:exla), ~c"libexla")
    :erlang.load_nif(path, @load_info)
  end

  @doc """
  Returns the value of `{:ok, value}` or raises the error of
  `{:error, {kind, message}}`: `ArgumentError` for bad input and
  `RuntimeError` for failures of the runtime.
  """
  def unwrap!({:ok, value}), do: value
  def unwrap!({:error, {:argument, message}}), do: raise(ArgumentError, message)
  def unwrap!({:error, {_kind, message}}), do: raise(RuntimeError, message)
  def unwrap!(other), do: other

  @doc """
  Calls `start`, a function of the NIF that takes a reference and hands its
  work to a native thread, then waits for that thread's reply
  `{reference, result}` and unwraps the result.

  The wait is an ordinary `receive`: the process can be killed meanwhile,
  and the work's result is then dropped.
  """
  def async!(start) when is_function(start, 1) do
    reference = make_ref()
    unwrap!(start.(reference))

    receive do
      {^reference, result} -> unwrap!(result)
    end
  end

  defp nif_error, do: :erlang.nif_error(:nif_not_loaded)

  def plugin_load(_path), do: nif_error()
  def os_env_put(_name, _value), do: nif_error()
  def library_load_global(_library), do: nif_error()
  def client_create(_plugin, _options, _xla_options), do: nif_error()
  def client_info(_client), do: nif_error()
  def host_heap_keep_freed_memory, do: nif_error()
  def compiles_wait_idle(_timeout_ms), do: nif_error()
  def plugin_xla_options(_path), do: nif_error()
  def plugin_flag_names(_path), do: nif_error()
  def xla_flags_env, do: nif_error()
  def client_memory_statistics(_client), do: nif_error()
  def client_reset_peak_memory(_client), do: nif_error()

  def resource_kind(_term), do: nif_error()

  def term_tree_size(_term, _budget, _skip), do: nif_error()
  def term_digest(_term, _known, _by_shape), do: nif_error()

  def buffer_from_binary(_client, _data, _type_code, _dims, _device), do: nif_error()
  def buffer_from_binary_dirty(_client, _data, _type_code, _dims, _device), do: nif_error()
  def buffer_read(_buffer, _limit), do: nif_error()
  def buffer_read_dirty(_buffer, _limit), do: nif_error()
  def buffer_delete(_buffer), do: nif_error()
  def buffer_delete_dirty(_buffer), do: nif_error()
  def buffer_ready(_buffer), do: nif_error()
  def buffer_await(_buffers), do: nif_error()
  def buffer_copy_to_device(_buffer, _device), do: nif_error()
  def buffer_host_address(_buffer), do: nif_error()
  def buffer_from_address(_client, _address, _type_code, _dims, _device), do: nif_error()
  def buffer_export_ipc(_buffer, _permissions), do: nif_error()
  def buffer_import_ipc(_client, _handle, _type_code, _dims, _device), do: nif_error()

  def executable_compile(_client, _mlir, _inputs, _device, _replicas, _partitions, _shardy, _ref),
    do: nif_error()

  def executable_output_shapes(_executable), do: nif_error()
  def executable_run(_executable, _buffers, _donatable), do: nif_error()
  def executable_run_dirty(_executable, _buffers, _donatable), do: nif_error()
  def executable_run_async(_executable, _buffers, _donatable, _ref, _checked), do: nif_error()
  def executable_devices(_executable), do: nif_error()
  def executable_run_devices(_executable, _lists, _donatable, _ref, _checked), do: nif_error()
  def executable_serialize(_executable, _ref), do: nif_error()
  def executable_deserialize(_client, _bytes, _inputs, _device, _ref), do: nif_error()

  def native_log_attach(_receiver, _level), do: nif_error()
  def native_log_set_level(_level), do: nif_error()
  def native_log_drain, do: nif_error()
  def native_log_dropped, do: nif_error()

  def callback_install(_client), do: nif_error()
  def callback_session(_owner), do: nif_error()
  def callback_push(_session, _binaries), do: nif_error()
  def callback_done(_session, _received), do: nif_error()
  def callback_close(_session), do: nif_error()
  def callback_session_count, do: nif_error()
  def callback_run(_executable, _session, _buffers, _donatable, _checked), do: nif_error()

  # A test aid, not an API, in test builds only (the `fault-injection`
  # cargo feature): the next host-callback session opened by `owner` panics
  # once on the Rust side, in the FFI handler (`:handler`) or in
  # `callback_push/2` (`:reply`). See native/exla/src/fault.rs. Other
  # builds do not export it, so this stub raises there.
  def callback_inject_panic(_owner, _at), do: :erlang.nif_error(:fault_injection_not_built)

  # A test aid of the same builds: emits `count` native events at `level`
  # (1 error .. 5 trace) on target "exla::test".
  def native_log_emit(_level, _count), do: :erlang.nif_error(:fault_injection_not_built)
end
