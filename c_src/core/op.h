/*
 * One description per op. Every op fusex computes (a family's forward,
 * backward and step) is described once, here in the op layer: its inputs,
 * attributes and results, a check over shapes, types and attributes that
 * answers the op layer's own messages and gives the results' shapes, the
 * scratch it asks for, and the `_into` function it runs. Every surface
 * reads the description instead of retyping it:
 *
 *   - the XLA handlers (c_src/xla): one generic binder; target
 *     "fusex_" + name, operands and results in the description's order,
 *     each present as its flag attribute (or its rule) says;
 *   - the NIF (c_src/nif/op_nif.c): generic rows fusex_nif:op/3,
 *     op_backward/4, op_check/4 and op_list/0, the options of the Erlang
 *     API derived from the description;
 *   - fusex_jax and Fusex.Defn: they enumerate the descriptions (JSON
 *     from priv/fusex_xla.so; terms from fusex_nif:op_list/0) and ask the
 *     check entry for their results' shapes and for the messages.
 *
 * A family adds its descriptions as one array, `const fx_op_desc
 * fx_<family>_op_descs[]` with `const int fx_<family>_op_ndescs` (its
 * count), and one entry in FX_OP_FAMILIES (c_src/core/op.c).
 *
 * Conventions every description follows (the surfaces rely on them):
 *   - a backward's gradient results are named "d" + the forward input they
 *     belong to ("dx", "dz_logits", "dh0"), in the forward's input order;
 *   - a backward's cotangent inputs are named "d" + the forward result they
 *     belong to ("dy", "dh", "dstate");
 *   - a step's state is the input "state", updated into the result
 *     "new_state" (an XLA program aliases or copies; the NIF updates the
 *     input in place); a step with more than one state (the LSTM's h and
 *     c) names each S and updates it into "new_" + S, in the same order.
 *
 * A repeated group (a stacked RNN's layers): the trailing inputs marked
 * `repeated` form a group given once per layer, as many times as the
 * description's one FX_ATTR_REPEAT attribute ("layers", at least 1) says;
 * a backward's gradients of them are its trailing results, repeated
 * alike. A call holds its tensors by slot: the entries before the group
 * at their own index, then entry `first + k` of repetition r at slot
 * `first + r * group + k` (one repetition: slot and index agree). The
 * arrays of the check entry (fusex_xla_op_check) and XLA's operands and
 * results follow the slots; messages name a slot "layers[1].w_hh". The
 * group's entries are always present and no state. The Erlang rows take
 * the group as one positional list of maps, [#{w_ih => T, ...}], and give
 * a backward's gradients of it as `layers => [#{w_ih => dW, ...}]`.
 */
#ifndef FX_CORE_OP_H
#define FX_CORE_OP_H

#include <stdbool.h>
#include <stddef.h>

#include "core/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most tensors (slots) a call passes or returns: a repeated group's
 * repetitions are limited by it (fx_op_max_repeats). */
#define FX_OP_MAX_IO 64
#define FX_OP_MAX_ATTRS 16
/* The most names an enumerated attribute has (FX_ATTR_ENUM). */
#define FX_OP_MAX_CHOICES 8

typedef enum fx_op_dir { FX_OP_FWD = 0, FX_OP_BWD, FX_OP_STEP } fx_op_dir;

/* What an attribute is to the surfaces. */
typedef enum fx_attr_role {
    /* An option of the public functions (dt_softplus, reverse,
     * return_state; candidate_g as the option "candidate_activation";
     * liquid's dt, a number, or a tensor where an input of that name is). */
    FX_ATTR_OPTION = 0,
    /* 1 exactly when the input (or cotangent) that names it as its flag is
     * given: the surfaces set it, never the user (has_d, has_h0, has_dstate). */
    FX_ATTR_PRESENCE,
    /* 1 when the forward keeps what its backward reads (the selective
     * scan's saved states): set by training forwards (save_for_backward,
     * a traced gradient). */
    FX_ATTR_SAVE,
    /* How many times the repeated group is given (a number, an integer
     * from 1 to fx_op_max_repeats): the surfaces set it from the groups
     * the caller passes, never as an option. */
    FX_ATTR_REPEAT,
} fx_attr_role;

