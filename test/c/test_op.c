/* The op layer's descriptions (core/op.h), over every described op alike:
 * the registry and its own consistency check, the generic check on shapes
 * alone against the same check on real tensors and against a real run
 * (the same specs, the same messages), every op on an arena of exactly
 * the scratch it says it needs, the context a forward keeps for its
 * backward, and the JSON. Inputs are made from the descriptions' layouts
 * ("[batch, seqlen, dim]"), so a new family's descriptions are tested
 * here as they are added. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/linear.h"
#include "core/linrec.h"
#include "core/op.h"
#include "core/ops.h"
#include "fusex_dtype.h"
#include "testutil.h"

/* The sizes the layouts' names stand for: a sequence long enough for the
 * selective scan to save states (seqlen 37: two chunks after the first),
 * a convolution of width 4, a linear layer 6 -> 5, one RNN layer of input
 * 3, "..." two axes. */
static const fx_test_size size_names[] = {{"batch", 2}, {"seqlen", 37}, {"dim", 8},      {"dstate", 4}, {"hidden", 5},
                                          {"width", 4}, {"width - 1", 3}, {"in", 6}, {"out", 5},
                                          {"input", 3}, {"layers", 1}};
static const int64_t leading[] = {3, 7};
static const fx_test_sizes sizes = {size_names, (int)(sizeof size_names / sizeof size_names[0]), leading, 2};

static int parse_layout(const char *layout, int64_t *dims) { return fx_test_layout(layout, &sizes, dims); }

static void make_tensor(fx_device *dev, fx_dtype type, int rank, const int64_t *dims, fx_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= dims[i];
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    fx_fill_uniform(v, n, -0.5, 0.5);
    fx_test_tensor(dev, type, rank, dims, v, t);
    free(v);
}

static void make_from_layout(fx_device *dev, const char *layout, fx_tensor *t)
{
    int64_t dims[FX_MAX_RANK];
    make_tensor(dev, FX_F32, parse_layout(layout, dims), dims, t);
}

static void make_from_spec(fx_device *dev, const fx_op_spec *s, fx_tensor *t)
{
    make_tensor(dev, s->dtype, s->rank, s->dims, t);
}

/* A tensor's shape and type without its memory. */
static fx_tensor shape_of(const fx_tensor *t)
{
    fx_tensor s = *t;
    s.data = NULL;
    s.buffer = NULL;
    return s;
}

/* ---- calls made from the descriptions ---- */

typedef struct made {
    fx_op_call call;
    fx_tensor in[FX_OP_MAX_IO];
} made;

static void made_release(made *m)
{
    for (int i = 0; i < FX_OP_MAX_IO; i++)
        fx_tensor_release(&m->in[i]);
}

/* The most choices of an op's enums (1 where it has none). */
static int most_choices(const fx_op_desc *d)
{
    int n = 1;
    for (int a = 0; a < d->nattrs; a++)
        if (d->attrs[a].kind == FX_ATTR_ENUM && fx_op_choice_count(&d->attrs[a]) > n)
            n = fx_op_choice_count(&d->attrs[a]);
    return n;
}

/* A forward or a step with every optional input given and every option
 * flag set (the choices' second), each enum at its choice `choice` (its
 * last where it has fewer), numbers at their defaults; a forward keeps
 * what its backward on `dev` reads. */
static void make_call_with(fx_device *dev, const fx_op_desc *d, int choice, made *m)
{
    memset(m, 0, sizeof *m);
    fx_op_call_init(&m->call, d, dev);
    for (int a = 0; a < d->nattrs; a++)
        if (d->attrs[a].kind == FX_ATTR_FLAG)
            m->call.attrs[a] = d->attrs[a].role == FX_ATTR_SAVE ? (!d->saves_on || d->saves_on(dev)) : 1;
        else if (d->attrs[a].kind == FX_ATTR_ENUM)
            m->call.attrs[a] = choice < fx_op_choice_count(&d->attrs[a]) ? choice
                                                                          : fx_op_choice_count(&d->attrs[a]) - 1;
    for (int i = 0; i < d->ninputs; i++) {
        make_from_layout(dev, d->inputs[i].layout, &m->in[i]);
        m->call.in[i] = &m->in[i];
    }
}

static void make_call(fx_device *dev, const fx_op_desc *d, made *m) { make_call_with(dev, d, INT32_MAX, m); }

/* The ops' results as the check gives them equal what a run allocates. */
static void expect_specs_are_results(const fx_op_desc *d, const fx_op_spec *specs, const fx_op_call *run)
{
    for (int r = 0; r < d->nresults; r++) {
        ck_assert_msg(specs[r].present == (run->out[r] != NULL), "%s: %s present", d->name, d->results[r].name);
        if (!specs[r].present)
            continue;
        const fx_tensor *t = run->out[r];
        ck_assert_msg(t->dtype == specs[r].dtype && t->rank == specs[r].rank &&
                          memcmp(t->dims, specs[r].dims, sizeof(int64_t) * (size_t)t->rank) == 0,
                      "%s: %s as the check said", d->name, d->results[r].name);
    }
}

