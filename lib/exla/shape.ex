defmodule EXLA.Shape do
  @moduledoc """
  The shape of an array on a device: its Nx type and dimensions.
  """

  @enforce_keys [:dtype, :dims]
  defstruct [:dtype, :dims]

  @type t :: %__MODULE__{dtype: Nx.Type.t() | {:pred, 8}, dims: tuple()}

  # PJRT_Buffer_Type codes of the C API.
  @codes [
    {{:pred, 8}, 1},
    {{:s, 8}, 2},
    {{:s, 16}, 3},
    {{:s, 32}, 4},
    {{:s, 64}, 5},
    {{:u, 8}, 6},
    {{:u, 16}, 7},
    {{:u, 32}, 8},
    {{:u, 64}, 9},
    {{:f, 16}, 10},
    {{:f, 32}, 11},
    {{:f, 64}, 12},
    {{:bf, 16}, 13},
    {{:c, 64}, 14},
    {{:c, 128}, 15}
  ]

  @doc """
  Builds a shape from an Nx type and a dimensions tuple.

      iex> EXLA.Shape.make_shape({:f, 32}, {2, 3})
      %EXLA.Shape{dtype: {:f, 32}, dims: {2, 3}}
  """
  def make_shape(dtype, dims) when is_tuple(dims) do
    _ = type_code(dtype)
    %EXLA.Shape{dtype: dtype, dims: dims}
  end

  @doc """
  The byte size of a dense array of `shape`.

      iex> EXLA.Shape.byte_size(EXLA.Shape.make_shape({:s, 64}, {2, 3}))
      48
  """
  def byte_size(%EXLA.Shape{dtype: {_, bits}, dims: dims}) do
    dims |> Tuple.to_list() |> Enum.reduce(div(bits, 8), &(&1 * &2))
  end

  @doc false
  def type_code(dtype)

  for {type, code} <- @codes do
    def type_code(unquote(type)), do: unquote(code)
  end

  def type_code(other), do: raise(ArgumentError, "unsupported type #{inspect(other)}")

  @doc false
  def from_spec({code, dims}), do: %EXLA.Shape{dtype: dtype(code), dims: List.to_tuple(dims)}

  @doc false
  def to_spec(%EXLA.Shape{dtype: dtype, dims: dims}), do: {type_code(dtype), Tuple.to_list(dims)}

  for {type, code} <- @codes do
    defp dtype(unquote(code)), do: unquote(type)
  end
end
