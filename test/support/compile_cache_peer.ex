defmodule EXLA.CompileCachePeer do
  @moduledoc false
  # Runs in the peer VMs of EXLA.CompileCacheTest (and in the test's VM):
  # compiles through the compile cache and runs the program on fixed
  # inputs.

  alias EXLA.{CompileCache, DeviceBuffer, Executable, Shape}

  @doc "Returns the cache's status and the bytes of every output."
  def compile_and_run(mlir, cache) do
    client = EXLA.Client.fetch!(:host)
    program = EXLA.MLIR.Check.read!(mlir, EXLA.Client.max_tensor_bytes(client))
    {exe, status} = CompileCache.compile(client, program, [], cache)
    {status, run(exe)}
  end

  defp run(exe) do
    inputs =
      for %Shape{dims: dims} = shape <- exe.input_shapes do
        data =
          dims
          |> Nx.iota(type: :f32, backend: Nx.BinaryBackend)
          |> Nx.remainder(17)
          |> Nx.multiply(0.01)
          |> Nx.to_binary()

        {data, shape}
      end

    [outputs] = Executable.run(exe, [inputs])
    Enum.map(outputs, &DeviceBuffer.read/1)
  end
end
