defmodule EXLA.MLIR.Check do
  @moduledoc false

  # Checks a program must pass before a PJRT plugin compiles it (internal).
  #
  # Plugins abort the whole VM, or block it forever, on some programs they
  # accept: a tensor whose size does not fit in memory throws `std::bad_alloc`
  # while compiling; a very long FFT trips an assertion of XLA:CPU's FFT
  # library; a recursive call overflows the compiler's stack; an infeed,
  # outfeed, send or recv waits for a transfer nobody will make. These checks
  # raise `ArgumentError` instead, before the plugin sees the program:
  #
  #   * every tensor must take at most the client's limit in bytes (see
  #     `EXLA.Client.max_tensor_bytes/1`);
  #
  #   * FFT lengths must be between 1 and 2^28;
  #
  #   * programs may not use `infeed`, `outfeed`, `send` or `recv`: EXLA gives
  #     them no channel (the PJRT C API has no infeed transfer, and EXLA
  #     registers no send or recv callbacks), so on every client they would
  #     wait forever;
  #
  #   * the functions of a program may not call each other in a cycle.
  #
  # `EXLA.Defn.Lowering` checks the size of every expression it lowers, and
  # the lengths of its FFTs, with `tensor_size!/3` and `fft_length!/1`, and
  # emits neither feeds nor calls. Hand-written programs given to
  # `EXLA.Executable.compile/3` are read with `read!/2`, which checks them
  # and returns them as an `EXLA.MLIR.Program`.
  #
  # This is the only module that reads MLIR text: EXLA's own programs carry
  # what is known about them as data (`EXLA.MLIR.Program`).

  alias EXLA.MLIR.{Facts, Program, Type}

  # The longest FFT a program may compute.
  @max_fft_length 2 ** 28

  @doc """
  Raises unless a tensor of `type` (`{element, dims}` as in
  `EXLA.MLIR.Type`) fits in `limit` bytes; `what` names the operation
  that produces it.
  """
  def tensor_size!(what, {element, dims}, limit) do
    bytes = element |> element_bytes() |> Kernel.*(Tuple.product(dims))

    if bytes > limit do
      raise ArgumentError,
            "cannot compile #{what}: its result, a #{EXLA.MLIR.Type.to_string({element, dims})}, " <>
              "takes #{format_bytes(bytes)}, more than the #{format_bytes(limit)} " <>
              "a tensor may take on this client (see EXLA.Client.max_tensor_bytes/1)"
    end

    :ok
  end

  defp element_bytes(:pred), do: 1
  defp element_bytes(type), do: EXLA.Shape.element_bytes(type)

  @doc "Raises unless `length` is a valid FFT length."
  def fft_length!(length) when is_integer(length) and length in 1..@max_fft_length, do: :ok

  def fft_length!(length) do
    raise ArgumentError,
          "cannot compile an FFT of length #{inspect(length)}: FFT lengths must be between 1 " <>
            "and #{@max_fft_length} (2^28; XLA's CPU FFT library can abort the VM on longer ones)"
  end

  @doc """
  Reads a hand-written MLIR module into an `EXLA.MLIR.Program`, checking
  the sizes of its tensor types against `max_tensor_bytes`, its FFT
  lengths, its operations and its call graph.

  The program's input shapes are those of `@main`'s parameters; its output
  shapes are left to the plugin (`nil`). Its facts come from the text: the
  unbounded ops it names, and the elements of the tensor types it writes
  (each mention counts, as the text does not tell values apart; a dynamic
  dimension makes them `:unknown`).
  """
  def read!(text, max_tensor_bytes) when is_binary(text) do
    refuse_channels!(text)
    refuse_recursion!(text)
    tensors = tensor_types(text)
    check_tensor_sizes!(text, tensors, max_tensor_bytes)
    check_fft_lengths!(text)

    %Program{
      text: text,
      input_shapes: main_input_shapes!(text),
      output_shapes: nil,
      facts: facts(text, tensors)
    }
  end

  ## Channels

  defp refuse_channels!(text) do
    case Regex.run(~r/\b(?:stablehlo|mhlo)\.(infeed|outfeed|send|recv)\b/, text) do
      [op, _] ->
        raise ArgumentError,
              "the MLIR program uses #{op}, which EXLA does not support: nothing would " <>
                "ever feed or answer it, so the program would wait forever"

      nil ->
        :ok
    end
  end

  ## Calls

  @function ~r/func\.func\s+(?:(?:public|private|nested)\s+)?@([\w$.-]+)\s*\(/
  # `func.call @f`, `call @f` (not `custom_call @f`), the generic form's
  # `callee = @f` and a composite's `decomposition = @f`.
  @call ~r/(?:(?<![\w.])(?:func\.)?call\s+|\b(?:callee|decomposition)\s*=\s*)@([\w$.-]+)/

  defp refuse_recursion!(text) do
    case find_cycle(call_graph(text)) do
      nil ->
        :ok

      [name | _] = path ->
        raise ArgumentError,
              "the MLIR program calls @#{name} recursively " <>
                "(#{Enum.map_join(path, " -> ", &"@#{&1}")}); XLA cannot compile recursion"
    end
  end

  # Functions are module-level, so each function's body runs from its
  # header to the next one.
  defp call_graph(text) do
    headers = Regex.scan(@function, text, return: :index)
    ends = Enum.map(Enum.drop(headers, 1), fn [{start, _}, _] -> start end) ++ [byte_size(text)]

    headers
    |> Enum.zip(ends)
    |> Map.new(fn {[{start, _}, name], stop} ->
      body = binary_part(text, start, stop - start)
      callees = @call |> Regex.scan(body, capture: :all_but_first) |> List.flatten()
      {slice(name, text), Enum.uniq(callees)}
    end)
  end

  # A depth-first search; returns a cycle as a path that starts and ends
  # with the same function, or nil.
  defp find_cycle(graph) do
    Enum.reduce_while(Map.keys(graph), %{}, fn name, state ->
      case visit(graph, name, [], state) do
        {:cycle, path} -> {:halt, path}
        {:ok, state} -> {:cont, state}
      end
    end)
    |> case do
      path when is_list(path) -> path
      _state -> nil
    end
  end

  defp visit(graph, name, stack, state) do
    case state do
      %{^name => :done} ->
        {:ok, state}

      %{^name => :active} ->
        {:cycle, [name | Enum.reverse([name | Enum.take_while(stack, &(&1 != name))])]}

      _ ->
        graph
        |> Map.get(name, [])
        |> Enum.filter(&Map.has_key?(graph, &1))
        |> Enum.reduce_while({:ok, Map.put(state, name, :active)}, fn callee, {:ok, state} ->
          case visit(graph, callee, [name | stack], state) do
            {:ok, state} -> {:cont, {:ok, state}}
            cycle -> {:halt, cycle}
          end
        end)
        |> case do
          {:ok, state} -> {:ok, Map.put(state, name, :done)}
          cycle -> cycle
        end
    end
  end

  ## Sizes

  @tensor ~r/tensor<((?:(?:[0-9]+|\?)x)*)(complex<\w+>|\w+)/

  # `{at, element, dims}` of every tensor type written in the text; `dims`
  # is `:unknown` when one is dynamic.
  defp tensor_types(text) do
    Regex.scan(@tensor, text, return: :index)
    |> Enum.map(fn [{at, _}, dims, element] ->
      dims = dims |> slice(text) |> String.split("x", trim: true)
      dims = if "?" in dims, do: :unknown, else: Enum.map(dims, &String.to_integer/1)
      {at, slice(element, text), dims}
    end)
  end

  defp check_tensor_sizes!(text, tensors, limit) do
    for {at, element, dims} <- tensors, dims != :unknown do
      bytes = element_bytes_of(element) * Enum.product(dims)
      if bytes > limit, do: raise_tensor_size!(text, at, bytes, limit)
    end
  end

  defp slice({at, len}, text), do: binary_part(text, at, len)

  # MLIR element types: i1, iN, uiN, fN, bf16, f8E5M2..., complex<fN>.
  defp element_bytes_of("complex<" <> inner), do: 2 * element_bytes_of(inner)

  defp element_bytes_of(element) do
    case Regex.run(~r/\d+/, element) do
      [bits] -> max(div(String.to_integer(bits), 8), 1)
      nil -> 8
    end
  end

  defp raise_tensor_size!(text, at, bytes, limit) do
    line = line_at(text, at)

    op =
      case Regex.run(~r/"?((?:stablehlo|mhlo|chlo|func)\.[a-z_]+)/, line) do
        [_, op] -> op
        nil -> "an operation"
      end

    raise ArgumentError,
          "cannot compile the MLIR program: a tensor of #{op} takes #{format_bytes(bytes)} " <>
            "(#{String.slice(String.trim(line), 0, 160)}), more than the " <>
            "#{format_bytes(limit)} a tensor may take on this client " <>
            "(see EXLA.Client.max_tensor_bytes/1)"
  end

  defp line_at(text, at) do
    start =
      case :binary.matches(binary_part(text, 0, at), "\n") do
        [] -> 0
        matches -> matches |> List.last() |> elem(0) |> Kernel.+(1)
      end

    rest = binary_part(text, start, byte_size(text) - start)
    rest |> String.split("\n", parts: 2) |> hd()
  end

  defp check_fft_lengths!(text) do
    ~r/fft_length\s*=\s*(?:array<i64:|dense<\[?)([\d,\s]*)/
    |> Regex.scan(text, capture: :all_but_first)
    |> Enum.each(fn [lengths] ->
      lengths
      |> String.split([",", " "], trim: true)
      |> Enum.each(&fft_length!(String.to_integer(&1)))
    end)
  end

  ## Facts

  @unbounded_op Regex.compile!(
                  "\\b(?:stablehlo|mhlo|chlo)\\.(?:#{Enum.join(Facts.unbounded_ops(), "|")})\\b"
                )

  defp facts(text, tensors) do
    unbounded = @unbounded_op |> Regex.scan(text) |> List.flatten() |> Enum.uniq()
    sizes = for {_at, _element, dims} <- tensors, do: elements(dims)
    unknown? = :unknown in sizes

    %Facts{
      unbounded: unbounded,
      largest_tensor: if(unknown?, do: :unknown, else: Enum.max(sizes, fn -> 0 end)),
      total_elements: if(unknown?, do: :unknown, else: Enum.sum(sizes))
    }
  end

  defp elements(:unknown), do: :unknown
  defp elements(dims), do: Enum.product(dims)

  ## Signature

  # The parameter shapes of `@main`, from its signature.
  defp main_input_shapes!(text) do
    case :binary.match(text, "@main(") do
      {start, len} ->
        rest = binary_part(text, start + len, byte_size(text) - start - len)
        rest |> signature_arguments() |> Enum.map(&argument_shape!/1)

      :nomatch ->
        raise ArgumentError, "the MLIR module has no @main function"
    end
  end

  # Splits the text up to the closing parenthesis on top-level commas.
  defp signature_arguments(text), do: split_arguments(text, 0, "", [])

  defp split_arguments(<<")", _::binary>>, 0, current, acc),
    do: Enum.reverse(add_argument(current, acc))

  defp split_arguments(<<",", rest::binary>>, 0, current, acc),
    do: split_arguments(rest, 0, "", add_argument(current, acc))

  defp split_arguments(<<c, rest::binary>>, depth, current, acc) when c in [?<, ?{, ?(, ?[],
    do: split_arguments(rest, depth + 1, <<current::binary, c>>, acc)

  defp split_arguments(<<c, rest::binary>>, depth, current, acc) when c in [?>, ?}, ?), ?]],
    do: split_arguments(rest, depth - 1, <<current::binary, c>>, acc)

  defp split_arguments(<<c, rest::binary>>, depth, current, acc),
    do: split_arguments(rest, depth, <<current::binary, c>>, acc)

  defp split_arguments(<<>>, _depth, _current, _acc),
    do: raise(ArgumentError, "could not read the signature of @main")

  defp add_argument(current, acc) do
    case String.trim(current) do
      "" -> acc
      argument -> [argument | acc]
    end
  end

  defp argument_shape!(argument) do
    with [_, dims, element] <- Regex.run(~r/:\s*tensor<((?:\d+x)*)(\w+|complex<\w+>)>/, argument),
         {:ok, element} <- Type.parse_element(element) do
      dims = dims |> String.split("x", trim: true) |> Enum.map(&String.to_integer/1)
      Type.to_shape({element, List.to_tuple(dims)})
    else
      :error ->
        raise ArgumentError, "unsupported MLIR element type in @main parameter: #{argument}"

      nil ->
        raise ArgumentError, "unsupported @main parameter: #{argument}"
    end
  end

  ## Messages

  @units ~w(KiB MiB GiB TiB PiB EiB ZiB YiB)

  # "1.5 GiB (1610612736 bytes)"
  defp format_bytes(bytes) when bytes < 1024, do: "#{bytes} bytes"
  defp format_bytes(bytes), do: format_bytes(bytes / 1024, @units, bytes)

  defp format_bytes(value, [_ | [_ | _] = units], bytes) when value >= 1024,
    do: format_bytes(value / 1024, units, bytes)

  defp format_bytes(value, [unit | _], bytes),
    do: "#{:erlang.float_to_binary(value, decimals: 1)} #{unit} (#{bytes} bytes)"
end
