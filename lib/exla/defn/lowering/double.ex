defmodule EXLA.Defn.Lowering.Double do
  @moduledoc false
  # Helpers of the defns that follow Nx.BinaryBackend in double precision
  # (EXLA.Defn.Lowering.LU and EXLA.Defn.Lowering.Eigh), applied while they
  # are traced.

  import Nx.Defn

  @doc false
  # `a` as f64, or c128 when complex: the precision of Erlang floats.
  deftransform as_work(a) do
    case Nx.type(a) do
      {:c, _} -> Nx.as_type(a, {:c, 128})
      _ -> Nx.as_type(a, {:f, 64})
    end
  end

  @doc false
  # The real part of a complex `x`; a real `x` itself.
  deftransform real_part(x) do
    case Nx.type(x) do
      {:c, _} -> Nx.real(x)
      _ -> x
    end
  end
end
