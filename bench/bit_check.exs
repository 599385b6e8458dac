# A corpus of programs whose results must not change by a bit when the
# compile path changes (plugin options, caching, concurrency): it runs each
# program, eagerly on EXLA.Backend and jitted, and writes one line per
# program with the SHA-256 of its results' bytes. Run it before and after a
# change and compare the files:
#
#     MIX_ENV=prod mix run bench/bit_check.exs > before.txt
#     XLA_FLAGS=--some_option MIX_ENV=prod mix run bench/bit_check.exs > after.txt
#     diff before.txt after.txt && echo same bits
#
# The last line (starting with `#`) is the time the plugin spent compiling
# the corpus (`:xla_compile_time` of `[:exla, :compilation, :details]`), not part of
# the comparison (`diff -I '^#'`). The disk compile cache is off, so every
# program is compiled. Inputs are fixed (Nx.Random with a fixed key, made
# on Nx.BinaryBackend) and include negative values, zeros and values near
# the edges of the elementary functions' domains.
#
# Environment: BIT_CHECK_CONCURRENCY (default 1): programs compiled by that
# many processes at once (the bits must not depend on it); BIT_CHECK_EAGER
# (default 1): `0` runs the jitted programs only.
Application.put_env(:exla, :cache_dir, false)

defmodule BitCheck do
  import Nx.Defn

  @float_types [{:f, 32}, {:f, 64}, {:bf, 16}, {:f, 16}]

  def input(shape, type, seed) do
    key = Nx.Random.key(seed)
    {t, _} = Nx.Random.normal(key, 0.0, 3.0, shape: shape, type: {:f, 64})
    t = Nx.backend_transfer(t, Nx.BinaryBackend)

    case type do
      {:f, _} -> Nx.as_type(t, type)
      {:bf, _} -> Nx.as_type(t, type)
      {:s, _} -> t |> Nx.multiply(10) |> Nx.round() |> Nx.as_type(type)
      {:u, _} -> t |> Nx.abs() |> Nx.multiply(10) |> Nx.round() |> Nx.as_type(type)
    end
  end

  @unary [
    :exp,
    :expm1,
    :log,
    :log1p,
    :sigmoid,
    :tanh,
    :sin,
    :cos,
    :tan,
    :asin,
    :acos,
    :atan,
    :sinh,
    :cosh,
    :asinh,
    :acosh,
    :atanh,
    :sqrt,
    :rsqrt,
    :cbrt,
    :erf,
    :erfc,
    :erf_inv,
    :negate,
    :abs,
    :round,
    :floor,
    :ceil,
    :sign
  ]

  @binary [:add, :subtract, :multiply, :divide, :pow, :atan2, :remainder, :min, :max]

  # {name, function, arguments} of every program.
  def programs do
    unary =
      for op <- @unary, shape <- [{5, 6}], type <- @float_types do
        {"#{op} #{inspect(type)} #{inspect(shape)}", &apply(Nx, op, [&1]),
         [input(shape, type, 1)]}
      end

    binary =
      for op <- @binary, shape <- [{5, 6}], type <- [{:f, 32}, {:f, 64}, {:s, 32}] do
        {"#{op} #{inspect(type)} #{inspect(shape)}", &apply(Nx, op, [&1, &2]),
         [input(shape, type, 2), input(shape, type, 3)]}
      end

    composite =
      for {name, fun} <- composites(), type <- [{:f, 32}, {:f, 64}] do
        {"#{name} #{inspect(type)}", fun, [input({6, 6}, type, 4), input({6, 6}, type, 5)]}
      end

    unary ++ binary ++ composite
  end

  defp composites do
    [
      softmax: &softmax/2,
      logsumexp: &logsumexp/2,
      mlp: &mlp/2,
      mlp_grad: &mlp_grad/2,
      sums: &sums/2,
      dots: &dots/2,
      cumulative: &cumulative/2,
      sorts: &sorts/2,
      windows: &windows/2,
      conv: &conv/2,
      gathers: &gathers/2,
      qr: &qr/2,
      svd: &svd/2,
      eigh: &eigh/2,
      cholesky: &cholesky/2,
      solve: &solve/2,
      determinant: &determinant/2,
      lu: &lu/2,
      while_loop: &while_loop/2
    ]
  end

  defn softmax(a, _b),
    do:
      Nx.exp(a - Nx.reduce_max(a, axes: [1], keep_axes: true))
      |> then(&(&1 / Nx.sum(&1, axes: [1], keep_axes: true)))

  defn logsumexp(a, b), do: Nx.log(Nx.sum(Nx.exp(a * b), axes: [0]))
  defn mlp(a, b), do: Nx.tanh(Nx.dot(a, b) + 1) |> Nx.dot(Nx.transpose(b)) |> Nx.sigmoid()
  defn mlp_grad(a, b), do: grad(a, fn a -> Nx.sum(mlp(a, b) ** 2) end)

  defn sums(a, b),
    do:
      {Nx.sum(a), Nx.product(b / 3), Nx.mean(a, axes: [0]), Nx.standard_deviation(b),
       Nx.reduce_min(a * b, axes: [1])}

  defn dots(a, b),
    do: {Nx.dot(a, b), Nx.dot(a, [0], b, [1]), Nx.outer(a[0], b[1]), Nx.dot(a, b[0])}

  defn cumulative(a, b),
    do: {Nx.cumulative_sum(a, axis: 1), Nx.cumulative_product(b / 4), Nx.cumulative_max(a)}

  defn sorts(a, b),
    do:
      {Nx.sort(a, axis: 1), Nx.argsort(b, axis: 0, direction: :desc), Nx.argmax(a, axis: 1),
       Nx.top_k(Nx.flatten(b), k: 3)}

  defn windows(a, b),
    do:
      {Nx.window_sum(a, {2, 2}), Nx.window_max(b, {3, 1}, strides: [1, 1], padding: :same),
       Nx.window_mean(a, {2, 3})}

  defn conv(a, b),
    do:
      Nx.conv(Nx.reshape(a, {1, 1, 6, 6}), Nx.reshape(Nx.slice(b, [0, 0], [3, 3]), {1, 1, 3, 3}),
        padding: :same
      )

  defn gathers(a, b),
    do:
      {Nx.take(a, Nx.argmax(b, axis: 0)), Nx.gather(a, Nx.tensor([[0, 1], [5, 2]])),
       Nx.indexed_add(a, Nx.tensor([[1, 1], [2, 3]]), Nx.tensor([1.0, 2.0], type: Nx.type(a)))}

  defn qr(a, _b), do: Nx.LinAlg.qr(a)
  defn svd(a, _b), do: Nx.LinAlg.svd(a)
  defn eigh(a, _b), do: Nx.LinAlg.eigh(a + Nx.transpose(a))
  defn cholesky(a, _b), do: Nx.LinAlg.cholesky(Nx.dot(a, Nx.transpose(a)) + Nx.eye(6) * 6)

  defn solve(a, b),
    do: {Nx.LinAlg.solve(a, b), Nx.LinAlg.triangular_solve(Nx.tril(a) + Nx.eye(6) * 20, b)}

  defn determinant(a, b), do: {Nx.LinAlg.determinant(a), Nx.LinAlg.invert(b)}
  defn lu(a, _b), do: Nx.LinAlg.lu(a)

  defn while_loop(a, b) do
    {_i, acc, _b} =
      while {i = 0, acc = a, b}, i < 5 do
        {i + 1, Nx.tanh(Nx.dot(acc, b) / 4), b}
      end

    acc
  end

  def count_compile(_event, measurements, _metadata, counter) do
    :counters.add(counter, 1, measurements[:xla_compile_time] || 0)
  end

  def hash(result) do
    binaries =
      [result]
      |> Nx.Defn.Composite.flatten_list()
      |> Enum.map(&[inspect(&1.type), inspect(&1.shape), Nx.to_binary(&1)])

    :crypto.hash(:sha256, binaries) |> Base.encode16(case: :lower) |> binary_part(0, 16)
  end

  def run({name, fun, args}) do
    jitted = hash(apply(EXLA.jit(fun), args))

    if System.get_env("BIT_CHECK_EAGER", "1") == "1" do
      eager_args = Enum.map(args, &Nx.backend_transfer(&1, EXLA.Backend))
      eager = hash(Nx.with_default_backend(EXLA.Backend, fn -> apply(fun, eager_args) end))
      "#{name}: jit #{jitted} eager #{eager}"
    else
      "#{name}: jit #{jitted}"
    end
  end