/* The check on shapes alone gives the same specs as on the tensors. */
static void expect_shape_only_check(const fx_op_call *c, const fx_op_spec *want)
{
    fx_op_call q = *c;
    fx_tensor shapes[FX_OP_MAX_IO];
    for (int i = 0; i < c->op->ninputs; i++)
        if (c->in[i]) {
            shapes[i] = shape_of(c->in[i]);
            q.in[i] = &shapes[i];
        }
    fx_op_spec got[FX_OP_MAX_IO];
    fx_status st;
    fx_status_clear(&st);
    fx_op_check(&q, got, &st);
    ck_assert_msg(st.code == FX_OK, "%s on shapes alone: %s", c->op->name, st.msg);
    for (int r = 0; r < c->op->nresults; r++)
        ck_assert_msg(got[r].present == want[r].present && (!got[r].present || (got[r].dtype == want[r].dtype &&
                                                                               got[r].rank == want[r].rank)),
                      "%s: %s on shapes alone", c->op->name, c->op->results[r].name);
}

/* Runs `c` on an arena of exactly the scratch fx_op_scratch asks for:
 * too little would fail the run. */
static void run_on_exact_scratch(fx_op_call *c, fx_tensor outs[FX_OP_MAX_IO])
{
    fx_device *dev = c->dev;
    fx_status st;
    fx_status_clear(&st);
    fx_op_spec specs[FX_OP_MAX_IO];
    ck_assert_int_eq(fx_op_check(c, specs, &st), FX_OK);
    memset(outs, 0, sizeof(fx_tensor) * FX_OP_MAX_IO);
    for (int r = 0; r < c->op->nresults; r++)
        if (specs[r].present && c->op->results[r].role != FX_IO_STATE) {
            fx_test_poisoned(dev, specs[r].dtype, specs[r].rank, specs[r].dims, &outs[r]);
            c->out[r] = &outs[r];
        } else if (specs[r].present) {
            c->out[r] = c->in[fx_op_state_input(c->op, r)];
        }
    fx_exec ex;
    ck_assert_int_eq(dev->backend->exec_default(dev->ordinal, &ex, &st), FX_OK);
    size_t bytes = fx_op_scratch(&ex, c);
    fx_tensor memory = {0};
    int64_t mdims[1] = {(int64_t)(bytes ? bytes : 1)};
    fx_test_poisoned(dev, FX_U8, 1, mdims, &memory);
    fx_scratch_arena arena = {.base = memory.data, .size = bytes, .used = 0};
    ex.scratch = fx_scratch_arena_use(&arena);
    fx_op_run_into(&ex, c, &st);
    ck_assert_msg(st.code == FX_OK, "%s on %zu bytes of scratch: %s", c->op->name, bytes, st.msg);
    ck_assert_int_eq(fx_op_synchronize(dev, &st), FX_OK);
    fx_tensor_release(&memory);
}

/* Every forward with its backward through the context, every step, with
 * each of its enums' choices: the check's specs are the run's results, on
 * shapes alone too, each on its exact scratch. */
static void runs_as_described(fx_device *dev, const fx_op_desc *d, int choice)
{
    fx_status st;
    fx_status_clear(&st);
    made m;
    make_call_with(dev, d, choice, &m);
    fx_op_spec specs[FX_OP_MAX_IO];
    ck_assert_msg(fx_op_check(&m.call, specs, &st) == FX_OK, "%s: %s", d->name, st.msg);
    expect_shape_only_check(&m.call, specs);
    fx_tensor outs[FX_OP_MAX_IO], exact[FX_OP_MAX_IO];
    fx_op_call run = m.call;
    ck_assert_msg(fx_op_run(&run, outs, &st) == FX_OK, "%s: %s", d->name, st.msg);
    expect_specs_are_results(d, specs, &run);
    fx_op_call on_arena = m.call;
    run_on_exact_scratch(&on_arena, exact);
    for (int r = 0; r < FX_OP_MAX_IO; r++)
        fx_tensor_release(&exact[r]);
    if (d->backward) {
        fx_op_ctx *ctx;
        ck_assert_int_eq(fx_op_ctx_new(&run, &ctx, &st), FX_OK);
        const fx_op_desc *b = fx_op_find(d->backward);
        /* The cotangents, like the results they belong to. */
        fx_tensor cot[FX_OP_MAX_IO] = {{0}};
        const fx_tensor *cotangents[FX_OP_MAX_IO] = {0};
        for (int i = 0; i < b->ninputs; i++)
            if (b->inputs[i].role == FX_IO_COTANGENT) {
                int r = fx_op_result_index(d, b->inputs[i].name + 1);
                make_from_spec(dev, &specs[r], &cot[i]);
                cotangents[i] = &cot[i];
            }
        made_release(&m); /* the context keeps its own references */
        fx_op_call bwd;
        ck_assert_int_eq(fx_op_ctx_backward(ctx, cotangents, &bwd, &st), FX_OK);
        fx_op_spec bspecs[FX_OP_MAX_IO];
        ck_assert_msg(fx_op_check(&bwd, bspecs, &st) == FX_OK, "%s: %s", b->name, st.msg);
        expect_shape_only_check(&bwd, bspecs);
        fx_tensor grads[FX_OP_MAX_IO];
        fx_op_call brun = bwd;
        ck_assert_msg(fx_op_run(&brun, grads, &st) == FX_OK, "%s: %s", b->name, st.msg);
        expect_specs_are_results(b, bspecs, &brun);
        for (int r = 0; r < b->nresults; r++) /* every input given has its gradient */
            ck_assert_msg(brun.out[r] != NULL, "%s: %s", b->name, b->results[r].name);
        run_on_exact_scratch(&bwd, exact);
        for (int r = 0; r < FX_OP_MAX_IO; r++) {
            fx_tensor_release(&exact[r]);
            fx_tensor_release(&grads[r]);
            fx_tensor_release(&cot[r]);
        }
        fx_op_ctx_free(ctx);
    }
    for (int r = 0; r < FX_OP_MAX_IO; r++)
        fx_tensor_release(&outs[r]);
    made_release(&m);
}

