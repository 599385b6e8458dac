defmodule EXLA.MLIR.Facts do
  @moduledoc false

  # What is known about a program's cost, as data (internal): the facts
  # `EXLA.Placement` decides where its runs happen from.
  #
  # `EXLA.MLIR.Builder` records them as it emits each op of EXLA's own
  # programs; `EXLA.MLIR.Check` reads them from the text of hand-written
  # ones. Cached and serialized executables keep them, so placement is
  # decided again, by the policy of the VM that loads them.
  #
  #   * `:unbounded` - why the program may run for unbounded time: the names
  #     of its ops that may (`stablehlo.while`, `stablehlo.custom_call`,
  #     transfers that wait for the host, collectives that wait for other
  #     devices; see `unbounded_op?/1`), and `"declared"` when its compiler
  #     said so. Empty for straight-line programs
  #
  #   * `:largest_tensor` - the elements of its largest tensor, or
  #     `:unknown` when a dimension is dynamic
  #
  #   * `:total_elements` - the elements its ops read and write, summed over
  #     the ops (a measure of the data a run touches), or `:unknown`
  #
  #   * `:run_checks` - whether its loops check that their run is still
  #     wanted: its last parameter is then the run's id, which a run passes
  #     itself (see `EXLA.Defn.Lowering`'s `:run_checks`)

  defstruct unbounded: [], largest_tensor: 0, total_elements: 0, run_checks: false

  @type elements :: non_neg_integer | :unknown
  @type t :: %__MODULE__{
          unbounded: [String.t()],
          largest_tensor: elements,
          total_elements: elements,
          run_checks: boolean
        }

  @doc """
  `facts` as this version knows them: facts serialized by an older one
  (the compile cache) lack the fields added since, which take their
  defaults.
  """
  def upgrade(facts), do: struct(__MODULE__, Map.delete(facts, :__struct__))

  # Ops that may run for unbounded time: loops, host callbacks, transfers
  # that wait for the host, and collectives that wait for other devices.
  # An op added to the emitter that can run for unbounded time belongs here.
  @unbounded_ops ~w(while custom_call infeed outfeed send recv all_reduce all_gather
                    all_to_all reduce_scatter collective_permute collective_broadcast)

  @doc "The short names (`while`, `custom_call`, ...) of the unbounded ops."
  def unbounded_ops, do: @unbounded_ops

  @doc """
  Whether the op of full name `name` (`"stablehlo.while"`) may run for
  unbounded time.

      iex> EXLA.MLIR.Facts.unbounded_op?("stablehlo.while")
      true
      iex> EXLA.MLIR.Facts.unbounded_op?("stablehlo.add")
      false
  """
  def unbounded_op?(name) do
    case String.split(name, ".", parts: 2) do
      [dialect, op] when dialect in ["stablehlo", "mhlo", "chlo"] -> op in @unbounded_ops
      _ -> false
    end
  end

  @doc """
  Records an op of `name` reading `operands` and writing `results` (types).
  With `work` (about how many element operations it costs besides the
  elements it reads and writes), an op known to end in bounded time: a
  custom call whose handler is known (one of the NIF's decompositions),
  which is not unbounded as other custom calls are.
  """
  def record_op(%__MODULE__{} = facts, name, operands, results, work \\ nil)
      when work == nil or (is_integer(work) and work >= 0) do
    facts = if work == nil and unbounded_op?(name), do: add_unbounded(facts, name), else: facts
    facts = Enum.reduce(results, facts, &record_tensor(&2, &1))
    touched = Enum.reduce(operands ++ results, work || 0, &(elements(&1) + &2))
    %{facts | total_elements: facts.total_elements + touched}
  end

  @doc "Records a tensor of `type` the program holds (a parameter)."
  def record_tensor(%__MODULE__{largest_tensor: largest} = facts, type),
    do: %{facts | largest_tensor: max(largest, elements(type))}

  @doc "Records a reason the program may run for unbounded time."
  def add_unbounded(%__MODULE__{unbounded: unbounded} = facts, reason) do
    if reason in unbounded, do: facts, else: %{facts | unbounded: unbounded ++ [reason]}
  end

  defp elements({_element, dims}), do: Tuple.product(dims)
end
