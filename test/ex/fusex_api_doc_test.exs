defmodule FusexApiDocTest do
  # docs/API-ELIXIR.md is what tools/elixir_api.exs makes of the compiled
  # modules' docs: a doc changed in lib/ without `make docs-ex` fails here.
  # The page holds the modules built on Nx.Defn and Axon, so the check
  # runs where those load (listed as skipped elsewhere). Signatures and
  # specs are as the compiling Elixir prints them: the committed page is
  # the offline kit's (CI's).
  use ExUnit.Case, async: false
  @moduletag :nx
  @moduletag :axon
  @compile {:no_warn_undefined, [Fusex.ApiDoc]}

  @root Path.expand("../..", __DIR__)

  test "docs/API-ELIXIR.md is the page tools/elixir_api.exs generates (make docs-ex)" do
    Code.require_file(Path.join(@root, "tools/elixir_api.exs"))
    page = File.cd!(@root, fn -> Fusex.ApiDoc.render() end)
    committed = File.read!(Path.join(@root, "docs/API-ELIXIR.md"))

    if page != committed do
      # the first line that differs, to say where
      {page_lines, committed_lines} = {String.split(page, "\n"), String.split(committed, "\n")}
      n = min(length(page_lines), length(committed_lines))

      {want, got, n} =
        Enum.zip([page_lines, committed_lines, Stream.iterate(1, &(&1 + 1))])
        |> Enum.find({Enum.at(page_lines, n, "(the end)"), Enum.at(committed_lines, n, "(the end)"), n + 1}, fn {a, b, _} -> a != b end)

      flunk("docs/API-ELIXIR.md is out of date (run make docs-ex); line #{n}: #{inspect(got)}, generated: #{inspect(want)}")
    end

    # every documented module of lib/ is in it, Fusex.Axon's states among them
    for m <- ["Fusex", "Fusex.Tensor", "Fusex.Defn", "Fusex.Axon", "Fusex.Model", "Fusex.Optim"],
        do: assert(page =~ "\n## #{m}\n", m)

    assert page =~ "### Fusex.Axon.min_gru/4"
  end
end