START_TEST(every_op_runs_as_described)
{
    fx_device *dev = fx_test_device();
    const fx_op_desc *d = fx_op_at(_i);
    if (d->dir == FX_OP_BWD)
        return; /* run from its forward's context */
    for (int choice = 0; choice < most_choices(d); choice++)
        runs_as_described(dev, d, choice);
}
END_TEST

/* One wrong input at a time (its type, then one axis longer, then one
 * axis fewer): the check on shapes alone refuses it with the message of
 * the check on the tensors, which is the run's. */
START_TEST(messages_on_shapes_alone_are_the_runs)
{
    fx_device *dev = fx_test_device();
    const fx_op_desc *d = fx_op_at(_i);
    if (d->dir == FX_OP_BWD)
        return; /* its inputs come from a forward; the XLA test covers its messages */
    int refused = 0;
    for (int i = 0; i < d->ninputs; i++)
        for (int how = 0; how < 3; how++) {
            made m;
            make_call(dev, d, &m);
            fx_tensor bad;
            int64_t dims[FX_MAX_RANK];
            int rank = m.in[i].rank;
            memcpy(dims, m.in[i].dims, sizeof dims);
            fx_dtype type = how == 0 ? FX_S32 : FX_F32;
            if (how == 1)
                dims[rank - 1] += 1;
            if (how == 2 && rank > 1)
                rank--;
            make_tensor(dev, type, rank, dims, &bad);
            m.call.in[i] = &bad;
            fx_status real, shapes, ran;
            fx_status_clear(&real);
            fx_status_clear(&shapes);
            fx_status_clear(&ran);
            fx_op_spec specs[FX_OP_MAX_IO];
            fx_op_check(&m.call, specs, &real);
            fx_op_call q = m.call;
            fx_tensor shape_only_in[FX_OP_MAX_IO];
            for (int k = 0; k < d->ninputs; k++) {
                shape_only_in[k] = shape_of(m.call.in[k]);
                q.in[k] = &shape_only_in[k];
            }
            fx_op_check(&q, specs, &shapes);
            fx_tensor outs[FX_OP_MAX_IO];
            fx_op_call run = m.call;
            fx_op_run(&run, outs, &ran);
            ck_assert_msg(shapes.code == real.code && strcmp(shapes.msg, real.msg) == 0,
                          "%s, input %s (%d): on shapes alone %d \"%s\", on tensors %d \"%s\"", d->name,
                          d->inputs[i].name, how, shapes.code, shapes.msg, real.code, real.msg);
            ck_assert_msg(ran.code == real.code && strcmp(ran.msg, real.msg) == 0,
                          "%s, input %s (%d): run %d \"%s\", check %d \"%s\"", d->name, d->inputs[i].name, how,
                          ran.code, ran.msg, real.code, real.msg);
            refused += real.code == FX_EBADARG;
            for (int r = 0; r < FX_OP_MAX_IO; r++)
                fx_tensor_release(&outs[r]);
            fx_tensor_release(&bad);
            made_release(&m);
        }
    ck_assert_msg(refused > d->ninputs, "%s: only %d wrong inputs refused", d->name, refused);
}
END_TEST