typedef enum fx_attr_kind {
    FX_ATTR_FLAG = 0, /* 0 or 1: XLA `i64`; a boolean (or one of two `choices`) elsewhere */
    FX_ATTR_NUMBER,   /* a double: XLA `f64` (an integer attribute is taken too) */
    /* One of `choices` (two or more), by its index: XLA `i64` 0 .. n - 1 (an
     * integer attribute of any width); its name elsewhere (an atom in
     * Erlang and Elixir, a string in JAX): an activation. */
    FX_ATTR_ENUM,
} fx_attr_kind;

typedef struct fx_op_attr {
    const char *name; /* the XLA attribute */
    fx_attr_kind kind;
    fx_attr_role role;
    double dflt;      /* where a surface's caller leaves the option out */
    /* The public option's name where it differs from `name`
     * ("candidate_activation" for candidate_g), else NULL. */
    const char *option;
    /* A flag given as one of two names: choices[0] is 0, choices[1] is 1
     * ({"identity", "g"}); an enum's names, choices[i] for index i
     * ({"none", "silu"}); NULL after the last, all NULL for a boolean and
     * a number. An enum's `dflt` is an index. */
    const char *choices[FX_OP_MAX_CHOICES];
    /* A number that must be positive and finite (liquid's dt): the check
     * refuses others, and a surface parsing the option may refuse them
     * first, in its own words ("a positive number or a fusex tensor"). */
    bool positive;
} fx_op_attr;

/* What an input or a result is to the surfaces. */
typedef enum fx_io_role {
    FX_IO_ARG = 0,     /* a positional argument of the public function */
    FX_IO_OPTION,      /* a tensor given as an option (h0, d, z, dt_bias) */
    FX_IO_STATE,       /* a step's state: input "state", result "new_state" */
    FX_IO_FORWARD,     /* a backward's input: the forward's input of that name */
    FX_IO_SAVED,       /* a forward's result only its backward reads (the
                        * selective scan's saved states): kept in the
                        * public forward's context, never returned; a
                        * backward's input: a forward result it reads
                        * (`kept` there), by name */
    FX_IO_COTANGENT,   /* a backward's input: "d" + a forward result */
    FX_IO_OUTPUT,      /* a forward's or step's result the caller gets
                        * (y, h; state, announced by return_state) */
    FX_IO_GRAD,        /* a backward's result: "d" + a forward input */
} fx_io_role;

/* How an input or a result comes to be present. */
typedef enum fx_io_when {
    FX_WHEN_ALWAYS = 0,
    FX_WHEN_FLAG, /* the flag attribute `flag` is 1 */
    FX_WHEN_RULE, /* the description's `present` says (from the attributes
                   * and the inputs before it: the saved states exist only
                   * past the first chunk) */
} fx_io_when;

typedef struct fx_op_io {
    const char *name;
    const char *layout; /* "[batch, seqlen, dim]": for docs and descriptions */
    fx_io_role role;
    fx_io_when when;
    const char *flag;   /* FX_WHEN_FLAG: the attribute; else NULL */
    /* A forward's result its backward reads (linrec's h, the selective
     * scan's saved states): a context keeps a reference to it where the
     * backward's input of its name is present for the forward's call (a
     * linear layer's y only for the activations whose derivative reads
     * it). */
    bool kept;
    /* One of the trailing entries given once per repetition (the layers'
     * w_ih, w_hh, b_ih, b_hh; their gradients): see the header. */
    bool repeated;
} fx_op_io;

/* A result's type and shape, as the check gives it. */
typedef struct fx_op_spec {
    bool present;
    fx_dtype dtype;
    int rank;
    int64_t dims[FX_MAX_RANK];
} fx_op_spec;

struct fx_op_desc;

/* One call of an op: its attributes, inputs and results by slot (the
 * description's indices without a repeated group; NULL: absent). The check runs on tensors whose
 * `data` may be NULL (shapes and types only: the check entry of JAX and
 * Fusex.Defn); every check that reads addresses (overlap) skips them. */
typedef struct fx_op_call {
    const struct fx_op_desc *op;
    fx_device *dev; /* where it runs: the inputs' device */
    double attrs[FX_OP_MAX_ATTRS];
    const fx_tensor *in[FX_OP_MAX_IO];
    const fx_tensor *out[FX_OP_MAX_IO];
} fx_op_call;

