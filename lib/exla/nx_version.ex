defmodule EXLA.NxVersion do
  @moduledoc false

  # The one module that knows which Nx this project is compiled against.
  # Every other module asks it (at compile time, in module bodies, or at run
  # time: all answers are constants) instead of probing Nx itself, so that
  # supporting another Nx line means changing the facts here and adding the
  # line's own lowering family, not editing checks across the tree.
  #
  # Lines:
  #
  #   * `:v0_7`  - Nx 0.7.2: `optional/3` and the optional callbacks,
  #     tokens, `Nx.Defn.stream/3`, s64 default integers.
  #   * `:v0_12` - Nx 0.12: `Nx.block/4` (`:block` nodes), tokens still,
  #     `Nx.runtime_call/4`, `stack/3`, pointers, sub-byte and f8 types,
  #     s32 default integers, `__shard_jit__/6`; no streams.
  #   * `:v0_13` - Nx 0.13: as 0.12, with hooks as `:hook` nodes (tokens
  #     are deprecated and no longer emitted).

  # Every fact is computed here, when this module compiles (the line is a
  # constant, so comparing it in a function body would always give the
  # same answer).

  Application.load(:nx)
  @version to_string(Application.spec(:nx, :vsn))

  @line (cond do
           Version.match?(@version, "~> 0.13.0") -> :v0_13
           Version.match?(@version, "~> 0.12.0") -> :v0_12
           Version.match?(@version, "~> 0.7.2") -> :v0_7
           true -> raise "EXLA supports Nx 0.7.2, 0.12 and 0.13, compiled with Nx #{@version}"
         end)

  @doc "The version of the compiled Nx."
  def version, do: @version

  @doc "The Nx line: `:v0_7`, `:v0_12` or `:v0_13`."
  def line, do: @line

  @doc "Whether the compiled Nx is one of the lines given."
  def line?(lines) when is_list(lines), do: @line in lines

  @doc "Whether Nx has `Nx.block/4` (the `:block` node and `block/4` callback)."
  @fact_blocks @line != :v0_7
  def blocks?, do: @fact_blocks

  @doc "Whether Nx has `Nx.Defn.stream/3` and the `Nx.Stream` protocol."
  @fact_streams @line == :v0_7
  def streams?, do: @fact_streams

  @doc "Whether Nx's expressions carry hooks on tokens (`:token`, `:attach_token`)."
  @fact_tokens @line in [:v0_7, :v0_12]
  def tokens?, do: @fact_tokens

  @doc "Whether Nx's expressions carry hooks as `:hook` nodes."
  @fact_hook_nodes @line == :v0_13
  def hook_nodes?, do: @fact_hook_nodes

  @doc "Whether Nx has `Nx.map/2` (the `:map` node and `map/4` callback)."
  @fact_maps @line == :v0_7
  def maps?, do: @fact_maps

  @doc "Whether Nx has `Nx.runtime_call/4` (the `:runtime_call` node)."
  @fact_runtime_calls @line != :v0_7
  def runtime_calls?, do: @fact_runtime_calls

  @doc "Whether Nx has the `:stack` node and `stack/3` callback."
  @fact_stack @line != :v0_7
  def stack?, do: @fact_stack

  @doc "Whether Nx has `Nx.to_pointer/2` and `Nx.from_pointer/5` (and their callbacks)."
  @fact_pointers @line != :v0_7
  def pointers?, do: @fact_pointers

  @doc "Whether Nx has `%Nx.Mesh{}` and the `__shard_jit__/6` compiler callback."
  @fact_meshes @line != :v0_7
  def meshes?, do: @fact_meshes

  @doc "Whether Nx has sub-byte integers (s2, s4, u2, u4) and f8 types."
  @fact_small_types @line != :v0_7
  def small_types?, do: @fact_small_types

  @doc "The type of integers Nx infers by default (and of indices it returns)."
  @fact_default_integer if(@line == :v0_7, do: {:s, 64}, else: {:s, 32})
  def default_integer, do: @fact_default_integer

  @doc """
  The values of the compiler's `:precision` option: EXLA 0.7.2 takes
  `:packed_nibble` too, EXLA 0.13.1 does not.
  """
  @fact_precisions [:default, :high, :highest] ++
                     if(@line == :v0_7, do: [:packed_nibble], else: [])
  def precisions, do: @fact_precisions

  @doc """
  Every fact of this module (its functions of no argument whose names end
  in `?`) and its value: `%{blocks?: true, ...}`. The tests are tagged with
  these names (`@tag nx: :streams?`) and leave out those whose fact is
  false, so a fact added here is a tag at once.
  """
  def facts do
    for {name, 0} <- __MODULE__.__info__(:functions),
        String.ends_with?(Atom.to_string(name), "?"),
        into: %{},
        do: {name, apply(__MODULE__, name, [])}
  end

  @doc "The callbacks of the compiled Nx's `Nx.Backend` behaviour."
  def backend_callbacks, do: Nx.Backend.behaviour_info(:callbacks)
end
