defmodule EXLA.SharedTerm.Elided do
  @moduledoc false
  # What `EXLA.SharedTerm.inspect/2` prints in place of a subterm past its
  # budget.
  defstruct [:struct]

  defimpl Inspect do
    def inspect(%{struct: nil}, _opts), do: "..."
    def inspect(%{struct: :map}, _opts), do: "%{...}"
    def inspect(%{struct: module}, _opts), do: "%#{Kernel.inspect(module)}{...}"
  end
end

defmodule EXLA.SharedTerm do
  @moduledoc false
  import Bitwise

  # A user's term (a function and what it captures, options, a block's
  # struct) at a cost bounded by its size in memory (internal).
  #
  # Terms share subterms: `Enum.reduce(1..40, :leaf, &{&2, &2})` is 40
  # tuples in memory and 2^40 leaves as a tree, and so is an `Nx.Defn`
  # expression where each step uses the one before twice. The VM hashes,
  # compares and copies a term (a `:persistent_term` or ETS key, a message,
  # a stored value) by walking its tree, in one call that does not yield:
  # a cache key holding a closure that captured such a term froze the VM.
  # `inspect/2` also walks the tree (preemptibly, but for ever).
  #
  #   * `key/1` is what stands for a term in a cache key (and
  #     `function_key/1` for a function, remembering the answer): the term itself
  #     when its tree is at most `budget/0` words (hashing and comparing
  #     it then take about a tenth of a millisecond at most), otherwise
  #     `{EXLA.SharedTerm, digest}`. Which of the two depends on the tree
  #     alone, never on how the term shares, so equal terms get equal keys.
  #
  #   * `digest/2` is a 128-bit digest of a term's value that visits each
  #     subterm in memory once (native, on a dirty scheduler): equal terms
  #     get equal digests however they share, and different terms equal
  #     ones with a probability of about 2^-128 per pair.
  #
  #   * `bounded?/1` tells whether a term may be stored or sent (its tree
  #     fits the budget): `EXLA.LockedCache` keeps no other.
  #
  #   * `inspect/2` prints a term cut down to a bounded tree.
  #
  # Functions are opaque to the NIF: it reports those it meets, and they
  # are expanded here (`:erlang.fun_info/2`: code and captured values).

  @budget 65_536
  @inspect_budget 2_000
  @small 64
  @small_integer 1 <<< 59

  alias EXLA.SharedTerm.Elided

  @doc "The most words a term's tree may take to stand for itself in a key."
  def budget, do: @budget

  @doc """
  What stands for `term` in a cache key: `term` when its tree fits the
  budget, else `{EXLA.SharedTerm, digest}`.
  """
  def key(term) do
    if small?(term) or bounded?(term), do: term, else: {__MODULE__, digest(term)}
  end

  @remembered {__MODULE__, :functions}
  @remembered_kept 4

  @doc """
  `key/1` of `fun`, a compiler's key (a jit's function, whose key is
  asked on every call; any other term is `key/1`'s). The calling process
  remembers the answer for the last #{@remembered_kept} functions that
  captured something, by their place in memory (the same term, so the
  same value): a jitted function called again skips the walk of what it
  captured, and its digest when it is over the budget. Remembering a
  function keeps it alive until #{@remembered_kept} others replace it.
  """
  def function_key(fun) when is_function(fun) do
    case :erlang.fun_info(fun, :env) do
      {:env, []} -> fun
      {:env, _} -> function_key(fun, remembered(Process.get(@remembered, []), fun))
    end
  end

  def function_key(other), do: key(other)

  defp function_key(fun, :itself), do: fun
  defp function_key(_fun, {:digest, digest}), do: {__MODULE__, digest}

  defp function_key(fun, nil) do
    if bounded?(fun) do
      remember(fun, :itself)
      fun
    else
      digest = digest(fun)
      remember(fun, {:digest, digest})
      {__MODULE__, digest}
    end
  end

  # Only the same term in memory counts: comparing values would walk them.
  defp remembered([{known, fact} | rest], fun) do
    if :erts_debug.same(known, fun), do: fact, else: remembered(rest, fun)
  end

  defp remembered([], _fun), do: nil

  defp remember(fun, fact) do
    kept = Enum.take([{fun, fact} | Process.get(@remembered, [])], @remembered_kept)
    Process.put(@remembered, kept)
  end

  # A look, in Elixir, at small terms (the usual options, an operation's
  # static arguments): at most #{@small} atoms, small integers, floats,
  # short binaries, lists, tuples, maps of at most 16 keys and functions
  # without captures. It costs
  # less than a call of the NIF, and gives the same answer (such a tree
  # fits the budget); anything else is left to the NIF.
  defp small?(term), do: small(term, @small) >= 0

  defp small(_term, left) when left < 0, do: left
  defp small([], left), do: left
  defp small([head | tail], left), do: small(tail, small(head, left - 1))

  defp small(tuple, left) when is_tuple(tuple),
    do: small_elements(tuple, tuple_size(tuple), left - 1)

  defp small(term, left) when is_atom(term) or is_float(term), do: left - 1
  defp small(term, left) when is_integer(term) and abs(term) < @small_integer, do: left - 1
  defp small(term, left) when is_binary(term) and byte_size(term) <= 64, do: left - 1

  defp small(map, left) when is_map(map) and map_size(map) <= 16,
    do: :maps.fold(fn key, value, left -> small(value, small(key, left - 1)) end, left - 1, map)

  defp small(fun, left) when is_function(fun) do
    if :erlang.fun_info(fun, :env) == {:env, []}, do: left - 1, else: -1
  end

  defp small(_term, _left), do: -1

  defp small_elements(_tuple, i, left) when i == 0 or left < 0, do: left

  defp small_elements(tuple, i, left),
    do: small_elements(tuple, i - 1, small(:erlang.element(i, tuple), left))

  @doc """
  Whether `term`'s tree, functions' captured values included, takes at
  most `budget` words. Costs at most the budget.
  """
  def bounded?(term, budget \\ @budget), do: tree_left([term], budget, []) != :over

  # What is left of `budget` once the trees of `roots` are walked, or
  # `:over`; the functions in `skip` count as leaves.
  defp tree_left(roots, budget, skip) do
    case EXLA.NIF.term_tree_size(roots, budget, skip) do
      {:ok, left, funs} -> captured(funs, left, skip)
      :over -> :over
    end
  end

  # What the functions met capture, walked next (a function without
  # captures, the usual jit key, costs no other walk).
  defp captured(funs, left, skip) do
    case for(fun <- funs, {:env, env} = :erlang.fun_info(fun, :env), env != [], do: env) do
      [] -> left
      envs -> tree_left(envs, left, skip)
    end
  end

  @doc """
  The 16-byte digest of `term`'s value. With `tensors: :by_shape`, every
  `Nx.Tensor` in it counts by its type and shape alone.
  """
  def digest(term, opts \\ []) do
    by_shape = Keyword.get(opts, :tensors) == :by_shape
    {digest, _known} = digest(term, [], by_shape)
    digest
  end

  # `known` pairs each function met so far with its digest. The NIF names
  # those it does not know; each is digested as its code and captured
  # values, and the term again (its walk costs once more what it did).
  defp digest(term, known, by_shape) do
    case EXLA.NIF.term_digest(term, known, by_shape) do
      {:ok, digest} ->
        {digest, known}

      {:funs, funs} ->
        known =
          Enum.reduce(funs, known, fn fun, known ->
            {digest, known} = digest(parts(fun), known, by_shape)
            [{fun, digest} | known]
          end)

        digest(term, known, by_shape)
    end
  end

  # What makes a function what it is: its code, and for an anonymous one
  # what it captured.
  defp parts(fun) do
    info = :erlang.fun_info(fun)

    case info[:type] do
      :external ->
        {:external, info[:module], info[:name], info[:arity]}

      :local ->
        {:local, info[:module], info[:new_index], info[:new_uniq], info[:arity], info[:env]}
    end
  end

  @doc """
  `Kernel.inspect/2` of `term` cut down to at most about 2,000 words:
  what is past that prints as `...` (a struct as `%Module{...}`). A
  function prints without what it captured, as always.
  """
  def inspect(term, opts \\ []) do
    {pruned, _left} = prune(term, @inspect_budget)
    Kernel.inspect(pruned, opts)
  end

  defp prune(_term, left) when left <= 0, do: {%Elided{}, 0}

  defp prune(term, left) do
    case EXLA.NIF.term_tree_size(term, left, []) do
      # Functions print without their captured values.
      {:ok, rest, _funs} -> {term, rest}
      :over -> prune_over(term, left)
    end
  end

  defp prune_over(tuple, left) when is_tuple(tuple) do
    {elements, left} = prune_list(Tuple.to_list(tuple), left - 1)
    {List.to_tuple(elements), left}
  end

  defp prune_over(list, left) when is_list(list), do: prune_list(list, left)
  defp prune_over(%module{}, _left), do: {%Elided{struct: module}, 0}
  defp prune_over(map, _left) when is_map(map), do: {%Elided{struct: :map}, 0}
  defp prune_over(_term, _left), do: {%Elided{}, 0}

  defp prune_list([], left), do: {[], left}
  defp prune_list([_ | _], left) when left <= 0, do: {[%Elided{}], 0}

  defp prune_list([head | tail], left) do
    {head, left} = prune(head, left - 1)
    {tail, left} = prune_list(tail, left)
    {[head | tail], left}
  end

  defp prune_list(improper, left), do: prune(improper, left)
end
