defmodule EXLA.NativeErrorsTest do
  use ExUnit.Case, async: true

  alias EXLA.NIF

  test "a missing plugin file is a clear error" do
    assert_raise RuntimeError, ~r/could not load PJRT plugin \/nonexistent\/plugin.so/, fn ->
      NIF.unwrap!(NIF.plugin_load("/nonexistent/plugin.so"))
    end
  end

  test "a library that is not a PJRT plugin is a clear error" do
    library = Path.join(:code.priv_dir(:exla), "libexla.so")

    assert_raise RuntimeError, ~r/does not export GetPjrtApi: not a PJRT plugin/, fn ->
      NIF.unwrap!(NIF.plugin_load(library))
    end
  end

  test "a library a plugin needs that does not load is an {:error, {kind, message}}" do
    # As every NIF's error (EXLA.NIF): the loader's reason, as EXLA.Plugin.Cuda shows it.
    assert {:error, {:runtime, message}} = NIF.library_load_global("libexla_nonexistent.so.1")
    assert message =~ "libexla_nonexistent.so.1"
    assert {:error, {:runtime, _}} = NIF.library_load_global("/nonexistent/libx.so")
  end

  @tag :cargo
  test "a plugin of an older PJRT C API is refused, naming both versions" do
    # A bundle (scripts/bundle) carries it built, for hosts without cargo.
    if System.find_executable("cargo") do
      {_, 0} =
        System.cmd("cargo", ~w(build --quiet --release -p test_plugin), stderr_to_stdout: true)
    end

    library = Path.expand("target/release/libexla_test_plugin.so")

    assert_raise RuntimeError,
                 ~r/implements PJRT C API 0\.40, but EXLA needs 0\.81 or newer/,
                 fn ->
                   NIF.unwrap!(NIF.plugin_load(library))
                 end
  end

  test "client options of a type the plugin does not expect are refused" do
    client = EXLA.Client.fetch!(:host)
    plugin = NIF.unwrap!(NIF.plugin_load(client.plugin_path))

    for value <- [{:string, "2"}, {:float, 2.0}, {:bool, true}, {:int64, 0}] do
      assert_raise ArgumentError, ~r/cpu_device_count/, fn ->
        NIF.unwrap!(NIF.client_create(plugin, [{"cpu_device_count", value}], []))
      end
    end

    # A value that is no tagged option at all fails to decode.
    assert_raise ErlangError, ~r/invalid_variant/, fn ->
      NIF.client_create(plugin, [{"cpu_device_count", :two}], [])
    end

    # An XLA option is a scalar.
    assert_raise ArgumentError, ~r/the XLA option xla_a cannot be a list/, fn ->
      one = [{"cpu_device_count", {:int64, 1}}]
      NIF.unwrap!(NIF.client_create(plugin, one, [{"xla_a", {:int64_list, [1]}}]))
    end
  end

  test "resources of the wrong kind are rejected" do
    client = EXLA.Client.fetch!(:host)
    assert_raise ArgumentError, fn -> NIF.buffer_read(client.ref, -1) end
    assert_raise ArgumentError, fn -> NIF.client_info(make_ref()) end
  end
end