typedef struct fx_op_desc {
    const char *name;   /* "mingru_fwd": the XLA target is "fusex_mingru_fwd" */
    const char *op;     /* "mingru": the public functions' name */
    const char *family; /* "linrec": docs, the bench and the tests' grouping */
    fx_op_dir dir;
    /* The family's own selector, for hooks its descriptions share
     * (linrec: the fx_linrec_kind). */
    int variant;
    int nattrs, ninputs, nresults;
    const fx_op_attr *attrs;
    const fx_op_io *inputs;
    const fx_op_io *results;
    /* FX_WHEN_RULE entries: whether input (`result` false) or result
     * `index` is present, given the attributes and the inputs before it
     * (all inputs for a result). Fails, with their check's message, where
     * the inputs it reads are malformed (the saved states' count needs
     * valid shapes). */
    int (*present)(const fx_op_call *c, bool result, int index, bool *present, fx_status *st);
    /* Checks the attributes (beyond kind: liquid's dt > 0) and the inputs
     * (shapes, types, devices, limits of c->dev's backend) with the op
     * layer's messages, and fills `results[i]` for every result. */
    int (*check)(const fx_op_call *c, fx_op_spec *results, fx_status *st);
    /* The most scratch bytes `run` asks of `ex` (from shapes alone). */
    size_t (*scratch)(const fx_exec *ex, const fx_op_call *c);
    /* Runs the op layer's `_into` function on the call's tensors (it
     * checks again: inputs and the caller's results). */
    int (*run)(const fx_exec *ex, const fx_op_call *c, fx_status *st);
    /* A forward's backward ("mingru_bwd"), or NULL. */
    const char *backward;
    /* The public functions' options, in the order their messages list
     * them (NULL-terminated; NULL: none). Each names an FX_IO_OPTION input
     * or an FX_IO_COTANGENT one with a flag (a backward's "dstate"), an
     * FX_ATTR_OPTION attribute (by its `option` name where it has one), or
     * "save_for_backward" (a forward with a backward). An input and a
     * number attribute may share a name (liquid's dt: a tensor or a
     * number). An option attribute left out is XLA's only (a step's
     * reverse: taken, of no effect), at its default elsewhere. */
    const char *const *options;
    /* A forward with a backward: what its contexts are called in messages
     * ("ctx: expected a context saved by fusex:mingru, got ..."); NULL:
     * `op`. */
    const char *saved_by;
    /* A forward with an FX_ATTR_SAVE attribute: whether a training forward
     * on `dev` sets it, i.e. whether the backward there reads what it
     * saves (the CPU's recomputes: fx_ssm_ops.reads_saved). NULL: always.
     * XLA programs set the attribute themselves. */
    bool (*saves_on)(const fx_device *dev);
    /* Not an XLA target (the linear layers: inside XLA programs XLA's own
     * products are the right ones): priv/fusex_xla.so neither registers
     * nor describes it. The registry lists such ops after every XLA
     * target, so the XLA library's ops are the registry's first
     * fx_op_xla_count(), by the same indices. */
    bool no_xla;
} fx_op_desc;

/* ---- the registry ---- */
int fx_op_count(void);
/* How many of the first descriptions are XLA targets (all but the
 * trailing `no_xla` ones). */
int fx_op_xla_count(void);
const fx_op_desc *fx_op_at(int index);      /* NULL past the last */
const fx_op_desc *fx_op_find(const char *name); /* NULL when unknown */
/* Indices by name; -1 when the description has none. */
int fx_op_attr_index(const fx_op_desc *d, const char *name);
int fx_op_input_index(const fx_op_desc *d, const char *name);
int fx_op_result_index(const fx_op_desc *d, const char *name);
/* The attribute that announces input / result `index` (FX_WHEN_FLAG), or
 * -1: fx_op_attr_index of its flag, looked up once. */
int fx_op_input_flag(const fx_op_desc *d, int index);
int fx_op_result_flag(const fx_op_desc *d, int index);
/* A step's state result `index` ("new_" + S): the input S it updates, or
 * -1 where the result is no state. */
