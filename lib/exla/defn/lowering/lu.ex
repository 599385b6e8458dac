defmodule EXLA.Defn.Lowering.LU do
  @moduledoc false
  # LU decomposition with partial pivoting (A = P . L . U) written as a defn,
  # traced to an expression and lowered like any other (`:lu` has no direct
  # StableHLO op). Pivots are the largest absolute value of each column, as
  # in LAPACK's getrf; P, L and U may differ from Nx.BinaryBackend's, which
  # chooses its permutation from the original matrix.

  import Nx.Defn

  @doc false
  def expr(%Nx.Tensor{} = template) do
    Nx.Defn.debug_expr(&lu/1).(template)
  end

  defn lu(a) do
    n = Nx.axis_size(a, -1)
    u = as_float(a)
    l = Nx.broadcast(Nx.as_type(0, Nx.type(u)), Nx.shape(u))
    perm = Nx.iota(row_shape(a), axis: -1)
    row_ids = perm

    {_k, u, l, perm} =
      while {k = 0, u, l, perm}, k < n do
        col = Nx.take(u, k, axis: -1)
        candidates = Nx.select(row_ids >= k, Nx.abs(col), -1)
        pivot = Nx.argmax(candidates, axis: -1, keep_axis: true)
        swap = Nx.select(row_ids == k, pivot, Nx.select(row_ids == pivot, k, row_ids))
        swap_rows = Nx.broadcast(Nx.new_axis(swap, -1), u)
        u = Nx.take_along_axis(u, swap_rows, axis: -2)
        l = Nx.take_along_axis(l, swap_rows, axis: -2)
        perm = Nx.take_along_axis(perm, swap, axis: -1)

        row = Nx.take(u, k, axis: -2)
        col = Nx.take(u, k, axis: -1)
        pivot_value = Nx.new_axis(Nx.take(row, k, axis: -1), -1)
        below = row_ids > k and pivot_value != 0
        factors = Nx.select(below, col / Nx.select(pivot_value == 0, 1, pivot_value), 0)
        u = u - Nx.new_axis(factors, -1) * Nx.new_axis(row, -2)
        l = l + Nx.new_axis(factors, -1) * (Nx.iota({1, n}) == k)
        {k + 1, u, l, perm}
      end

    rows = Nx.iota({n, n}, axis: 0)
    cols = Nx.iota({n, n}, axis: 1)
    l = l + Nx.eye(n, type: Nx.type(l))
    u = Nx.select(Nx.broadcast(rows <= cols, Nx.shape(u)), u, 0)
    p = Nx.new_axis(perm, -2) == Nx.iota(Nx.shape(a), axis: -2)
    {Nx.as_type(p, Nx.type(a)), l, u}
  end

  deftransformp as_float(a), do: Nx.as_type(a, Nx.Type.to_floating(Nx.type(a)))
  deftransformp row_shape(a), do: Tuple.delete_at(Nx.shape(a), Nx.rank(a) - 1)
end
