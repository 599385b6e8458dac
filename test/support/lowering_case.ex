defmodule EXLA.LoweringCase do
  @moduledoc """
  Helpers for the lowering tests: trace a function to an expression, lower it
  with `EXLA.Defn.Lowering.to_mlir/3`, compile and run it on the host client
  (or through `EXLA.jit` and `EXLA.Backend`, `assert_jit_and_eager/3`) and
  compare the results with `Nx.Defn.Evaluator` on `Nx.BinaryBackend`.
  """

  use ExUnit.CaseTemplate

  using do
    quote do
      import EXLA.LoweringCase
    end
  end

  @doc "Lowers `fun` applied to `args` (a list of tensors or containers)."
  def lower(fun, args, opts \\ []) do
    expr = apply(Nx.Defn.debug_expr(fun), args)
    shapes = args |> flatten() |> Enum.map(&EXLA.Shape.make_shape(&1.type, &1.shape))
    EXLA.Defn.Lowering.to_mlir(expr, shapes, opts)
  end

  @doc "The MLIR text of `fun` applied to `args`."
  def mlir(fun, args, opts \\ []), do: lower(fun, args, opts).program.text

  @doc "Runs `fun` with the reference evaluator on the binary backend."
  def reference(fun, args) do
    Nx.with_default_backend(Nx.BinaryBackend, fn ->
      apply(Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator), args)
    end)
  end

  @doc """
  Lowers, compiles and runs `fun` on the host, returning the flattened
  results as binary-backend tensors.
  """
  def run(fun, args, opts \\ []) do
    %{program: program, used_inputs: used} = lower(fun, args, opts)
    shapes = program.output_shapes
    client = EXLA.Client.fetch!(:host)
    exe = EXLA.Executable.compile(client, program, [])
    flat = args |> flatten() |> List.to_tuple()

    # @main takes only the inputs the expression uses
    inputs =
      Enum.map(used, fn i ->
        t = elem(flat, i)
        {Nx.to_binary(t), EXLA.Shape.make_shape(t.type, t.shape)}
      end)

    [buffers] = EXLA.Executable.run(exe, [inputs])

    Enum.zip_with(buffers, shapes, fn buffer, shape ->
      buffer
      |> EXLA.DeviceBuffer.read()
      |> Nx.from_binary(shape.dtype, backend: Nx.BinaryBackend)
      |> Nx.reshape(shape.dims)
    end)
  end

  @doc """
  Compares the compiled results of `fun` with the evaluator. Options:
  `:atol`, `:rtol` (floats), `:precision` (lowering option).
  """
  def assert_same(fun, args, opts \\ []) do
    result = reference(fun, args)
    expected = flatten([result])
    actual = run(fun, args, Keyword.take(opts, [:precision]))
    assert length(expected) == length(actual)

    [labels(result), expected, actual]
    |> Enum.zip_with(fn [label, e, a] ->
      assert_tensor(e, a, Keyword.put(opts, :label, label))
    end)

    actual
  end

  @doc """
  Runs `fun` on `args` with `EXLA.jit` and eagerly (`Nx.Defn.Evaluator`
  over `EXLA.Backend` copies of the arguments, so each op is an
  `EXLA.Backend` call) and compares both with the reference evaluator on
  `Nx.BinaryBackend`: the same containers, vectorized axes, types and
  shapes, and values as `assert_tensor/3` compares them (`:atol`, `:rtol`).
  Options given to `EXLA.jit` go in `:jit` (say, `[client: :other]`).
  Returns the jitted result.
  """
  def assert_jit_and_eager(fun, args, opts \\ []) do
    expected = reference(fun, args)
    jitted = EXLA.jit_apply(fun, args, Keyword.get(opts, :jit, []))

    eager =
      Nx.with_default_backend(EXLA.Backend, fn ->
        args = Enum.map(args, &Nx.backend_copy(&1, EXLA.Backend))
        Nx.Defn.jit_apply(fun, args, compiler: Nx.Defn.Evaluator)
      end)

    for {mode, actual} <- [jit: jitted, eager: eager] do
      assert_container(expected, actual, Keyword.put(opts, :label, mode))
    end

    jitted
  end

  @doc """
  Runs `fun` on `args` with `EXLA.jit` and eagerly on `EXLA.Backend`
  copies of the arguments, asserts both give results of the same types,
  shapes and bits, and returns the jitted ones as a tuple on
  `Nx.BinaryBackend`: for results checked by their properties rather than
  against the reference (decompositions, whose signs are arbitrary).
  """
  def jit_and_eager_bits(fun, args) do
    jitted = fun |> EXLA.jit() |> apply(args) |> results()

    eager =
      Nx.with_default_backend(EXLA.Backend, fn ->
        apply(fun, Enum.map(args, &Nx.backend_copy(&1, EXLA.Backend)))
      end)
      |> results()

    assert length(jitted) == length(eager)

    for {j, e} <- Enum.zip(jitted, eager) do
      assert %EXLA.Backend{} = e.data
      assert {j.type, j.shape} == {e.type, e.shape}
      # NaN payloads aside
      assert bits(j) == bits(e), "eager #{inspect(e)}\ndiffers from jit #{inspect(j)}"
    end

    jitted |> Enum.map(&Nx.backend_copy(&1, Nx.BinaryBackend)) |> List.to_tuple()
  end

  defp results(tuple) when is_tuple(tuple), do: Tuple.to_list(tuple)
  defp results(tensor), do: [tensor]

  defp bits(t), do: t |> Nx.backend_copy(Nx.BinaryBackend) |> Nx.to_binary()

  defp assert_container(expected, actual, opts) do
    expected_flat = flatten([expected])
    actual_flat = flatten([actual])
    label = opts[:label]

    assert length(expected_flat) == length(actual_flat),
           "#{label}: #{length(actual_flat)} outputs, expected #{length(expected_flat)}"

    for {e, a} <- Enum.zip(expected_flat, actual_flat) do
      assert %EXLA.Backend{} = a.data, "#{label}: result not on EXLA.Backend: #{inspect(a)}"

      assert e.vectorized_axes == a.vectorized_axes,
             "#{label}: vectorized axes #{inspect(a.vectorized_axes)} != #{inspect(e.vectorized_axes)}"

      actual = a |> Nx.devectorize() |> Nx.backend_copy(Nx.BinaryBackend)
      assert_tensor(e, actual, opts)
    end
  end

  defp labels(%{} = map) when not is_struct(map) do
    map
    |> Map.keys()
    |> Enum.sort()
    |> Enum.flat_map(fn key -> Enum.map(flatten([map[key]]), fn _ -> key end) end)
  end

  defp labels(tuple) when is_tuple(tuple) do
    tuple
    |> Tuple.to_list()
    |> Enum.with_index()
    |> Enum.flat_map(fn {elem, i} -> Enum.map(flatten([elem]), fn _ -> i end) end)
  end

  defp labels(other), do: flatten([other]) |> Enum.map(fn _ -> nil end)

  @doc "Asserts two tensors are equal (integers) or close (floats/complex)."
  def assert_tensor(expected, actual, opts \\ []) do
    expected = Nx.devectorize(expected)
    label = if opts[:label] != nil, do: "#{inspect(opts[:label])}: ", else: ""

    assert expected.type == actual.type,
           "#{label}type #{inspect(actual.type)} != #{inspect(expected.type)}"

    assert expected.shape == actual.shape,
           "#{label}shape #{inspect(actual.shape)} != #{inspect(expected.shape)}"

    case expected.type do
      {kind, _} when kind in [:s, :u] ->
        assert Nx.to_binary(expected) == Nx.to_binary(actual),
               "#{label}expected #{inspect(expected)}\ngot #{inspect(actual)}"

      _ ->
        atol = Keyword.get(opts, :atol, 1.0e-5)
        rtol = Keyword.get(opts, :rtol, 1.0e-4)

        close =
          Nx.all_close(expected, actual, atol: atol, rtol: rtol, equal_nan: true)
          |> Nx.to_number()

        assert close == 1, "#{label}expected #{inspect(expected)}\ngot #{inspect(actual)}"
    end
  end

  @doc "Flattens a list of containers into a list of tensors."
  def flatten(args) do
    args
    |> Nx.Defn.Composite.flatten_list()
    |> Enum.map(&Nx.to_tensor/1)
  end
end