START_TEST(the_registry_is_consistent)
{
    fx_status st;
    fx_status_clear(&st);
    ck_assert_msg(fx_op_registry_check(&st) == FX_OK, "%s", st.msg);
    /* docs/XLA.md's order: each op's forward, backward and step; the ops
     * that are no XLA targets last */
    static const char *const names[] = {
        "selective_scan_fwd", "selective_scan_bwd", "selective_scan_step", "linear_scan_fwd", "linear_scan_bwd",
        "linear_scan_step",   "mingru_fwd",         "mingru_bwd",          "mingru_step",     "minlstm_fwd",
        "minlstm_bwd",        "minlstm_step",       "liquid_fwd",          "liquid_bwd",      "liquid_step",
        "causal_conv1d_fwd",  "causal_conv1d_bwd",  "causal_conv1d_step",  "rms_norm_fwd",    "rms_norm_bwd",
        "layer_norm_fwd",     "layer_norm_bwd",     "gru_fwd",             "gru_bwd",         "gru_step",
        "lstm_fwd",           "lstm_bwd",           "lstm_step",           "linear_fwd",      "linear_bwd"};
    const int count = (int)(sizeof names / sizeof names[0]);
    ck_assert_int_eq(fx_op_count(), count);
    ck_assert_int_eq(fx_op_xla_count(), count - 2);
    for (int i = 0; i < fx_op_count(); i++) {
        const fx_op_desc *d = fx_op_at(i);
        ck_assert_str_eq(d->name, names[i]);
        ck_assert_ptr_eq(fx_op_find(names[i]), d);
        ck_assert_int_eq(fx_op_index(d), i);
        const char *dir = strrchr(names[i], '_') + 1;
        ck_assert_int_eq((int)d->dir, strcmp(dir, "fwd") == 0 ? FX_OP_FWD : strcmp(dir, "bwd") == 0 ? FX_OP_BWD
                                                                                                     : FX_OP_STEP);
        ck_assert(d->no_xla == (i >= fx_op_xla_count()));
    }
    ck_assert_ptr_null(fx_op_at(fx_op_count()));
    ck_assert_ptr_null(fx_op_at(-1));
    ck_assert_ptr_null(fx_op_find("mingru"));
    const fx_op_desc *d = fx_op_find("liquid_fwd");
    ck_assert_int_eq(fx_op_attr_index(d, "dt"), 4);
    ck_assert_int_eq(fx_op_input_index(d, "dt"), 3);
    ck_assert_int_eq(fx_op_result_index(d, "state"), 1);
    ck_assert_int_eq(fx_op_attr_index(d, "candidate_g"), -1);
}
END_TEST

/* The attributes, operands and results in docs/XLA.md's order. */
static void expect_names(const char *op, const char *what, const char *want)
{
    const fx_op_desc *d = fx_op_find(op);
    char got[512] = "";
    size_t used = 0;
    int n = strcmp(what, "attrs") == 0 ? d->nattrs : strcmp(what, "inputs") == 0 ? d->ninputs : d->nresults;
    for (int i = 0; i < n; i++) {
        const char *name = strcmp(what, "attrs") == 0    ? d->attrs[i].name
                           : strcmp(what, "inputs") == 0 ? d->inputs[i].name
                                                         : d->results[i].name;
        used += (size_t)snprintf(got + used, sizeof got - used, "%s%s", i ? " " : "", name);
    }
    ck_assert_msg(strcmp(got, want) == 0, "%s %s: \"%s\", expected \"%s\"", op, what, got, want);
}