int fx_op_state_input(const fx_op_desc *d, int result);
/* ---- repeated groups and slots (see the header) ---- */
/* The repeated group among the inputs (`result` false) or results: its
 * size (0: none) and its first entry's index. */
int fx_op_group(const fx_op_desc *d, bool result, int *first);
/* The FX_ATTR_REPEAT attribute's index, or -1. */
int fx_op_repeat_attr(const fx_op_desc *d);
/* The most repetitions a call may have (the slots of every description of
 * its op within FX_OP_MAX_IO: a forward takes what its backward takes);
 * 1 without a group. */
int fx_op_max_repeats(const fx_op_desc *d);
/* The call's repetitions: its FX_ATTR_REPEAT value where valid (an
 * integer 1 .. fx_op_max_repeats), else 1 (fx_op_check refuses it). */
int fx_op_repeats(const fx_op_call *c);
/* How many input / result slots a call with `repeats` repetitions has. */
int fx_op_slot_count(const fx_op_desc *d, bool result, int repeats);
/* The entry (description index) of a slot, and its repetition (0 for an
 * entry outside the group); -1 past the last slot. */
int fx_op_slot_entry(const fx_op_desc *d, bool result, int slot, int *rep);
/* The slot of entry `index` in repetition `rep` (rep ignored outside the
 * group). */
int fx_op_slot_of(const fx_op_desc *d, bool result, int index, int rep);
/* A slot's name in messages: "x", "layers[1].w_hh". */
void fx_op_slot_name(const fx_op_desc *d, bool result, int slot, char *out, size_t len);
/* A call's result slots: fx_op_slot_count for its repetitions. */
int fx_op_call_results(const fx_op_call *c);
/* The description's place in the registry (fx_op_at(i) == d), or -1. */
int fx_op_index(const fx_op_desc *d);
/* An attribute's names (FX_ATTR_FLAG with two, FX_ATTR_ENUM): how many
 * (0 for a boolean or a number), the index of `name` (-1: none of them),
 * and the names as a list for messages, "none, relu, gelu or silu" (`sep`
 * between all but the last two, " or " before the last). */
int fx_op_choice_count(const fx_op_attr *a);
int fx_op_choice_index(const fx_op_attr *a, const char *name);
void fx_op_choice_list(const fx_op_attr *a, const char *sep, char *out, size_t len);
/* An enum's value is an index of its choices; where not, the message
 * every surface gives ("activation: expected 0 to 1 (none or silu), got
 * 2"; `got` as the surface writes the value). */
bool fx_op_enum_valid(const fx_op_attr *a, double v);
int fx_op_enum_error(const fx_op_attr *a, const char *got, fx_status *st);
/* Every description follows the conventions above and names only what it
 * has (flags, options, its backward, gradient and cotangent names, counts
 * within FX_OP_MAX_*); else the first fault, named. For the tests. */
int fx_op_registry_check(fx_status *st);

/* ---- calls ---- */
/* A call with every attribute at its default and no tensors. */
void fx_op_call_init(fx_op_call *c, const fx_op_desc *d, fx_device *dev);
/* Whether input / result `index` is present for the call's attributes
 * (and, for rules, its inputs so far: a rule fails where they are
 * malformed, with their check's message). */
int fx_op_input_present(const fx_op_call *c, int index, bool *present, fx_status *st);
int fx_op_result_present(const fx_op_call *c, int index, bool *present, fx_status *st);
/* The flags are 0 or 1, the enums an index of their choices (numbers
 * are the description's check's: liquid's dt says "a positive number"),
 * every input that should be present is and
 * no other (an FX_IO_SAVED input with a rule may be missing: the check
 * says whether the device's backward reads it), then the description's
 * check: the results' specs (the first nresults entries), `present` for
 * each. Works on tensors whose
 * `data` is NULL (shapes and types only). */
int fx_op_check(const fx_op_call *c, fx_op_spec results[FX_OP_MAX_IO], fx_status *st);
/* The repeat attribute (where the description has one) is an integer from
 * 1 to fx_op_max_repeats: what fx_op_check checks first, for a binder
 * that must know the slots before it takes the tensors. */
