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

  @doc "Renders an element type, e.g. `f32`, `ui8`, `complex<f64>`, `i1`."
  @spec element(element) :: String.t()
  def element(:pred), do: "i1"
  def element({:f, 8}), do: "f8E5M2"
  def element({:f, size}), do: "f#{size}"
  def element({:bf, 16}), do: "bf16"
  def element({:s, size}), do: "i#{size}"
  def element({:u, size}), do: "ui#{size}"
  def element({:c, 64}), do: "complex<f32>"
  def element({:c, 128}), do: "complex<f64>"

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
