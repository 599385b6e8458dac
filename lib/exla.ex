defmodule EXLA do
  @moduledoc """
  Runs Nx on Google's [XLA](https://openxla.org/xla) compiler, which it
  loads at run time as a PJRT plugin for the CPU, GPUs or TPUs.

  EXLA plays two parts: `EXLA.Backend` keeps tensors on a device and runs
  each operation there, and this module compiles whole `defn`/`Nx.Defn`
  functions into one XLA program.

  ## Configuration

  To keep tensors on the device by default, set the backend in your
  `config/config.exs`:

      import Config
      config :nx, :default_backend, EXLA.Backend

  A script or a notebook can call `Nx.global_default_backend(EXLA.Backend)`
  instead. The backend does not choose the compiler of `defn`; to make it
  EXLA:

      config :nx, :default_defn_options, compiler: EXLA

  or call `Nx.Defn.global_default_options(compiler: EXLA)`.

  EXLA picks the client to allocate and compute on from `:preferred_clients`
  (`[:cuda, :rocm, :tpu, :host]` by default): the first one whose platform is
  available. Set `config :exla, :default_client, :host` to choose one; see
  `EXLA.Client` for the configuration of clients.

  EXLA's native code reports what it does (plugins loaded, clients
  created, compilations and their durations, failed host callbacks,
  integrity failures) to `Logger`; set `config :exla, :native_log_level,
  :info` (or `:debug`, `:trace`) to see more than the warnings it reports
  by default. See `EXLA.NativeLog`.

  Inspecting a tensor on `EXLA.Backend` shows the client, device and buffer
  reference it lives in. Set `config :exla, :add_backend_on_inspect, false`
  to leave that line out.

  ## Options

  The functions in this module (and `Nx.Defn` with `compiler: EXLA`) accept:

    * `:client` - the name of the `EXLA.Client` that compiles and runs the
      program. When absent, `EXLA.Client.default_name/0` picks it.

    * `:device_id` - which of that client's devices runs the program. When
      absent, the client's `:default_device_id`.

    * `:precision` - the precision of dot products and convolutions on
      floating point operands: `:default`, `:high` or `:highest`. Defaults
      to `:default`. Any other value raises, as EXLA 0.13 words it,
      "expected precision configuration to be one of :default, :high, or
      :highest, got: ...", when the function is compiled (EXLA raises
      only when it lowers a dot product or a convolution). On Nx 0.7,
      `:packed_nibble` is accepted too, as in EXLA 0.7, and the message
      lists it (":default, :high, :highest, or :packed_nibble"), but
      StableHLO has no such precision, so a function with a dot product or
      a convolution raises when compiled with it. (EXLA 0.7's MLIR compiler
      checked the value but left it out of the program; here it is the
      `precision_config` of every `dot_general` and `convolution`.)

    * `:compiler_mode` - `:mlir`, the only mode: every function is lowered
      to StableHLO (MLIR) for the PJRT plugin. EXLA 0.7's legacy `:xla`
      mode raises an `ArgumentError`. When not given, it is read from
      `config :exla, :compiler_mode` (defaulting to `:mlir`), as in EXLA 0.7.

    * `:cache` - `true`, `false` or a file path. Defaults to `true`: the
      compiled function is kept in memory for the life of the VM, and its
      executable in the compile cache on disk (`EXLA.CompileCache`) for
      later VMs. When `false`, the function is compiled on every call and
      nothing is kept, in memory or on disk. A path (a string) keeps the
      executable in that one file, as EXLA 0.9 and later do: every call
      (every compilation, for `compile/3`) reads the file first, before
      the function kept in memory. A file for the same configuration (the
      client, the arguments' types, shapes and names, `:lazy_transfers`,
      the hooks' names and the other options) is used, and with
      `debug: true` "EXLA disk cache found at PATH" is logged; without a
      file, "EXLA disk cache not found at PATH" is logged with
      `debug: true` and the file is written. A file for another
      configuration logs EXLA's warning "EXLA disk cache does not match
      configuration." with the entries that differ, and is replaced. Unlike
      EXLA, a file whose configuration matches but which holds another
      program (another function given the same path, a function changed
      since, or one compiled by another plugin) is not run: a warning says
      so, and the file is replaced. `shard_jit/3` keeps its programs in
      memory only.

    * `:debug` - when `true`, logs (at the debug level) the time spent
      evaluating the expression, compiling it (with whether each was a cache
      hit or miss), waiting for the device and executing it. Defaults to
      `false`; streams log the wait and the time to start them. The wait
      is logged as "EXLA device N lock in Xms", as in EXLA 0.7, whose runs
      took a lock on their device. This EXLA takes no such lock: the plugin
      queues the executions of a device, so X is the time from the run
      request to the start of the run, which nothing delays (0.0ms). A run
      may still wait for a free dirty scheduler or run thread (see
      `EXLA.Executable`) and in the plugin's queue: that time counts in the
      execution time.

    * `:lazy_transfers` - `:opt_in`, `:always` or `:never`. Defaults to
      `:opt_in`, as in EXLA 0.7.

      With `:always`, inputs not yet on a device are not transferred
      before the computation starts: the program asks the calling process
      for such an input (through a host callback) when it first needs it,
      so an input that only a branch not taken uses, or that is not used at
      all, is never transferred (nor, for a lazy container, materialized).
      Each of these transfers emits the `[:exla, :lazy_transfer]` telemetry
      event. Inputs that already are `EXLA.Backend` tensors are passed to
      the program as ordinary parameters (copied first if they live on
      another device) and never go through the host; a program is compiled
      (and cached) for each combination of device and host inputs a function
      is called with. This trades latency (a round trip to the BEAM per host
      input) for device memory.

      `:opt_in` makes lazy only the inputs that opt in, and Nx 0.7 gives an
      argument no way to opt in, so, as in EXLA 0.7, it transfers every
      input before the computation starts, exactly like `:never`.

    * `:donate` - the arguments whose device memory the computation may
      reuse for its outputs, as a list of positions (JAX's
      `donate_argnums`). Defaults to `[]`.

      A position counts the function's arguments from 0, skipping those
      `Nx.Defn` does not pass as tensors (lists, such as keyword options,
      and functions). Every tensor of a donated argument is donated: the
      argument itself when it is a tensor, or each tensor of a tuple, map
      or other container. The program reuses the buffer of a donated
      tensor for an output of the same type and shape (the first such
      output not taken by an earlier donated tensor) instead of
      allocating one, and frees the others when it runs; either way,
      every donated tensor is deallocated after the call and reading it
      raises `RuntimeError` "called on deleted or donated buffer". A
      training step that returns updated parameters thus updates them in
      place: donate the parameters and use the returned ones.

      A donated tensor that is not on the function's client and device
      (on another device or client, or on another backend) is copied there
      first and the copy is donated: the original stays as it is. Passing
      the same tensor twice in one call, once donated, raises. The option
      is part of the cache key. `stream/3` does not support it.

  Options EXLA does not know pass through, as in EXLA 0.7: libraries give
  their own to every compiler (`Nx.Serving` gives `:batch_keys`, Axon
  `:mode`). Like the known ones, they are part of the cache key.

  ## Caching

  A function is compiled once per combination of argument types, shapes and
  names, options, client and device. When many processes call a function that
  is not yet compiled, one of them compiles it while the others wait for it
  and reuse its result. `cached?/3` tells whether a call would be served from
  the cache. Calls served from the cache neither evaluate nor lower the
  expression: they move the arguments to the device and run the program.

  Compiled programs are also kept on disk, in `EXLA.CompileCache`, so that
  a new VM loads them instead of compiling them again (it still evaluates
  and lowers the function, a few milliseconds, to find them). It is on by
  default; `config :exla, :cache_dir, false` turns it off, and its module
  documentation gives its settings and how a damaged or foreign file is
  refused. Its size limit and the shortest compile worth writing are also
  set by the environment variables `EXLA_CACHE_MAX_SIZE` (such as `512M`)
  and `EXLA_CACHE_MIN_COMPILE_TIME` (milliseconds). Within a VM, programs
  that lower to the same MLIR text share one executable.

  ## Recompilation

  The function is part of the key: an anonymous function that captures a
  tensor is a new function whenever that tensor is another one, and is
  compiled again although the shapes are the same. To be told when this
  happens, set:

      config :exla, :check_recompilation, 5

    * `:check_recompilation` - a positive integer `n`, or `:infinity` (the
      default, no check). EXLA then logs a warning, once, when it has
      compiled a function `n` times with the same argument and result
      types and shapes. Closures of the same code count as one function
      when they capture the same values, tensors counting by type and
      shape only. Only compilations count (calls served from the cache
      do nothing more), and not those with `cache: false`, which compile on
      every call by request. Another value raises `ArgumentError` at the
      next compilation.

  ## What a function captures

  The cache key of a jitted function holds the function, and so what it
  captured, and its options. A term may share subterms: `Enum.reduce(1..40,
  :leaf, fn _, t -> {t, t} end)` is 40 tuples in memory but 2^40 leaves as
  a tree, and so is an `Nx.Defn` expression in which each step uses the
  one before twice (what `Nx.Defn.Graph.run/3` jits). The VM hashes,
  compares and copies a term as a tree, in one call that cannot be
  interrupted, so such a key would hold a scheduler for ever. EXLA
  therefore keeps the cost of every key within the size of its terms in
  memory:

    * the function, and the options, each stand for themselves when their
      tree takes at most 65,536 words (a function's captured values
      included), as in EXLA; EXLA walks them first, on the calling
      scheduler, which costs about what hashing them does (small options,
      and a function that captures nothing, are looked at in Elixir
      without the walk);

    * a larger one stands for a 128-bit digest of its value, computed on
      a dirty scheduler with each subterm visited once wherever it is
      shared (XXH3-128, 5 to 50 ns a subterm): equal values get equal
      digests however they share, two different ones the same digest with
      a probability of about 2^-128. The calling process remembers the
      answer for the last 4 functions that captured something (the same
      term in memory, so the same value): calling the same jitted
      function again skips the walk and the digest of what it captured
      (a remembered function is kept alive until 4 others replace it);

    * a compiled program that would hold such a term (a hook's function
      that captured it, or the variants of `lazy_transfers: :always`,
      which keep the function) is not kept: each call evaluates and lowers
      the function again, and takes the executable of the same program
      text from the in-memory compile cache.

  Logged and raised keys and options are printed cut down to about 2,000
  words. The `[:exla, :compilation]` metadata still holds the function
  itself, as in EXLA (given by reference, at no cost): a handler that
  prints, compares or sends it pays for its tree.

  Measured on a 2-core machine shared with other work, with one scheduler
  (`bench/shared_term_bench.exs`, Elixir 1.14 and Nx 0.7.2; medians of 7
  rounds, µs per cached call of `x + 1` on an `f32[2]`; the same closure
  called again, or a new closure of equal value at each call):

  | captured | before, same | before, new | now, same | now, new |
  | --- | --- | --- | --- | --- |
  | nothing | 4.7 | 4.8 | 4.8 | 5.3 |
  | a list of 1,000 integers | 10.4 | 10.5 | 10.6 | 15.9 |
  | a list of 100,000 integers | 789 | 959 | 5.3 | 3,610 |
  | a chain of 20 tuples, 2^20 leaves | 20,237 | 19,880 | 6.0 | 292 |

  A closure that captured a chain of 16 tuples used to take 19 ms at its
  first call beyond the compile and 0.8 ms at each later one, of 20
  tuples 335 and 17.5 ms (the scheduler held 47 ms at a time), of 22
  tuples 1,066 and 55 ms (291 ms held), and of 40 never returned. Now a
  first call takes the evaluator's time and the compile's plus less than a
  millisecond, and a later one 10 µs, at any depth (60 tested), with the
  scheduler held less than a millisecond.

  ## Runs nobody waits for

  On the host platform, a program's `while` loops check whether their run
  is still wanted: when the process that called it (a jitted function,
  `EXLA.Executable.run/3`, an `Nx.Serving` run) exits or is killed, the
  run stops at its loops' next check, about 50 µs later or after one
  iteration, and gives its memory back; so does a run under way when the
  VM halts (OTP 26 and later). The checks cost about 1% of a loop's time,
  within the noise of a measure (see "Runs nobody waits for" in the README
  for the numbers, and the programs that have no checks). To compile
  programs without them:

      config :exla, :stop_abandoned_runs, false

    * `:stop_abandoned_runs` - `true` (the default) or `false`, read when a
      program is compiled.

  ## Distribution

  Tensors and compiled functions may be sent to other nodes of a cluster
  (see "Tensors of other nodes" in `EXLA.Backend`). An `EXLA.Backend`
  tensor of another node given to a function of this module is copied to
  this node's device first, as a tensor of another device is.

  A function returned by `compile/3` carries its executable: on another
  node with the same PJRT plugin file, its first call loads the executable
  from the node that compiled it (serialized, checked for integrity and
  for the plugin, see `EXLA.Executable`) instead of compiling the function
  again; with another plugin, or when that node is gone or no longer has
  it, the function is compiled there. A `jit/2` function compiles on each
  node it runs on, except that a jitted anonymous function made on another
  connected node first looks there for its program, cached for the same
  arguments and options, and loads it likewise. (From OTP 27 on, a
  function no longer records the node that made it: it looks on every
  connected node.)

  ## Telemetry

  EXLA emits `[:exla, :compilation]` once per compilation, of a jitted
  function or of an `EXLA.Backend` operation, exactly as EXLA does: the
  measurements are, in microseconds,

    * `:eval_time` - building the expression (Nx's tracing of the
      function);
    * `:compile_time` - everything after it: lowering the expression to
      MLIR, looking for the program in the compile cache on disk, and
      compiling it with XLA or loading it from there;
    * `:total_time` - their sum;

  and the metadata is exactly `%{key: key}`, where `key` is the compiled
  function (for `EXLA.Backend`, the operation's name, an atom, or for a
  block of Nx 0.12 and later, `{struct, default_function}`).

  What this EXLA knows beyond that comes with an event of its own,
  `[:exla, :compilation, :details]`, emitted right after it for the same
  compilation. Its measurements are the three above and the stages of
  `:compile_time`, all in microseconds:

    * `:lower_time` - the lowering to MLIR;
    * `:xla_compile_time` - the PJRT plugin's compile (its HLO passes and
      its code generation; 0 when the executable came from the disk cache);
    * `:cache_load_time` - looking for the program in the disk cache, and
      loading it when it is there;
    * `:cache_write_time` - serializing a new executable and writing it to
      the disk cache (0 when it is not written, see `EXLA.CompileCache`).

  Its metadata is `%{key: key, kind: kind, disk_cache: status, client:
  client}`: `key` as above, `kind` is `:jit` (`jit/2`, `compile/3`,
  `stream/3`, `shard_jit/3` and defn) or `:backend` (an eager
  `EXLA.Backend` operation), `client` the name of the client that
  compiled it, and `status` tells where the executable came from: `:hit`
  (loaded from the compile cache on disk, or from the file of `cache:
  path`), `:miss` (compiled by XLA after looking on disk), `:off`
  (compiled, no disk cache for this call) or `:memory` (the executable of
  a program with the same MLIR text, compiled or loaded before in this
  VM, as happens for closures made anew for each call; see
  `EXLA.CompileCache`).

      :telemetry.attach(
        "log-slow-compiles",
        [:exla, :compilation, :details],
        fn _event, %{xla_compile_time: us}, %{key: key, disk_cache: cache}, _config ->
          if us > 1_000_000, do: IO.puts("\#{inspect(key)}: \#{div(us, 1000)} ms (\#{cache})")
        end,
        nil
      )

  The plugin reports no timings of its own through PJRT: its HLO passes
  and code generation per kernel can be told apart in an XLA dump
  (`XLA_FLAGS=--xla_dump_to=DIR`, whose files are written as each stage
  ends), as `bench/scholar_bench.exs` does with `BENCH_DUMP=1`.

  Calls served from the cache emit nothing.

  With `lazy_transfers: :always`, EXLA emits `[:exla, :lazy_transfer]` each
  time a running program receives an input, with the measurement `:bytes`
  and the metadata `%{input: index}` (the index of the flattened input).

  ## Examples

      iex> fun = EXLA.jit(&Nx.add/2)
      iex> fun.(Nx.tensor([1.0, 2.0, 3.0]), Nx.tensor([4.0, 5.0, 6.0]))
      #Nx.Tensor<
        f32[3]
        [5.0, 7.0, 9.0]
      >

  """

  @behaviour Nx.Defn.Compiler

  @doc """
  Wraps `function` so that it is compiled with EXLA when called.

  Equivalent to `Nx.Defn.jit/2` with `compiler: EXLA` added to `options`;
  the module documentation lists the options.

  ## Examples

      iex> fun = EXLA.jit(fn x, y -> Nx.multiply(x, y) end)
      iex> fun.(Nx.tensor([1.0, 2.0]), Nx.tensor(3.0))
      #Nx.Tensor<
        f32[2]
        [3.0, 6.0]
      >

  """
  def jit(function, options \\ []) when is_function(function) and is_list(options) do
    Nx.Defn.jit(function, Keyword.put(options, :compiler, __MODULE__))
  end

  @doc """
  Compiles `function` with EXLA and applies it to `args`.

  Equivalent to `Nx.Defn.jit_apply/3` with `compiler: EXLA` added to
  `options`.

  ## Examples

      iex> EXLA.jit_apply(&Nx.sum/1, [Nx.tensor([1.0, 2.0, 3.0])])
      #Nx.Tensor<
        f32
        6.0
      >

  """
  def jit_apply(function, args, options \\ [])
      when is_function(function) and is_list(args) and is_list(options) do
    Nx.Defn.jit_apply(function, args, Keyword.put(options, :compiler, __MODULE__))
  end

  @doc """
  Compiles `function` ahead of time for arguments shaped like `args`.

  `args` may be tensors or templates (see `Nx.template/3`). The returned
  function only accepts arguments compatible with `args` and runs without
  looking at the cache. Equivalent to `Nx.Defn.compile/3` with
  `compiler: EXLA` added to `options`.

  ## Examples

      iex> fun = EXLA.compile(&Nx.negate/1, [Nx.template({2}, {:f, 32})])
      iex> fun.(Nx.tensor([1.0, -2.0]))
      #Nx.Tensor<
        f32[2]
        [-1.0, 2.0]
      >

  """
  def compile(function, args, options \\ [])
      when is_function(function) and is_list(args) and is_list(options) do
    Nx.Defn.compile(function, args, Keyword.put(options, :compiler, __MODULE__))
  end

  # Nx 0.7 has no Nx.Mesh.
  @mesh_doc ~S"""
  ## With an `Nx.Mesh` (Nx 0.12 and later)

  Given an `%Nx.Mesh{}`, this is `Nx.Defn.shard_jit/3` with EXLA as the
  compiler, as in EXLA 0.11 and later. The mesh's partitions are the
  client's first devices in the mesh's row-major order (a `{2, 2}` mesh
  runs on devices 0 to 3): a mesh with more partitions than the client
  has devices raises `ArgumentError`. Its `:name` names it in the program
  (any non-empty string but `"main"`).

  The returned function takes a list with one list of arguments per
  partition, each holding that partition's part of every input (the
  caller cuts the inputs; Nx reads their types and shapes from the first
  partition's, and the others' must be the same). It returns a list with
  one result per partition: that partition's part of the results, on its
  device.

  The options are those of `jit/2` (`:device_id` aside), and:

    * `:input_shardings` (required) - how the inputs are split, one map per
      tensor of the flattened arguments, from a tensor axis (an integer, a
      negative integer counting from the last axis, or a name) to the list
      of mesh axes it is split over: `%{0 => [0]}` splits axis 0 over mesh
      axis 0; `%{0 => [0, 1]}` over mesh axes 0 and 1, mesh axis 0 the
      major one; axes not given, and `%{}`, are replicated. Each mesh axis
      appears at most once per input. Wrong counts, unknown axes and
      repeated ones raise `ArgumentError`.

  XLA's Shardy partitioner compiles the program. Each input keeps the
  sharding it is given (EXLA 0.13.1 leaves the inputs' shardings open, so
  that Shardy may split an input further, after which the parts given no
  longer fit), and each result gets the sharding Shardy propagates to it:
  an elementwise result is split as its inputs, a sum over a split axis is
  whole on every partition, and a result that cannot be split evenly stays
  whole. Each call copies every partition's arguments through the host to
  its device.

  A mesh of one partition runs on any client:

      iex> mesh = %Nx.Mesh{name: "mesh", shape: {1}}
      iex> double = EXLA.shard_jit(&Nx.multiply(&1, 2), mesh, input_shardings: [%{0 => [0]}])
      iex> [part] = double.([[Nx.tensor([1, 2, 3])]])
      iex> part
      #Nx.Tensor<
        s32[3]
        [2, 4, 6]
      >

  On a client with four devices, a `{2, 2}` mesh splits `x` (whole shape
  `{4, 2}`) into one `{2, 1}` part per device:

      mesh = %Nx.Mesh{name: "mesh", shape: {2, 2}}
      add = EXLA.shard_jit(&Nx.add/2, mesh, input_shardings: [%{0 => [0], 1 => [1]}, %{}])
      x = Nx.iota({4, 2})
      parts = for r <- [0, 2], c <- [0, 1], do: [x[[r..(r + 1), c..c]], 10]
      add.(parts)
      #=> [[[10], [12]], [[11], [13]], [[14], [16]], [[15], [17]]], on devices 0 to 3
  """
  @mesh_doc if EXLA.NxVersion.meshes?(), do: @mesh_doc, else: ""

  @doc """
  Wraps `function` so that, when called, it is compiled into one SPMD
  program that runs on every device of a `mesh` at once, each device
  computing on its part of the inputs.

  EXLA 0.11 and later call this `shard_jit`; Nx 0.7 has no meshes, so here
  a mesh is a tuple of sizes, the logical shape of a grid of the client's
  devices, numbered in row-major order: `{2}` is devices 0 and 1, `{2, 2}`
  devices 0 to 3 (the client needs that many, see "Host devices" in
  `EXLA.Client` for the CPU).

  The options are those of `jit/2` (`:device_id` aside: the mesh picks the
  devices), and:

    * `:input_shardings` - how each input tensor is split over the mesh,
      one entry per tensor of the flattened arguments: a map from a tensor
      axis to the mesh axis it is split along, `%{0 => 0}` splitting axis 0
      in as many equal parts as mesh axis 0 has devices. Along the mesh
      axes a tensor does not use, and for `%{}`, it is replicated. Each
      split axis must divide evenly. Defaults to replicating every input.

  XLA's SPMD partitioner compiles one program per device from the
  `mhlo.sharding` annotations of the inputs and adds the communication
  between devices the computation needs (a sum over a split axis becomes
  an all-reduce). The results are whole on every device; the returned
  tensors are those of the mesh's first device.

  Each call splits its inputs on the host and copies each device's part
  there. The CPU plugin runs these programs across the devices of a host
  client.

  ## Examples

      # A client with two CPU devices: config :exla, :clients,
      #   host: [platform: :host, device_count: 2]
      sum_rows = EXLA.shard_jit(&Nx.sum(&1, axes: [1]), {2}, input_shardings: [%{0 => 0}])
      sum_rows.(Nx.iota({4, 3}))
      #=> [3, 12, 21, 30], each device summing two of the rows

      total = EXLA.shard_jit(&Nx.sum/1, {2}, input_shardings: [%{0 => 0}])
      total.(Nx.iota({4, 3}))
      #=> 66, from an all-reduce of the two devices' partial sums

  #{@mesh_doc}
  """
  def shard_jit(function, mesh, options \\ [])

  if EXLA.NxVersion.meshes?() do
    def shard_jit(function, %Nx.Mesh{} = mesh, options)
        when is_function(function) and is_list(options) do
      Nx.Defn.shard_jit(function, mesh, Keyword.put(options, :compiler, __MODULE__))
    end
  end

  def shard_jit(function, mesh, options)
      when is_function(function) and is_list(options) do
    Nx.Defn.jit(function, [compiler: EXLA.Defn.Sharded, mesh: mesh] ++ options)
  end

  # Nx 0.7 only: Nx 0.10 removed Nx.Defn.stream/3 and the Nx.Stream
  # protocol, and EXLA 0.10 and later have no streams either.
  if EXLA.NxVersion.streams?() do
    @doc """
    Compiles `function` with EXLA and starts it as a stream: a program that
    keeps running on the device and handles chunks of input as they come.

    Equivalent to `Nx.Defn.stream/3` with `compiler: EXLA` added to
    `options`. `function` takes a chunk and the accumulator and returns
    `{output, accumulator}`. The accumulator stays on the device between
    chunks; each `Nx.Stream.send/2` (from any process) produces one output
    for `Nx.Stream.recv/1`, and `Nx.Stream.done/1` ends the stream and
    returns the last accumulator. Only the process that started the stream
    may call `recv` and `done`.

        defn tenfold(chunk, count), do: {chunk * 10, count + 1}

        stream = EXLA.stream(&tenfold/2, [0, 0])
        Nx.Stream.send(stream, 4)
        Nx.Stream.send(stream, 7)
        Nx.to_number(Nx.Stream.recv(stream))
        #=> 40
        Nx.to_number(Nx.Stream.recv(stream))
        #=> 70
        Nx.to_number(Nx.Stream.done(stream))
        #=> 2

    ## Errors

      * `Nx.Stream.send/2` of data that does not match the stream's input
        (type, shape, names, as `Nx.compatible?/2`) raises `ArgumentError`;
        the stream goes on. Data may be any `Nx.LazyContainer`; other data (a
        list, an atom, a string) raises the same way. Of a lazy container,
        only the tensors the step reads are built and sent.

      * `Nx.Stream.done/1` while outputs are not received yet raises
        `RuntimeError` ("cannot mark stream as done when there are recv
        messages pending") and changes nothing: receive them, then call
        `Nx.Stream.done/1` again.

      * `Nx.Stream.recv/1` on a stream that has ended (done, or failed)
        raises `RuntimeError` ("cannot recv from stream because it has been
        terminated"); so do `Nx.Stream.done/1` and `Nx.Stream.send/2`, with
        their own messages.

      * When the program fails (which checked input cannot make happen), the
        next `Nx.Stream.recv/1` raises the failure (so does
        `Nx.Stream.done/1` when no output is pending).

      * `Nx.Stream.recv/1` and `Nx.Stream.done/1` from another process raise
        `RuntimeError`.

      * If the starting process dies, the native side closes the session and
        the program ends. In every case the client stays usable.
    """
    def stream(function, args, options \\ [])
        when is_function(function) and is_list(args) and is_list(options) do
      Nx.Defn.stream(function, args, Keyword.put(options, :compiler, __MODULE__))
    end

    @doc """
    Returns whether the stream of `function` with `args` and `options` is
    compiled and cached already. Nothing is compiled or run.
    """
    def stream_cached?(function, args, options \\ [])
        when is_function(function) and is_list(args) and is_list(options) do
      EXLA.Defn.__with_mode__(:cached?, fn -> stream(function, args, options) end)
    end
  end

  @doc """
  Returns whether `function` applied to `args` with `options` is compiled
  and cached already. Nothing is compiled or run.

  ## Examples

      iex> fun = fn x -> Nx.add(x, 10) end
      iex> EXLA.cached?(fun, [Nx.tensor([1, 2, 3])])
      false
      iex> EXLA.jit_apply(fun, [Nx.tensor([1, 2, 3])])
      iex> EXLA.cached?(fun, [Nx.tensor([1, 2, 3])])
      true
      iex> EXLA.cached?(fun, [Nx.tensor([1.0, 2.0, 3.0])])
      false

  """
  def cached?(function, args, options \\ [])
      when is_function(function) and is_list(args) and is_list(options) do
    EXLA.Defn.__with_mode__(:cached?, fn -> jit_apply(function, args, options) end)
  end

  @mlir_mesh_doc """

    * `:mesh` - an `%Nx.Mesh{}`: the module is the one `shard_jit/3`
      compiles for that mesh, with `:input_shardings` (required, as
      `shard_jit/3` takes them), and `args` is one list of arguments per
      partition, as the function `shard_jit/3` returns takes. The module
      declares the mesh (`sdy.mesh`) and each parameter's sharding
      (`sdy.sharding`), and its types are those of the whole inputs
  """
  @mlir_mesh_doc if EXLA.NxVersion.meshes?(), do: @mlir_mesh_doc, else: ""

  @doc """
  Returns the StableHLO module `function` compiles to for `args`, as a map
  of:

    * `:mlir_module` - the module as text, which `EXLA.Executable.compile/3`
      compiles
    * `:used_inputs` - a `MapSet` of the positions (in the flattened
      arguments) of the inputs the computation reads: the module's
      parameters, in order
    * `:output_container` - the output, with template tensors

  `args` may be templates. Nothing is compiled by XLA or cached.

  ## Options

  The options of `jit/2` (those that shape the program, such as
  `:precision` and `:client`, change the module), and:

    * `:within_defn_compiler` - `true` when called from another `defn`
      compiler's callback (such as its `__compile__/4`), with the function
      and the vars that callback was given: `function` is then called with
      the list `args` and returns the expression, as a compiler calls it,
      and EXLA lowers it although a compilation is under way. Defaults to
      `false`, where `function` takes `args` as its arguments, as in
      `jit/2`.
  #{@mlir_mesh_doc}
  ## Examples

      iex> fun = fn x, y -> Nx.add(Nx.sin(x), y) end
      iex> args = [Nx.template({3}, {:f, 32}), Nx.template({3}, {:f, 32})]
      iex> %{mlir_module: mlir, used_inputs: used} = EXLA.to_mlir_module(fun, args)
      iex> mlir =~ "func.func public @main"
      true
      iex> mlir =~ "stablehlo.sine"
      true
      iex> used
      MapSet.new([0, 1])

  """
  def to_mlir_module(function, args, options \\ [])
      when is_function(function) and is_list(args) and is_list(options) do
    {nested?, options} = Keyword.pop(options, :within_defn_compiler, false)

    unless is_boolean(nested?) do
      raise ArgumentError,
            "expected :within_defn_compiler to be a boolean, got: #{inspect(nested?)}"
    end

    {mesh, options} = Keyword.pop(options, :mesh)
    mesh = mlir_mesh!(mesh)

    run =
      if nested?,
        do: compiler_run(function, args, mesh, options),
        else: mlir_module_run(function, args, mesh, options)

    result = EXLA.Defn.__with_mode__(:to_mlir, run)
    %{result | used_inputs: MapSet.new(result.used_inputs)}
  end

  defp mlir_mesh!(nil), do: nil

  if EXLA.NxVersion.meshes?() do
    defp mlir_mesh!(%Nx.Mesh{} = mesh), do: mesh
  end

  defp mlir_mesh!(mesh),
    do: raise(ArgumentError, "expected :mesh to be an %Nx.Mesh{}, got: #{inspect(mesh)}")

  # From another compiler's callback, Nx is not asked to compile (it would
  # refuse a compilation inside another): EXLA's own callback is called with
  # the compiler's function and vars, as Nx would call it.
  defp compiler_run(fun, vars, nil, options),
    do: fn -> EXLA.Defn.__jit__(fun, vars, fun, [vars], options) end

  # With a mesh, vars are the first partition's parts (as for shard_jit/3),
  # and so every partition's as far as a module only lowered is concerned.
  defp compiler_run(fun, vars, mesh, options) do
    args_list = List.duplicate(vars, Tuple.product(mesh.shape))
    fn -> EXLA.Defn.Sharded.shard_jit(fun, mesh, vars, fun, args_list, options) end
  end

  defp mlir_module_run(function, args, nil, options) do
    if Keyword.has_key?(options, :input_shardings) do
      raise ArgumentError,
            "input sharding configuration provided but no device mesh was provided " <>
              "(the :mesh option)"
    end

    fn -> jit_apply(function, args, options) end
  end

  defp mlir_module_run(function, args, mesh, options),
    do: fn -> shard_jit(function, mesh, options).(args) end

  @impl Nx.Defn.Compiler
  defdelegate __jit__(key, vars, fun, args_list, opts), to: EXLA.Defn

  @impl Nx.Defn.Compiler
  defdelegate __compile__(key, vars, fun, opts), to: EXLA.Defn

  if EXLA.NxVersion.streams?() do
    @impl Nx.Defn.Compiler
    defdelegate __stream__(key, input, acc, vars, fun, args_list, opts), to: EXLA.Defn
  end

  if EXLA.NxVersion.meshes?() do
    @impl Nx.Defn.Compiler
    defdelegate __shard_jit__(key, mesh, vars, fun, args_list, opts),
      to: EXLA.Defn.Sharded,
      as: :shard_jit
  end

  @impl Nx.Defn.Compiler
  defdelegate __partitions_options__(opts), to: EXLA.Defn

  @impl Nx.Defn.Compiler
  defdelegate __to_backend__(opts), to: EXLA.Defn
end
