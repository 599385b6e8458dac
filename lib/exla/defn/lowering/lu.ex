defmodule EXLA.Defn.Lowering.LU do
  @moduledoc false
  # LU decomposition with partial pivoting (A = P . L . U) written as a defn,
  # traced to an expression and lowered like any other (`:lu` has no
  # StableHLO op). At step k the row at or below k with the largest absolute
  # value in column k (the first on ties) becomes the pivot row, as in
  # LAPACK's getrf. The work is done in the output's type (no widening), so
  # it compiles and runs the same on every platform. A zero pivot (singular
  # matrix) leaves the rows below it alone. P, L and U can differ from
  # Nx.BinaryBackend's, which picks its permutation from the original matrix
  # before eliminating; P . L . U gives A in both.

  import Nx.Defn

  @doc false
  def expr(%Nx.Tensor{} = template) do
    Nx.Defn.debug_expr(&lu/1).(template)
  end

  defn lu(a) do
    n = Nx.axis_size(a, -1)
    u = as_float(a)
    l = Nx.broadcast(Nx.as_type(0, Nx.type(u)), Nx.shape(u))
    row_ids = Nx.iota(row_shape(a), axis: -1)
    col_ids = Nx.iota({1, n})

    {_k, u, l, perm} =
      while {k = 0, u, l, perm = row_ids}, k < n do
        candidates = Nx.select(row_ids >= k, Nx.abs(Nx.take(u, k, axis: -1)), -1)
        pivot = Nx.argmax(candidates, axis: -1, keep_axis: true, tie_break: :low)
        swap = Nx.select(row_ids == k, pivot, Nx.select(row_ids == pivot, k, row_ids))
        swap_rows = Nx.broadcast(Nx.new_axis(swap, -1), u)
        u = Nx.take_along_axis(u, swap_rows, axis: -2)
        l = Nx.take_along_axis(l, swap_rows, axis: -2)

        row = Nx.take(u, k, axis: -2)
        col = Nx.take(u, k, axis: -1)
        pivot_value = Nx.new_axis(Nx.take(row, k, axis: -1), -1)
        eliminate = row_ids > k and pivot_value != 0
        factors = col / Nx.select(pivot_value == 0, 1, pivot_value)
        # selects, not a zero factor: rows that are not eliminated keep
        # their bits (0 * inf would be NaN)
        rows_below = Nx.broadcast(Nx.new_axis(eliminate, -1), u)
        u = Nx.select(rows_below, u - Nx.new_axis(factors, -1) * Nx.new_axis(row, -2), u)
        l = Nx.select(rows_below and col_ids == k, Nx.new_axis(factors, -1), l)
        {k + 1, u, l, Nx.take_along_axis(perm, swap, axis: -1)}
      end

    rows = Nx.iota({n, n}, axis: 0)
    cols = Nx.iota({n, n}, axis: 1)
    l = l + Nx.eye(n, type: Nx.type(l))
    u = Nx.select(Nx.broadcast(rows <= cols, Nx.shape(u)), u, 0)
    p = Nx.new_axis(perm, -2) == Nx.iota(Nx.shape(a), axis: -2)
    {Nx.as_type(p, Nx.type(a)), l, u}
  end

  # The input in the floating-point type the decomposition works in;
  # `EXLA.Defn.Lowering.QR` works in the same one.
  @doc false
  deftransform as_float(a), do: Nx.as_type(a, Nx.Type.to_floating(Nx.type(a)))

  deftransformp row_shape(a), do: Tuple.delete_at(Nx.shape(a), Nx.rank(a) - 1)
end
