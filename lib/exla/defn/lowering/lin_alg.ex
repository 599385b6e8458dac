defmodule EXLA.Defn.Lowering.LinAlg do
  @moduledoc false
  # dot, convolution, FFT and triangular solve.

  alias EXLA.MLIR.Ops
  alias Nx.Defn.Expr
  alias Nx.Tensor, as: T
  import EXLA.Defn.Lowering

  @ops [:dot, :conv, :fft, :ifft, :triangular_solve]

  def ops, do: @ops

  def lower(:dot, %T{data: %Expr{args: [x, c1, b1, y, c2, b2]}} = t, b) do
    {x, b} = lower_as(x, t.type, b)
    {y, b} = lower_as(y, t.type, b)
    Ops.dot_general(b, x, y, type_of(t), {b1, c1, b2, c2}, b.assigns.precision)
  end

  def lower(:conv, %T{data: %Expr{args: [input, kernel, opts]}} = t, b) do
    {input, b} = lower_as(input, t.type, b)
    {kernel, b} = lower_as(kernel, t.type, b)
    rank = tuple_size(dims(t))
    spatial = rank - 2
    ones = List.duplicate(1, spatial)

    Ops.convolution(b, input, kernel, type_of(t),
      layouts: {
        layout(opts[:input_permutation], rank, "b", "f"),
        layout(opts[:kernel_permutation], rank, "o", "i"),
        layout(opts[:output_permutation], rank, "b", "f")
      },
      strides: opts[:strides] || ones,
      padding: opts[:padding] || List.duplicate({0, 0}, spatial),
      lhs_dilation: opts[:input_dilation] || ones,
      rhs_dilation: opts[:kernel_dilation] || ones,
      feature_group_count: opts[:feature_group_size] || 1,
      batch_group_count: opts[:batch_group_size] || 1,
      precision: b.assigns.precision
    )
  end

  def lower(op, %T{data: %Expr{args: [x, opts]}} = t, b) when op in [:fft, :ifft] do
    {x, b} = lower_as(x, t.type, b)
    {_, in_dims} = x.type
    axis = opts[:axis] || tuple_size(in_dims) - 1
    n = opts[:length] || elem(in_dims, axis)
    fft_along(b, x, if(op == :fft, do: "FFT", else: "IFFT"), axis, n, t.type)
  end

  def lower(:triangular_solve, %T{data: %Expr{args: [a, x, opts]}} = t, b) do
    {a, b} = lower_as(a, t.type, b)
    {x, b} = lower_as(x, t.type, b)
    {_, a_dims} = a.type
    {_, x_dims} = x.type
    left? = Keyword.get(opts, :left_side, true)
    # b may be a (batch of) vector(s): one rank less than a
    vector? = tuple_size(x_dims) == tuple_size(a_dims) - 1
    rank = tuple_size(x_dims)

    {x, b} =
      cond do
        not vector? -> {x, b}
        left? -> Ops.reshape(b, x, Tuple.insert_at(x_dims, rank, 1))
        true -> Ops.reshape(b, x, Tuple.insert_at(x_dims, rank - 1, 1))
      end

    transpose =
      case opts[:transform_a] || :none do
        :none -> "NO_TRANSPOSE"
        :transpose -> "TRANSPOSE"
        :conjugate -> "ADJOINT"
      end

    {v, b} =
      Ops.triangular_solve(b, a, x,
        left_side: left?,
        lower: Keyword.get(opts, :lower, true),
        transpose_a: transpose
      )

    if vector?, do: Ops.reshape(b, v, x_dims), else: {v, b}
  end

  # Nx permutations say where each logical axis (batch, feature, spatial...)
  # lives in the tensor: logical axis k is tensor axis perm[k].
  defp layout(perm, rank, first, second) do
    perm = perm || Enum.to_list(0..(rank - 1))

    perm
    |> Enum.with_index()
    |> Enum.reduce(List.duplicate(nil, rank), fn {pos, k}, acc ->
      letter =
        case k do
          0 -> first
          1 -> second
          k -> Integer.to_string(k - 2)
        end

      List.replace_at(acc, pos, letter)
    end)
  end

  @doc false
  # A stablehlo.fft of `kind` ("FFT", "IFFT", "RFFT") along `axis` of `x`,
  # which is first cut or padded with zeros to `n` elements along it; the
  # result has the element type `elem` (complex for RFFT, of n/2+1 elements
  # along the axis).
  def fft_along(b, x, kind, axis, n, elem) do
    {x_elem, in_dims} = x.type
    rank = tuple_size(in_dims)
    last = rank - 1
    perm = Enum.to_list(0..last) |> List.replace_at(axis, last) |> List.replace_at(last, axis)
    {x, b} = if axis == last, do: {x, b}, else: Ops.transpose(b, x, perm)
    {_, dims} = x.type
    size = elem(dims, last)

    {x, b} =
      cond do
        size < n ->
          {zero, b} = const(b, x_elem, 0)
          zeros = List.duplicate(0, rank)
          Ops.pad(b, x, zero, zeros, List.replace_at(zeros, last, n - size), zeros)

        size > n ->
          limits = dims |> put_elem(last, n) |> Tuple.to_list()
          Ops.slice(b, x, List.duplicate(0, rank), limits, List.duplicate(1, rank))

        true ->
          {x, b}
      end

    {_, dims} = x.type
    out_dims = if kind == "RFFT", do: put_elem(dims, last, div(n, 2) + 1), else: dims
    {x, b} = Ops.fft(b, x, kind, [n], {elem, out_dims})
    if axis == last, do: {x, b}, else: Ops.transpose(b, x, perm)
  end
end
