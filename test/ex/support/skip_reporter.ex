defmodule Fusex.SkipReporter do
  @moduledoc false
  # An ExUnit formatter that lists, by name, every test that did not run
  # because a tag was excluded (the Nx tests where Nx is absent), so they
  # are reported as skipped rather than silently counted.
  use GenServer

  def init(_opts), do: {:ok, []}

  def handle_cast({:test_finished, %ExUnit.Test{state: {:excluded, why}} = test}, acc),
    do: {:noreply, [{test, why} | acc]}

  def handle_cast({:test_finished, %ExUnit.Test{state: {:skipped, why}} = test}, acc),
    do: {:noreply, [{test, why} | acc]}

  def handle_cast({:suite_finished, _}, acc) do
    print(Enum.reverse(acc))
    {:noreply, acc}
  end

  def handle_cast(_event, acc), do: {:noreply, acc}

  defp print([]), do: :ok

  defp print(skipped) do
    IO.puts("\nSkipped #{length(skipped)} tests:")

    for {test, why} <- skipped do
      IO.puts("  SKIPPED #{inspect(test.module)} \"#{test.name}\" (#{why})")
    end
  end
end
