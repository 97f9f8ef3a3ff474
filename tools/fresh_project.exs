# README.md's Elixir lines tried on a new Mix project (tools/fresh_project.sh
# makes the project and runs the two steps):
#
#   elixir tools/fresh_project.exs deps ROOT MIX_EXS
#     writes the deps of README's "Install" block into the new project's
#     mix.exs: fusex as the path dependency the block's comment offers, Nx
#     and Axon with the block's version requirements but from the offline
#     kit's sources (FUSEX_KIT_SRC), and the kit's Complex, Telemetry and
#     Polaris in place of hex's (Nx's and Axon's own dependencies); EXLA is
#     left out, saying so (its build downloads a prebuilt XLA).
#
#   mix run ROOT/tools/fresh_project.exs check ROOT    (in the project)
#     runs README's Elixir examples as a user pastes them: the iex session
#     (each shown result against what the line gives), the defn layer under
#     Nx.Defn.Evaluator (through fusex's NIF, against the eager call) and
#     the Axon model trained with Fusex.Optim.adamw and served by
#     Fusex.Model (each served frame against the Axon model's output).
defmodule Fusex.FreshProject do
  @moduledoc false
  # (the deps step runs in plain elixir, where none of these is loaded)
  @compile {:no_warn_undefined, [Nx, Nx.Random, Axon, Fusex, Fusex.Model, Fusex.Defn.Runtime, :telemetry]}

  @install "### Install"
  @session "### An iex session"
  @defn "### Inside `defn`, EXLA and Axon"
  @served "### Trained in Axon, served frame by frame"

  def main(["deps", root, mix_exs]), do: write_deps(root, mix_exs)
  def main(["check", root]), do: check(root)

  # ---- README's blocks ----

  # The first ```elixir block after the line `heading`.
  defp block(root, heading) do
    lines = root |> Path.join("README.md") |> File.read!() |> String.split("\n")

    rest =
      case Enum.drop_while(lines, &(&1 != heading)) do
        [] -> fail("README.md has no heading #{inspect(heading)}")
        [_ | rest] -> rest
      end

    case rest |> Enum.drop_while(&(&1 != "```elixir")) do
      [_ | body] -> body |> Enum.take_while(&(&1 != "```")) |> Enum.join("\n")
      [] -> fail("README.md has no ```elixir block after #{inspect(heading)}")
    end
  end

  defp fail(message) do
    IO.puts(:stderr, "fresh project: FAILED: #{message}")
    System.halt(1)
  end

  # ---- deps ----

  defp write_deps(root, mix_exs) do
    kit = System.fetch_env!("FUSEX_KIT_SRC")

    readme_deps =
      case Code.string_to_quoted!(block(root, @install)) do
        {:def, _, [{:deps, _, _}, [do: list]]} -> list |> Code.eval_quoted() |> elem(0)
        other -> fail("README's Install block is not one `def deps do [...] end`: #{Macro.to_string(other)}")
      end

    kit_dep = fn name, extra -> {name, Keyword.merge(extra, path: Path.join(kit, Atom.to_string(name)), override: true)} end

    deps =
      Enum.flat_map(readme_deps, fn
        {:fusex, opts} ->
          unless Keyword.has_key?(opts, :git), do: fail("README's fusex line has no git: #{inspect(opts)}")
          [{:fusex, path: root}]

        {:exla, requirement} ->
          IO.puts("fresh project: README's {:exla, #{inspect(requirement)}} left out (its build downloads a prebuilt XLA)")
          []

        {name, requirement} when name in [:nx, :axon] and is_binary(requirement) ->
          {name, opts} = kit_dep.(name, [])
          [{name, requirement, opts}]

        other ->
          fail("README's Install block names #{inspect(other)}, which the kit has not")
      end)

    deps = deps ++ Enum.map([:complex, :telemetry, :polaris], &kit_dep.(&1, []))
    IO.puts("fresh project: deps #{inspect(deps)}")
    text = "  defp deps do\n    " <> inspect(deps, pretty: true, width: 96, limit: :infinity) <> "\n  end\n"
    source = File.read!(mix_exs)
    new = Regex.replace(~r/  defp deps do\n.*?\n  end\n/s, source, text)
    if new == source, do: fail("#{mix_exs} has no `defp deps` to replace")
    File.write!(mix_exs, new)
  end

  # ---- the examples ----

  defp check(root) do
    session(block(root, @session))
    defn_layer(block(root, @defn))
    served(block(root, @served))
    IO.puts("fresh project: README's Elixir examples ran as shown")
  end

  # Each `iex> ` line evaluated in turn (the bindings carried, and every
  # result kept, as iex's history keeps them: a result no variable holds
  # stays alive, its fusex memory counted), its result printed as iex
  # prints it and compared with the lines shown after it, where some are.
  defp session(text) do
    entries =
      text
      |> String.split("\n")
      |> Enum.reduce([], fn
        "iex> " <> code, acc -> [{code, []} | acc]
        line, [{code, out} | acc] -> [{code, [line | out]} | acc]
        _line, [] -> []
      end)
      |> Enum.reverse()
      |> Enum.map(fn {code, out} -> {code, out |> Enum.reverse() |> Enum.join("\n") |> String.trim()} end)

    if entries == [], do: fail("README's iex session has no iex> lines")

    {failures, _binding, _history} =
      Enum.reduce(entries, {[], [], []}, fn {code, shown}, {failures, binding, history} ->
        {printed, binding, history} =
          try do
            {value, binding} = Code.eval_string(code, binding)
            {inspect(value, pretty: true, width: 80), binding, [value | history]}
          rescue
            e -> {Exception.format_banner(:error, e, __STACKTRACE__), binding, history}
          end

        if shown == "" or shown == printed,
          do: {failures, binding, history},
          else: {["iex> #{code}\nREADME shows:\n#{shown}\nit gives:\n#{printed}" | failures], binding, history}
      end)

    if failures != [], do: fail("README's iex session:\n\n" <> Enum.join(Enum.reverse(failures), "\n\n"))
    IO.puts("fresh project: the iex session: #{length(entries)} lines as shown")
  end

  # README's defn function in a module, called under the Evaluator: the
  # NIF runs it (the telemetry event of a NIF run), equal to the eager op.
  defp defn_layer(text) do
    Code.eval_string("defmodule ReadmeDefn do\n  import Nx.Defn\n" <> text <> "\nend")
    key = Nx.Random.key(7)
    {x, key} = Nx.Random.uniform(key, -1.0, 1.0, shape: {2, 5, 4})
    {dt, key} = Nx.Random.uniform(key, -1.0, 1.0, shape: {2, 5, 4})
    {a, key} = Nx.Random.uniform(key, -1.0, -0.1, shape: {4, 3})
    {b, key} = Nx.Random.uniform(key, -1.0, 1.0, shape: {2, 5, 3})
    {c, key} = Nx.Random.uniform(key, -1.0, 1.0, shape: {2, 5, 3})
    {d, _key} = Nx.Random.uniform(key, -1.0, 1.0, shape: {4})

    :telemetry.attach("fresh-project", Fusex.Defn.Runtime.event(), &__MODULE__.nif_ran/4, self())
    y = apply(ReadmeDefn, :layer, [x, dt, a, b, c, d])
    :telemetry.detach("fresh-project")

    receive do
      {:nif_ran, _meta} -> :ok
    after
      0 -> fail("README's defn layer under the Evaluator did not run fusex's NIF")
    end

    want = Fusex.selective_scan(x, dt, a, b, c, d: d, dt_softplus: true)
    err = rel_l2(y, want)
    if not (err <= 1.0e-5), do: fail("README's defn layer: rel-L2 #{err} against Fusex.selective_scan")
    IO.puts("fresh project: the defn layer under the Evaluator, through the NIF: rel-L2 #{Float.round(err, 9)} against the eager op")
  end

  # README's training and serving block, given `data` (three batches
  # toward a leaky running sum of the inputs) and `frame` (the first step
  # of a held-out sequence); the frame it serves, and the next, against the
  # trained Axon model's outputs at those steps.
  defp served(text) do
    key = Nx.Random.key(11)
    {xs, key} = Nx.Random.uniform(key, -1.0, 1.0, shape: {3, 4, 6, 3})
    target = fn x -> x |> Nx.sum(axes: [2], keep_axes: true) |> Nx.cumulative_sum(axis: 1) |> Nx.divide(6) end
    data = for i <- 0..2, do: {xs[i], target.(xs[i])}
    {held_out, _key} = Nx.Random.uniform(key, -1.0, 1.0, shape: {1, 2, 3})
    frame = held_out[[.., 0, ..]]

    {_, binding} = Code.eval_string(text, data: data, frame: frame)
    [model, params, served, state, y] = Enum.map([:model, :params, :served, :state, :y], &Keyword.fetch!(binding, &1))

    {_init, predict} = Axon.build(model)
    want = predict.(params, held_out)
    {y2, _state} = Fusex.Model.step(served, state, held_out[[.., 1, ..]])

    for {got, t} <- [{y, 0}, {y2, 1}] do
      err = rel_l2(got, want[[.., t, ..]])
      if not (err <= 1.0e-5), do: fail("README's served model: frame #{t}: rel-L2 #{err} against the Axon model")
    end

    IO.puts("fresh project: the Axon model trained with Fusex.Optim.adamw, served frame by frame as Axon predicts it")
  end

  @doc false
  def nif_ran(_event, _measurements, meta, parent), do: send(parent, {:nif_ran, meta})

  defp rel_l2(got, want) do
    unless got.shape == want.shape, do: fail("shape #{inspect(got.shape)}, want #{inspect(want.shape)}")
    diff = Nx.subtract(got, want) |> Nx.as_type(:f64) |> Nx.pow(2) |> Nx.sum() |> Nx.to_number()
    norm = want |> Nx.as_type(:f64) |> Nx.pow(2) |> Nx.sum() |> Nx.to_number()
    :math.sqrt(diff / max(norm, 1.0e-30))
  end
end

Fusex.FreshProject.main(System.argv())
