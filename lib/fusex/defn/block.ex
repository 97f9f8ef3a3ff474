defmodule Fusex.Defn.Block do
  @moduledoc """
  The tag of a fusex `Nx.block/4`: which op and direction it computes, and
  its options as the attributes of the XLA custom-call target
  `fusex_<op>_<direction>` (docs/XLA.md).

  Its inputs and results are that target's operands and results, in their
  order, so that EXLA can run the block as that target (`EXLA.CustomCall`)
  and every other compiler and backend runs the default implementation of
  `Fusex.Defn` on the same operands, with the same results.

    * `:op` - `:selective_scan`, `:linear_scan`, `:mingru`, `:minlstm`,
      `:liquid`;
    * `:direction` - `:fwd`, `:bwd`, `:step`;
    * `:attrs` - `[{name, value}]` in the contract's order: flags are 0 or
      1 (`i64`), liquid's `dt` a float (`f64`);
    * `:save_every` - for the selective scan's forward and backward, the
      steps between saved states (`K` of docs/XLA.md), or `nil` where there
      are none (`seqlen <= K`): the forward then returns no `saved` and the
      backward takes none, as docs/XLA.md has it.

  Needs no Nx: it is data.
  """

  @enforce_keys [:op, :direction]
  defstruct [:op, :direction, attrs: [], save_every: nil]

  @type t :: %__MODULE__{
          op: :selective_scan | :linear_scan | :mingru | :minlstm | :liquid,
          direction: :fwd | :bwd | :step,
          attrs: [{atom(), integer() | float()}],
          save_every: pos_integer() | nil
        }

  @doc "The XLA custom-call target: `fusex_<op>_<direction>`."
  def target_name(%__MODULE__{op: op, direction: direction}), do: "fusex_#{op}_#{direction}"

  @doc "Whether the flag attribute `name` is 1."
  def flag?(%__MODULE__{attrs: attrs}, name), do: Keyword.fetch!(attrs, name) == 1

  @doc "The value of the attribute `name`."
  def attr(%__MODULE__{attrs: attrs}, name), do: Keyword.fetch!(attrs, name)

  @doc """
  The attributes as EXLA's `EXLA.CustomCall.Spec` takes them: `{name,
  MLIR attribute}` pairs, `"1 : i64"` for flags, `"0.5 : f64"` for floats.
  """
  def mlir_attributes(%__MODULE__{attrs: attrs}) do
    Enum.map(attrs, fn
      {name, v} when is_integer(v) -> {Atom.to_string(name), "#{v} : i64"}
      {name, v} when is_float(v) -> {Atom.to_string(name), "#{Float.to_string(v)} : f64"}
    end)
  end

  @doc false
  def flag(true), do: 1
  def flag(false), do: 0
end
