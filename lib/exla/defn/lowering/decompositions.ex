defmodule EXLA.Defn.Lowering.Decompositions do
  @moduledoc false
  # The decompositions the host computes natively: one custom call each to
  # a kernel of the NIF (native/linalg, faer's decompositions), which the
  # NIF registers with every CPU client's plugin. Where the client's
  # platform has them (`EXLA.Platform.native_linalg?/1`, the
  # `:native_linalg` assign), `EXLA.Defn.Lowering.Blocks` lowers QR, eigh,
  # SVD, Cholesky, LU, solve and the determinant (from 4x4) here, on every
  # Nx line; elsewhere they keep their other lowerings.
  #
  # A call takes a batch of matrices `[..., m, n]` of f32, f64, c64 or
  # c128: integer inputs are computed in f32, f16 and bf16 in f32 and their
  # results rounded once. Its results are the factors of each matrix, with
  # the conventions of native/linalg/src/kernels.rs (and the README):
  #
  #   * QR: R's diagonal real and non-negative;
  #   * eigh: of the Hermitian part (A + Aᴴ) / 2; eigenvalues by decreasing
  #     magnitude, each eigenvector with its largest entry real positive;
  #   * SVD: singular values non-increasing, each row of Vᴴ with its largest
  #     entry real positive (U's columns turned with them);
  #   * Cholesky: NaN everywhere for a matrix that is not positive definite;
  #   * LU: partial pivoting, A = P . L . U;
  #   * eigh and SVD give NaN everywhere for a matrix holding NaN or an
  #     infinity.
  #
  # Eigenvalues and singular values come back real and are converted to the
  # output's type (complex on Nx 0.7 for complex input).

  alias EXLA.MLIR.Ops
  import EXLA.Defn.Lowering

  @doc """
  Q and R of `tensor`, `:reduced` or `:complete`, as `outputs` ({q, r}).
  With the `:qr_in_f64` assign (the host's), f32 and c64 are computed in
  f64 and c128, as EXLA's Householder QR computes them there.
  """
  def qr(tensor, mode, outputs, b) do
    flags = [complete: mode == :complete]
    call("exla_linalg_qr", [tensor], outputs, flags, [false, false], b, b.assigns.qr_in_f64)
  end

  @doc "Eigenvalues and eigenvectors of `tensor`, as `outputs`."
  def eigh(tensor, outputs, b),
    do: call("exla_linalg_eigh", [tensor], outputs, [], [true, false], b)

  @doc "U, S and Vᴴ of `tensor` (full or thin), as `outputs`."
  def svd(tensor, full?, outputs, b),
    do: call("exla_linalg_svd", [tensor], outputs, [full: full?], [false, true, false], b)

  @doc "The lower Cholesky factor of `tensor`, as `output`."
  def cholesky(tensor, output, b), do: single("exla_linalg_cholesky", [tensor], output, b)

  @doc "P, L and U of `tensor`, as `outputs`."
  def lu(tensor, outputs, b),
    do: call("exla_linalg_lu", [tensor], outputs, [], [false, false, false], b)

  @doc """
  X with A X = B (`a` square, `b` a batch of matrices or of vectors), as
  `output`, by LU with partial pivoting (LAPACK's gesv, as JAX's solve).
  """
  def solve(a, b_tensor, output, b) do
    {_, a_dims} = type_of(a)
    {_, b_dims} = type_of(b_tensor)

    if tuple_size(b_dims) == tuple_size(a_dims) - 1 do
      # a vector B is a one-column matrix
      columns = %{output | shape: Tuple.insert_at(output.shape, tuple_size(output.shape), 1)}
      {x, b} = single("exla_linalg_solve", [a, b_tensor], columns, b, b_dims)
      Ops.reshape(b, x, dims(output))
    else
      single("exla_linalg_solve", [a, b_tensor], output, b)
    end
  end

  @doc """
  Whether `determinant/3` computes the determinant of `tensor`: from 4x4
  on. Nx's default for 2x2 and 3x3 matrices is a closed formula, exact for
  small integers, and as fast.
  """
  def determinant?(tensor) do
    {_, dims} = type_of(tensor)
    elem(dims, tuple_size(dims) - 1) >= 4
  end

  @doc "The determinant of `tensor` (from the LU of each matrix), as `output`."
  def determinant(tensor, output, b), do: single("exla_linalg_determinant", [tensor], output, b)

  # A call with one result, returned as a value.
  defp single(target, tensors, output, b, vector_dims \\ nil) do
    {{:tuple, [value]}, b} = call(target, tensors, {output}, [], [false], b, false, vector_dims)
    {value, b}
  end

  # One custom call of `target` on `tensors` computed in their working
  # type, whose results (real ones where `real` says so) are converted to
  # the types of the templates in `outputs`. `vector_dims`, when given,
  # are the dimensions of a last tensor that is a batch of vectors, passed
  # as one-column matrices.
  defp call(target, tensors, outputs, flags, real, b, in_f64? \\ false, vector_dims \\ nil) do
    templates = Tuple.to_list(outputs)
    type = Nx.Type.to_floating(hd(templates).type)
    working = if in_f64?, do: widened(working_type(type)), else: working_type(type)
    {operands, b} = Enum.map_reduce(tensors, b, &lower_as(&1, working, &2))

    {operands, b} =
      if vector_dims do
        {init, [last]} = Enum.split(operands, -1)
        {last, b} = Ops.reshape(b, last, Tuple.insert_at(vector_dims, tuple_size(vector_dims), 1))
        {init ++ [last], b}
      else
        {operands, b}
      end

    result_types =
      Enum.zip_with(templates, real, fn t, real? ->
        {if(real?, do: real_part(working), else: working), dims(t)}
      end)

    {values, b} =
      Ops.custom_call(b, target, operands, result_types, backend_config(flags),
        work: work(target, hd(operands).type)
      )

    # f16 and bf16 results are f32's rounded (also where f32 is computed
    # in f64).
    {values, b} =
      Enum.zip(values, templates)
      |> Enum.map_reduce(b, fn {v, t}, b ->
        {v, b} = if working_type(t.type) != t.type, do: Ops.convert(b, v, {:f, 32}), else: {v, b}
        Ops.convert(b, v, t.type)
      end)

    {{:tuple, values}, b}
  end

  # What a call on a batch of matrices of `type` counts towards
  # EXLA.Placement's budget of elements, with the program's other ops (a
  # call is not unbounded, as other custom calls are): its operations,
  # m * n * min(m, n) per matrix times the op's factor (as LAPACK counts
  # them, rounded) and 4 for complex types, over @operations_per_element.
  # The budget (65,536 elements, some 10 µs of element-wise ops) is far
  # under the 1 ms a normal scheduler may be held, and the trip to a dirty
  # scheduler costs about 25 µs, more than a 64x64 Cholesky's kernel
  # (15 µs; 44 µs in all on a dirty scheduler, 19 on the caller's). Over 32,
  # the largest calls kept on the caller's scheduler take about 0.2 ms: a
  # Cholesky of 120, a QR of 75, an eigh of 60, an SVD of 44.
  @operations_per_element 32

  @work_factors %{
    "exla_linalg_qr" => 4,
    "exla_linalg_eigh" => 9,
    "exla_linalg_svd" => 22,
    "exla_linalg_cholesky" => 1,
    "exla_linalg_lu" => 1,
    "exla_linalg_solve" => 2,
    "exla_linalg_determinant" => 1
  }

  defp work(target, {element, dims}) do
    {batch, [m, n]} = dims |> Tuple.to_list() |> Enum.split(-2)
    complex = if match?({:c, _}, element), do: 4, else: 1

    operations =
      Map.fetch!(@work_factors, target) * complex * Enum.product(batch) * m * n * min(m, n)

    div(operations, @operations_per_element)
  end

  defp widened({:f, 32}), do: {:f, 64}
  defp widened({:c, 64}), do: {:c, 128}
  defp widened(type), do: type

  # The type a decomposition computes in for results of `type` (floating:
  # P, L and U of an integer matrix are integers on Nx 0.7, computed as
  # f32 and converted, as the default implementation does).
  defp working_type({kind, 16}) when kind in [:f, :bf], do: {:f, 32}
  defp working_type(type), do: type

  defp real_part({:c, 64}), do: {:f, 32}
  defp real_part({:c, 128}), do: {:f, 64}
  defp real_part(type), do: type

  defp backend_config(flags) do
    entries =
      Enum.map_join(flags, ", ", fn {name, on?} -> "#{name} = #{if on?, do: 1, else: 0} : i64" end)

    [backend_config: "{#{entries}}"]
  end
end
