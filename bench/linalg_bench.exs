# Linear algebra on the host against JAX's CPU, side by side in one run:
# each op of Nx.LinAlg that rests on a decomposition (QR, SVD, eigh,
# Cholesky, LU, and solve, invert, determinant, least squares and pinv
# built on them), at 8x6 (8x8 for square-only ops), 64, 256 and 1024, in f32
# and f64. For each it prints the compile time of a program that is just
# the op, the median run time of one call, and how accurate the results
# are (below), for EXLA and for JAX (jax.jit on JAX_PLATFORMS=cpu, through
# bench/linalg_jax.py, which this script starts and talks to).
#
#     NX_PATH=path/to/nx MIX_ENV=prod mix run bench/linalg_bench.exs
#
# Environment: LINALG_PYTHON (a Python with jax==0.10.2, default
# `python3`), LINALG_OPS, LINALG_SIZES, LINALG_TYPES (comma-separated
# subsets of the defaults), LINALG_ROUNDS (default 5).
#
# Both sides get the same input (random normal, written once as f64 and
# converted by each side): symmetric for eigh, A Aᵀ / n + I for Cholesky,
# I + A / (4 sqrt(n)) for the determinant (finite at 1024), and for solve
# and least squares b the mean of A's columns. Compile time: EXLA's
# `Nx.Defn.compile/3` with `cache: false` (tracing, lowering and the
# plugin's compile, no disk cache) and JAX's `jit(f).lower(x).compile()`.
# Run time: the two sides alternate, LINALG_ROUNDS rounds of a few calls
# each, inputs already on the device, each call waited for; the median of
# all calls. Accuracy, in f64 (EXLA's results with EXLA at
# `precision: :highest`, JAX's with NumPy):
#
#   * orth - max |QᵀQ - I| over the orthonormal factors (Q; U and V; the
#     eigenvectors);
#   * recon - max |A - product of the factors| / max |A| (QR, SVD, eigh,
#     Cholesky, LU, pinv's A P A), the relative residual |A x - b| for
#     solve, |A X - I| for invert, |Aᵀ(A x - b)| / |Aᵀ b| for least
#     squares, the relative error for the determinant.
#
# JAX's SVD here is the thin one (full_matrices=False), as Nx's
# least squares and pinv use it; Nx.LinAlg.svd/2 is called with
# `full_matrices?: false` too.
Code.require_file("support/timing.exs", __DIR__)