end

xla_time = :counters.new(1, [])

:telemetry.attach(
  "bit-check",
  [:exla, :compilation, :details],
  &BitCheck.count_compile/4,
  xla_time
)

# CPU time of the whole OS process (all threads, the plugin's included), in
# ms: a loaded machine disturbs it less than wall time.
cpu_ms = fn ->
  fields =
    "/proc/self/stat" |> File.read!() |> String.split(") ") |> List.last() |> String.split()

  ticks = String.to_integer(Enum.at(fields, 11)) + String.to_integer(Enum.at(fields, 12))
  div(ticks * 1000, 100)
end

cpu_before = cpu_ms.()
concurrency = String.to_integer(System.get_env("BIT_CHECK_CONCURRENCY", "1"))
started = System.monotonic_time(:millisecond)

BitCheck.programs()
|> Task.async_stream(&BitCheck.run/1,
  max_concurrency: concurrency,
  ordered: true,
  timeout: :infinity
)
|> Enum.each(fn {:ok, line} -> IO.puts(line) end)

wall = System.monotonic_time(:millisecond) - started

IO.puts(
  "# #{length(BitCheck.programs())} programs; plugin compile #{div(:counters.get(xla_time, 1), 1000)} ms; wall #{wall} ms; " <>
    "process CPU #{cpu_ms.() - cpu_before} ms"
)