START_TEST(the_xla_contract)
{
    expect_names("selective_scan_fwd", "attrs", "dt_softplus has_d has_z has_dt_bias has_h0 return_state save");
    expect_names("selective_scan_fwd", "inputs", "x dt a b c d z dt_bias h0");
    expect_names("selective_scan_fwd", "results", "y state saved");
    expect_names("selective_scan_bwd", "attrs", "dt_softplus has_d has_z has_dt_bias has_h0 has_dstate");
    expect_names("selective_scan_bwd", "inputs", "x dt a b c d z dt_bias h0 saved dy dstate");
    expect_names("selective_scan_bwd", "results", "dx ddt da db dc dd dz ddt_bias dh0");
    expect_names("selective_scan_step", "attrs", "dt_softplus has_d has_z has_dt_bias");
    expect_names("selective_scan_step", "inputs", "state x dt a b c d z dt_bias");
    expect_names("selective_scan_step", "results", "y new_state");
    expect_names("linear_scan_fwd", "attrs", "reverse has_h0 return_state");
    expect_names("mingru_fwd", "attrs", "reverse candidate_g has_h0 return_state");
    expect_names("minlstm_bwd", "attrs", "reverse candidate_g has_h0 has_dstate");
    expect_names("liquid_fwd", "attrs", "reverse has_dt has_h0 return_state dt");
    expect_names("liquid_fwd", "inputs", "f_logits tau a dt h0");
    expect_names("liquid_bwd", "inputs", "f_logits tau a dt h0 h dh dstate");
    expect_names("liquid_bwd", "results", "df_logits dtau da ddt dh0");
    expect_names("liquid_step", "attrs", "reverse has_dt dt");
    expect_names("liquid_step", "inputs", "state f_logits tau a dt");
    expect_names("minlstm_step", "inputs", "state f_logits i_logits cand");
    expect_names("mingru_step", "results", "h new_state");
    expect_names("causal_conv1d_fwd", "attrs", "activation has_bias has_initial_state return_state");
    expect_names("causal_conv1d_fwd", "inputs", "x w bias initial_state");
    expect_names("causal_conv1d_fwd", "results", "y final_state");
    expect_names("causal_conv1d_bwd", "attrs", "activation has_bias has_initial_state has_dfinal_state");
    expect_names("causal_conv1d_bwd", "inputs", "x w bias initial_state dy dfinal_state");
    expect_names("causal_conv1d_bwd", "results", "dx dw dbias dinitial_state");
    expect_names("causal_conv1d_step", "attrs", "activation has_bias");
    expect_names("causal_conv1d_step", "inputs", "state x w bias");
    expect_names("causal_conv1d_step", "results", "y new_state");
    expect_names("rms_norm_fwd", "attrs", "eps residual_in_f32 has_bias has_residual has_gate save");
    expect_names("rms_norm_fwd", "inputs", "x weight bias residual gate");
    expect_names("rms_norm_fwd", "results", "y s rstd");
    expect_names("rms_norm_bwd", "attrs", "eps residual_in_f32 has_bias has_residual has_gate has_ds");
    expect_names("rms_norm_bwd", "inputs", "x weight bias residual gate s rstd dy ds");
    expect_names("rms_norm_bwd", "results", "dx dweight dbias dresidual dgate");
    expect_names("layer_norm_fwd", "attrs", "eps residual_in_f32 has_residual has_gate save");
    expect_names("layer_norm_fwd", "inputs", "x weight bias residual gate");
    expect_names("layer_norm_fwd", "results", "y s mean rstd");
    expect_names("layer_norm_bwd", "attrs", "eps residual_in_f32 has_residual has_gate has_ds");
    expect_names("layer_norm_bwd", "inputs", "x weight bias residual gate s mean rstd dy ds");
    expect_names("layer_norm_bwd", "results", "dx dweight dbias dresidual dgate");
    expect_names("linear_fwd", "attrs", "activation allow_tf32 has_bias save");
    expect_names("linear_fwd", "inputs", "x w bias");
    expect_names("linear_fwd", "results", "y pre");
    expect_names("linear_bwd", "inputs", "x w bias y pre dy");
    expect_names("linear_bwd", "results", "dx dw dbias");
}
END_TEST