defmodule LinalgBench do
  import Nx.Defn

  @ops ~w(qr svd eigh cholesky lu solve invert determinant least_squares pinv)
  @square ~w(eigh cholesky lu solve invert determinant)

  def main do
    ops = list_env("LINALG_OPS", @ops)
    sizes = "LINALG_SIZES" |> list_env(~w(8 64 256 1024)) |> Enum.map(&String.to_integer/1)
    types = list_env("LINALG_TYPES", ~w(f32 f64))
    rounds = String.to_integer(System.get_env("LINALG_ROUNDS", "5"))
    Nx.default_backend(EXLA.Backend)
    jax = start_jax()
    dir = Path.join(System.tmp_dir!(), "linalg_bench_#{System.os_time()}")
    File.mkdir_p!(dir)
    {load, _} = :os.cmd(~c"cat /proc/loadavg") |> to_string() |> Float.parse()
    IO.puts("load average at start: #{load}")

    rows =
      for op <- ops, n <- sizes, type <- types do
        row = measure(jax, dir, op, n, type, rounds)
        IO.puts(line(row))
        row
      end

    send(jax, {self(), {:command, "quit\n"}})
    {load, _} = :os.cmd(~c"cat /proc/loadavg") |> to_string() |> Float.parse()
    IO.puts("load average at end: #{load}\n")
    IO.puts(table(rows))
    File.rm_rf!(dir)
  end

  defp list_env(name, default) do
    case System.get_env(name) do
      nil -> default
      value -> String.split(value, ",", trim: true)
    end
  end

  ## One case

  defp measure(jax, dir, op, n, type, rounds) do
    {m, k} = if n == 8 and op not in @square, do: {8, 6}, else: {n, n}
    a = input(op, m, k)
    file = Path.join(dir, "#{op}_#{m}x#{k}.f64")
    File.write!(file, Nx.to_binary(Nx.backend_copy(a, Nx.BinaryBackend)))
    args = args(op, Nx.as_type(a, String.to_atom(type)))
    fun = op_fun(op)

    {compile_us, compiled} =
      :timer.tc(fn ->
        Nx.Defn.compile(fun, Enum.map(args, &Nx.to_template/1), compiler: EXLA, cache: false)
      end)

    out = apply(compiled, args)
    exla_errors = errors(op, args, out)

    [jax_compile | jax_errors] = ask(jax, "case #{op} #{type} #{m} #{k} #{file}")
    jax_compile = number(jax_compile)

    jax_errors =
      Map.new(jax_errors, fn pair ->
        [name, value] = String.split(pair, "=")
        {String.to_atom(name), number(value)}
      end)

    reps = reps(n)

    {exla_runs, jax_runs} =
      Enum.reduce(1..rounds, {[], []}, fn _, {exla, jax_times} ->
        mine =
          for _ <- 1..reps do
            {us, _} = :timer.tc(fn -> apply(compiled, args) |> wait() end)
            us / 1000
          end

        theirs = jax |> ask("run #{reps}") |> Enum.map(&number/1)
        {mine ++ exla, theirs ++ jax_times}
      end)

    %{
      op: op,
      shape: {m, k},
      type: type,
      exla: %{compile: compile_us / 1000, run: BenchTiming.median(exla_runs), errors: exla_errors},
      jax: %{compile: jax_compile, run: BenchTiming.median(jax_runs), errors: jax_errors}
    }
  end

  defp reps(n) when n <= 8, do: 200
  defp reps(n) when n <= 64, do: 40
  defp reps(n) when n <= 256, do: 4
  defp reps(_), do: 1

  defp wait(out) do
    [out] |> Nx.Defn.Composite.flatten_list() |> Enum.each(&BenchTiming.wait/1)
    out
  end

  # The op's input matrix, f64 (see the header).
  defp input(op, m, n) do
    key = Nx.Random.key(42)
    {a, _} = Nx.Random.normal(key, 0.0, 1.0, shape: {m, n}, type: :f64)

    case op do
      "eigh" -> Nx.divide(Nx.add(a, Nx.transpose(a)), 2)
      "cholesky" -> Nx.add(Nx.divide(Nx.dot(a, Nx.transpose(a)), n), Nx.eye(n, type: :f64))
      "determinant" -> Nx.add(Nx.eye(n, type: :f64), Nx.divide(a, 4 * :math.sqrt(n)))
      _ -> a
    end
  end

  defp args(op, a) when op in ["solve", "least_squares"],
    do: [a, Nx.divide(Nx.sum(a, axes: [1]), Nx.axis_size(a, 1))]

  defp args(_op, a), do: [a]

  defp op_fun("qr"), do: &Nx.LinAlg.qr/1
  defp op_fun("svd"), do: &Nx.LinAlg.svd(&1, full_matrices?: false)
  defp op_fun("eigh"), do: &Nx.LinAlg.eigh/1
  defp op_fun("cholesky"), do: &Nx.LinAlg.cholesky/1
  defp op_fun("lu"), do: &Nx.LinAlg.lu/1
  defp op_fun("solve"), do: &Nx.LinAlg.solve/2
  defp op_fun("invert"), do: &Nx.LinAlg.invert/1
  defp op_fun("determinant"), do: &Nx.LinAlg.determinant/1
  defp op_fun("least_squares"), do: &Nx.LinAlg.least_squares/2
  defp op_fun("pinv"), do: &Nx.LinAlg.pinv/1

  ## Accuracy (in f64, with EXLA)

  defp errors(op, args, out) do
    args = Enum.map(args, &Nx.as_type(&1, :f64))
    out = [out] |> Nx.Defn.Composite.flatten_list() |> Enum.map(&Nx.as_type(&1, :f64))

    EXLA.jit(&error_terms(op, &1, &2), precision: :highest).(
      List.to_tuple(args),
      List.to_tuple(out)
    )
    |> Enum.map(fn {name, value} -> {name, Nx.to_number(value)} end)
    |> Map.new()
  end

  deftransformp error_terms(op, args, out) do
    a = elem(args, 0)

    case {op, Tuple.to_list(out)} do
      {"qr", [q, r]} ->
        %{orth: orth(q), recon: relative(Nx.dot(q, r), a)}

      {"svd", [u, s, vt]} ->
        %{
          orth: Nx.max(orth(u), orth(Nx.transpose(vt))),
          recon: relative(Nx.dot(Nx.multiply(u, s), vt), a)
        }

      {"eigh", [w, v]} ->
        %{orth: orth(v), recon: relative(Nx.dot(Nx.multiply(v, w), Nx.transpose(v)), a)}

      {"cholesky", [l]} ->
        %{recon: relative(Nx.dot(l, Nx.transpose(l)), a)}

      {"lu", [p, l, u]} ->
        %{recon: relative(p |> Nx.dot(l) |> Nx.dot(u), a)}

      {"solve", [x]} ->
        %{recon: relative(Nx.dot(a, x), elem(args, 1))}

      {"invert", [x]} ->
        %{recon: max_abs(Nx.subtract(Nx.dot(a, x), Nx.eye(Nx.axis_size(a, 0), type: :f64)))}

      {"determinant", [d]} ->
        # log|det| from the f64 LU of A
        {_p, _l, u} = Nx.LinAlg.lu(a)
        exact = Nx.exp(Nx.sum(Nx.log(Nx.abs(Nx.take_diagonal(u)))))
        %{recon: Nx.divide(Nx.abs(Nx.subtract(Nx.abs(d), exact)), exact)}

      {"least_squares", [x]} ->
        at = Nx.transpose(a)
        b = elem(args, 1)

        %{
          recon:
            Nx.divide(max_abs(Nx.dot(at, Nx.subtract(Nx.dot(a, x), b))), max_abs(Nx.dot(at, b)))
        }

      {"pinv", [p]} ->
        %{recon: relative(a |> Nx.dot(p) |> Nx.dot(a), a)}
    end
  end

  defnp orth(q) do
    k = Nx.axis_size(q, 1)
    max_abs(Nx.dot(Nx.transpose(q), q) - Nx.eye(k, type: :f64))
  end

  defnp relative(x, reference), do: max_abs(x - reference) / max_abs(reference)
  defnp max_abs(x), do: Nx.reduce_max(Nx.abs(x))

  ## JAX

  defp start_jax do
    python = System.find_executable(System.get_env("LINALG_PYTHON", "python3"))
    script = Path.expand("linalg_jax.py", __DIR__)
    parent = self()

    spawn_link(fn ->
      port =
        Port.open({:spawn_executable, python}, [
          :binary,
          {:line, 1_000_000},
          args: [script],
          env: [{~c"JAX_PLATFORMS", ~c"cpu"}]
        ])

      send(parent, {:jax_ready, self()})
      relay(port, parent)
    end)

    receive do
      {:jax_ready, pid} -> pid
    end
  end

  defp relay(port, parent) do
    receive do
      {^parent, {:command, data}} ->
        Port.command(port, data)
        relay(port, parent)

      {^port, {:data, {:eol, line}}} ->
        send(parent, {:jax, line})
        relay(port, parent)
    end
  end

  # Sends one command line; returns the words of the answer.
  defp ask(jax, message) do
    send(jax, {self(), {:command, message <> "\n"}})

    receive do
      {:jax, line} -> String.split(line)
    after
      600_000 -> raise "JAX did not answer #{inspect(message)}"
    end
  end

  # A number Python printed (repr): 1e-07, 0.5, nan, inf.
  defp number(text) do
    case Float.parse(text) do
      {x, ""} -> x
      _ -> String.to_atom(text)
    end
  end

  ## Output

  defp line(%{op: op, shape: {m, n}, type: type, exla: e, jax: j}) do
    "#{op} #{m}x#{n} #{type}: compile #{ms(e.compile)} / #{ms(j.compile)} ms, " <>
      "run #{ms(e.run)} / #{ms(j.run)} ms (#{ratio(e.run, j.run)}x), " <>
      "errors #{inspect(e.errors)} / #{inspect(j.errors)}"
  end

  defp table(rows) do
    header =
      "| op, size, type | EXLA: compile / run | JAX: compile / run | run EXLA/JAX | orth EXLA / JAX | recon EXLA / JAX |\n" <>
        "|---|---|---|---|---|---|\n"

    header <>
      Enum.map_join(rows, "\n", fn %{op: op, shape: {m, n}, type: type, exla: e, jax: j} ->
        "| #{op} #{m}×#{n} #{type} | #{ms(e.compile)} ms / #{ms(e.run)} ms | " <>
          "#{ms(j.compile)} ms / #{ms(j.run)} ms | #{ratio(e.run, j.run)} | " <>
          "#{err(e.errors[:orth])} / #{err(j.errors[:orth])} | " <>
          "#{err(e.errors[:recon])} / #{err(j.errors[:recon])} |"
      end)
  end

  defp ms(x) when x >= 100, do: :erlang.float_to_binary(x / 1, decimals: 0)
  defp ms(x) when x >= 1, do: :erlang.float_to_binary(x / 1, decimals: 1)
  defp ms(x), do: :erlang.float_to_binary(x / 1, decimals: 3)

  defp ratio(a, b), do: :erlang.float_to_binary(a / b, decimals: 2)

  defp err(nil), do: "-"
  defp err(x) when is_number(x), do: :erlang.float_to_binary(x / 1, [{:scientific, 1}])
  defp err(x), do: to_string(x)
end

LinalgBench.main()
