defmodule EXLA.SmallTypesCallbacksTest do
  # Sub-byte integers (s2, s4, u2, u4; Nx 0.12 and later) through the host
  # callbacks: hooks (tokens on Nx 0.12, hook nodes on 0.13), print_value
  # and Nx.runtime_call/4. Nx packs them in bitstrings, the device holds
  # one byte per element: what a callback receives and returns must be
  # what Nx.Defn.Evaluator gives on Nx.BinaryBackend.
  use ExUnit.Case, async: true

  @moduletag nx: :small_types?

  if EXLA.NxVersion.small_types?() do
    @types [s2: [-2, -1, 0, 1], s4: [-8, -3, 0, 7], u2: [0, 1, 2, 3], u4: [0, 5, 9, 15]]

    defp evaluator(fun, args), do: Nx.Defn.jit_apply(fun, args, compiler: Nx.Defn.Evaluator)
    defp exla(fun, args), do: EXLA.jit_apply(fun, args)

    # Same type, shape and bits, read from either backend.
    defp same!(exla, reference) do
      assert Nx.type(exla) == Nx.type(reference)
      assert Nx.shape(exla) == Nx.shape(reference)
      assert Nx.to_binary(exla) == Nx.to_binary(reference)
      assert Nx.to_flat_list(exla) == Nx.to_flat_list(reference)
    end

    # What print_value printed, less the line naming the backend. Nx 0.12
    # and 0.13 cannot inspect sub-byte tensors (Nx.Backend.inspect/3 reads
    # whole bytes): they print an Inspect.Error showing the tensor's data,
    # on Nx.BinaryBackend too, and that data must be the reference's.
    defp printed_value(text) do
      case Regex.run(~r/data: %Nx.BinaryBackend\{state: (.*)\},\n/, text) do
        [_, state] -> {:inspect_error, state}
        nil -> text |> String.split("\n") |> Enum.reject(&(&1 =~ "Backend<")) |> Enum.join("\n")
      end
    end

    # What `fun` sends to the hook, and its result, under `run`.
    defp hooked(run, fun, args) do
      result = run.(fun, args)
      assert_received {:hooked, value}
      {value, result}
    end

    for {type, values} <- @types do
      @type_ type
      @values values

      test "a hook receives a #{type} tensor as the reference does" do
        parent = self()
        x = Nx.tensor(@values, type: @type_)

        # Wraps around as the type does (0 - x, x + x).
        fun = fn x ->
          y = Nx.Defn.Kernel.hook(Nx.subtract(0, x), &send(parent, {:hooked, &1}))
          {y, Nx.add(y, y)}
        end

        {seen, {y, twice}} = hooked(&exla/2, fun, [x])
        {ref_seen, {ref_y, ref_twice}} = hooked(&evaluator/2, fun, [x])
        same!(seen, ref_seen)
        same!(y, ref_y)
        same!(twice, ref_twice)
      end

      test "print_value prints a #{type} tensor as the reference does" do
        x = Nx.tensor(@values, type: @type_)
        fun = fn x -> Nx.Defn.Kernel.print_value(Nx.multiply(x, 1)) end
        printed = ExUnit.CaptureIO.capture_io(fn -> same!(exla(fun, [x]), Nx.multiply(x, 1)) end)
        reference = ExUnit.CaptureIO.capture_io(fn -> evaluator(fun, [x]) end)
        assert printed =~ "#{@type_}"
        assert printed_value(printed) == printed_value(reference)
      end
    end

    test "a hook receives a container of sub-byte tensors" do
      parent = self()
      a = Nx.tensor([1, -2], type: :s2)
      b = Nx.tensor([[3, 15], [0, 8]], type: :u4)

      fun = fn a, b ->
        Nx.Defn.Kernel.hook({Nx.negate(a), Nx.add(b, 1)}, &send(parent, {:hooked, &1}))
      end

      {{sa, sb}, {ra, rb}} = hooked(&exla/2, fun, [a, b])
      {{ea, eb}, {era, erb}} = hooked(&evaluator/2, fun, [a, b])
      same!(sa, ea)
      same!(sb, eb)
      same!(ra, era)
      same!(rb, erb)
    end

    test "a hook receives f8 tensors as the reference does" do
      parent = self()

      for type <- [:f8, :f8_e4m3fn] do
        x = Nx.tensor([1.0, -2.0, 0.5, 3.0], type: type)
        fun = fn x -> Nx.Defn.Kernel.hook(Nx.multiply(x, 2), &send(parent, {:hooked, &1})) end
        {seen, doubled} = hooked(&exla/2, fun, [x])
        {ref_seen, ref_doubled} = hooked(&evaluator/2, fun, [x])
        same!(seen, ref_seen)
        same!(doubled, ref_doubled)
      end
    end

    @tag nx: :runtime_calls?
    test "Nx.runtime_call/4 takes and returns sub-byte tensors" do
      x = Nx.tensor([-8, -1, 0, 7], type: :s4)
      y = Nx.tensor([[1, 2], [3, 0]], type: :u2)

      fun = fn x, y ->
        template = {Nx.template({4}, :u4), Nx.template({2, 2}, :s2)}

        {u, s} =
          Nx.runtime_call(template, {x, y}, [], fn {x, y}, _opts ->
            # The callback sees the values the device holds, packed as Nx
            # packs them; its results travel back the same way.
            {Nx.as_type(Nx.add(x, 8), :u4), Nx.as_type(Nx.subtract(y, 2), :s2)}
          end)

        {Nx.add(u, 1), Nx.multiply(s, 1)}
      end

      {u, s} = exla(fun, [x, y])
      {ref_u, ref_s} = evaluator(fun, [x, y])
      same!(u, ref_u)
      same!(s, ref_s)
      assert Nx.to_flat_list(u) == [1, 8, 9, 0]
    end
  end
end