START_TEST(the_json)
{
    const fx_op_desc *d = fx_op_find("linear_scan_fwd");
    const char *want =
        "{\"index\": 3, \"name\": \"linear_scan_fwd\", \"op\": \"linear_scan\", \"family\": \"linrec\", "
        "\"dir\": \"fwd\", \"target\": \"fusex_linear_scan_fwd\", \"attrs\": ["
        "{\"name\": \"reverse\", \"kind\": \"flag\", \"role\": \"option\", \"default\": 0, \"option\": null, "
        "\"choices\": null, \"positive\": false}, "
        "{\"name\": \"has_h0\", \"kind\": \"flag\", \"role\": \"presence\", \"default\": 0, \"option\": null, "
        "\"choices\": null, \"positive\": false}, "
        "{\"name\": \"return_state\", \"kind\": \"flag\", \"role\": \"option\", \"default\": 0, \"option\": null, "
        "\"choices\": null, \"positive\": false}], "
        "\"inputs\": ["
        "{\"name\": \"a\", \"layout\": \"[batch, seqlen, hidden]\", \"role\": \"arg\", \"presence\": \"always\", "
        "\"flag\": null, \"kept\": false, \"repeated\": false}, "
        "{\"name\": \"b\", \"layout\": \"[batch, seqlen, hidden]\", \"role\": \"arg\", \"presence\": \"always\", "
        "\"flag\": null, \"kept\": false, \"repeated\": false}, "
        "{\"name\": \"h0\", \"layout\": \"[batch, hidden]\", \"role\": \"option\", \"presence\": \"flag\", "
        "\"flag\": \"has_h0\", \"kept\": false, \"repeated\": false}], "
        "\"results\": ["
        "{\"name\": \"h\", \"layout\": \"[batch, seqlen, hidden]\", \"role\": \"output\", \"presence\": \"always\", "
        "\"flag\": null, \"kept\": true, \"repeated\": false}, "
        "{\"name\": \"state\", \"layout\": \"[batch, hidden]\", \"role\": \"output\", \"presence\": \"flag\", "
        "\"flag\": \"return_state\", \"kept\": false, \"repeated\": false}], "
        "\"options\": [\"h0\", \"return_state\", \"reverse\", \"save_for_backward\"], "
        "\"backward\": \"linear_scan_bwd\", \"saved_by\": \"fusex:linear_scan\"}";
    char out[4096];
    size_t need = fx_op_describe_json(d, NULL, 0);
    ck_assert_uint_eq(need, strlen(want));
    ck_assert_uint_eq(fx_op_describe_json(d, out, sizeof out), need);
    ck_assert_str_eq(out, want);
    /* cut to fit, always terminated */
    ck_assert_uint_eq(fx_op_describe_json(d, out, 10), need);
    ck_assert_str_eq(out, "{\"index\":");
    /* a number attribute, choices and a step without a backward */
    fx_op_describe_json(fx_op_find("liquid_step"), out, sizeof out);
    ck_assert_ptr_nonnull(strstr(out, "{\"name\": \"dt\", \"kind\": \"number\", \"role\": \"option\", \"default\": 1, "
                                      "\"option\": null, \"choices\": null, \"positive\": true}"));
    ck_assert_ptr_nonnull(strstr(out, "\"options\": [\"dt\"], \"backward\": null, \"saved_by\": null}"));
    fx_op_describe_json(fx_op_find("mingru_bwd"), out, sizeof out);
    ck_assert_ptr_nonnull(strstr(out, "\"option\": \"candidate_activation\", \"choices\": [\"identity\", \"g\"]"));
    ck_assert_ptr_nonnull(strstr(out, "\"role\": \"saved\""));
    /* an enum: its choices by index, the default an index */
    fx_op_describe_json(fx_op_find("causal_conv1d_fwd"), out, sizeof out);
    ck_assert_ptr_nonnull(strstr(out, "{\"name\": \"activation\", \"kind\": \"enum\", \"role\": \"option\", "
                                      "\"default\": 0, \"option\": null, \"choices\": [\"none\", \"silu\"], "
                                      "\"positive\": false}"));
    ck_assert_ptr_nonnull(strstr(out, "\"target\": \"fusex_causal_conv1d_fwd\""));
    fx_op_describe_json(fx_op_find("rms_norm_fwd"), out, sizeof out);
    ck_assert_ptr_nonnull(strstr(out, "{\"name\": \"eps\", \"kind\": \"number\", \"role\": \"option\", "
                                      "\"default\": 1.0000000000000001e-05, "));
    /* no XLA target */
    fx_op_describe_json(fx_op_find("linear_fwd"), out, sizeof out);
    ck_assert_ptr_nonnull(strstr(out, "\"dir\": \"fwd\", \"target\": null, \"attrs\": [{\"name\": \"activation\", "
                                      "\"kind\": \"enum\", \"role\": \"option\", \"default\": 0, \"option\": null, "
                                      "\"choices\": [\"none\", \"relu\", \"gelu\", \"silu\", \"tanh\", \"sigmoid\"]"));
    ck_assert_uint_eq(fx_op_dtypes_json(out, sizeof out), strlen(out));
    ck_assert_str_eq(out, "[\"f32\", \"f64\", \"bf16\", \"f16\", \"s32\", \"s64\", \"u8\"]");
}
END_TEST

/* A forward's context holds its inputs and kept results (references, no
 * copies); its backward equals the family's own on the same tensors. */
START_TEST(a_context_keeps_the_forwards_tensors)
{
    fx_device *dev = fx_test_device();
    const fx_op_desc *d = fx_op_find("mingru_fwd");
    fx_status st;
    fx_status_clear(&st);
    made m;
    make_call(dev, d, &m);
    fx_tensor outs[FX_OP_MAX_IO];
    ck_assert_int_eq(fx_op_run(&m.call, outs, &st), FX_OK);
    fx_op_ctx *ctx;
    ck_assert_int_eq(fx_op_ctx_new(&m.call, &ctx, &st), FX_OK);
    ck_assert_ptr_eq(fx_op_ctx_op(ctx), d);
    ck_assert_uint_eq(fx_op_ctx_saved_bytes(ctx), 0); /* h is the caller's too */
    ck_assert_int_eq(atomic_load(&m.in[0].buffer->refs), 2);
    ck_assert_int_eq(atomic_load(&outs[0].buffer->refs), 2);
    /* the family's backward on the same tensors */
    fx_linrec_inputs in = {.kind = FX_LINREC_MINGRU, .seq = {&m.in[0], &m.in[1]}, .h0 = &m.in[2],
                           .candidate_g = true, .reverse = true};
    fx_tensor dh;
    make_tensor(dev, FX_F32, outs[0].rank, outs[0].dims, &dh);
    fx_linrec_grads want;
    ck_assert_int_eq(fx_op_linrec_backward(&in, &outs[0], &dh, NULL, 0, &want, &st), FX_OK);
    made_release(&m);
    fx_tensor_release(&outs[0]);
    fx_tensor_release(&outs[1]);
    const fx_tensor *cotangents[FX_OP_MAX_IO] = {0};
    const fx_op_desc *b = fx_op_find("mingru_bwd");
    cotangents[fx_op_input_index(b, "dh")] = &dh;
    fx_op_call bwd;
    ck_assert_int_eq(fx_op_ctx_backward(ctx, cotangents, &bwd, &st), FX_OK);
    ck_assert(bwd.attrs[fx_op_attr_index(b, "has_h0")] == 1 && bwd.attrs[fx_op_attr_index(b, "has_dstate")] == 0);
    ck_assert(bwd.attrs[fx_op_attr_index(b, "reverse")] == 1 && bwd.attrs[fx_op_attr_index(b, "candidate_g")] == 1);
    fx_tensor grads[FX_OP_MAX_IO];
    ck_assert_int_eq(fx_op_run(&bwd, grads, &st), FX_OK);
    const fx_tensor *mine[] = {&grads[0], &grads[1], &grads[2]}, *theirs[] = {&want.seq[0], &want.seq[1], &want.h0};
    for (int k = 0; k < 3; k++) {
        double *a = fx_test_read(mine[k]), *w = fx_test_read(theirs[k]);
        fx_assert_close(a, w, mine[k]->numel, 0);
        free(a);
        free(w);
    }
    for (int r = 0; r < FX_OP_MAX_IO; r++)
        fx_tensor_release(&grads[r]);
    fx_linrec_tensors_release(&want);
    fx_tensor_release(&dh);
    /* a context is the forward's: a step has none */
    made s;
    make_call(dev, fx_op_find("mingru_step"), &s);
    fx_op_ctx *none = (fx_op_ctx *)&s;
    ck_assert_int_eq(fx_op_ctx_new(&s.call, &none, &st), FX_EINTERNAL);
    ck_assert_ptr_null(none);
    made_release(&s);
    fx_op_ctx_free(ctx);
}
END_TEST