int fx_op_check_repeats(const fx_op_call *c, fx_status *st);
/* Check, then run into results the caller allocated (c->out: each present
 * result, NULL for the others) on `ex` (NULL: the device's own context).
 * A step updates c->out[new_state] in place, reading it as the state
 * before the step: a caller passes the state itself (fx_op_run does) or
 * a copy of it (the XLA binder). */
int fx_op_run_into(const fx_exec *ex, const fx_op_call *c, fx_status *st);
/* The most scratch bytes fx_op_run_into asks of `ex` for this call (a
 * checked one), from shapes alone; SIZE_MAX where that does not fit. */
size_t fx_op_scratch(const fx_exec *ex, const fx_op_call *c);
/* Check, allocate every present result on c->dev (outs[i], each owning
 * its buffer; zeroed where absent), set c->out to them, run on the
 * device's own context. On failure nothing is left allocated. A step's
 * "new_state" is not allocated: c->out[new_state] is c->in[state],
 * updated in place (outs[new_state] stays zeroed). */
int fx_op_run(fx_op_call *c, fx_tensor outs[FX_OP_MAX_IO], fx_status *st);

/* ---- contexts: what a forward keeps for its backward ---- */
/* References to the forward's inputs and to its `kept` results, and its
 * attributes. A forward with a backward only; its tensors must be fusex
 * buffers (each kept by a reference: the memory stays while the context
 * does, whatever the caller frees). */
typedef struct fx_op_ctx fx_op_ctx;
/* From a forward that ran (fwd->out: its results). */
int fx_op_ctx_new(const fx_op_call *fwd, fx_op_ctx **ctx, fx_status *st);
void fx_op_ctx_free(fx_op_ctx *ctx);
const fx_op_desc *fx_op_ctx_op(const fx_op_ctx *ctx);
/* Device bytes the context holds that the caller does not see: its kept
 * FX_IO_SAVED results (the selective scan's saved states), not the inputs
 * nor a result the caller also got (linrec's h). */
size_t fx_op_ctx_saved_bytes(const fx_op_ctx *ctx);
/* The backward's call from a context: its FX_IO_FORWARD and FX_IO_SAVED
 * inputs and its attributes taken from the forward, the cotangents given
 * by name (cotangents[i] for the backward's input i; NULL: not given),
 * presence flags set from what is given. */
int fx_op_ctx_backward(const fx_op_ctx *ctx, const fx_tensor *const cotangents[FX_OP_MAX_IO], fx_op_call *bwd,
                       fx_status *st);

/* ---- descriptions as data, for the surfaces ---- */
/* The description as a JSON object (fusex_jax reads it through
 * priv/fusex_xla.so), on one line, keys in this order:
 *   {"index": 3, "name": "linear_scan_fwd", "op": "linear_scan",
 *    "family": "linrec", "dir": "fwd" | "bwd" | "step",
 *    "target": "fusex_linear_scan_fwd",
 *    "attrs": [{"name", "kind": "flag" | "number" | "enum",
 *               "role": "option" | "presence" | "save" | "repeat", "default": 0,
 *               "option": null | "candidate_activation",
 *               "choices": null | ["identity", "g"] | ["none", "silu"],
 *               "positive": false}],
 *    "inputs": [{"name", "layout", "role": "arg" | "option" | "state" |
 *                "forward" | "saved" | "cotangent" | "output" | "grad",
 *                "presence": "always" | "flag" | "rule", "flag": null | "has_h0",
 *                "kept": false, "repeated": false}],
 *    "results": [the same],
 *    "options": ["h0", "return_state", ...],
 *    "backward": null | "linear_scan_bwd", "saved_by": "fusex:linear_scan"}
 * ("saved_by" is null where the op has no backward; "target" null where
 * it is no XLA target; an enum's "default" is an index). Writes at most `len`
 * bytes (NUL included; cut where it does not fit); returns the length it
 * needs, NUL excluded. */
size_t fx_op_describe_json(const fx_op_desc *d, char *out, size_t len);
/* The element types by code (fx_dtype) as a JSON list of Nx-less short
 * names: ["f32", "f64", "bf16", "f16", "s32", "s64", "u8"]; as above. */
size_t fx_op_dtypes_json(char *out, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* FX_CORE_OP_H */
