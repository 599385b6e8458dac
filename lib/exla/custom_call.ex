if EXLA.NxVersion.blocks?() do
  defprotocol EXLA.CustomCall do
    @moduledoc """
    Lowers `Nx.block/4` blocks of your own (or Nx's) to XLA custom calls
    (`stablehlo.custom_call`). Nx 0.12 and later only: Nx 0.7 has no blocks.

    When a function compiled by `EXLA` (or an `EXLA.Backend` operation)
    meets a block, EXLA asks `call/4` how to lower it, with:

      * `struct` - the block's struct, the first argument of `Nx.block/4`;
      * `out` - the block's output: a tensor template or a tuple of them
        (types and shapes, not data);
      * `args` - the templates of the block's tensor inputs, in order;
      * `client` - the `EXLA.Client` the program is compiled for (match on
        `%{platform: :host}`, for example, for a host-only handler).

    `call/4` returns `:skip` to let EXLA lower the block its own way, or
    `{:ok, %EXLA.CustomCall.Spec{}}` to emit a custom call to the handler
    the spec names, with the block's inputs as operands and its outputs as
    results (see `EXLA.CustomCall.Spec`), all row-major (the last axis
    varies fastest, as in `Nx.to_binary/1`). The handler must be registered
    with the PJRT plugin that runs the program (by a native library of
    yours); EXLA does not register it.

    The protocol falls back to `Any`, whose implementation returns `:skip`
    for every struct. EXLA's own lowerings of a skipped block are: native
    ones for QR (`Nx.LinAlg.qr/2`), LU (`Nx.LinAlg.lu/1`), `Nx.take/3`,
    `Nx.take_along_axis/3` and `Nx.top_k/2`, and for every other block the
    default implementation Nx gives with it, compiled in the same program.
    An implementation for one of Nx's structs replaces EXLA's lowering of
    it.

    ## Examples

        defmodule MyApp.Sinc do
          defstruct []
        end

        defimpl EXLA.CustomCall, for: MyApp.Sinc do
          def call(_block, %Nx.Tensor{type: {:f, 32}}, [_x], %{platform: :host}),
            do: {:ok, %EXLA.CustomCall.Spec{call_target_name: "my_sinc_f32"}}

          def call(_block, _out, _args, _client), do: :skip
        end

    Where the handler is not registered, the plugin rejects the program
    when it compiles it.
    """

    @fallback_to_any true

    @doc "Returns `:skip` or `{:ok, %EXLA.CustomCall.Spec{}}` for a block."
    def call(struct, out, args, client)
  end

  defimpl EXLA.CustomCall, for: Any do
    # EXLA's lowerings of Nx's blocks are not custom calls
    # (EXLA.Defn.Lowering.Blocks): they are chosen after this answer.
    def call(_struct, _out, _args, _client), do: :skip
  end

  defmodule EXLA.CustomCall.Spec do
    @moduledoc """
    How `EXLA.CustomCall.call/4` asks for a block to be lowered:

      * `:call_target_name` - the name of the handler (required), as
        registered with the plugin.

      * `:attributes` - `{name, value}` pairs of binaries: MLIR attribute
        names and values (such as `{"k", "3 : i64"}`), written in the call's
        `backend_config` dictionary. Default `[]` (no dictionary).

      * `:operand_element_types` - `:default` to hand the inputs over in
        their own types, or one `Nx.Type.t()` per input: inputs of another
        type are converted first. Default `:default`.
    """

    @enforce_keys [:call_target_name]
    defstruct [:call_target_name, attributes: [], operand_element_types: :default]

    @type t :: %__MODULE__{
            call_target_name: String.t(),
            attributes: [{String.t(), String.t()}],
            operand_element_types: :default | [Nx.Type.t()]
          }
  end
end
