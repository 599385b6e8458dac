defmodule EXLA.MLIR.Type do
  @moduledoc false

  # Tensor types of the StableHLO text emitter.
  #
  # A type is `{element, dims}` where `element` is an Nx type (`{:f, 32}`,
  # `{:u, 8}`, `{:c, 64}`, ...) or `:pred` (MLIR `i1`) and `dims` is a tuple.

  @type element :: Nx.Type.t() | :pred
  @type t :: {element, tuple}

  @doc "Renders a tensor type, e.g. `tensor<2x3xf32>`."
  @spec to_string(t) :: String.t()
  def to_string({element, dims}) do
    case Tuple.to_list(dims) do
      [] -> "tensor<#{element(element)}>"
      list -> "tensor<#{Enum.map_join(list, "x", &Integer.to_string/1)}x#{element(element)}>"
    end
  end

  # The MLIR names of element types, from the one table of element types
  # (`EXLA.Shape`): rendered by `element/1`, read back by `parse_element/1`.
  # XLA's booleans are `:pred` here, `{:pred, 8}` in a shape.
  @elements (for {type, _code, name} <- EXLA.Shape.element_types() do
               {if(type == {:pred, 8}, do: :pred, else: type), name}
             end)

  @doc "Renders an element type, e.g. `f32`, `ui8`, `complex<f64>`, `i1`."
  @spec element(element) :: String.t()
  for {element, text} <- @elements do
    def element(unquote(Macro.escape(element))), do: unquote(text)
  end

  @doc """
  The element type written `text` in MLIR, or `:error`.

      iex> EXLA.MLIR.Type.parse_element("complex<f32>")
      {:ok, {:c, 64}}
      iex> EXLA.MLIR.Type.parse_element("i1")
      {:ok, :pred}
      iex> EXLA.MLIR.Type.parse_element("f8E4M3B11FNUZ")
      :error
  """
  @spec parse_element(String.t()) :: {:ok, element} | :error
  for {element, text} <- @elements do
    def parse_element(unquote(text)), do: {:ok, unquote(Macro.escape(element))}
  end

  def parse_element(_text), do: :error

  @doc """
  The `EXLA.Shape` of a value of `type` at a program's boundary.

      iex> EXLA.MLIR.Type.to_shape({{:f, 32}, {2, 3}})
      %EXLA.Shape{dtype: {:f, 32}, dims: {2, 3}}
  """
  def to_shape({:pred, dims}), do: EXLA.Shape.make_shape({:pred, 8}, dims)
  def to_shape({element, dims}), do: EXLA.Shape.make_shape(element, dims)

  @doc "The real type that makes up a complex type."
  def complex_part({:c, 64}), do: {:f, 32}
  def complex_part({:c, 128}), do: {:f, 64}
end
