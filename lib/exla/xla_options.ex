defmodule EXLA.XLAOptions do
  @moduledoc false
  # Checks XLA's compiler options before a plugin sees them: the
  # `XLA_FLAGS` environment variable and the clients' `:xla_options`. XLA
  # ends the process on a flag it cannot parse and aborts on some values
  # (see "XLA options and XLA_FLAGS" in `EXLA.Client` for the rules).
  #
  # The options are the fields of XLA's `DebugOptions` message. Their names
  # and types come from the plugin file itself (`EXLA.NIF.plugin_xla_options/1`
  # reads the message's protobuf descriptor, which the library carries), so
  # the checks follow whichever XLA version built the plugin. Value ranges
  # XLA does not check itself are in `@ranges`.

  # The option that sets the number of host devices.
  @device_count "xla_force_host_platform_device_count"

  # Values XLA accepts by type but that take the process down or stall the
  # compiler, measured on the CPU plugin: a negative split count throws a
  # C++ exception, 0 fails every compilation and 2^31 - 1 never finishes;
  # the host device count creates that many devices.
  @ranges %{
    "xla_cpu_parallel_codegen_split_count" => 1..1024,
    @device_count => 1..1024
  }

  @int_ranges %{
    int32: -0x80000000..0x7FFFFFFF,
    int64: -0x8000000000000000..0x7FFFFFFFFFFFFFFF
  }

  @float_max 3.4028234663852886e38

  @whitespace [?\s, ?\t, ?\r, ?\n]

  ## The host device count

  @doc """
  Checks a host client's `:device_count` option against the range of the
  XLA flag that sets the same count (`#{@device_count}`): `:ok` or
  `{:error, reason}`.
  """
  def check_device_count(count), do: check_range(@device_count, count)

  @doc """
  The host device count `flags` (the value of `XLA_FLAGS`, or nil) sets:
  the value of its last `--#{@device_count}` entry (XLA applies entries in
  order, so the last one wins), or nil when it has none. Raises
  `ArgumentError` as `check_flags!/2` does when the flags cannot be parsed
  or that value is not an integer within its range; needs no plugin.
  """
  def flags_device_count(nil), do: nil

  def flags_device_count(flags) when is_binary(flags) do
    with {:ok, entries} <- parse_flags(flags),
         {name, value} <- entries |> Enum.reverse() |> List.keyfind(@device_count, 0),
         :ok <- check_device_count_flag(name, value) do
      flag_number(value)
    else
      nil -> nil
      {:error, reason} -> raise ArgumentError, "invalid XLA_FLAGS: " <> reason
    end
  end

  # The checks check_flag/3 makes of this entry that need no plugin: an
  # integer (the range is narrower than the field's type), within range.
  defp check_device_count_flag(name, value) do
    with :ok <- check_flag_value(:int64, false, value),
         :ok <- check_range(name, flag_number(value)) do
      :ok
    else
      {:error, reason} -> {:error, flag_error(name, value, reason)}
    end
  end

  ## :xla_options

  @doc """
  Checks the values of a client's `:xla_options` that `@ranges` limits.
  Needs no plugin: called when the client's options are validated.
  """
  def check_ranges!(options, client_name) do
    Enum.each(options, fn {name, value} ->
      with {:error, reason} <- check_range(to_string(name), value) do
        raise ArgumentError, options_error(client_name, name, reason)
      end
    end)
  end

  @doc """
  Checks a client's `:xla_options` against the options of the plugin at
  `path`: each must be one of them, with a value of its type. Their ranges
  are `check_ranges!/2`'s, which validated the client's options before.
  Without options the plugin file is not read (25 ms of a client's
  creation).
  """
  def check_options!(options, _path, _client_name) when options == [] or options == %{},
    do: :ok

  def check_options!(options, path, client_name) do
    case fields(path) do
      nil ->
        :ok

      fields ->
        Enum.each(options, fn {name, value} ->
          with {:error, reason} <- check_option(fields, to_string(name), value) do
            raise ArgumentError, options_error(client_name, name, reason)
          end
        end)
    end
  end

  defp options_error(client_name, name, reason) do
    "invalid :xla_options for EXLA client #{inspect(client_name)}: #{name} #{reason}"
  end

  defp check_option(fields, name, value) do
    case Map.fetch(fields, name) do
      {:ok, {type, repeated?}} ->
        check_option_value(type, repeated?, value)

      :error ->
        {:error, "is not an XLA option of this plugin"}
    end
  end

  # Compile options reach XLA as a boolean, integer, float or string; a
  # string sets enums by value name and repeated options as a comma-separated
  # list.
  defp check_option_value(:message, _repeated?, _value),
    do: {:error, "cannot be set as a client option (it is a message)"}

  defp check_option_value(type, true, value) when is_binary(value) do
    value
    |> String.split(",", trim: true)
    |> Enum.find_value(:ok, fn item ->
      case check_option_value(type, false, item) do
        :ok -> nil
        {:error, reason} -> {:error, "item #{inspect(item)}: #{reason}"}
      end
    end)
  end

  defp check_option_value(_type, true, value),
    do: {:error, "expects a comma-separated string, got: #{inspect(value)}"}

  defp check_option_value(:bool, false, value) when is_boolean(value), do: :ok

  defp check_option_value(type, false, value) when type in [:int32, :int64] and is_integer(value),
    do: in_range(value, @int_ranges[type], "an #{type}")

  defp check_option_value(type, false, value) when type in [:float, :double] and is_float(value),
    do: if(type == :float and abs(value) > @float_max, do: {:error, "is too large"}, else: :ok)

  defp check_option_value(type, false, value) when type in [:string, :bytes] and is_binary(value),
    do: :ok

  defp check_option_value({:enum, values}, false, value) when is_binary(value) do
    if List.keymember?(values, value, 0),
      do: :ok,
      else: {:error, "expects one of #{names(values)}, got: #{inspect(value)}"}
  end

  defp check_option_value({:enum, values}, false, value) when is_integer(value) do
    if List.keymember?(values, value, 1),
      do: :ok,
      else: {:error, "expects one of #{names(values)}, got: #{inspect(value)}"}
  end

  defp check_option_value(type, false, value),
    do: {:error, "expects #{describe(type)}, got: #{inspect(value)}"}

  defp describe(:bool), do: "a boolean"
  defp describe(type) when type in [:int32, :int64], do: "an integer"
  defp describe(type) when type in [:float, :double], do: "a float"
  defp describe(type) when type in [:string, :bytes], do: "a string"
  defp describe({:enum, values}), do: "one of #{names(values)}"
  defp describe(type), do: "a value of type #{inspect(type)}, which EXLA cannot send"

  defp names(values), do: values |> Enum.map(&elem(&1, 0)) |> Enum.join(", ")

  defp check_range(name, value) do
    case @ranges do
      %{^name => range} when is_integer(value) ->
        in_range(value, range, "an integer")

      %{^name => range} ->
        {:error, "must be an integer in #{inspect(range)}, got: #{inspect(value)}"}

      _ ->
        :ok
    end
  end

  defp in_range(value, first..last//_ = range, what) do
    if value in range,
      do: :ok,
      else: {:error, "must be #{what} between #{first} and #{last}, got: #{value}"}
  end

  ## XLA_FLAGS

  @doc """
  Checks `flags` (the value of `XLA_FLAGS`, or nil) against the plugin at
  `path`; raises `ArgumentError` naming the first entry it refuses.
  """
  def check_flags!(nil, _path), do: :ok

  def check_flags!(flags, path) when is_binary(flags) do
    with {:ok, entries} <- parse_flags(flags),
         :ok <- check_entries(entries, path) do
      :ok
    else
      {:error, reason} -> raise ArgumentError, "invalid XLA_FLAGS: " <> reason
    end
  end

  # The plugin's options are only read when there are entries to check.
  defp check_entries([], _path), do: :ok

  defp check_entries(entries, path) do
    case fields(path) do
      nil ->
        {:error,
         "the PJRT plugin #{path} does not describe its options, so EXLA cannot check them"}

      fields ->
        flag_names = flag_names(path)
        Enum.find_value(entries, :ok, &check_flag(&1, fields, flag_names))
    end
  end

  defp check_flag({name, value}, fields, flag_names) do
    result =
      case Map.fetch(fields, name) do
        _ when name == "help" ->
          {:error, "is refused: XLA would print its usage and end the process"}

        :error ->
          {:error, "is not an XLA option of this plugin"}

        {:ok, _} when not is_map_key(flag_names, name) ->
          {:error, "is an XLA option without a flag; set it with the client's :xla_options"}

        {:ok, {type, repeated?}} ->
          with :ok <- check_flag_value(type, repeated?, value) do
            check_range(name, flag_number(value))
          end
      end

    case result do
      :ok -> nil
      {:error, reason} -> {:error, flag_error(name, value, reason)}
    end
  end

  defp flag_error(name, value, reason), do: "--#{name}#{if value, do: "=" <> value} #{reason}"

  # XLA reads a flag's value as its field's type; enum flags each have their
  # own syntax (exact names, upper-cased names, other words), so EXLA leaves
  # them to :xla_options, where enum values are always the names.
  defp check_flag_value({:enum, _}, _repeated?, _value),
    do: {:error, "sets an enum, which EXLA cannot check in XLA_FLAGS; use :xla_options"}

  defp check_flag_value(:message, false, _value),
    do: {:error, "sets a message, which XLA_FLAGS cannot"}

  defp check_flag_value(:bool, false, nil), do: :ok
  defp check_flag_value(_type, _repeated?, nil), do: {:error, "needs a value (--name=value)"}

  defp check_flag_value(type, true, _value) when type in [:string, :bytes, :message], do: :ok

  defp check_flag_value(:bool, false, value) do
    if String.downcase(value) in ["true", "false", "1", "0"],
      do: :ok,
      else: {:error, "expects true, false, 1 or 0"}
  end

  defp check_flag_value(type, false, value) when type in [:int32, :int64] do
    case Integer.parse(value) do
      {number, ""} -> in_range(number, @int_ranges[type], "an integer")
      _ -> {:error, "expects an integer"}
    end
  end

  defp check_flag_value(type, false, value) when type in [:float, :double] do
    with true <- value =~ ~r/^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$/,
         {number, ""} <- Float.parse(value),
         true <- type == :double or abs(number) <= @float_max do
      :ok
    else
      _ -> {:error, "expects a finite decimal number"}
    end
  end

  defp check_flag_value(type, false, _value) when type in [:string, :bytes], do: :ok

  defp check_flag_value(type, _repeated?, _value),
    do: {:error, "has a type (#{inspect(type)}) EXLA cannot check in XLA_FLAGS"}

  defp flag_number(nil), do: nil

  defp flag_number(value) do
    case Integer.parse(value) do
      {number, ""} -> number
      _ -> value
    end
  end

  @doc """
  Splits `XLA_FLAGS` into `{name, value}` entries (`value` is nil for a bare
  `--name`) the way XLA does, refusing what XLA would not parse as flags.
  """
  def parse_flags(flags) do
    case skip_whitespace(flags) do
      "" ->
        {:ok, []}

      <<?-, _::binary>> = rest ->
        parse_entries(rest, [])

      rest ->
        {:error,
         "expected --flag or --flag=value entries; XLA would read #{inspect(first_word(rest))} " <>
           "as the name of a file of flags, which EXLA does not check"}
    end
  end

  defp parse_entries("", acc), do: {:ok, Enum.reverse(acc)}

  defp parse_entries(<<?-, _::binary>> = text, acc) do
    {token, rest} = split_token(text)

    with {:ok, entry} <- parse_entry(token) do
      parse_entries(skip_whitespace(rest), [entry | acc])
    end
  end

  defp parse_entries(text, _acc) do
    {:error,
     "#{inspect(first_word(text))} does not start with --; XLA would ignore it and " <>
       "every entry after it"}
  end

  # A token is `--name=value` up to whitespace, or `--name="quoted value"`
  # (single or double quotes; backslash escapes in double quotes), as XLA's
  # own reader splits them.
  defp split_token(text) do
    {name_part, rest} = take_name(text, "")

    case rest do
      <<?=, quote, quoted::binary>> when quote in [?", ?'] ->
        {value, rest} = take_quoted(quoted, quote, "")
        {{:quoted, name_part, value}, rest}

      _ ->
        {word, rest} = take_word(rest, "")
        {name_part <> word, rest}
    end
  end

  defp take_name(<<c, rest::binary>>, acc)
       when c in ?a..?z or c in ?A..?Z or c in ?0..?9 or c in [?-, ?_],
       do: take_name(rest, <<acc::binary, c>>)

  defp take_name(rest, acc), do: {acc, rest}

  defp take_quoted(<<?\\, c, rest::binary>>, ?", acc),
    do: take_quoted(rest, ?", <<acc::binary, c>>)

  defp take_quoted(<<quote, rest::binary>>, quote, acc), do: {acc, rest}

  defp take_quoted(<<c, rest::binary>>, quote, acc),
    do: take_quoted(rest, quote, <<acc::binary, c>>)

  defp take_quoted("", _quote, acc), do: {acc, ""}

  defp take_word(<<c, _::binary>> = rest, acc) when c in @whitespace, do: {acc, rest}
  defp take_word(<<c, rest::binary>>, acc), do: take_word(rest, <<acc::binary, c>>)
  defp take_word("", acc), do: {acc, ""}

  defp parse_entry({:quoted, "--" <> name, value}), do: entry(name, value, "--#{name}=...")

  defp parse_entry({:quoted, name_part, _value}),
    do: {:error, "#{name_part}=... does not start with --"}

  defp parse_entry("--" <> flag) do
    case String.split(flag, "=", parts: 2) do
      [name, value] -> entry(name, value, "--" <> flag)
      [name] -> entry(name, nil, "--" <> flag)
    end
  end

  defp parse_entry(token), do: {:error, "#{token} does not start with --"}

  defp entry(name, value, token) do
    if name =~ ~r/^[a-z0-9_]+$/,
      do: {:ok, {name, value}},
      else: {:error, "#{token} is not a flag XLA can read"}
  end

  defp skip_whitespace(<<c, rest::binary>>) when c in @whitespace, do: skip_whitespace(rest)
  defp skip_whitespace(rest), do: rest

  defp first_word(text), do: text |> take_word("") |> elem(0)

  ## What the plugin declares

  @doc """
  The options of the plugin at `path` as a map of name to `{type,
  repeated?}`, or nil when the file does not describe them. Read once per
  plugin file.
  """
  def fields(path) do
    cached({__MODULE__, :fields, path}, fn ->
      case EXLA.NIF.unwrap!(EXLA.NIF.plugin_xla_options(path)) do
        nil -> :none
        fields -> Map.new(fields, &field/1)
      end
    end)
  end

  defp field({name, :enum, values, repeated?}), do: {name, {{:enum, values}, repeated?}}
  defp field({name, type, [], repeated?}), do: {name, {type, repeated?}}

  defp flag_names(path) do
    cached({__MODULE__, :flag_names, path}, fn ->
      path |> EXLA.NIF.plugin_flag_names() |> EXLA.NIF.unwrap!() |> Map.new(&{&1, true})
    end)
  end

  defp cached(key, fun) do
    case EXLA.Memo.get(key, fun) do
      :none -> nil
      value -> value
    end
  end
end
