defmodule EXLA.MLIR.Program do
  @moduledoc false

  # A StableHLO program as a value (internal): its MLIR text and what is
  # known about it, so that no later stage reads the text again.
  #
  #   * `:text` - the MLIR module, whose entry point is `@main`
  #   * `:input_shapes` - the `EXLA.Shape`s of `@main`'s parameters
  #   * `:output_shapes` - those of its results, or `nil` when they are not
  #     known (a hand-written program: the plugin tells them)
  #   * `:donated` - `%{parameter => result}`: the parameters aliased to a
  #     result (`tf.aliasing_output`), by position
  #   * `:facts` - the `EXLA.MLIR.Facts` placement is decided from
  #
  # `EXLA.MLIR.Builder.module/5` makes EXLA's own programs, recording their
  # facts as it emits each op; `EXLA.MLIR.Check.read!/2` makes one from the
  # text of a hand-written program.

  @enforce_keys [:text, :input_shapes, :facts]
  defstruct [:text, :input_shapes, :output_shapes, :facts, donated: %{}]

  @type t :: %__MODULE__{
          text: String.t(),
          input_shapes: [EXLA.Shape.t()],
          output_shapes: [EXLA.Shape.t()] | nil,
          donated: %{non_neg_integer => non_neg_integer},
          facts: EXLA.MLIR.Facts.t()
        }
end