/* An enum's value is an index of its choices; the check says which. */
START_TEST(enums)
{
    fx_device *dev = fx_test_device();
    fx_status st;
    fx_op_spec specs[FX_OP_MAX_IO];
    made m;
    const fx_op_desc *d = fx_op_find("causal_conv1d_fwd");
    make_call(dev, d, &m);
    const int act = fx_op_attr_index(d, "activation");
    ck_assert_int_eq(fx_op_choice_count(&d->attrs[act]), 2);
    ck_assert_int_eq(fx_op_choice_index(&d->attrs[act], "silu"), 1);
    ck_assert_int_eq(fx_op_choice_index(&d->attrs[act], "relu"), -1);
    const double bad[] = {2, -1, 0.5};
    const char *const msgs[] = {"activation: expected 0 to 1 (none or silu), got 2",
                                "activation: expected 0 to 1 (none or silu), got -1",
                                "activation: expected 0 to 1 (none or silu), got 0.5"};
    for (int k = 0; k < 3; k++) {
        m.call.attrs[act] = bad[k];
        fx_status_clear(&st);
        ck_assert_int_eq(fx_op_check(&m.call, specs, &st), FX_EBADARG);
        ck_assert_str_eq(st.msg, msgs[k]);
    }
    made_release(&m);
    const fx_op_desc *lin = fx_op_find("linear_fwd");
    char names[128];
    fx_op_choice_list(&lin->attrs[fx_op_attr_index(lin, "activation")], ", ", names, sizeof names);
    ck_assert_str_eq(names, "none, relu, gelu, silu, tanh or sigmoid");
    ck_assert_int_eq(fx_op_choice_count(&fx_op_find("mingru_fwd")->attrs[1]), 2);
    ck_assert_int_eq(fx_op_choice_count(&fx_op_find("mingru_fwd")->attrs[0]), 0);
}
END_TEST

/* A context keeps a kept result only where the backward reads it: a
 * linear layer's y for relu, its pre-activation (saved) for gelu,
 * neither for none; the backward through it equals the family's own. */
