defmodule EXLA.MemoryStatisticsTest do
  # Changes the :clients configuration, which other tests read.
  use ExUnit.Case, async: false

  alias EXLA.Client

  # A client of its own, with two devices, so no other test's tensors
  # are counted and every number below is exact.
  @client :memory_statistics_test

  setup_all do
    # No warm-up run on it, should it be the first CPU client of the VM.
    EXLA.TestClients.add(@client, platform: :host, device_count: 2, warm_up: false)
  end

  setup do
    # Tensors of earlier tests may still wait for garbage collection.
    :erlang.garbage_collect()
    Client.reset_peak_memory(@client)
    :ok
  end

  defp stats, do: Client.get_memory_statistics(@client)

  defp on(device_id), do: {EXLA.Backend, client: @client, device_id: device_id}

  # f32[n] on `device_id`: 4 * n bytes, transferred (no program runs).
  defp floats(n, device_id \\ 0),
    do: Nx.from_binary(:binary.copy(<<1.0::float-32-native>>, n), :f32, backend: on(device_id))

  # The statistics after `fun`, relative to those before it, and its
  # result. Garbage is collected first each time, so only tensors still
  # referenced count: callers use afterwards those they expect to live.
  defp delta(fun) do
    :erlang.garbage_collect()
    before = stats()
    result = fun.()
    :erlang.garbage_collect()
    now = stats()

    {%{
       allocated: now.allocated - before.allocated,
       peak: now.peak,
       per_device: Map.new(now.per_device, fn {id, b} -> {id, b - before.per_device[id]} end)
     }, result}
  end

  test "has the shape of EXLA 0.11's statistics, one entry per device" do
    assert %{allocated: a, peak: p, per_device: %{0 => d0, 1 => d1}} = stats()
    assert a == d0 + d1 and p >= a
    assert stats() == Client.get_memory_statistics(Client.fetch!(@client))
    assert Client.reset_peak_memory(Client.fetch!(@client)) == :ok
  end

  test "transfers to a device add their bytes to it; deallocation removes them once" do
    {delta, t} = delta(fn -> floats(1000, 1) end)
    assert delta.allocated == 4000
    assert delta.per_device == %{0 => 0, 1 => 4000}

    {delta, _} = delta(fn -> Nx.backend_deallocate(t) end)
    assert delta.allocated == -4000
    assert delta.per_device == %{0 => 0, 1 => -4000}

    {delta, _} = delta(fn -> Nx.backend_deallocate(t) end)
    assert delta.allocated == 0
  end

  test "types count their size: u8, f64, c64 and pred" do
    for {type, bytes} <- [{:u8, 10}, {:f64, 80}, {:c64, 80}] do
      {delta, t} = delta(fn -> Nx.iota({10}, type: type, backend: on(0)) end)
      assert delta.allocated == bytes, inspect(type)
      Nx.backend_deallocate(t)
    end

    {a, b} = {floats(10), floats(10)}
    {delta, equal} = delta(fn -> Nx.equal(a, b) end)
    # A pred[10] output.
    assert delta.allocated == 10
    Enum.each([a, b, equal], &Nx.backend_deallocate/1)
  end

  test "program outputs and copies to another device are counted where they live" do
    t = floats(256)
    add = EXLA.jit(&{Nx.add(&1, 1), Nx.sum(&1)}, client: @client)

    {delta, {sum, total}} = delta(fn -> add.(t) end)
    assert delta.allocated == 1024 + 4
    assert delta.per_device == %{0 => 1028, 1 => 0}

    {delta, copy} = delta(fn -> Nx.backend_copy(sum, on(1)) end)
    assert delta.per_device == %{0 => 0, 1 => 1024}

    {delta, _} = delta(fn -> Enum.each([sum, total, copy, t], &Nx.backend_deallocate/1) end)
    assert delta.allocated == -(1028 + 1024 + 1024)
  end

  test "a donated argument stops counting when the program runs" do
    add_one = &Nx.add(&1, 1)
    {p, q} = {floats(1000), floats(1000)}

    {delta, kept} = delta(fn -> EXLA.jit(add_one, client: @client).(q) end)
    assert delta.allocated == 4000
    assert Nx.to_binary(q) != <<>>

    Client.reset_peak_memory(@client)
    base = stats().allocated
    {delta, updated} = delta(fn -> EXLA.jit(add_one, client: @client, donate: [0]).(p) end)
    # The output reuses the donated buffer: nothing more is held, at any time.
    assert delta.allocated == 0
    assert delta.peak == base

    {delta, _} = delta(fn -> Nx.backend_deallocate(p) end)
    assert delta.allocated == 0
    Enum.each([q, kept, updated], &Nx.backend_deallocate/1)
  end

  test "garbage collection of a tensor removes its bytes" do
    before = stats().allocated
    parent = self()

    pid =
      spawn(fn ->
        _t = floats(2048)
        send(parent, {:allocated, stats().allocated})
        receive do: (:exit -> :ok)
      end)

    assert_receive {:allocated, allocated}
    assert allocated == before + 8192
    ref = Process.monitor(pid)
    send(pid, :exit)
    assert_receive {:DOWN, ^ref, _, _, _}
    # The DOWN message can arrive before the exiting process's heap, and
    # with it the tensor's last reference, is freed on its scheduler.
    assert allocated_soon(before) == before
  end

  # The allocated bytes once they reach `expected` (or after a second).
  defp allocated_soon(expected) do
    EXLA.TestWait.until(fn -> stats().allocated == expected end)
    stats().allocated
  end

  test "the peak is the most held at once, until reset" do
    base = stats().allocated
    a = floats(1000)
    b = floats(500, 1)
    Nx.backend_deallocate(a)
    c = floats(100)
    assert stats().allocated == base + 2400
    assert stats().peak == base + 6000

    Client.reset_peak_memory(@client)
    assert stats().peak == base + 2400
    Nx.backend_deallocate(b)
    Nx.backend_deallocate(c)
    assert stats().peak == base + 2400
    assert stats().allocated == base
  end

  test "counts are exact when many processes allocate and free at once" do
    before = stats().allocated

    kept =
      1..16
      |> Task.async_stream(
        fn i ->
          for j <- 1..50 do
            t = floats(i + j, rem(i, 2))
            if rem(j, 5) == 0, do: t, else: Nx.backend_deallocate(t)
          end
          |> Enum.filter(&is_struct(&1, Nx.Tensor))
        end,
        max_concurrency: 16
      )
      |> Enum.flat_map(fn {:ok, kept} -> kept end)

    expected = kept |> Enum.map(&Nx.byte_size/1) |> Enum.sum()
    assert stats().allocated == before + expected
    Enum.each(kept, &Nx.backend_deallocate/1)
    assert stats().allocated == before
  end
end
