defmodule EXLA.Shape do
  @moduledoc """
  The shape of an array on a device: its Nx type and dimensions.
  """

  @enforce_keys [:dtype, :dims]
  defstruct [:dtype, :dims]

  @type t :: %__MODULE__{dtype: Nx.Type.t() | {:pred, 8}, dims: tuple()}

  # The element types, in one table: each Nx type (and `{:pred, 8}`, XLA's
  # booleans), its PJRT_Buffer_Type code in the C API and its name in
  # MLIR. `EXLA.MLIR.Type` takes its names from here.
  @element_types [
    {{:pred, 8}, 1, "i1"},
    {{:s, 8}, 2, "i8"},
    {{:s, 16}, 3, "i16"},
    {{:s, 32}, 4, "i32"},
    {{:s, 64}, 5, "i64"},
    {{:u, 8}, 6, "ui8"},
    {{:u, 16}, 7, "ui16"},
    {{:u, 32}, 8, "ui32"},
    {{:u, 64}, 9, "ui64"},
    {{:f, 16}, 10, "f16"},
    {{:f, 32}, 11, "f32"},
    {{:f, 64}, 12, "f64"},
    {{:bf, 16}, 13, "bf16"},
    {{:c, 64}, 14, "complex<f32>"},
    {{:c, 128}, 15, "complex<f64>"}
  ]

  # Types that Nx 0.7.2 does not have (it refuses `{:f, 8}` too): f8 is
  # FP8 E5M2; s2, s4, u2 and u4 take a byte per element in host memory
  # given to or read from PJRT (see to_device/2).
  if EXLA.NxVersion.small_types?() do
    @element_types @element_types ++
                     [
                       {{:f, 8}, 16, "f8E5M2"},
                       {{:f8_e4m3fn, 8}, 17, "f8E4M3FN"},
                       {{:s, 4}, 21, "i4"},
                       {{:u, 4}, 22, "ui4"},
                       {{:s, 2}, 24, "i2"},
                       {{:u, 2}, 25, "ui2"}
                     ]
  end

  @doc false
  # `[{type, pjrt_code, mlir_name}]`, for the compiled Nx.
  def element_types, do: @element_types

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
  def byte_size(%EXLA.Shape{dtype: dtype, dims: dims}) do
    dims |> Tuple.to_list() |> Enum.reduce(element_bytes(dtype), &(&1 * &2))
  end

  @doc false
  # The bytes an element takes in host memory given to or read from PJRT:
  # sub-byte integers take one.
  def element_bytes({_, bits}), do: max(div(bits, 8), 1)

  @doc false
  # Nx packs sub-byte integers (s2, s4, u2, u4) as bitstrings, `bits` bits
  # per element, the first element in the highest bits. PJRT takes them
  # from the host and gives them back one per byte (to_device/2,
  # from_host/2); on the device, and so to host callbacks, they are packed
  # its own way: `8 / bits` elements per byte, the first in the lowest bits
  # (from_device/3, to_packed/2). Other types are left as they are.
  def to_device(data, {kind, bits}) when bits < 8 and kind in [:s, :u] do
    for <<x::size(bits) <- data>>, into: <<>>, do: <<extend(x, kind, bits)::8>>
  end

  def to_device(data, _dtype), do: data

  @doc false
  # Data of the host's layout, one element per byte (what the plugin gives
  # back, see to_device/2), packed as Nx packs it.
  def from_host(data, {kind, bits}) when bits < 8 and kind in [:s, :u] do
    for <<x::8 <- data>>, into: <<>>, do: <<x::size(bits)>>
  end

  def from_host(data, _dtype), do: data

  @doc false
  # The first `count` elements of data packed by the plugin, packed as Nx
  # packs them.
  def from_device(data, {kind, bits}, count) when bits < 8 and kind in [:s, :u] do
    mask = Bitwise.bsl(1, bits) - 1
    per_byte = div(8, bits)

    elements =
      for <<byte <- data>>,
          i <- 0..(per_byte - 1),
          do: byte |> Bitwise.bsr(i * bits) |> Bitwise.band(mask)

    for x <- Enum.take(elements, count), into: <<>>, do: <<x::size(bits)>>
  end

  def from_device(data, _dtype, _count), do: data

  @doc false
  # Data packed as Nx packs it, packed as the plugin packs it.
  def to_packed(data, {kind, bits}) when bits < 8 and kind in [:s, :u] do
    per_byte = div(8, bits)
    elements = for <<x::size(bits) <- data>>, do: x

    for chunk <- Enum.chunk_every(elements, per_byte), into: <<>> do
      byte =
        chunk
        |> Enum.with_index()
        |> Enum.reduce(0, fn {x, i}, acc -> Bitwise.bor(acc, Bitwise.bsl(x, i * bits)) end)

      <<byte>>
    end
  end

  def to_packed(data, _dtype), do: data

  # A signed element's byte keeps its sign.
  defp extend(x, :s, bits) do
    <<v::signed-size(bits)>> = <<x::size(bits)>>
    v
  end

  defp extend(x, :u, _bits), do: x

  @doc false
  def type_code(dtype)

  for {type, code, _mlir} <- @element_types do
    def type_code(unquote(type)), do: unquote(code)
  end

  def type_code(other), do: raise(ArgumentError, "unsupported type #{inspect(other)}")

  @doc false
  def from_spec({code, dims}), do: %EXLA.Shape{dtype: dtype(code), dims: List.to_tuple(dims)}

  @doc false
  def to_spec(%EXLA.Shape{dtype: dtype, dims: dims}), do: {type_code(dtype), Tuple.to_list(dims)}

  for {type, code, _mlir} <- @element_types do
    defp dtype(unquote(code)), do: unquote(type)
  end
end
