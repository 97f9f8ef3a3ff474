"""The one call path of every fusex_jax function, over the op layer's
descriptions (``_lib.DESCRIPTIONS``; docs/XLA.md).

A family's public functions name their op and pass their arguments by the
description's names: ``forward(op, args, **options)`` for a forward,
``step(op, args, **options)`` for a step. From the description alone:

  * the options: a tensor option is an input (None: not given), a flag a
    boolean (Python's, numpy's, a 0-d boolean array), a flag with choices
    one of its two names, an enum one of its names (a string; None for its
    first, "none"), passed to XLA as its index, a number a concrete real
    scalar; an option that is both a number and an input (a tensor or
    a number) is the number when it is a concrete scalar and the input
    otherwise (an array of shape ``()`` broadcast to the input's layout);
  * the operands in the description's order, the presence attributes set
    from the tensors given;
  * the results' types and shapes from the op layer's check
    (``fusex_xla_op_check`` with the Host rules), which refuses bad input
    when the function is called (at trace time) with the op layer's
    message (``ArgumentError``); the CUDA handler checks the CUDA
    backend's limits again when the program runs;
  * the gradient: a forward's ``jax.custom_vjp`` runs the training forward
    (its ``save`` attribute 1) and the backward the description names,
    feeding it by role (the forward's inputs and kept results by name, the
    cotangents ``d`` + a result) and taking ``d`` + each input back; a
    step's is that backward on sequences of one step from ``h0 = state``;
  * a repeated group (a stacked RNN's layers): the positional argument of
    the repeat attribute's name (``layers``), one tuple of the group's
    tensors per repetition; the call's description has the group written
    out once per repetition (``layers[1].w_hh``: one input or result per
    slot, as the handlers take them), its op ``(index, repetitions)``.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _lib
from ._lib import ArgumentError

_INDEX = {d["name"]: i for i, d in enumerate(_lib.DESCRIPTIONS)}


def _base(op):
    """The library's index of a call's op (an index, or (index, repetitions))."""
    return op[0] if isinstance(op, tuple) else op


def _repeat_attr(d):
    return next((k for k, a in enumerate(d["attrs"]) if a["role"] == "repeat"), -1)


@functools.lru_cache(maxsize=None)
def _expanded(index, repeats):
    """Description `index` with its repeated group written out `repeats`
    times: one entry per slot, named ``layers[r].w_ih`` (a gradient
    ``dlayers[r].w_ih``: "d" + its input's slot)."""
    d = _lib.DESCRIPTIONS[index]
    group = d["attrs"][_repeat_attr(d)]["name"]

    def slots(entries):
        out = [e for e in entries if not e["repeated"]]
        for r in range(repeats):
            for e in (e for e in entries if e["repeated"]):
                grad = e["role"] == "grad"
                name = f"{'d' if grad else ''}{group}[{r}].{e['name'][1:] if grad else e['name']}"
                out.append(dict(e, name=name))
        return out

    return dict(d, inputs=slots(d["inputs"]), results=slots(d["results"]))


def _with_repeats(op, repeats):
    """The call's op for `repeats` repetitions (the index alone where the
    description has no repeated group)."""
    index = _base(op)
    return (index, repeats) if _repeat_attr(_lib.DESCRIPTIONS[index]) >= 0 else index


def _repeats_of(op):
    return op[1] if isinstance(op, tuple) else 1


def _desc(op):
    return _expanded(*op) if isinstance(op, tuple) else _lib.DESCRIPTIONS[op]


def _find(name):
    try:
        return _INDEX[name]
    except KeyError:
        raise LookupError(f"fusex_jax: the library describes no op {name!r}") from None


def _index_of(items, name):
    for i, item in enumerate(items):
        if item["name"] == name:
            return i
    return -1


# ---- option values ----


def _scalar(value):
    """``(kind, value)`` of a concrete scalar (a Python or numpy number, a
    0-d array that is not traced): kind ``bool``, ``int``, ``float`` or
    ``complex``; None for anything else."""
    if isinstance(value, jax.core.Tracer):
        return None
    for kind in (bool, int, float, complex):
        if isinstance(value, kind):
            return kind.__name__, value
    try:
        arr = np.asarray(value)
    except Exception:  # noqa: BLE001 - not array-like: not a scalar
        return None
    if arr.ndim != 0 or arr.dtype == object:
        return None
    if arr.dtype == np.bool_:
        return "bool", bool(arr)
    for kind, base in (("int", jnp.integer), ("float", jnp.floating), ("complex", jnp.complexfloating)):
        if jnp.issubdtype(arr.dtype, base):
            return kind, {"int": int, "float": float, "complex": complex}[kind](arr)
    return None


def _show(value):
    if isinstance(value, jax.core.Tracer):
        return "a traced value (options are static)"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _flag(name, value):
    """A boolean: Python's, numpy's, or a 0-d boolean array (the Erlang
    API's and Fusex.Defn's words for what else came)."""
    s = _scalar(value)
    if s is not None and s[0] == "bool":
        return float(s[1])
    raise ArgumentError(f"{name}: expected true or false, got {_show(value)}")


def _choice(name, value, choices):
    if isinstance(value, str) and value in choices:
        return float(choices.index(value))
    raise ArgumentError(f"{name}: expected {choices[0]} or {choices[1]}, got {_show(value)}")


def _choice_list(choices):
    """The op layer's list of names (fx_op_choice_list): "a, b or c"."""
    return choices[0] if len(choices) == 1 else ", ".join(choices[:-1]) + " or " + choices[-1]


def _enum(name, value, choices):
    """An enum option (an activation): one of its names, as a string, or
    None for its first ("none"); its index."""
    if value is None:
        return 0.0
    if isinstance(value, str) and value in choices:
        return float(choices.index(value))
    raise ArgumentError(f"{name}: expected {_choice_list(choices)}, got {_show(value)}")


def _number(name, value, expected):
    """A concrete real scalar as a float (the op layer checks its range);
    None where value is not a scalar at all."""
    s = _scalar(value)
    if s is None:
        return None
    kind, v = s
    if kind in ("int", "float"):
        try:
            return float(v)
        except OverflowError:
            pass
    raise ArgumentError(f"{name}: expected {expected}, got {_show(value)}")


def _tensor(name, value, expected):
    """An array argument; ArgumentError where `value` is none."""
    if isinstance(value, (str, bytes)):
        raise ArgumentError(f"{name}: expected {expected}, got {_show(value)}")
    try:
        return jnp.asarray(value)
    except (TypeError, ValueError):
        raise ArgumentError(f"{name}: expected {expected}, got {_show(value)}") from None


def _layout(layout):
    """A layout's axis names (``[batch, seqlen, 1]``), or None where it has
    an optional part (``[batch, seqlen, [groups,] dstate]``)."""
    names = layout.strip("[]").split(", ")
    return None if any("[" in n or "]" in n for n in names) else names


def _broadcast(d, inputs, i, value):
    """An array of shape () as input i: broadcast to its layout (sizes
    from the other inputs given), in the first positional tensor's type."""
    sizes = {}
    for spec, t in zip(d["inputs"], inputs):
        names = _layout(spec["layout"])
        if t is not None and names and len(names) == t.ndim:
            for n, size in zip(names, t.shape):
                sizes.setdefault(n, size)
    names = _layout(d["inputs"][i]["layout"]) or []
    if not all(n.isdigit() or n in sizes for n in names):
        return value  # the check refuses what the sizes come from
    first = next(t for s, t in zip(d["inputs"], inputs) if s["role"] == "arg")
    shape = tuple(int(n) if n.isdigit() else sizes[n] for n in names)
    return jnp.broadcast_to(value.astype(first.dtype), shape)


def _flatten_group(name, d, args):
    """`args` with the repeated group's argument (``layers``: a sequence of
    tuples of the group's tensors) written out by slot, and the number of
    repetitions (1 without a group)."""
    a = _repeat_attr(d)
    if a < 0:
        return args, 1
    group = d["attrs"][a]["name"]
    entries = [e["name"] for e in d["inputs"] if e["repeated"]]
    expected = f"a non-empty sequence of ({', '.join(entries)}), one per layer"
    value = args.get(group)
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or not hasattr(value, "__iter__"):
        raise ArgumentError(f"{group}: expected {expected}, got {_show(value)}")
    value = list(value)
    if not value:
        raise ArgumentError(f"{group}: expected {expected}, got none")
    out = {k: v for k, v in args.items() if k != group}
    for r, item in enumerate(value):
        if isinstance(item, dict) or not hasattr(item, "__len__") or len(item) != len(entries):
            raise ArgumentError(f"{group}[{r}]: expected a tuple ({', '.join(entries)}), got {_show(item)}")
        for e, t in zip(entries, item):
            out[f"{group}[{r}].{e}"] = t
    return out, len(value)


class _Call(NamedTuple):
    """What is fixed at trace time: the description and its attributes
    (one number each, in its order; presence ones as the tensors say)."""
    op: int
    attrs: tuple


def _prepare(name, args, options):
    """The call of description `name` and its inputs (a tuple aligned with
    the description's, None where absent) from the public function's
    positional tensors and options."""
    op = _find(name)
    args, repeats = _flatten_group(name, _desc(op), args)
    op = _with_repeats(op, repeats)
    d = _desc(op)
    positional = [s["name"] for s in d["inputs"] if s["role"] in ("arg", "state")]
    if list(args) != positional:
        raise TypeError(f"fusex_jax: {name} takes the tensors {positional}, got {list(args)}")
    inputs = [None] * len(d["inputs"])
    for k, v in args.items():
        i = _index_of(d["inputs"], k)
        inputs[i] = _tensor(k, v, f"an array {d['inputs'][i]['layout']}")
    attrs = [float(a["default"]) for a in d["attrs"]]
    if _repeat_attr(d) >= 0:
        attrs[_repeat_attr(d)] = float(repeats)
    known = [o for o in d["options"] if o != "save_for_backward"]
    unknown = [k for k in options if k not in known]
    if unknown:
        raise TypeError(f"fusex_jax: {name} has no options {unknown} (its options: {known})")
    deferred = []
    for key, value in options.items():
        i = _index_of(d["inputs"], key)
        a = next((k for k, at in enumerate(d["attrs"]) if (at["option"] or at["name"]) == key and
                  at["role"] == "option"), -1)
        if a >= 0 and d["attrs"][a]["kind"] == "number":
            positive = "positive " if d["attrs"][a]["positive"] else ""
            expected = f"a {positive}number" + (f" or a tensor ({d['inputs'][i]['layout']})" if i >= 0 else "")
            number = _number(key, value, expected)
            if number is not None:
                attrs[a] = number
                continue
            if i < 0:
                raise ArgumentError(f"{key}: expected {expected}, got {_show(value)}")
        elif a >= 0 and d["attrs"][a]["kind"] == "enum":
            attrs[a] = _enum(key, value, d["attrs"][a]["choices"])
            continue
        elif a >= 0:
            choices = d["attrs"][a]["choices"]
            attrs[a] = _choice(key, value, choices) if choices else _flag(key, value)
            continue
        if i < 0:
            raise TypeError(f"fusex_jax: {name}: the option {key} is neither an input nor an attribute")
        if value is not None:
            what = expected if a >= 0 else f"an array {d['inputs'][i]['layout']}"
            inputs[i] = _tensor(key, value, what)
            if inputs[i].ndim == 0:
                deferred.append(i)
    for i in deferred:
        inputs[i] = _broadcast(d, inputs, i, inputs[i])
    return _Call(op, tuple(attrs)), tuple(inputs)


# ---- one custom call ----


def _presence(d, attrs, inputs):
    """The attributes with every presence flag set from the inputs given."""
    attrs = list(attrs)
    for spec, t in zip(d["inputs"], inputs):
        if spec["presence"] == "flag":
            a = _index_of(d["attrs"], spec["flag"])
            if d["attrs"][a]["role"] == "presence":
                attrs[a] = float(t is not None)
    return attrs


def _specs(op, attrs, inputs):
    """The op layer's check of the call: each result's (dtype, shape), None
    where absent; ArgumentError with its message for bad input."""
    d = _desc(op)
    return _lib.check(_base(op), [None if t is None else (t.dtype, t.shape) for t in inputs],
                      _presence(d, attrs, inputs), desc=d)


def _run(op, attrs, inputs):
    """Description `op`'s custom call on `inputs` (aligned with the
    description's, None where absent): its results, aligned likewise."""
    d = _desc(op)
    attrs = _presence(d, attrs, inputs)
    specs = _specs(op, attrs, inputs)
    given = [i for i, t in enumerate(inputs) if t is not None]
    made = [r for r, s in enumerate(specs) if s is not None]
    values = {a["name"]: np.int64(v) if a["kind"] in ("flag", "enum") else np.float64(v) for a, v in zip(d["attrs"], attrs)}
    # A step's states are updated in place where the caller donates them:
    # state S (the operand) into "new_" + S (the result).
    state_in = {d["inputs"][i]["name"]: k for k, i in enumerate(given) if d["inputs"][i]["role"] == "state"}
    aliases = {state_in[d["results"][r]["name"][len("new_"):]]: k for k, r in enumerate(made)
               if d["results"][r]["role"] == "state" and d["results"][r]["name"][len("new_"):] in state_in}
    aliases = aliases or None
    fn = jax.ffi.ffi_call(d["target"], tuple(jax.ShapeDtypeStruct(specs[r][1], specs[r][0]) for r in made),
                          vmap_method="sequential", input_output_aliases=aliases)
    outs = iter(fn(*(inputs[i] for i in given), **values))
    return tuple(None if s is None else next(outs) for s in specs)


def _shown(d, results):
    """The results the public function returns: its outputs and a step's
    new state, in order."""
    return [k for k, (r, v) in enumerate(zip(d["results"], results)) if v is not None and
            r["role"] in ("output", "state")]


def _public(op, results):
    """What the public function returns: one result alone, several as a tuple."""
    outs = tuple(results[k] for k in _shown(_desc(op), results))
    return outs[0] if len(outs) == 1 else outs


def _cotangents(op, specs, cotangent):
    """The cotangent of each result the public function returned, by name."""
    d = _desc(op)
    given = cotangent if isinstance(cotangent, tuple) else (cotangent,)
    return {d["results"][k]["name"]: g for k, g in zip(_shown(d, specs), given)}


def _with_save(op, attrs, save):
    d = _desc(op)
    return tuple(float(save) if a["role"] == "save" else v for a, v in zip(d["attrs"], attrs))


def _attrs_from(op, source_op, source_attrs):
    """Description `op`'s attributes, its options taken by name from a
    related call's (the forward's for its backward, a step's)."""
    d, s = _desc(op), _desc(source_op)
    attrs = []
    for a in d["attrs"]:
        k = _index_of(s["attrs"], a["name"])
        attrs.append(source_attrs[k] if k >= 0 and a["role"] in ("option", "repeat") else float(a["default"]))
    return tuple(attrs)


def _backward(fwd_op, inputs, saved, cotangents, source_op, source_attrs):
    """The forward's backward: its inputs by role (the forward's `inputs`
    by name, `saved` results by name, `cotangents` by result name; absent
    where None), its gradients by forward input name."""
    fwd = _desc(fwd_op)
    bwd_op = _with_repeats(_find(fwd["backward"]), _repeats_of(fwd_op))
    bwd = _desc(bwd_op)
    operands = []
    for spec in bwd["inputs"]:
        name, role = spec["name"], spec["role"]
        if role == "forward":
            operands.append(inputs.get(name))
        elif role == "saved":
            operands.append(saved.get(name))
        elif role == "cotangent":
            operands.append(cotangents.get(name[1:]))
        else:
            raise TypeError(f"fusex_jax: {bwd['name']}: no source for an input of role {role!r}")
    grads = _run(bwd_op, _attrs_from(bwd_op, source_op, source_attrs), tuple(operands))
    return {r["name"][1:]: g for r, g in zip(bwd["results"], grads) if g is not None}


# ---- forwards ----


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _forward(call, inputs):
    return _public(call.op, _run(call.op, _with_save(call.op, call.attrs, False), inputs))


def _forward_fwd(call, inputs):
    results = _run(call.op, _with_save(call.op, call.attrs, True), inputs)
    kept = tuple(v if r["kept"] else None for r, v in zip(_desc(call.op)["results"], results))
    return _public(call.op, results), (inputs, kept)


def _forward_bwd(call, residuals, cotangent):
    inputs, kept = residuals
    d = _desc(call.op)
    specs = _specs(call.op, _with_save(call.op, call.attrs, False), inputs)
    grads = _backward(call.op, {s["name"]: t for s, t in zip(d["inputs"], inputs)},
                      {r["name"]: v for r, v in zip(d["results"], kept)}, _cotangents(call.op, specs, cotangent),
                      call.op, call.attrs)
    return (tuple(None if t is None else grads[s["name"]] for s, t in zip(d["inputs"], inputs)),)


_forward.defvjp(_forward_fwd, _forward_bwd)


def forward(name, args, **options):
    """Op `name`'s forward (description ``<name>_fwd``) on the positional
    tensors `args` (a dict, in the description's order) with `options`:
    its outputs, differentiable in every tensor."""
    call, inputs = _prepare(name + "_fwd", args, options)
    return _forward(call, inputs)


# ---- steps ----


def _seq_axis(layout):
    names = layout.strip("[]").split(", ")
    return names.index("seqlen") if "seqlen" in names else -1


def _framing(fwd_layout, step_layout):
    """The axis a step's tensor gains as the forward's (its sequence axis,
    where the forward's layout has one and the step's has not), or -1."""
    axis = _seq_axis(fwd_layout)
    return axis if axis >= 0 and _seq_axis(step_layout) < 0 else -1


def _forward_state_names(step, fwd):
    """A step's state input and result ("state", "new_state") as its
    forward's input and result: h0 and state, or where the forward has no
    h0, its optional input and its output of the state's layout (the
    convolution's initial_state and final_state)."""
    if _index_of(fwd["inputs"], "h0") >= 0:
        return {"state": "h0", "new_state": "state"}
    layout = next(s["layout"] for s in step["inputs"] if s["role"] == "state")
    initial = next(s["name"] for s in fwd["inputs"] if s["role"] == "option" and s["layout"] == layout)
    final = next(r["name"] for r in fwd["results"] if r["role"] == "output" and r["layout"] == layout)
    return {"state": initial, "new_state": final}


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _step(call, inputs):
    return _public(call.op, _run(call.op, call.attrs, inputs))


def _step_fwd(call, inputs):
    results = _run(call.op, call.attrs, inputs)
    return _public(call.op, results), (inputs, results)


def _step_bwd(call, residuals, cotangent):
    # A step is the forward of one step from h0 = state: its backward is
    # that forward's backward on sequences of one step.
    inputs, results = residuals
    step = _desc(call.op)
    fwd_op = _find(step["op"] + "_fwd")
    fwd = _desc(fwd_op)
    bwd = _desc(_find(fwd["backward"]))
    layouts = {s["name"]: s["layout"] for s in fwd["inputs"] + fwd["results"]}

    # The step's tensors under the forward's names: its state is h0 (in),
    # the final state (out), or what the forward calls them.
    state_names = _forward_state_names(step, fwd)

    def forward_name(spec):
        return state_names[spec["name"]] if spec["role"] == "state" else spec["name"]

    def framing(spec):
        return _framing(layouts.get(forward_name(spec), spec["layout"]), spec["layout"])

    def as_sequence(spec, t):
        axis = framing(spec)
        return t if t is None or axis < 0 else jnp.expand_dims(t, axis)

    seq_in = {forward_name(s): as_sequence(s, t) for s, t in zip(step["inputs"], inputs)}
    seq_out = {forward_name(r): as_sequence(r, v) for r, v in zip(step["results"], results)}
    given = cotangent if isinstance(cotangent, tuple) else (cotangent,)
    shown = [step["results"][k] for k in _shown(step, results)]
    cotangents = {forward_name(r): as_sequence(r, g) for r, g in zip(shown, given)}
    saved = {s["name"]: seq_out.get(s["name"]) for s in bwd["inputs"] if s["role"] == "saved"}
    grads = _backward(fwd_op, seq_in, saved, cotangents, call.op, call.attrs)
    out = []
    for spec, t in zip(step["inputs"], inputs):
        if t is None:
            out.append(None)
            continue
        g = grads[forward_name(spec)]
        axis = framing(spec)
        out.append(g if axis < 0 else jnp.squeeze(g, axis))
    return (tuple(out),)


_step.defvjp(_step_fwd, _step_bwd)


def step(name, args, **options):
    """Op `name`'s step (description ``<name>_step``) on the positional
    tensors `args` (the state first) with `options`: ``(output,
    new_state)``, differentiable in every tensor."""
    call, inputs = _prepare(name + "_step", args, options)
    return _step(call, inputs)
