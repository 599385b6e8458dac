defmodule EXLA.HooksTest do
  use ExUnit.Case, async: false

  import Nx.Defn

  defp collect(tag), do: fn value -> send(self(), {tag, value}) end

  defp received do
    receive do
      msg -> [msg | received()]
    after
      0 -> []
    end
  end

  defn hooked(a, b) do
    c = hook(a + b, :sum)
    d = hook(c * 2, :double)
    {c, d}
  end

  test "hooks get the values computed at their point, in program order" do
    fun = EXLA.jit(&hooked/2, hooks: %{sum: collect(:sum), double: collect(:double)})
    {c, d} = fun.(Nx.tensor([1, 2]), Nx.tensor([10, 20]))
    assert Nx.to_flat_list(c) == [11, 22]
    assert Nx.to_flat_list(d) == [22, 44]
    assert [{:sum, sum}, {:double, double}] = received()
    assert Nx.to_flat_list(sum) == [11, 22]
    assert Nx.to_flat_list(double) == [22, 44]
  end

  test "the :hooks option picks and overrides hooks by name" do
    fun = EXLA.jit(&hooked/2, hooks: %{double: collect(:only)})
    fun.(Nx.tensor(1.0), Nx.tensor(2.0))
    assert [{:only, value}] = received()
    assert Nx.to_number(value) == 6.0
  end

  test "without active hooks the plain path is used" do
    {c, _} = EXLA.jit(&hooked/2).(Nx.tensor(1), Nx.tensor(2))
    assert Nx.to_number(c) == 3
    assert received() == []
  end

  defn independent(a, b, c) do
    a = hook(a, :a)
    b = hook(b, :b)
    c = hook(c, :c)
    a + c + b
  end

  # Hooks on one token (hook_token/3, deprecated on Nx 0.13), called
  # through apply/3 so that Nx 0.13 does not warn at compile time.
  defp on_one_token(a, b, c) do
    token = apply(Nx.Defn.Kernel, :create_token, [])
    {token, a} = apply(Nx.Defn.Kernel, :hook_token, [token, a, :a])
    {token, b} = apply(Nx.Defn.Kernel, :hook_token, [token, b, :b])
    {token, c} = apply(Nx.Defn.Kernel, :hook_token, [token, c, :c])
    apply(Nx.Defn.Kernel, :attach_token, [token, Nx.add(Nx.add(a, c), b)])
  end

  # Nx records no order between hooks that do not use each other's values
  # (on Nx 0.13 no token either): they run when the result uses their
  # values, as in Nx.Defn.Evaluator and EXLA 0.7.2 (EXLA 0.13.1 leaves them
  # to XLA's scheduler, which happens to run this example a, b, c; see the
  # README's hooks). Hooks on one token run in the token's order.
  test "independent hooks run as the result uses them; hooks on a token in its order" do
    hooks = Map.new([:a, :b, :c], &{&1, collect(&1)})
    args = [Nx.tensor(1), Nx.tensor(2), Nx.tensor(3)]

    for {fun, order} <- [{&independent/3, [:a, :c, :b]}, {&on_one_token/3, [:a, :b, :c]}] do
      assert Nx.to_number(apply(EXLA.jit(fun, hooks: hooks), args)) == 6
      assert Enum.map(received(), &elem(&1, 0)) == order

      Nx.Defn.jit_apply(fun, args, compiler: Nx.Defn.Evaluator, hooks: hooks)
      assert Enum.map(received(), &elem(&1, 0)) == order
    end
  end

  defn counting(n) do
    {i, _} =
      while {i = 0, n}, i < n do
        i = hook(i + 1, :step)
        {i, n}
      end

    hook(i * 10, :after)
  end

  test "hooks inside while run once per iteration, before later hooks" do
    fun = EXLA.jit(&counting/1, hooks: %{step: collect(:step), after: collect(:after)})
    assert Nx.to_number(fun.(Nx.tensor(3))) == 30
    msgs = received() |> Enum.map(fn {tag, t} -> {tag, Nx.to_number(t)} end)
    assert msgs == [step: 1, step: 2, step: 3, after: 30]
  end

  defn checked(n) do
    {i, _} =
      while {i = 0, n}, hook(i, :check) < hook(n, :limit) do
        {hook(i + 1, :step), n}
      end

    hook(i * 10, :after)
  end

  defp numbers(msgs), do: Enum.map(msgs, fn {tag, t} -> {tag, Nx.to_number(t)} end)

  test "hooks in a while condition run each time it is evaluated, in program order" do
    hooks = Map.new([:check, :limit, :step, :after], &{&1, collect(&1)})
    fun = EXLA.jit(&checked/1, hooks: hooks)
    assert Nx.to_number(fun.(Nx.tensor(2))) == 20

    assert numbers(received()) == [
             check: 0,
             limit: 2,
             step: 1,
             check: 1,
             limit: 2,
             step: 2,
             check: 2,
             limit: 2,
             after: 20
           ]

    # A loop that never runs evaluates its condition (and its hooks) once.
    assert Nx.to_number(fun.(Nx.tensor(0))) == 0
    assert numbers(received()) == [check: 0, limit: 0, after: 0]
  end

  test "hooks in a while condition are chained, and only active ones cost anything" do
    %{mlir_module: mlir} =
      EXLA.to_mlir_module(&checked/1, [Nx.tensor(2)], hooks: %{check: collect(:check)})

    # The condition region only reads the carried predicate; the hooked
    # condition is computed before the loop and at the end of the body.
    assert [_, cond_region | _] = String.split(mlir, "^bb0")
    refute cond_region =~ "custom_call"
    assert length(String.split(mlir, "exla_host_callback")) == 3

    fun = EXLA.jit(&checked/1, hooks: %{check: collect(:check)})
    assert Nx.to_number(fun.(Nx.tensor(3))) == 30
    assert numbers(received()) == [check: 0, check: 1, check: 2, check: 3]

    plain = EXLA.to_mlir_module(&checked/1, [Nx.tensor(2)]).mlir_module
    refute plain =~ "exla_host_callback"
  end

  defn nested_checks(n) do
    {_, total, _} =
      while {i = 0, total = 0, n}, i < n do
        {j, total, _} =
          while {j = 0, total, i}, hook(j, :inner) <= i do
            {j + 1, total + 1, i}
          end

        {hook(i + 1, :outer), total + j, n}
      end

    total
  end

  test "condition hooks of a nested while run in the reference's order" do
    hooks = %{inner: collect(:in), outer: collect(:out)}
    fun = EXLA.jit(&nested_checks/1, hooks: hooks)
    assert Nx.to_number(fun.(Nx.tensor(2))) == 6
    exla = numbers(received())

    reference = Nx.Defn.jit(&nested_checks/1, compiler: Nx.Defn.Evaluator, hooks: hooks)
    assert Nx.to_number(reference.(Nx.tensor(2))) == 6
    assert exla == numbers(received())

    # The outer hook does not depend on the inner loop, so both run it first.
    assert exla == [out: 1, in: 0, in: 1, out: 2, in: 0, in: 1, in: 2]
  end

  defn printed_condition(x) do
    {x, _} =
      while {x, i = 0}, print_value(i) < 2 do
        {x * 2, i + 1}
      end

    x
  end

  test "print_value in a while condition prints every evaluation" do
    out =
      ExUnit.CaptureIO.capture_io(fn ->
        assert Nx.to_flat_list(EXLA.jit(&printed_condition/1).(Nx.tensor([1.5]))) == [6.0]
      end)

    assert length(String.split(out, "#Nx.Tensor<")) == 4
    assert out =~ ~r/0\n.*1\n.*2\n/s
  end

  test "a condition hook that raises is re-raised and nothing is left behind" do
    fun = EXLA.jit(&checked/1, hooks: %{limit: fn _ -> raise "bad limit" end})
    assert_raise RuntimeError, "bad limit", fn -> fun.(Nx.tensor(1000)) end
    assert received() == []
    Process.sleep(50)
    assert EXLA.HostCallback.session_count() == 0
  end

  defn branching(x) do
    y =
      if x > 0 do
        hook(x + 1, :pos)
      else
        hook(x - 1, :neg)
      end

    hook(y * 2, :last)
  end

  test "hooks inside cond run only in the taken branch" do
    hooks = %{pos: collect(:pos), neg: collect(:neg), last: collect(:last)}
    fun = EXLA.jit(&branching/1, hooks: hooks)
    assert Nx.to_number(fun.(Nx.tensor(5))) == 12
    assert [pos: a, last: b] = received()
    assert {Nx.to_number(a), Nx.to_number(b)} == {6, 12}
    assert Nx.to_number(fun.(Nx.tensor(-5))) == -12
    assert [neg: _, last: _] = received()
  end

  defn many_branches(x) do
    cond do
      x < 0 -> hook(x - 1, :neg)
      x == 0 -> hook(x, :zero)
      x < 10 -> hook(x + 1, :small)
      true -> x * 2
    end
    |> hook(:last)
  end

  test "hooks inside a cond of several clauses run only in the taken branch" do
    hooks = Map.new([:neg, :zero, :small, :last], &{&1, collect(&1)})
    fun = EXLA.jit(&many_branches/1, hooks: hooks)

    for {x, tag, value} <- [{-5, :neg, -6}, {0, :zero, 0}, {3, :small, 4}, {50, nil, 100}] do
      assert Nx.to_number(fun.(Nx.tensor(x))) == value
      expected = if tag, do: [{tag, value}, {:last, value}], else: [{:last, value}]
      assert Enum.map(received(), fn {t, v} -> {t, Nx.to_number(v)} end) == expected
    end
  end

  defn hooked_predicates(x) do
    cond do
      hook(x < 0, :first) -> x - 1
      hook(x < 10, :second) -> x + 1
      true -> x * 2
    end
  end

  test "hooks in the predicates of a cond run only for the predicates reached" do
    hooks = %{first: collect(:first), second: collect(:second)}
    fun = EXLA.jit(&hooked_predicates/1, hooks: hooks)
    assert Nx.to_number(fun.(Nx.tensor(-5))) == -6
    assert [first: _] = received()
    assert Nx.to_number(fun.(Nx.tensor(5))) == 6
    assert [first: _, second: _] = received()
  end

  defn with_container(a) do
    hook({a, %{b: a * 2}}, fn {x, %{b: y}} -> send(self(), {:pair, x, y}) end)
  end

  test "hooks receive containers; hooks given as functions run by default" do
    EXLA.jit(&with_container/1).(Nx.tensor([1.0, 2.0]))
    assert [{:pair, x, y}] = received()
    assert Nx.to_flat_list(x) == [1.0, 2.0]
    assert Nx.to_flat_list(y) == [2.0, 4.0]
  end

  # A hook receives its value as it is in the program, as in EXLA 0.7.2:
  # vectorized values arrive vectorized. Nx.Defn.Evaluator (Nx 0.7.2) hands
  # the same entries over devectorized (the vectorized axes of inputs
  # becoming named axes) and can only hook vectorized values it has already
  # computed, or inputs: the cases compared with it below.
  defn vectorized_cond(x) do
    y = x * 2

    if y > 2 do
      {a, b} = hook({y, x}, :taken)
      a + b
    else
      hook(y, :other) - 1
    end
  end

  defn computed_in_branch(x) do
    if x > 2 do
      hook(x * 3, :taken)
    else
      hook(x - 1, :other)
    end
  end

  defn hooked_input(x), do: hook(x, :input) + 1
  defn hooked_double(x), do: hook(x * 2, :seen)

  # Runs `fun` under EXLA and the evaluator with hooks `names`; checks the
  # results agree and the hooks saw the same entries. Returns EXLA's hooks.
  defp compare_hooks(fun, args, names) do
    hooks = Map.new(names, &{&1, collect(&1)})
    exla = apply(EXLA.jit(fun, hooks: hooks), args)
    exla_hooks = received()
    reference = apply(Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator, hooks: hooks), args)
    assert Enum.map(exla_hooks, &entries/1) == Enum.map(received(), &entries/1)
    assert Nx.to_binary(Nx.devectorize(exla)) == Nx.to_binary(Nx.devectorize(reference))
    assert exla.vectorized_axes == reference.vectorized_axes
    exla_hooks
  end

  # What a hooked value holds, whether vectorized or not: per tensor its
  # type, devectorized shape and data.
  defp entries({tag, value}) do
    {tag,
     Nx.Defn.Composite.flatten_list([value])
     |> Enum.map(&Nx.devectorize/1)
     |> Enum.map(&{&1.type, &1.shape, Nx.to_binary(&1)})}
  end

  defp vectorized(list, axis), do: list |> Nx.tensor() |> Nx.vectorize(axis)

  test "hooks inside a vectorized cond receive their values vectorized" do
    x = vectorized([1, 2, 3], :x)
    hooks = compare_hooks(&vectorized_cond/1, [x], [:taken, :other])
    # Both branches run (some entries take each); their hooks see every entry.
    assert [taken: {y, input}, other: other] = hooks
    assert y == vectorized([2, 4, 6], :x)
    assert input == x
    assert other == y
    assert inspect(y) =~ "vectorized[x: 3]"

    # Entries all on one side run one branch only.
    all = vectorized([5, 6], :x)
    assert [taken: {y, _}] = compare_hooks(&vectorized_cond/1, [all], [:taken, :other])
    assert y == vectorized([10, 12], :x)
  end

  test "hooks on values computed inside a vectorized cond receive them vectorized" do
    hooks = %{taken: collect(:taken), other: collect(:other)}
    result = EXLA.jit(&computed_in_branch/1, hooks: hooks).(vectorized([1, 2, 3], :x))
    assert Nx.backend_transfer(result) == vectorized([0, 1, 9], :x)
    assert received() == [taken: vectorized([3, 6, 9], :x), other: vectorized([0, 1, 2], :x)]
  end

  test "hooks on vectorized inputs with several vectorized axes" do
    x = Nx.iota({2, 3, 2}, type: :f32) |> Nx.vectorize(:a) |> Nx.vectorize(:b)
    assert [input: value] = compare_hooks(&hooked_input/1, [x], [:input])
    assert value == x
    assert value.vectorized_axes == [a: 2, b: 3]
  end

  test "hooks on computed vectorized values receive them vectorized" do
    x = Nx.tensor([[1.0, 2.0], [3.0, 4.0]]) |> Nx.vectorize(:rows)
    fun = EXLA.jit(&hooked_double/1, hooks: %{seen: collect(:seen)})
    assert fun.(x).vectorized_axes == [rows: 2]
    assert [seen: seen] = received()
    assert seen == Nx.vectorize(Nx.tensor([[2.0, 4.0], [6.0, 8.0]]), :rows)
  end

  defn printing(a), do: print_value(a + 1)

  test "print_value prints the value" do
    out = ExUnit.CaptureIO.capture_io(fn -> EXLA.jit(&printing/1).(Nx.tensor(41)) end)
    assert out =~ "42"
  end

  test "a hook that raises is re-raised and leaves the device usable" do
    raising = fn _ -> raise "hook failed" end
    fun = EXLA.jit(&counting/1, hooks: %{step: raising})
    assert_raise RuntimeError, "hook failed", fn -> fun.(Nx.tensor(100)) end
    assert received() == []
    fun = EXLA.jit(&counting/1, hooks: %{after: collect(:after)})
    assert Nx.to_number(fun.(Nx.tensor(2))) == 20
    assert [after: _] = received()
    Process.sleep(50)
    assert EXLA.HostCallback.session_count() == 0
  end

  test "a failed hooked run raises as a plain run does, and leaves nothing behind" do
    t = Nx.tensor([1, 2], backend: EXLA.Backend)
    EXLA.DeviceBuffer.deallocate(t.data.buffer)
    plain = catch_error(EXLA.jit(&Nx.add(&1, 1)).(t))
    fun = EXLA.jit(&hooked/2, hooks: %{sum: collect(:sum)})
    hooked = catch_error(fun.(t, t))
    assert hooked.__struct__ == plain.__struct__
    assert Exception.message(hooked) == Exception.message(plain)
    assert received() == []
    assert EXLA.HostCallback.session_count() == 0
  end

  test "many hooked calls leave no sessions or messages behind" do
    fun = EXLA.jit(&hooked/2, hooks: %{sum: fn _ -> :ok end})
    a = Nx.tensor([1, 2])

    for _ <- 1..2000, do: fun.(a, a)

    assert received() == []
    assert EXLA.HostCallback.session_count() == 0
  end

  @tag :slow
  @tag timeout: 600_000
  test "100,000 hooked calls keep the BEAM's and the process's memory flat" do
    fun = EXLA.jit(&hooked/2, hooks: %{sum: fn _ -> :ok end})
    a = Nx.tensor([1, 2])
    {beam, rss} = EXLA.TestMemory.growth(fn -> fun.(a, a) end, 5_000, 100_000)
    assert beam < 20_000_000, "BEAM memory grew by #{beam} bytes"
    assert rss < 50_000, "the process's RSS grew by #{rss} kB"
    assert EXLA.HostCallback.session_count() == 0
  end
end
