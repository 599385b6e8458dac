defmodule EXLA.LoweringCase do
  @moduledoc """
  Helpers for the lowering tests: trace a function to an expression, lower it
  with `EXLA.Defn.Lowering.to_mlir/3`, compile and run it on the host client
  and compare the results with `Nx.Defn.Evaluator` on `Nx.BinaryBackend`.
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
