defmodule EXLA.Defn.Lowering.LinAlg do
  @moduledoc false
  # dot, convolution, FFT and triangular solve.

  alias EXLA.MLIR.{Ops, Value}
  alias EXLA.Defn.Lowering.ElementWise
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
    fft_along(b, x, if(op == :fft, do: "FFT", else: "IFFT"), [axis], [n], t.type)
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

    {a, transpose, b} = transform_a(b, a, opts[:transform_a] || :none)

    {v, b} =
      Ops.triangular_solve(b, a, x,
        left_side: left?,
        lower: Keyword.get(opts, :lower, true),
        transpose_a: transpose
      )

    if vector?, do: Ops.reshape(b, v, x_dims), else: {v, b}
  end

  # Nx's :conjugate (Nx 0.12 and later; Nx 0.7 refuses it) solves with
  # conj(a), not transposed. StableHLO's ADJOINT would also transpose, so
  # a is conjugated first (nothing to do for a real a) and solved as it is.
  defp transform_a(b, a, :none), do: {a, "NO_TRANSPOSE", b}
  defp transform_a(b, a, :transpose), do: {a, "TRANSPOSE", b}

  defp transform_a(b, %Value{type: {{:c, _}, _}} = a, :conjugate) do
    {a, b} = ElementWise.conjugate(b, a)
    {a, "NO_TRANSPOSE", b}
  end

  defp transform_a(b, a, :conjugate), do: {a, "NO_TRANSPOSE", b}

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
  # A stablehlo.fft of `kind` ("FFT", "IFFT", "RFFT", "IRFFT") over `axes`
  # of `x` (one or two), with `lengths` the length of the transform along
  # each. stablehlo.fft transforms the trailing dimensions, so the axes are
  # moved last (in the order given) and back. The input is first cut or
  # padded with zeros along each axis to what the transform reads: the
  # length itself, except along the last axis of an IRFFT, which reads the
  # n/2+1 elements of a one-sided spectrum. The result has the element type
  # `elem` and, along the last axis, n/2+1 elements for RFFT and n for
  # IRFFT.
  def fft_along(b, x, kind, axes, lengths, elem) do
    {_, in_dims} = x.type
    rank = tuple_size(in_dims)
    perm = (Enum.to_list(0..(rank - 1)) -- axes) ++ axes
    {x, b} = transpose(b, x, perm)
    {x, b} = fit(b, x, read(kind, lengths))
    {_, dims} = x.type
    n = List.last(lengths)

    out_dims =
      case kind do
        "RFFT" -> put_elem(dims, rank - 1, div(n, 2) + 1)
        "IRFFT" -> put_elem(dims, rank - 1, n)
        _ -> dims
      end

    {x, b} = Ops.fft(b, x, kind, lengths, {elem, out_dims})
    transpose(b, x, inverse(perm))
  end

  # How many elements along each transformed axis the fft reads.
  defp read("IRFFT", lengths) do
    {init, [n]} = Enum.split(lengths, -1)
    init ++ [div(n, 2) + 1]
  end

  defp read(_kind, lengths), do: lengths

  # Cuts (one slice) then pads with zeros (one pad) the trailing axes of `x`
  # to the sizes in `targets`.
  defp fit(b, %{type: {x_elem, dims}} = x, targets) do
    rank = tuple_size(dims)
    {lead, sizes} = Enum.split(Tuple.to_list(dims), rank - length(targets))
    zeros = List.duplicate(0, rank)
    kept = Enum.zip_with(sizes, targets, &min/2)

    {x, b} =
      if kept == sizes do
        {x, b}
      else
        Ops.slice(b, x, zeros, lead ++ kept, List.duplicate(1, rank))
      end

    if kept == targets do
      {x, b}
    else
      {zero, b} = const(b, x_elem, 0)
      high = Enum.map(lead, fn _ -> 0 end) ++ Enum.zip_with(kept, targets, &(&2 - &1))
      Ops.pad(b, x, zero, zeros, high, zeros)
    end
  end

  defp transpose(b, x, perm) do
    if perm == Enum.sort(perm), do: {x, b}, else: Ops.transpose(b, x, perm)
  end

  defp inverse(perm) do
    perm |> Enum.with_index() |> Enum.sort() |> Enum.map(&elem(&1, 1))
  end
end
