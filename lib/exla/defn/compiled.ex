defmodule EXLA.Defn.Compiled do
  @moduledoc false
  # Everything a call of a compiled function needs, computed once at
  # compile time and kept in the cache (or in the closure `EXLA.compile/3`
  # returns):
  #
  #   * `:exe` - the `EXLA.Executable`
  #   * `:client` / `:client_name` / `:device_id` - where it runs
  #   * `:input_shapes` - one `EXLA.Shape` per flattened input, used only when
  #     an argument is not already on the device; `nil` for an input the
  #     program does not take (unread and not donated: it is not a parameter
  #     and is never transferred)
  #   * `:output` - the output container with template tensors
  #   * `:build` - a function from the list of output buffers to the result
  #   * `:debug?` / `:name` - whether calls log timings, and the name they
  #     log (the function's key, inspected by `EXLA.SharedTerm.inspect/2`:
  #     the key itself may capture more than a cached value may hold)
  #   * `:callbacks` - `nil`, or the host-callback sites of a program with
  #     hooks (site => payload, see `EXLA.HostCallback`)
  #   * `:donate` - the positions, among the program's parameters, of the
  #     inputs each run donates (among the flattened inputs for a lazy
  #     program, whose parameters vary per call)
  #   * `:cache_file` / `:program_key` - with `cache: path`, the path, which
  #     every call reads first (see EXLA.Defn.CacheFile), and the compile
  #     cache's key of the program; `nil` otherwise
  defstruct [
    :exe,
    :client,
    :client_name,
    :device_id,
    :input_shapes,
    :output,
    :build,
    :name,
    debug?: false,
    callbacks: nil,
    donate: [],
    cache_file: nil,
    program_key: nil
  ]
end
