defmodule EXLA.MLIR.Value do
  @moduledoc false

  # An SSA value in the function being emitted: its textual name (`%3`,
  # `%7#1`, `%arg0`) and its `EXLA.MLIR.Type`.
  defstruct [:name, :type]

  @type t :: %__MODULE__{name: String.t(), type: EXLA.MLIR.Type.t()}
end

defmodule EXLA.MLIR.Builder do
  @moduledoc false

  # A small, purely functional emitter of MLIR text in the generic operation
  # form, e.g.
  #
  #     %3 = "stablehlo.add"(%1, %2) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
  #
  # The builder accumulates the lines of one function body. Names come from a
  # single counter, so they are unique across nested regions and the output is
  # deterministic. Regions are opened with `begin_region/2` and closed with
  # `end_region/3`, which returns the region text to pass to `op/5`.
  #
  # `assigns` is free for the client (the lowering keeps its state there).
  # `facts` are the `EXLA.MLIR.Facts` recorded as each op is emitted: what
  # `EXLA.Placement` decides where the program runs from. `module/5` returns
  # the whole program as an `EXLA.MLIR.Program`.

  alias EXLA.MLIR.{Facts, Program, Type, Value}

  defstruct lines: [], counter: 0, depth: 2, assigns: %{}, facts: %Facts{}

  @type t :: %__MODULE__{
          lines: iodata,
          counter: non_neg_integer,
          depth: pos_integer,
          assigns: map,
          facts: Facts.t()
        }

  @doc "A new, empty builder."
  def new, do: %__MODULE__{}

  @doc """
  Emits an operation and returns `{results, builder}`.

  Options:

    * `:attrs` - a list of `{name, text}` attributes, already rendered
    * `:regions` - a list of region texts from `end_region/3`
    * `:work` - for an op that would count as unbounded (a custom call)
      but is known to end: about how many element operations it costs,
      recorded in the facts instead (`EXLA.MLIR.Facts.record_op/5`)
  """
  @spec op(t, String.t(), [Value.t()], [Type.t()], keyword) :: {[Value.t()], t}
  def op(%__MODULE__{} = b, name, operands, result_types, opts \\ []) do
    attrs = Keyword.get(opts, :attrs, [])
    regions = Keyword.get(opts, :regions, [])
    {results, lhs, b} = results(b, result_types)

    text = [
      lhs,
      ~s("#{name}"(),
      Enum.map_join(operands, ", ", & &1.name),
      ")",
      regions_text(regions),
      attrs_text(attrs),
      " : (",
      Enum.map_join(operands, ", ", &Type.to_string(&1.type)),
      ") -> ",
      results_type(result_types)
    ]

    operand_types = Enum.map(operands, & &1.type)

    facts = Facts.record_op(b.facts, name, operand_types, result_types, opts[:work])

    {results, emit(%{b | facts: facts}, text)}
  end

  @doc "Like `op/5` for an operation with exactly one result."
  @spec op1(t, String.t(), [Value.t()], Type.t(), keyword) :: {Value.t(), t}
  def op1(b, name, operands, result_type, opts \\ []) do
    {[value], b} = op(b, name, operands, [result_type], opts)
    {value, b}
  end

  defp results(b, []), do: {[], "", b}

  defp results(%{counter: c} = b, [type]) do
    name = "%#{c}"
    {[%Value{name: name, type: type}], name <> " = ", %{b | counter: c + 1}}
  end

  defp results(%{counter: c} = b, types) do
    values =
      types
      |> Enum.with_index()
      |> Enum.map(fn {type, i} -> %Value{name: "%#{c}##{i}", type: type} end)

    {values, "%#{c}:#{length(types)} = ", %{b | counter: c + 1}}
  end

  defp results_type([type]), do: Type.to_string(type)
  defp results_type(types), do: ["(", Enum.map_join(types, ", ", &Type.to_string/1), ")"]

  defp regions_text([]), do: []
  defp regions_text(regions), do: [" (", Enum.intersperse(regions, ", "), ")"]

  defp attrs_text([]), do: []

  defp attrs_text(attrs), do: [" {", attrs_list(attrs), "}"]

  defp emit(%{lines: lines, depth: depth} = b, text) do
    %{b | lines: [lines, String.duplicate("  ", depth), text, "\n"]}
  end

  @doc """
  Opens a region whose entry block takes arguments of `arg_types`.

  Returns `{args, saved, builder}`; pass `saved` to `end_region/3`.
  """
  def begin_region(%__MODULE__{} = b, arg_types) do
    {args, counter} =
      Enum.map_reduce(arg_types, b.counter, fn type, c ->
        {%Value{name: "%#{c}", type: type}, c + 1}
      end)

    header =
      case args do
        [] ->
          []

        _ ->
          args_text = Enum.map_join(args, ", ", &"#{&1.name}: #{Type.to_string(&1.type)}")
          [String.duplicate("  ", b.depth), "^bb0(", args_text, "):\n"]
      end

    saved = {b.lines, b.depth}
    {args, saved, %{b | lines: header, counter: counter, depth: b.depth + 1}}
  end

  @doc """
  Closes a region with a terminator returning `results` (default op
  `stablehlo.return`). Returns `{region_text, builder}`.
  """
  def end_region(%__MODULE__{} = b, {lines, depth}, results, terminator \\ "stablehlo.return") do
    b = terminator(b, terminator, results)
    text = ["{\n", b.lines, String.duplicate("  ", depth), "}"]
    {text, %{b | lines: lines, depth: depth}}
  end

  defp terminator(b, name, results) do
    text = [
      ~s("#{name}"(),
      Enum.map_join(results, ", ", & &1.name),
      ") : (",
      Enum.map_join(results, ", ", &Type.to_string(&1.type)),
      ") -> ()"
    ]

    emit(b, text)
  end

  @doc """
  Renders a whole module with a public function `name` taking `args` (a list
  of types; they are named `%arg0`, ...) whose body is produced by
  `body_fun.(builder, arg_values)`, which returns `{results, builder}`.

  Returns `{program, builder}`: the `EXLA.MLIR.Program` (its shapes are
  those of the arguments the function takes and of its results; its facts
  those recorded while emitting the body, and the parameters) and the
  builder after the body.

  Options:

    * `:donated` - positions of arguments whose buffers the program may
      reuse: each is aliased (`tf.aliasing_output`) to the first result of
      the same type not aliased yet, in order; one without such a result
      is not aliased. Defaults to `[]`

    * `:kept` - a function that, given the builder after the body, returns
      the positions of the arguments the function takes: the others are
      left out of its signature (the body must not use them). Defaults to
      all of them

    * `:arg_attrs` - one list of `{name, text}` attributes per argument
      (by position in `args`), written on the parameters the function
      takes, after the alias. Defaults to none

    * `:result_attrs` - one list of `{name, text}` attributes per result.
      Defaults to none

    * `:module_attrs` - a list of `{name, text}` attributes of the module
      (`module attributes {...}`). Defaults to none

    * `:module_ops` - lines of text, each an operation of the module
      written before the function, such as the `sdy.mesh` a sharded
      program's annotations refer to. Defaults to none
  """
  def module(name, arg_types, body_fun, assigns \\ %{}, opts \\ []) do
    opts =
      Keyword.validate!(opts,
        donated: [],
        kept: nil,
        arg_attrs: [],
        result_attrs: [],
        module_attrs: [],
        module_ops: []
      )

    args =
      arg_types
      |> Enum.with_index()
      |> Enum.map(fn {type, i} -> %Value{name: "%arg#{i}", type: type} end)

    {results, b} = body_fun.(%{new() | assigns: assigns}, args)
    b = terminator(b, "func.return", results)
    result_types = Enum.map(results, & &1.type)
    aliases = aliases(arg_types, result_types, opts[:donated])
    kept = if opts[:kept], do: opts[:kept].(b), else: Enum.to_list(0..(length(args) - 1)//1)
    args = List.to_tuple(args)
    arg_attrs = List.to_tuple(opts[:arg_attrs])

    args_text =
      Enum.map_join(kept, ", ", fn i ->
        arg = elem(args, i)
        alias = if result = aliases[i], do: [{"tf.aliasing_output", "#{result} : i32"}], else: []
        attrs = if i < tuple_size(arg_attrs), do: alias ++ elem(arg_attrs, i), else: alias
        "#{arg.name}: #{Type.to_string(arg.type)}#{signature_attrs(attrs)}"
      end)

    results_text =
      results
      |> Enum.with_index()
      |> Enum.map_join(", ", fn {result, i} ->
        Type.to_string(result.type) <> signature_attrs(Enum.at(opts[:result_attrs], i, []))
      end)

    text =
      IO.iodata_to_binary([
        module_header(opts[:module_attrs]),
        Enum.map(opts[:module_ops], &["  ", &1, "\n"]),
        "  func.func public @#{name}(#{args_text}) -> (#{results_text}) {\n",
        b.lines,
        "  }\n",
        "}\n"
      ])

    kept_types = Enum.map(kept, &elem(args, &1).type)
    positions = kept |> Enum.with_index() |> Map.new()

    program = %Program{
      text: text,
      input_shapes: Enum.map(kept_types, &Type.to_shape/1),
      output_shapes: Enum.map(result_types, &Type.to_shape/1),
      donated:
        for(
          {i, result} <- aliases,
          Map.has_key?(positions, i),
          into: %{},
          do: {positions[i], result}
        ),
      facts: Enum.reduce(kept_types, b.facts, &Facts.record_tensor(&2, &1))
    }

    {program, b}
  end

  defp module_header([]), do: "module {\n"
  defp module_header(attrs), do: ["module attributes {", attrs_list(attrs), "} {\n"]

  defp signature_attrs([]), do: ""
  defp signature_attrs(attrs), do: " {" <> attrs_list(attrs) <> "}"

  defp attrs_list(attrs), do: Enum.map_join(attrs, ", ", fn {k, v} -> "#{k} = #{v}" end)

  # %{argument position => result position}
  defp aliases(_arg_types, _result_types, []), do: %{}

  defp aliases(arg_types, result_types, donated) do
    arg_types = List.to_tuple(arg_types)
    results = Enum.with_index(result_types)

    donated
    |> Enum.sort()
    |> Enum.dedup()
    |> Enum.reduce({%{}, results}, fn i, {aliases, free} ->
      type = elem(arg_types, i)

      case Enum.split_while(free, fn {result_type, _} -> result_type != type end) do
        {before, [{_, j} | rest]} -> {Map.put(aliases, i, j), before ++ rest}
        {_, []} -> {aliases, free}
      end
    end)
    |> elem(0)
  end

  ## Attribute helpers

  @doc "Renders `array<i64: 1, 2>`."
  def i64_array(list),
    do: "array<i64#{if list == [], do: "", else: ": "}#{Enum.join(list, ", ")}>"

  @doc "Renders a boolean attribute."
  def bool(true), do: "true"
  def bool(false), do: "false"

  @doc "Renders a 2-D i64 dense attribute such as padding `[[lo, hi], ...]`."
  def i64_pairs(pairs) do
    n = length(pairs)
    inner = Enum.map_join(pairs, ", ", fn {lo, hi} -> "[#{lo}, #{hi}]" end)
    "dense<#{if n == 0, do: "", else: "[#{inner}]"}> : tensor<#{n}x2xi64>"
  end
end
