defmodule EXLA.CallbackPanicTest do
  # Panics on the Rust side of host callbacks, injected with the test aid
  # `EXLA.NIF.callback_inject_panic/2` (there is no natural way to make the
  # handler or the replying NIF panic). Each panic is reported as an
  # `exla::panic` error through Logger, never written to stderr: the tests
  # capture that report and check it.
  use ExUnit.Case, async: false

  @moduletag :fault_injection

  import Nx.Defn
  import ExUnit.CaptureLog

  defn hooked(a), do: hook(a + 1, :h) * 2
  defn affine(a, b), do: a * 2 + b

  defp inject(owner, at), do: EXLA.NIF.unwrap!(EXLA.NIF.callback_inject_panic(owner, at))

  # Runs `fun`, which provokes one injected panic, and returns what it
  # returns after checking the one panic report it logged.
  defp with_panic_report(fun) do
    {result, log} =
      with_log(fn ->
        result = fun.()
        EXLA.NativeLog.flush()
        result
      end)

    assert [report] = Regex.scan(~r/\[error\].*\[exla::panic\].*/, log)
    assert hd(report) =~ "[exla::panic] native code panicked (reason: injected panic in "
    assert hd(report) =~ ~r/location: native\/exla\/src\/fault.rs:\d+/
    result
  end

  defp wait_for_sessions(count) do
    closed? = EXLA.TestWait.until(fn -> EXLA.HostCallback.session_count() <= count end, 100, 20)
    closed? || flunk("host callback sessions were not closed")
  end

  defp assert_usable(sessions) do
    # The VM, the client and the callback bridge all still work.
    assert Nx.to_number(EXLA.jit(&Nx.add/2).(1, 2)) == 3
    test = self()
    fun = EXLA.jit(&hooked/1, hooks: %{h: &send(test, {:hook, Nx.to_number(&1)})})
    assert Nx.to_number(fun.(Nx.tensor(4))) == 10
    assert_received {:hook, 5}
    wait_for_sessions(sessions)
    refute_received {:exla_callback, _, _, _}
    refute_received {:exla_run, _, _}
  end

  test "a panic in the host callback handler becomes a RuntimeError" do
    sessions = EXLA.HostCallback.session_count()
    fun = EXLA.jit(&hooked/1, hooks: %{h: fn _ -> flunk("the hook must not run") end})
    :ok = inject(self(), :handler)

    with_panic_report(fn ->
      assert_raise RuntimeError, ~r/host callback panicked: injected panic in the host/, fn ->
        fun.(Nx.tensor(1))
      end
    end)

    assert_usable(sessions)
  end

  test "a panic in the handler while it serves a lazy input" do
    sessions = EXLA.HostCallback.session_count()
    fun = EXLA.jit(&affine/2, lazy_transfers: :always)
    :ok = inject(self(), :handler)

    with_panic_report(fn ->
      assert_raise RuntimeError, ~r/host callback panicked/, fn ->
        fun.(Nx.tensor([1, 2]), Nx.tensor([3, 4]))
      end
    end)

    assert Nx.to_flat_list(fun.(Nx.tensor([1, 2]), Nx.tensor([3, 4]))) == [5, 8]
    assert_usable(sessions)
  end

  test "a panic inside the NIF that replies to a callback raises in the caller" do
    sessions = EXLA.HostCallback.session_count()
    fun = EXLA.jit(&affine/2, lazy_transfers: :always)
    :ok = inject(self(), :reply)

    # rustler turns the NIF's panic into an exception in the calling process;
    # the run it was answering is failed and waited for before it is raised.
    error =
      with_panic_report(fn ->
        assert_raise ErlangError, ~r/nif_panicked/, fn ->
          fun.(Nx.tensor([1, 2]), Nx.tensor([3, 4]))
        end
      end)

    assert error.original == :nif_panicked

    assert Nx.to_flat_list(fun.(Nx.tensor([1, 2]), Nx.tensor([3, 4]))) == [5, 8]
    assert_usable(sessions)
  end

  test "faults are armed per owner process and bad places are refused" do
    sessions = EXLA.HostCallback.session_count()
    fun = EXLA.jit(&hooked/1, hooks: %{h: fn _ -> :ok end})

    # A fault armed for another process does not touch this one's runs.
    other = spawn(fn -> Process.sleep(:infinity) end)
    :ok = inject(other, :handler)
    assert Nx.to_number(fun.(Nx.tensor(1))) == 4
    Process.exit(other, :kill)

    assert_raise ArgumentError, ~r/:handler or :reply/, fn ->
      EXLA.NIF.unwrap!(EXLA.NIF.callback_inject_panic(self(), :elsewhere))
    end

    assert_usable(sessions)
  end
end
