defmodule EXLA.Defn.Lowering.LU do
  @moduledoc false
  # LU decomposition (A = P . L . U) written as a defn, traced to an
  # expression and lowered like any other (`:lu` has no direct StableHLO op).
  #
  # It follows Nx.BinaryBackend so that results match it: the permutation
  # is chosen first, from the original matrix (for each column j, the row at
  # or below j with the largest absolute value in column j, the first one on
  # ties, is swapped into row j); then the permuted matrix is eliminated
  # without further pivoting. The arithmetic is done in double precision and
  # rounded once at the end (the reference computes with Erlang floats);
  # entries below `eps` in absolute value become zero, as in the reference,
  # and a zero pivot gives infinite multipliers.

  import Nx.Defn
  import EXLA.Defn.Lowering.Double, only: [as_work: 1, real_part: 1]

  @doc false
  def expr(%Nx.Tensor{} = template, opts \\ []) do
    eps = Keyword.get(opts, :eps, 1.0e-10)
    Nx.Defn.debug_expr(&lu(&1, eps: eps)).(template)
  end

  defn lu(a, opts \\ []) do
    eps = opts[:eps]
    n = Nx.axis_size(a, -1)
    work = as_work(a)
    row_ids = Nx.iota(row_shape(a), axis: -1)

    {_j, work, perm} =
      while {j = 0, work, perm = row_ids}, j < n - 1 do
        candidates = Nx.select(row_ids >= j, Nx.abs(Nx.take(work, j, axis: -1)), -1)
        pivot = Nx.argmax(candidates, axis: -1, keep_axis: true, tie_break: :low)
        swap = Nx.select(row_ids == j, pivot, Nx.select(row_ids == pivot, j, row_ids))
        work = Nx.take_along_axis(work, Nx.broadcast(Nx.new_axis(swap, -1), work), axis: -2)
        {j + 1, work, Nx.take_along_axis(perm, swap, axis: -1)}
      end

    l = Nx.broadcast(Nx.as_type(0, Nx.type(work)), Nx.shape(work))
    col_ids = Nx.iota({1, n})

    {_k, u, l} =
      while {k = 0, u = work, l}, k < n do
        row = flush(Nx.take(u, k, axis: -2), eps)
        u = Nx.select(Nx.broadcast(Nx.new_axis(row_ids == k, -1), u), Nx.new_axis(row, -2), u)
        col = Nx.take(u, k, axis: -1)
        pivot = Nx.broadcast(Nx.new_axis(Nx.take(row, k, axis: -1), -1), col)
        inf = Nx.select(real_part(col) >= 0, Nx.Constants.infinity(), Nx.Constants.neg_infinity())
        factors = Nx.select(pivot == 0, inf, col / Nx.select(pivot == 0, 1, pivot))
        below = Nx.broadcast(Nx.new_axis(row_ids > k, -1), u)
        factors = Nx.new_axis(flush(factors, eps), -1)
        # selects, not masks: an infinite factor (zero pivot) times a zero
        # mask would put NaN where the reference leaves entries alone
        u = Nx.select(below, u - factors * Nx.new_axis(row, -2), u)
        {k + 1, u, Nx.select(below and col_ids == k, Nx.broadcast(factors, l), l)}
      end

    rows = Nx.iota({n, n}, axis: 0)
    cols = Nx.iota({n, n}, axis: 1)
    l = flush(l + Nx.eye(n, type: Nx.type(l)), eps)
    u = flush(Nx.select(Nx.broadcast(rows <= cols, Nx.shape(u)), u, 0), eps)
    p = Nx.new_axis(perm, -2) == Nx.iota(Nx.shape(a), axis: -2)
    {Nx.as_type(p, Nx.type(a)), l, u}
  end

  defnp flush(x, eps), do: Nx.select(Nx.abs(x) < eps, 0, x)

  deftransformp row_shape(a), do: Tuple.delete_at(Nx.shape(a), Nx.rank(a) - 1)
end
