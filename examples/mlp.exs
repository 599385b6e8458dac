# Trains a small multi-layer perceptron on generated data with EXLA.jit on
# the default client (the CPU PJRT plugin unless a GPU plugin is present),
# printing the loss per epoch and the training steps per second.
#
#     mix run examples/mlp.exs
defmodule Example.MLP do
  import Nx.Defn

  @doc "Points in [-1, 1]^2 labelled by whether they fall inside a circle."
  def data(key, count) do
    {points, _key} = Nx.Random.uniform(key, -1.0, 1.0, shape: {count, 2}, type: :f32)
    inside = Nx.less(Nx.sum(Nx.multiply(points, points), axes: [1]), 0.5)
    labels = Nx.equal(Nx.new_axis(inside, 1), Nx.tensor([[0, 1]]))
    {points, Nx.as_type(labels, :f32)}
  end

  def init_params(key, sizes) do
    {params, _key} =
      sizes
      |> Enum.chunk_every(2, 1, :discard)
      |> Enum.map_reduce(key, fn [fan_in, fan_out], key ->
        scale = :math.sqrt(2.0 / fan_in)
        {w, key} = Nx.Random.normal(key, 0.0, scale, shape: {fan_in, fan_out}, type: :f32)
        {{w, Nx.broadcast(Nx.tensor(0.0, type: :f32), {fan_out})}, key}
      end)

    List.to_tuple(params)
  end

  defn predict({{w1, b1}, {w2, b2}, {w3, b3}}, x) do
    x
    |> Nx.dot(w1)
    |> Nx.add(b1)
    |> Nx.max(0)
    |> Nx.dot(w2)
    |> Nx.add(b2)
    |> Nx.max(0)
    |> Nx.dot(w3)
    |> Nx.add(b3)
  end

  defn loss(params, x, y) do
    logits = predict(params, x)
    log_probs = logits - Nx.logsumexp(logits, axes: [1], keep_axes: true)
    -Nx.mean(Nx.sum(y * log_probs, axes: [1]))
  end

  defn train_step(params, x, y, learning_rate) do
    {loss, grads} = value_and_grad(params, &loss(&1, x, y))
    {sgd(params, grads, learning_rate), loss}
  end

  defnp sgd({l1, l2, l3}, {g1, g2, g3}, lr) do
    {sgd_layer(l1, g1, lr), sgd_layer(l2, g2, lr), sgd_layer(l3, g3, lr)}
  end

  defnp sgd_layer({w, b}, {gw, gb}, lr), do: {w - lr * gw, b - lr * gb}
end

defmodule Example.Runner do
  def run do
    key = Nx.Random.key(42)
    {x, y} = Example.MLP.data(key, 8192)
    params = Example.MLP.init_params(Nx.Random.key(7), [2, 64, 64, 2])
    batch = 128
    epochs = 10
    batches = div(Nx.axis_size(x, 0), batch)

    x_batches =
      x
      |> Nx.reshape({batches, batch, 2})
      |> Nx.to_batched(1)
      |> Enum.map(&Nx.squeeze(&1, axes: [0]))

    y_batches =
      y
      |> Nx.reshape({batches, batch, 2})
      |> Nx.to_batched(1)
      |> Enum.map(&Nx.squeeze(&1, axes: [0]))

    data =
      Enum.zip(x_batches, y_batches)
      |> Enum.map(fn {xb, yb} ->
        {Nx.backend_transfer(xb, EXLA.Backend), Nx.backend_transfer(yb, EXLA.Backend)}
      end)

    step = EXLA.jit(&Example.MLP.train_step/4)
    lr = Nx.tensor(0.1, type: :f32)
    IO.puts("client: #{EXLA.Client.default_name()}, #{batches} steps of #{batch} per epoch")

    Enum.reduce(1..epochs, params, fn epoch, params ->
      start = System.monotonic_time(:microsecond)

      {params, losses} =
        Enum.map_reduce(data, params, fn {xb, yb}, params ->
          {params, loss} = step.(params, xb, yb, lr)
          {loss, params}
        end)
        |> then(fn {losses, params} -> {params, losses} end)

      mean_loss = losses |> Enum.map(&Nx.to_number/1) |> Enum.sum() |> Kernel./(batches)
      seconds = (System.monotonic_time(:microsecond) - start) / 1_000_000

      IO.puts(
        "epoch #{epoch}: loss #{Float.round(mean_loss, 4)}, #{round(batches / seconds)} steps/s"
      )

      params
    end)
  end
end

Example.Runner.run()