START_TEST(a_context_keeps_what_the_backward_reads)
{
    fx_device *dev = fx_test_device();
    const fx_op_desc *d = fx_op_find("linear_fwd"), *b = fx_op_find("linear_bwd");
    const int acts[] = {FX_ACT_NONE, FX_ACT_RELU, FX_ACT_GELU};
    for (int k = 0; k < 3; k++) {
        fx_status st;
        fx_status_clear(&st);
        made m;
        make_call(dev, d, &m);
        m.call.attrs[fx_op_attr_index(d, "activation")] = acts[k];
        fx_tensor outs[FX_OP_MAX_IO];
        ck_assert_int_eq(fx_op_run(&m.call, outs, &st), FX_OK);
        ck_assert((outs[1].buffer != NULL) == (acts[k] == FX_ACT_GELU)); /* pre: a result where it is read */
        fx_op_ctx *ctx;
        ck_assert_int_eq(fx_op_ctx_new(&m.call, &ctx, &st), FX_OK);
        ck_assert_int_eq(atomic_load(&outs[0].buffer->refs), acts[k] == FX_ACT_RELU ? 2 : 1);
        ck_assert_uint_eq(fx_op_ctx_saved_bytes(ctx), acts[k] == FX_ACT_GELU ? outs[1].nbytes : 0);
        /* the family's own forward and backward on the same tensors */
        fx_linear_inputs in = {.x = &m.in[0], .w = &m.in[1], .bias = &m.in[2], .activation = acts[k],
                               .allow_tf32 = true};
        fx_tensor y;
        fx_linear_ctx *lctx;
        ck_assert_int_eq(fx_op_linear_forward(&in, &y, &lctx, &st), FX_OK);
        fx_tensor dy;
        make_tensor(dev, FX_F32, y.rank, y.dims, &dy);
        fx_linear_grads want;
        ck_assert_int_eq(fx_op_linear_backward(lctx, &dy, &want, &st), FX_OK);
        const fx_tensor *cotangents[FX_OP_MAX_IO] = {0};
        cotangents[fx_op_input_index(b, "dy")] = &dy;
        fx_op_call bwd;
        ck_assert_int_eq(fx_op_ctx_backward(ctx, cotangents, &bwd, &st), FX_OK);
        ck_assert((bwd.in[fx_op_input_index(b, "y")] != NULL) == (acts[k] == FX_ACT_RELU));
        ck_assert((bwd.in[fx_op_input_index(b, "pre")] != NULL) == (acts[k] == FX_ACT_GELU));
        fx_tensor grads[FX_OP_MAX_IO];
        ck_assert_int_eq(fx_op_run(&bwd, grads, &st), FX_OK);
        const fx_tensor *theirs[] = {&want.dx, &want.dw, &want.dbias};
        for (int g = 0; g < 3; g++) {
            double *a = fx_test_read(&grads[g]), *w = fx_test_read(theirs[g]);
            fx_assert_close(a, w, grads[g].numel, 0);
            free(a);
            free(w);
        }
        for (int r = 0; r < FX_OP_MAX_IO; r++) {
            fx_tensor_release(&grads[r]);
            fx_tensor_release(&outs[r]);
        }
        fx_linear_grads_release(&want);
        fx_linear_ctx_free(lctx);
        fx_tensor_release(&y);
        fx_tensor_release(&dy);
        fx_op_ctx_free(ctx);
        made_release(&m);
    }
}
END_TEST

/* The generic checks' own messages: presence and flags. */
START_TEST(presence_and_flags)
{
    fx_device *dev = fx_test_device();
    fx_status st;
    fx_op_spec specs[FX_OP_MAX_IO];
    made m;
    make_call(dev, fx_op_find("linear_scan_fwd"), &m);
    m.call.attrs[1] = 0; /* has_h0 0, h0 given */
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_check(&m.call, specs, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "h0: expected none (has_h0 is 0), got a tensor");
    m.call.attrs[1] = 1;
    m.call.in[2] = NULL;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_check(&m.call, specs, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "h0: expected a tensor (has_h0 is 1), got none");
    m.call.attrs[1] = 0;
    m.call.in[1] = NULL;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_check(&m.call, specs, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "b: expected a tensor, got none");
    m.call.in[1] = &m.in[1];
    m.call.attrs[0] = 2;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_check(&m.call, specs, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "reverse: expected 0 or 1, got 2");
    m.call.attrs[0] = 0;
    /* results the caller gives: each present one, no other */
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_check(&m.call, specs, &st), FX_OK);
    ck_assert(specs[0].present && specs[1].present);
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_run_into(NULL, &m.call, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "h: expected a result tensor, got none");
    made_release(&m);
    /* the saved states by rule: there past one chunk of the sequence */
    make_call(dev, fx_op_find("selective_scan_fwd"), &m);
    m.call.attrs[fx_op_attr_index(m.call.op, "save")] = 1;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_check(&m.call, specs, &st), FX_OK);
    ck_assert(specs[2].present && specs[2].rank == 4 && specs[2].dims[1] == 2);
    m.in[0].dims[1] = 5; /* x claims a shorter sequence than dt's: the rule reports the check's message */
    bool present = true;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_result_present(&m.call, 2, &present, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "dt: expected shape {2,5,8} [batch, seqlen, dim], got {2,37,8}");
    m.in[0].dims[1] = 37;
    made_release(&m);
}
END_TEST

Suite *fx_suite_op(void)
{
    Suite *s = suite_create("op");
    TCase *tc = tcase_create("the ops' descriptions");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, the_registry_is_consistent);
    tcase_add_test(tc, the_xla_contract);
    tcase_add_test(tc, the_json);
    tcase_add_test(tc, presence_and_flags);
    tcase_add_test(tc, a_context_keeps_the_forwards_tensors);
    tcase_add_test(tc, enums);
    tcase_add_test(tc, a_context_keeps_what_the_backward_reads);
    tcase_add_loop_test(tc, every_op_runs_as_described, 0, fx_op_count());
    tcase_add_loop_test(tc, messages_on_shapes_alone_are_the_runs, 0, fx_op_count());
    suite_add_tcase(s, tc);
    return s;
}
