defmodule EXLA.Defn.Lowering.Blocks do
  @moduledoc false
  # Ops that Nx gives with a default implementation, which a compiler may
  # replace: `:optional` nodes (Nx 0.7, with `:lu`, a required callback
  # there) and `:block` nodes (Nx 0.12 and later, `Nx.block/4`). The two
  # lines name the same operations differently; both reach the same native
  # lowerings here:
  #
  #   * QR, eigh, SVD, Cholesky, LU, solve and determinant (from 4x4) - on
  #     the host, custom calls to the NIF's native kernels
  #     (`EXLA.Defn.Lowering.Decompositions`, where the `:native_linalg`
  #     assign says so); elsewhere QR is a Householder QR
  #     (`EXLA.Defn.Lowering.QR`), instead of Nx's default expression, which
  #     reconstructs Q . R less accurately, LU is `EXLA.Defn.Lowering.LU`
  #     (Nx 0.7 has no default for it), and the others are Nx's default
  #     implementations;
  #   * take and take_along_axis - one gather each, as the `:take` and
  #     `:take_along_axis` nodes of Nx 0.7 (`EXLA.Defn.Lowering.Structure`);
  #   * top_k - `chlo.top_k`;
  #   * rfft, irfft, fft2 and ifft2 - one `stablehlo.fft` each (Nx's
  #     defaults chain complex FFTs, mirror spectra and slice).
  #
  # Any other `:block` struct goes to `EXLA.CustomCall.call/4`: a custom
  # call when an implementation for the struct gives one, and otherwise
  # (`:skip`, the case of every struct without an implementation) Nx's
  # default implementation, lowered in its own scope on the block's inputs.
  # These of Nx's structs stay on their default because it does as well as
  # a native lowering would (or there is none):
  #
  #   * cumulative sum, product, min and max - Nx's associative scan. One
  #     `stablehlo.reduce_window` (window spanning the axis, JAX's lowering
  #     on CPU and GPU) compiles faster from axes of 512 (2 to 10 times for
  #     sum, up to 5 for max), but on the CPU plugin it runs slower at every
  #     axis size measured, 8 to 32768: 1.4 to 5 times on 19 of 20 inputs of
  #     64K elements (XLA:CPU rewrites the window into windows of 16, each
  #     element summed window by window, where the scan's slices, pads and
  #     adds fuse into a few elementwise loops), so there is no size up to
  #     which it wins (bench/cumulative_bench.exs, bench/PERFORMANCE.md);
  #   * all_close - the default is already one elementwise fusion and one
  #     reduction; a native lowering would emit the same ops. Its f64 for
  #     integer inputs is needed to give the same results: s8 -27 and -90
  #     are not close with `rtol: 0.7, atol: 0` (0.7 * 90 is just below 63
  #     in f64), but would be in f32 (where it rounds to 63.0);
  #   * eigh, SVD, Cholesky, solve and determinant off the host (and the
  #     determinant of 2x2 and 3x3 matrices, a closed formula) - Nx's
  #     defaults, as on Nx 0.7, where they are `:optional` nodes whose
  #     defaults are lowered too.

  alias EXLA.Defn.Lowering.Decompositions
  alias Nx.Defn.Expr
  alias Nx.Tensor, as: T
  import EXLA.Defn.Lowering

  @ops if EXLA.NxVersion.blocks?(), do: [:block], else: [:optional, :lu]

  def ops, do: @ops

  if EXLA.NxVersion.blocks?() do
    ## Nx 0.12 and later

    def lower(:block, %T{data: %Expr{args: [struct, in_args, default, _fun]}} = t, b) do
      lower_block(struct, in_args, default, t, b)
    end

    # Gathers and top_k are lowered inline; every other block asks
    # EXLA.CustomCall first (an implementation for one of Nx's structs
    # replaces EXLA's lowering of it). The structs are matched by name, so
    # this module compiles on Nx 0.7.
    defp lower_block(%{__struct__: Nx.Block.Take, axis: axis}, [x, idx | _], _default, t, b),
      do: EXLA.Defn.Lowering.Structure.lower(:take, node(t, :take, [x, idx, axis]), b)

    defp lower_block(%{__struct__: Nx.Block.TakeAlongAxis, axis: axis}, [x, idx | _], _, t, b) do
      node = node(t, :take_along_axis, [x, idx, axis])
      EXLA.Defn.Lowering.Structure.lower(:take_along_axis, node, b)
    end

    # One real-input FFT, where Nx's default computes the complex FFT and
    # keeps its first half.
    defp lower_block(%{__struct__: Nx.Block.RFFT, length: n, axis: axis}, [x | _], _, t, b) do
      {x, b} = lower_as(x, EXLA.MLIR.Type.complex_part(t.type), b)
      EXLA.Defn.Lowering.LinAlg.fft_along(b, x, "RFFT", [axis], [n], t.type)
    end

    # One two-dimensional FFT, where Nx's default chains two FFTs.
    defp lower_block(%{__struct__: s, lengths: lengths, axes: axes}, [x | _], _, t, b)
         when s in [Nx.Block.FFT2, Nx.Block.IFFT2] do
      {x, b} = lower_as(x, t.type, b)
      kind = if s == Nx.Block.FFT2, do: "FFT", else: "IFFT"
      EXLA.Defn.Lowering.LinAlg.fft_along(b, x, kind, axes, lengths, t.type)
    end

    # One complex-to-real FFT of the one-sided spectrum, where Nx's default
    # mirrors it into the full spectrum and takes the real part of its
    # inverse FFT. Both ignore the imaginary parts of the DC and Nyquist
    # terms: the real part drops their contribution. The transform runs in
    # the complex type of the output's precision (c128 for f64, else c64)
    # and its result is converted to the output's type.
    defp lower_block(%{__struct__: Nx.Block.IRFFT, length: n, axis: axis}, [x | _], _, t, b) do
      complex = Nx.Type.to_complex(t.type)
      {x, b} = lower_as(x, complex, b)
      real = EXLA.MLIR.Type.complex_part(complex)
      {x, b} = EXLA.Defn.Lowering.LinAlg.fft_along(b, x, "IRFFT", [axis], [n], real)
      EXLA.MLIR.Ops.convert(b, x, t.type)
    end

    defp lower_block(%{__struct__: Nx.Block.TopK, k: k}, [tensor | _], {values, indices}, _t, b),
      do: native_top_k(tensor, k, values, indices, b)

    defp lower_block(struct, in_args, default, _t, b) do
      {tensors, _opts} = Enum.split_while(in_args, &(not is_list(&1)))

      case EXLA.CustomCall.call(struct, default, tensors, b.assigns.client) do
        :skip ->
          lower_skipped(struct, in_args, default, b)

        {:ok, %EXLA.CustomCall.Spec{} = spec} ->
          custom_call(spec, tensors, default, b)

        other ->
          raise ArgumentError,
                "EXLA.CustomCall.call/4 must return :skip or {:ok, %EXLA.CustomCall.Spec{}}, got: #{inspect(other)}"
      end
    end

    defp lower_skipped(%{__struct__: Nx.Block.LinAlg.QR, mode: mode}, [x | _], default, b),
      do: native_qr(x, mode, default, b)

    defp lower_skipped(%{__struct__: Nx.Block.LinAlg.LU}, [x | _], default, b),
      do: native_lu(x, default, b)

    @decompositions %{
      Nx.Block.LinAlg.Eigh => :eigh,
      Nx.Block.LinAlg.SVD => :svd,
      Nx.Block.LinAlg.Cholesky => :cholesky,
      Nx.Block.LinAlg.Solve => :solve,
      Nx.Block.LinAlg.Determinant => :determinant
    }

    defp lower_skipped(%{__struct__: s} = struct, in_args, default, b)
         when b.assigns.native_linalg and is_map_key(@decompositions, s) do
      full? = Map.get(struct, :full_matrices?, true)
      native_decomposition(@decompositions[s], in_args, full?, default, b)
    end

    defp lower_skipped(_struct, in_args, default, b), do: lower_default(in_args, default, b)

    # A node of Nx 0.7's kind, for the lowerings shared with it.
    defp node(%T{data: %Expr{} = expr} = t, op, args),
      do: %{t | data: %{expr | op: op, args: args}}

    # chlo.top_k takes the k largest along the last axis, in descending order
    # with the first of equal elements first, as Nx.top_k/2 does.
    defp native_top_k(tensor, k, values, indices, b) do
      {x, b} = lower_value(tensor, b)

      {[v, i], b} =
        EXLA.MLIR.Builder.op(
          b,
          "chlo.top_k",
          [x],
          [type_of(values), {{:s, 32}, dims(indices)}],
          attrs: [k: "#{k} : i64"]
        )

      {i, b} = EXLA.MLIR.Ops.convert(b, i, indices.type)
      {{:tuple, [v, i]}, b}
    end

    defp custom_call(spec, tensors, out, b) do
      {args, b} = Enum.map_reduce(tensors, b, &lower_value/2)
      {args, b} = operand_types(args, spec.operand_element_types, b)
      outputs = Nx.Defn.Composite.flatten_list([out])

      {values, b} =
        EXLA.MLIR.Ops.custom_call(
          b,
          spec.call_target_name,
          args,
          Enum.map(outputs, &type_of/1),
          backend_config(spec.attributes)
        )

      case out do
        %T{} -> {hd(values), b}
        _ -> {{:tuple, values}, b}
      end
    end

    defp operand_types(args, :default, b), do: {args, b}

    defp operand_types(args, types, b) when is_list(types) and length(types) == length(args),
      do:
        Enum.zip(args, types)
        |> Enum.map_reduce(b, fn {v, type}, b -> EXLA.MLIR.Ops.convert(b, v, type) end)

    defp operand_types(_args, other, _b) do
      raise ArgumentError,
            "EXLA.CustomCall.Spec's :operand_element_types must be :default or one type per block input, got: #{inspect(other)}"
    end

    defp backend_config([]), do: []

    defp backend_config(attributes) when is_list(attributes) do
      entries =
        Enum.map_join(attributes, ", ", fn
          {name, value} when is_binary(name) and is_binary(value) ->
            "#{name} = #{value}"

          other ->
            raise ArgumentError,
                  "EXLA.CustomCall.Spec's :attributes must be {name, value} pairs of binaries, got: #{inspect(other)}"
        end)

      [backend_config: "{#{entries}}"]
    end
  else
    ## Nx 0.7

    def lower(
          :optional,
          %T{data: %Expr{args: [%{data: %Expr{op: :qr, args: [tensor, opts]}}, default, _]}},
          b
        ) do
      native_qr(tensor, opts[:mode] || :reduced, default, b)
    end

    def lower(:optional, %T{data: %Expr{args: [%{data: %Expr{op: op} = call}, default, _]}}, b)
        when b.assigns.native_linalg and op in [:eigh, :svd, :cholesky, :solve, :determinant] do
      full? = op != :svd or Keyword.get(List.last(call.args), :full_matrices?, true)
      native_decomposition(op, call.args, full?, default, b)
    end

    def lower(:optional, %T{data: %Expr{args: [call, default, _callback]}}, b) do
      lower_default(call.data.args, default, b)
    end

    def lower(:lu, %T{data: %Expr{args: [{p, l, u}, tensor, _opts]}}, b) do
      native_lu(tensor, {p, l, u}, b)
    end
  end

  ## Lowerings

  # The default implementation, in its own scope: its parameters are the
  # tensors among the arguments (the options that follow are static).
  defp lower_default(in_args, default, b) do
    {tensors, _opts} = Enum.split_while(in_args, &(not is_list(&1)))
    {args, b} = Enum.map_reduce(tensors, b, &lower_value/2)

    isolated_scope(b, args, fn b ->
      case default do
        %T{} ->
          lower(default, b)

        container ->
          {values, b} = lower_container(container, b)
          {{:tuple, values}, b}
      end
    end)
  end

  defp native_qr(tensor, mode, default, b) when b.assigns.native_linalg,
    do: Decompositions.qr(tensor, mode, default, b)

  defp native_qr(tensor, mode, default, b) do
    {x, b} = lower_value(tensor, b)
    template = Nx.template(dims(tensor), tensor.type)
    expr = EXLA.Defn.Lowering.QR.expr(template, [mode: mode], b.assigns.qr_in_f64)
    {values, b} = isolated_scope(b, [x], &lower_container(expr, &1))
    converted(values, Tuple.to_list(default), b)
  end

  # The decompositions that only the host's native kernels lower (on both
  # Nx lines; `args` as the node has them): the determinant from 4x4, the
  # smaller ones by Nx's closed formulas.
  defp native_decomposition(:eigh, [x | _], _full?, default, b),
    do: Decompositions.eigh(x, default, b)

  defp native_decomposition(:svd, [x | _], full?, default, b),
    do: Decompositions.svd(x, full?, default, b)

  defp native_decomposition(:cholesky, [x | _], _full?, default, b),
    do: Decompositions.cholesky(x, default, b)

  defp native_decomposition(:solve, [a, x | _], _full?, default, b),
    do: Decompositions.solve(a, x, default, b)

  defp native_decomposition(:determinant, [x | _] = args, _full?, default, b) do
    if Decompositions.determinant?(x),
      do: Decompositions.determinant(x, default, b),
      else: lower_default(args, default, b)
  end

  defp native_lu(tensor, outputs, b) when b.assigns.native_linalg,
    do: Decompositions.lu(tensor, outputs, b)

  defp native_lu(tensor, outputs, b) do
    {x, b} = lower_value(tensor, b)
    expr = EXLA.Defn.Lowering.LU.expr(Nx.template(dims(tensor), tensor.type))
    {values, b} = isolated_scope(b, [x], &lower_container(expr, &1))
    converted(values, Tuple.to_list(outputs), b)
  end

  defp converted(values, templates, b) do
    {values, b} = convert_each(values, templates, b)
    {{:tuple, values}, b}
  end
end
