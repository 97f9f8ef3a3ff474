defmodule Fusex.NxHelpers do
  @moduledoc false
  # Nx tensors for the Fusex.Defn suites: seeded random inputs, the Erlang
  # API on their bytes (the cpu backend: the reference), errors measured as
  # rel-L2 in f64. Compiles without Nx (only calls into it), so that the
  # suites exist, and are listed as skipped, where Nx is absent.
  @compile {:no_warn_undefined, [Nx, Nx.Random, Nx.Defn]}

  import ExUnit.Assertions

  @doc "A tensor of `shape` and `type`, uniform in [lo, hi] (seeded by ExUnit's seed through :rand)."
  def uniform(shape, type \\ {:f, 32}, lo \\ -1.0, hi \\ 1.0) do
    key = Nx.Random.key(:rand.uniform(1_000_000_000))
    {t, _} = Nx.Random.uniform(key, lo, hi, shape: shape, type: {:f, 64})
    Nx.as_type(t, type)
  end

  @doc "An Erlang API tensor (cpu) holding the Nx tensor's bytes."
  def erl(t), do: :fusex.tensor(Nx.to_binary(t), t.type, t.shape, %{device: :cpu})

  @doc "The Erlang API tensor as an Nx tensor."
  def nx(ref), do: ref |> :fusex.to_binary() |> Nx.from_binary(:fusex.type(ref)) |> Nx.reshape(:fusex.shape(ref))

  @doc "|got - want| / |want| (L2, in f64); NaN and mismatched shapes or types fail."
  def rel_l2(got, want) do
    assert got.shape == want.shape, "shape #{inspect(got.shape)}, want #{inspect(want.shape)}"
    diff = Nx.subtract(Nx.as_type(got, {:f, 64}), Nx.as_type(want, {:f, 64}))
    num = diff |> Nx.pow(2) |> Nx.sum() |> Nx.to_number()
    den = want |> Nx.as_type({:f, 64}) |> Nx.pow(2) |> Nx.sum() |> Nx.to_number()

    cond do
      not (is_number(num) and is_number(den)) -> :nan
      den == 0.0 -> :math.sqrt(num)
      true -> :math.sqrt(num / den)
    end
  end

  @doc "Asserts rel_l2(got, want) <= tol, the types equal."
  def assert_close(got, want, tol, label) do
    assert got.type == want.type, "#{label}: type #{inspect(got.type)}, want #{inspect(want.type)}"
    err = rel_l2(got, want)
    assert is_float(err) and err <= tol, "#{label}: rel-L2 #{inspect(err)} > #{tol}"
  end

  @doc """
  For a gradient summed over `terms` values (a parameter's, over batch and
  time): rel-L2 within `tol` grown as sqrt(terms) / 4 (the C and JAX suites'
  rule), or an absolute error within f32's rounding of the terms (1e-6 an
  element and term), so that a sum that nearly cancels is not asked a
  relative accuracy its terms cannot give.
  """
  def assert_close_sum(got, want, tol, terms, label) do
    assert got.type == want.type, "#{label}: type #{inspect(got.type)}, want #{inspect(want.type)}"
    tol = tol * max(1.0, :math.sqrt(terms) / 4)
    diff = Nx.subtract(Nx.as_type(got, {:f, 64}), Nx.as_type(want, {:f, 64}))
    d = diff |> Nx.pow(2) |> Nx.sum() |> Nx.to_number()
    r = want |> Nx.as_type({:f, 64}) |> Nx.pow(2) |> Nx.sum() |> Nx.to_number()
    floor = if tol < 1.0e-4, do: 1.0e-6 * :math.sqrt(Nx.size(want) * terms), else: 0.0
    assert is_float(d) and is_float(r), "#{label}: NaN"
    assert :math.sqrt(d) <= tol * :math.sqrt(r) + floor,
           "#{label}: |diff| #{:math.sqrt(d)} > #{tol} |ref| + #{floor} (|ref| #{:math.sqrt(r)})"
  end

  @doc "The tolerance of a type against the f64 reference (house rules)."
  def tol({:f, 64}), do: 1.0e-10
  def tol({:f, 32}), do: 1.0e-5
  def tol(_16bit), do: 1.0e-2

  @doc "The message an Erlang API call raises as {badarg, Message}."
  def erl_message(fun) do
    fun.()
    flunk("the Erlang API accepted the input")
  catch
    :error, {:badarg, msg} -> msg
  end

  @doc "sum(t * w) over all elements, in f64 (a scalar loss)."
  def dot(t, w), do: Nx.sum(Nx.multiply(Nx.as_type(t, {:f, 64}), Nx.as_type(w, {:f, 64})))
end
