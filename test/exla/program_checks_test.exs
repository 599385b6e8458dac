defmodule EXLA.ProgramChecksTest do
  # Programs a plugin would abort or block on are refused before it sees
  # them (see EXLA.MLIR.Check); each case here took the VM down before.
  use ExUnit.Case, async: true

  alias EXLA.{DeviceBuffer, Executable, Shape}

  setup do
    {:ok, client: EXLA.Client.fetch!(:host)}
  end

  defp scalar(x), do: {<<x::float-32-native>>, Shape.make_shape({:f, 32}, {})}

  defp run(exe, x) do
    [[out]] = Executable.run(exe, [[scalar(x)]])
    <<value::float-32-native>> = DeviceBuffer.read(out)
    value
  end

  describe "hand-written MLIR" do
    @infeed """
    module {
      func.func public @main(%x: tensor<f32>) -> tensor<f32> {
        %t = stablehlo.create_token : !stablehlo.token
        %0:2 = "stablehlo.infeed"(%t) {infeed_config = ""} : (!stablehlo.token) -> (tensor<f32>, !stablehlo.token)
        %1 = stablehlo.add %x, %0#0 : tensor<f32>
        return %1 : tensor<f32>
      }
    }
    """

    @outfeed """
    module {
      func.func public @main(%x: tensor<f32>) -> tensor<f32> {
        %t = stablehlo.create_token : !stablehlo.token
        %0 = "stablehlo.outfeed"(%x, %t) {outfeed_config = ""} : (tensor<f32>, !stablehlo.token) -> !stablehlo.token
        return %x : tensor<f32>
      }
    }
    """

    @send """
    module {
      func.func public @main(%x: tensor<f32>) -> tensor<f32> {
        %t = stablehlo.create_token : !stablehlo.token
        %0 = "stablehlo.send"(%x, %t) {channel_handle = #stablehlo.channel_handle<handle = 1, type = 2>, is_host_transfer = true} : (tensor<f32>, !stablehlo.token) -> !stablehlo.token
        return %x : tensor<f32>
      }
    }
    """

    @recv """
    module {
      func.func public @main(%x: tensor<f32>) -> tensor<f32> {
        %t = stablehlo.create_token : !stablehlo.token
        %0:2 = stablehlo.recv(%t) {channel_handle = #stablehlo.channel_handle<handle = 1, type = 3>, is_host_transfer = true} : (!stablehlo.token) -> (tensor<f32>, !stablehlo.token)
        return %0#0 : tensor<f32>
      }
    }
    """

    test "infeed, outfeed, send and recv are refused", %{client: client} do
      for {mlir, op} <- [
            {@infeed, "stablehlo.infeed"},
            {@outfeed, "stablehlo.outfeed"},
            {@send, "stablehlo.send"},
            {@recv, "stablehlo.recv"},
            {String.replace(@infeed, "stablehlo.infeed", "mhlo.infeed"), "mhlo.infeed"}
          ] do
        assert_raise ArgumentError, ~r/uses #{op}, which EXLA does not support/, fn ->
          Executable.compile(client, mlir)
        end
      end
    end

    @recursive """
    module {
      func.func private @f(%x: tensor<f32>) -> tensor<f32> {
        %0 = func.call @f(%x) : (tensor<f32>) -> tensor<f32>
        return %0 : tensor<f32>
      }
      func.func public @main(%x: tensor<f32>) -> tensor<f32> {
        %0 = func.call @f(%x) : (tensor<f32>) -> tensor<f32>
        return %0 : tensor<f32>
      }
    }
    """

    @mutual """
    module {
      func.func public @main(%x: tensor<f32>) -> tensor<f32> {
        %0 = call @even(%x) : (tensor<f32>) -> tensor<f32>
        return %0 : tensor<f32>
      }
      func.func private @even(%x: tensor<f32>) -> tensor<f32> {
        %0 = call @odd(%x) : (tensor<f32>) -> tensor<f32>
        return %0 : tensor<f32>
      }
      func.func private @odd(%x: tensor<f32>) -> tensor<f32> {
        %0 = "func.call"(%x) {callee = @even} : (tensor<f32>) -> tensor<f32>
        return %0 : tensor<f32>
      }
    }
    """

    test "recursive calls are refused", %{client: client} do
      assert_raise ArgumentError, ~r/calls @f recursively \(@f -> @f\)/, fn ->
        Executable.compile(client, @recursive)
      end

      assert_raise ArgumentError, ~r/recursively \(@\w+ -> @\w+ -> @\w+\)/, fn ->
        Executable.compile(client, @mutual)
      end
    end

    @calls """
    module {
      func.func private @double(%x: tensor<f32>) -> tensor<f32> {
        %0 = stablehlo.add %x, %x : tensor<f32>
        return %0 : tensor<f32>
      }
      func.func private @quadruple(%x: tensor<f32>) -> tensor<f32> {
        %0 = func.call @double(%x) : (tensor<f32>) -> tensor<f32>
        %1 = func.call @double(%0) : (tensor<f32>) -> tensor<f32>
        return %1 : tensor<f32>
      }
      func.func public @main(%x: tensor<f32>) -> tensor<f32> {
        %0 = func.call @quadruple(%x) : (tensor<f32>) -> tensor<f32>
        %1 = func.call @double(%0) : (tensor<f32>) -> tensor<f32>
        %2 = stablehlo.custom_call @main(%1) : (tensor<f32>) -> tensor<f32>
        return %1 : tensor<f32>
      }
    }
    """

    test "calls without a cycle compile and run", %{client: client} do
      # A custom call target is not a call of a function.
      mlir = String.replace(@calls, ~r/ *%2 = stablehlo.custom_call.*\n/, "")
      assert run(Executable.compile(client, mlir), 1.5) == 12.0
    end

    @big """
    module {
      func.func public @main(%x: tensor<f32>) -> tensor<3000000000x1000000000xf32> {
        %0 = stablehlo.broadcast_in_dim %x, dims = [] : (tensor<f32>) -> tensor<3000000000x1000000000xf32>
        return %0 : tensor<3000000000x1000000000xf32>
      }
    }
    """

    test "tensors larger than the client can hold are refused, naming the op", %{client: client} do
      assert_raise ArgumentError,
                   ~r/cannot compile the MLIR program: a tensor of func.func takes 10.4 EiB/,
                   fn -> Executable.compile(client, @big) end

      body_only =
        String.replace(@big, "-> tensor<3000000000x1000000000xf32> {", "-> tensor<f32> {")

      assert_raise ArgumentError,
                   ~r/a tensor of stablehlo.broadcast_in_dim takes 10.4 EiB/,
                   fn -> Executable.compile(client, body_only) end

      limit = EXLA.Client.max_tensor_bytes(client)
      over = String.replace(@big, "3000000000x1000000000xf32", "#{div(limit, 4) + 1}xf32")

      assert_raise ArgumentError, ~r/more than the .* a tensor may take on this client/, fn ->
        Executable.compile(client, over)
      end
    end

    test "FFT lengths are checked", %{client: client} do
      fft = """
      module {
        func.func public @main(%x: tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>> {
          %0 = stablehlo.fft %x, type = FFT, length = [N] : (tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>>
          return %0 : tensor<4xcomplex<f32>>
        }
      }
      """

      generic = """
      module {
        func.func public @main(%x: tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>> {
          %0 = "stablehlo.fft"(%x) {fft_type = #stablehlo<fft_type FFT>, fft_length = array<i64: 1000000000>} : (tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>>
          return %0 : tensor<4xcomplex<f32>>
        }
      }
      """

      assert_raise ArgumentError, ~r/FFT of length 1000000000/, fn ->
        Executable.compile(client, generic)
      end

      assert %Executable{} =
               Executable.compile(client, String.replace(generic, "1000000000", "4"))

      assert %Executable{} = Executable.compile(client, String.replace(fft, "N", "4"))
    end
  end

  describe "EXLA.Backend and EXLA.jit" do
    test "a broadcast beyond the client's memory raises, naming the op" do
      message = ~r/cannot compile broadcast: its result, a tensor<3000000000x1000000000xf32>/

      assert_raise ArgumentError, message, fn ->
        Nx.broadcast(Nx.tensor(1.0, backend: EXLA.Backend), {3_000_000_000, 1_000_000_000})
      end

      assert_raise ArgumentError, message, fn ->
        EXLA.jit(&Nx.broadcast(&1, {3_000_000_000, 1_000_000_000})).(1.0)
      end

      # A constant is folded by Nx before it reaches the lowering.
      assert_raise ArgumentError, ~r/cannot compile \w+: its result/, fn ->
        EXLA.jit(fn -> Nx.broadcast(1.0, {3_000_000_000, 1_000_000_000}) end).()
      end

      # Everything carries on.
      t = Nx.broadcast(Nx.tensor(1.0, backend: EXLA.Backend), {2, 2})
      assert Nx.to_flat_list(t) == [1.0, 1.0, 1.0, 1.0]
    end

    test "the limit is the host's memory for the host client" do
      client = EXLA.Client.fetch!(:host)
      [_, kib] = Regex.run(~r/^MemTotal:\s+(\d+) kB/m, File.read!("/proc/meminfo"))
      assert EXLA.Client.max_tensor_bytes(client) == String.to_integer(kib) * 1024
      limit = EXLA.Client.max_tensor_bytes(client)

      assert_raise ArgumentError, ~r/cannot compile iota/, fn ->
        EXLA.jit(fn -> Nx.iota({div(limit, 8) + 1}, type: :f64) end, client: :host).()
      end
    end

    test "FFT lengths are validated" do
      t = Nx.tensor([1.0, 2.0, 3.0, 4.0], backend: EXLA.Backend)

      assert_raise ArgumentError, ~r/cannot compile an FFT of length 1000000000/, fn ->
        Nx.fft(t, length: 1_000_000_000)
      end

      assert_raise ArgumentError, ~r/FFT of length 1000000000/, fn ->
        EXLA.jit(&Nx.ifft(&1, length: 1_000_000_000)).(t)
      end

      expected = Nx.fft(Nx.backend_copy(t, Nx.BinaryBackend), length: 8)
      assert Nx.all_close(Nx.fft(t, length: 8), expected) |> Nx.to_number() == 1
    end
  end
end
