defmodule Fusex.Defn.Block do
  @moduledoc """
  The tag of a fusex `Nx.block/4`: which op and direction it computes, and
  its attributes, those of the XLA custom-call target
  `fusex_<op>_<direction>` (docs/XLA.md).

  A block is made from the op layer's description of that op
  (`:fusex.op_list/0`): its inputs are the description's inputs present in
  the call, its results the results the op layer's check
  (`:fusex.op_check/4`) says the call has, both in the description's
  order, so that EXLA can run the block as the target (`EXLA.CustomCall`)
  and every other compiler and backend runs the default implementation of
  `Fusex.Defn` on the same operands, with the same results.

    * `:op` - the op (`fusex:op_list/0`'s `op`);
    * `:direction` - `:fwd`, `:bwd`, `:step`;
    * `:attrs` - `[{name, value}]`, every attribute of the description in
      its order: flags are 0 or 1 (`i64`), enums the index of their choice
      (`i64`: an activation), numbers floats (`f64`).

  Needs no Nx: it is data.
  """

  @enforce_keys [:op, :direction]
  defstruct [:op, :direction, attrs: []]

  @type t :: %__MODULE__{
          op: atom(),
          direction: :fwd | :bwd | :step,
          attrs: [{atom(), integer() | float()}]
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
