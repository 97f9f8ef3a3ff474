/* The launch context: every family run where someone else decides, as an
 * XLA custom call runs it. Two "lanes", each a stream that is not fusex's
 * own (on CUDA; the CPU has none) with an arena over memory the test
 * allocated as its scratch, run different problems at once; outputs are
 * tensors the test allocated and poisoned. Every result must equal the CPU
 * backend's on the same inputs. Each op gets an arena of exactly the bytes
 * its scratch query names (a launcher that asks more fails), and an arena
 * too small for the scratch it takes first is refused with a clean error.
 * The layers (conv, norm, linear) run through their descriptions
 * (core/op.h), as an XLA custom call runs them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/linrec.h"
#include "core/op.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/rnn.h"
#include "core/ssm.h"
#include "fusex_dtype.h"
#include "testutil.h"

/* ---- lanes: a caller's stream and its scratch ---- */

/* What the largest op takes: GRU and LSTM keep a GEMM workspace (32 MB
 * with cuBLASLt) besides their buffers. */
#define ARENA_BYTES ((size_t)64 << 20)

typedef struct lane {
    fx_device *dev;
    void *stream;         /* NULL on the CPU: its ops are synchronous */
    fx_tensor memory;     /* what the arena hands out */
    fx_scratch_arena arena;
    fx_exec ex;
} lane;

static void lane_open_sized(fx_device *dev, size_t arena_bytes, lane *l)
{
    fx_status st;
    fx_status_clear(&st);
    memset(l, 0, sizeof *l);
    l->dev = dev;
    if (dev->backend->stream_create) {
        dev->backend->stream_create(dev->ordinal, &l->stream, &st);
        FX_CK_OK(st);
    }
    int64_t bytes[1] = {(int64_t)(arena_bytes ? arena_bytes : 1)};
    ck_assert_int_eq(fx_tensor_alloc(dev, FX_U8, 1, bytes, &l->memory, &st), FX_OK);
    l->ex.device = dev->ordinal;
    l->ex.stream = l->stream;
}

static void lane_open(fx_device *dev, lane *l) { lane_open_sized(dev, ARENA_BYTES, l); }

/* The lane's context with a fresh arena of `bytes`: work enqueued earlier
 * on the lane's stream is done with the memory before the next op's runs. */
static const fx_exec *lane_exec(lane *l, size_t bytes)
{
    ck_assert_msg(bytes <= l->memory.nbytes, "a scratch query of %zu bytes", bytes);
    l->arena.base = l->memory.data;
    l->arena.size = bytes;
    l->arena.used = 0;
    l->ex.scratch = fx_scratch_arena_use(&l->arena);
    return &l->ex;
}

static void lane_wait(lane *l)
{
    fx_status st;
    fx_status_clear(&st);
    if (l->stream)
        l->dev->backend->stream_synchronize(l->dev->ordinal, l->stream, &st);
    FX_CK_OK(st);
}

static void lane_close(lane *l)
{
    lane_wait(l);
    fx_tensor_release(&l->memory);
    if (l->stream)
        l->dev->backend->stream_destroy(l->dev->ordinal, l->stream);
}

/* Tensors uploaded or poisoned on fusex's own stream before the lanes run. */
static void own_stream_done(fx_device *dev)
{
    fx_status st;
    fx_status_clear(&st);
    fx_op_synchronize(dev, &st);
    FX_CK_OK(st);
}

/* ---- host values and tensors ---- */

static double *values(int64_t n, double lo, double hi)
{
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    fx_fill_uniform(v, n, lo, hi);
    return v;
}

static int64_t numel(int rank, const int64_t *dims)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= dims[i];
    return n;
}

/* A tensor for every named input: on the device under test and on the CPU. */
typedef struct pair {
    fx_tensor dut, cpu;
    double *host;
    int64_t n;
} pair;

static void pair_make(fx_device *dev, fx_dtype type, int rank, const int64_t *dims, double lo, double hi, pair *p)
{
    p->n = numel(rank, dims);
    p->host = values(p->n, lo, hi);
    fx_test_tensor(dev, type, rank, dims, p->host, &p->dut);
    fx_test_tensor(fx_test_oracle(), type, rank, dims, p->host, &p->cpu);
}

/* An output: poisoned on both devices. */
static void pair_out(fx_device *dev, fx_dtype type, int rank, const int64_t *dims, pair *p)
{
    p->n = numel(rank, dims);
    p->host = NULL;
    fx_test_poisoned(dev, type, rank, dims, &p->dut);
    fx_test_poisoned(fx_test_oracle(), type, rank, dims, &p->cpu);
}

static void pair_free(pair *p)
{
    fx_tensor_release(&p->dut);
    fx_tensor_release(&p->cpu);
    free(p->host);
    memset(p, 0, sizeof *p);
}

/* The output on the device under test against the CPU's. */
static void pair_check(const char *what, const pair *p, double tol)
{
    double *got = fx_test_read(&p->dut), *want = fx_test_read(&p->cpu);
    double err = fx_rel_l2(got, want, p->n);
    ck_assert_msg(err <= tol, "%s: rel-L2 %.3g > %.3g (seed %llu)", what, err, tol,
                  (unsigned long long)fx_test_seed());
    free(got);
    free(want);
}

/* A sum of `terms` f32 values rounds `terms` times (docs/TESTING.md). */
static double sum_tol(int64_t terms) { return 1e-5 * fmax(1.0, sqrt((double)terms) / 4); }

/* ---- the selective scan ---- */

typedef struct ssm_spec {
    int64_t B, L, D, N, G;
    bool options; /* d, z, dt_bias, h0, softplus */
} ssm_spec;

typedef struct ssm_run {
    ssm_spec s;
    pair x, dt, a, b, c, d, z, bias, h0, dy;
    pair y, state, saved, dx, ddt, da, db, dc, dd, dz, dbias, dh0;
    pair sx, sdt, sb, sc, sz, sstate, sy; /* one step */
    bool saved_used;
} ssm_run;

static void ssm_inputs(const ssm_run *r, bool cpu, bool step, fx_ssm_inputs *in)
{
#define T(p) (cpu ? &r->p.cpu : &r->p.dut)
    memset(in, 0, sizeof *in);
    in->x = step ? T(sx) : T(x);
    in->dt = step ? T(sdt) : T(dt);
    in->a = T(a);
    in->b = step ? T(sb) : T(b);
    in->c = step ? T(sc) : T(c);
    if (r->s.options) {
        in->d = T(d);
        in->z = step ? T(sz) : T(z);
        in->dt_bias = T(bias);
        in->h0 = step ? NULL : T(h0);
        in->dt_softplus = true;
    }
#undef T
}

static void ssm_make(fx_device *dev, const ssm_spec *s, ssm_run *r)
{
    memset(r, 0, sizeof *r);
    r->s = *s;
    const fx_dtype f = FX_F32;
    int64_t btd[3] = {s->B, s->L, s->D}, dn[2] = {s->D, s->N}, d1[1] = {s->D};
    int64_t bc[4] = {s->B, s->L, s->G, s->N}, st3[3] = {s->B, s->D, s->N};
    int64_t bd[2] = {s->B, s->D}, sbc[3] = {s->B, s->G, s->N};
    pair_make(dev, f, 3, btd, -1, 1, &r->x);
    pair_make(dev, f, 3, btd, s->options ? -3.0 : 0.01, s->options ? 0.5 : 0.3, &r->dt);
    pair_make(dev, f, 2, dn, -2.0, -0.5, &r->a);
    pair_make(dev, f, 4, bc, -1, 1, &r->b);
    pair_make(dev, f, 4, bc, -1, 1, &r->c);
    pair_make(dev, f, 3, btd, -1, 1, &r->dy);
    pair_make(dev, f, 2, bd, -1, 1, &r->sx);
    pair_make(dev, f, 2, bd, -3.0, 0.5, &r->sdt);
    pair_make(dev, f, 3, sbc, -1, 1, &r->sb);
    pair_make(dev, f, 3, sbc, -1, 1, &r->sc);
    pair_make(dev, f, 3, st3, -1, 1, &r->sstate);
    if (s->options) {
        pair_make(dev, f, 1, d1, -1, 1, &r->d);
        pair_make(dev, f, 3, btd, -2, 2, &r->z);
        pair_make(dev, f, 1, d1, 0, 0.3, &r->bias);
        pair_make(dev, f, 3, st3, -1, 1, &r->h0);
        pair_make(dev, f, 2, bd, -2, 2, &r->sz);
        pair_out(dev, f, 1, d1, &r->dd);
        pair_out(dev, f, 3, btd, &r->dz);
        pair_out(dev, f, 1, d1, &r->dbias);
        pair_out(dev, f, 3, st3, &r->dh0);
    }
    pair_out(dev, f, 3, btd, &r->y);
    pair_out(dev, f, 3, st3, &r->state);
    fx_ssm_dims n = {s->B, s->L, s->D, s->N, s->G};
    int64_t saved[4];
    fx_ssm_saved_shape(&n, f, saved);
    pair_out(dev, f, 4, saved, &r->saved);
    pair_out(dev, f, 3, btd, &r->dx);
    pair_out(dev, f, 3, btd, &r->ddt);
    pair_out(dev, f, 2, dn, &r->da);
    pair_out(dev, f, 4, bc, &r->db);
    pair_out(dev, f, 4, bc, &r->dc);
    pair_out(dev, f, 2, bd, &r->sy);
}

static fx_ssm_grad_outs ssm_grads(const ssm_run *r, bool cpu)
{
#define T(p) (cpu ? &r->p.cpu : &r->p.dut)
    fx_ssm_grad_outs g = {.x = T(dx), .dt = T(ddt), .a = T(da), .b = T(db), .c = T(dc)};
    if (r->s.options) {
        g.d = T(dd);
        g.z = T(dz);
        g.dt_bias = T(dbias);
        g.h0 = T(dh0);
    }
    return g;
#undef T
}

/* The forward, backward and step on `ex` (NULL: the CPU's own, the oracle). */
static void ssm_forward(ssm_run *r, bool cpu, lane *l)
{
    fx_status st;
    fx_status_clear(&st);
    fx_ssm_inputs in;
    ssm_inputs(r, cpu, false, &in);
    const fx_tensor *y = cpu ? &r->y.cpu : &r->y.dut, *state = cpu ? &r->state.cpu : &r->state.dut;
    const fx_tensor *saved = cpu ? &r->saved.cpu : &r->saved.dut;
    fx_ssm_fwd_args q = {.n = {r->s.B, r->s.L, r->s.D, r->s.N, r->s.G}, .x = in.x, .dt = in.dt, .a = in.a,
                         .b = in.b, .c = in.c, .d = in.d, .z = in.z, .dt_bias = in.dt_bias, .h0 = in.h0,
                         .dt_softplus = in.dt_softplus, .y = y, .state = state, .saved = saved};
    const fx_exec *ex = NULL;
    if (l) {
        ex = lane_exec(l, l->dev->backend->ssm->forward_scratch(&l->ex, &q));
    }
    fx_op_ssm_forward_into(ex, &in, y, state, saved, &st);
    FX_CK_OK(st);
}

static void ssm_backward(ssm_run *r, bool cpu, lane *l)
{
    fx_status st;
    fx_status_clear(&st);
    fx_ssm_inputs in;
    ssm_inputs(r, cpu, false, &in);
    fx_ssm_grad_outs g = ssm_grads(r, cpu);
    const fx_tensor *saved = cpu ? &r->saved.cpu : &r->saved.dut, *dy = cpu ? &r->dy.cpu : &r->dy.dut;
    const fx_exec *ex = NULL;
    if (l) {
        fx_ssm_bwd_args q = {
            .fwd = {.n = {r->s.B, r->s.L, r->s.D, r->s.N, r->s.G}, .x = in.x, .dt = in.dt, .a = in.a, .b = in.b,
                    .c = in.c, .d = in.d, .z = in.z, .dt_bias = in.dt_bias, .h0 = in.h0,
                    .dt_softplus = in.dt_softplus, .saved = saved},
            .dy = dy, .dx = g.x, .ddt = g.dt, .da = g.a, .db = g.b, .dc = g.c, .dd = g.d, .dz = g.z,
            .ddt_bias = g.dt_bias, .dh0 = g.h0};
        ex = lane_exec(l, l->dev->backend->ssm->backward_scratch(&l->ex, &q));
    }
    fx_op_ssm_backward_into(ex, &in, saved, dy, NULL, &g, &st);
    FX_CK_OK(st);
}

static void ssm_step(ssm_run *r, bool cpu, lane *l)
{
    fx_status st;
    fx_status_clear(&st);
    fx_ssm_inputs in;
    ssm_inputs(r, cpu, true, &in);
    fx_op_ssm_step_into(l ? lane_exec(l, 0) : NULL, cpu ? &r->sstate.cpu : &r->sstate.dut, &in,
                        cpu ? &r->sy.cpu : &r->sy.dut, &st);
    FX_CK_OK(st);
}

static void ssm_check(const ssm_run *r)
{
    const ssm_spec *s = &r->s;
    pair_check("selective_scan y", &r->y, 1e-5);
    pair_check("selective_scan state", &r->state, 1e-5);
    pair_check("selective_scan saved states", &r->saved, 1e-5); /* the CPU fills them too */
    pair_check("selective_scan dx", &r->dx, 1e-5);
    pair_check("selective_scan ddt", &r->ddt, 1e-5);
    pair_check("selective_scan da", &r->da, sum_tol(s->B * s->L));
    pair_check("selective_scan db", &r->db, sum_tol(s->D / s->G));
    pair_check("selective_scan dc", &r->dc, sum_tol(s->D / s->G));
    if (s->options) {
        pair_check("selective_scan dd", &r->dd, sum_tol(s->B * s->L));
        pair_check("selective_scan dz", &r->dz, 1e-5);
        pair_check("selective_scan ddt_bias", &r->dbias, sum_tol(s->B * s->L));
        pair_check("selective_scan dh0", &r->dh0, 1e-5);
        pair_check("selective_scan_step y", &r->sy, 1e-5);
        pair_check("selective_scan_step state", &r->sstate, 1e-5);
    }
}

static void ssm_free(ssm_run *r)
{
    pair *all[] = {&r->x,  &r->dt, &r->a,  &r->b,  &r->c,  &r->d,     &r->z,   &r->bias, &r->h0,
                   &r->dy, &r->y,  &r->state, &r->saved, &r->dx, &r->ddt, &r->da, &r->db, &r->dc,
                   &r->dd, &r->dz, &r->dbias, &r->dh0, &r->sx, &r->sdt, &r->sb, &r->sc, &r->sz,
                   &r->sstate, &r->sy};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        pair_free(all[i]);
}

START_TEST(selective_scan_on_two_caller_streams)
{
    fx_device *dev = fx_test_device();
    /* dstate 16 (the warp-specialized forward), and 48 in two groups (the
     * sliced kernels and their scratch on CUDA); odd and prime lengths. */
    ssm_spec specs[2] = {{2, 45, 64, 16, 1, true}, {3, 37, 64, 48, 2, false}};
    ssm_run runs[2];
    lane lanes[2];
    for (int i = 0; i < 2; i++) {
        ssm_make(dev, &specs[i], &runs[i]);
        lane_open(dev, &lanes[i]);
    }
    own_stream_done(dev);
    for (int i = 0; i < 2; i++)
        ssm_forward(&runs[i], false, &lanes[i]);
    for (int i = 0; i < 2; i++)
        ssm_backward(&runs[i], false, &lanes[i]);
    ssm_step(&runs[0], false, &lanes[0]);
    for (int i = 0; i < 2; i++) {
        ssm_forward(&runs[i], true, NULL);
        ssm_backward(&runs[i], true, NULL);
        if (i == 0)
            ssm_step(&runs[i], true, NULL);
        lane_wait(&lanes[i]);
        ssm_check(&runs[i]);
        lane_close(&lanes[i]);
        ssm_free(&runs[i]);
    }
}
END_TEST

/* ---- the linear recurrences ---- */

typedef struct lr_run {
    int kind;
    int64_t B, L, H;
    bool reverse, h0, dt_tensor;
    pair seq[FX_LINREC_MAX_SEQ], tau, lam, dt, init;
    pair h, state, dh;
    pair dseq[FX_LINREC_MAX_SEQ], dtau, dlam, ddt, dinit;
    pair sseq[FX_LINREC_MAX_SEQ], sdt, sstate, sh; /* one step */
} lr_run;

static void lr_make(fx_device *dev, int kind, int64_t B, int64_t L, int64_t H, bool reverse, bool h0, lr_run *r)
{
    memset(r, 0, sizeof *r);
    r->kind = kind, r->B = B, r->L = L, r->H = H, r->reverse = reverse, r->h0 = h0;
    r->dt_tensor = kind == FX_LINREC_LIQUID && h0;
    const fx_dtype f = FX_F32;
    int64_t seq[3] = {B, L, H}, bh[2] = {B, H}, h1[1] = {H}, dt3[3] = {B, L, 1}, dt2[2] = {B, 1};
    for (int k = 0; k < fx_linrec_nseq(kind); k++) {
        bool coeff = kind == FX_LINREC_SCAN && k == 0;
        pair_make(dev, f, 3, seq, coeff ? 0.5 : -2, coeff ? 1.0 : 2, &r->seq[k]);
        pair_out(dev, f, 3, seq, &r->dseq[k]);
        pair_make(dev, f, 2, bh, coeff ? 0.5 : -2, coeff ? 1.0 : 2, &r->sseq[k]);
    }
    if (kind == FX_LINREC_LIQUID) {
        pair_make(dev, f, 1, h1, 0.5, 2.0, &r->tau);
        pair_make(dev, f, 1, h1, -1, 1, &r->lam);
        pair_out(dev, f, 1, h1, &r->dtau);
        pair_out(dev, f, 1, h1, &r->dlam);
        if (r->dt_tensor) {
            pair_make(dev, f, 3, dt3, 0.1, 1.0, &r->dt);
            pair_out(dev, f, 3, dt3, &r->ddt);
            pair_make(dev, f, 2, dt2, 0.1, 1.0, &r->sdt);
        }
    }
    if (h0) {
        pair_make(dev, f, 2, bh, -1, 1, &r->init);
        pair_out(dev, f, 2, bh, &r->dinit);
    }
    pair_make(dev, f, 3, seq, -1, 1, &r->dh);
    pair_out(dev, f, 3, seq, &r->h);
    pair_out(dev, f, 2, bh, &r->state);
    pair_make(dev, f, 2, bh, -1, 1, &r->sstate);
    pair_out(dev, f, 2, bh, &r->sh);
}

static void lr_inputs(const lr_run *r, bool cpu, bool step, fx_linrec_inputs *in)
{
#define T(q) (cpu ? &r->q.cpu : &r->q.dut)
    memset(in, 0, sizeof *in);
    in->kind = r->kind;
    for (int k = 0; k < fx_linrec_nseq(r->kind); k++)
        in->seq[k] = step ? T(sseq[k]) : T(seq[k]);
    if (r->kind == FX_LINREC_LIQUID) {
        in->tau = T(tau);
        in->lam = T(lam);
        in->dt = r->dt_tensor ? (step ? T(sdt) : T(dt)) : NULL;
        in->dt_value = 0.7;
    }
    in->candidate_g = r->kind == FX_LINREC_MINGRU || r->kind == FX_LINREC_MINLSTM ? r->reverse : 0;
    in->reverse = step ? 0 : r->reverse;
    in->h0 = r->h0 && !step ? T(init) : NULL;
#undef T
}

/* The backend's problem for the scratch queries, as the op layer's check
 * fills it. */
static fx_linrec_problem lr_problem(const lr_run *r, const fx_linrec_inputs *in)
{
    fx_linrec_problem p;
    memset(&p, 0, sizeof p);
    p.kind = in->kind;
    p.batch = r->B, p.seqlen = r->L, p.hidden = r->H, p.dtype = FX_F32, p.nseq = fx_linrec_nseq(r->kind);
    for (int k = 0; k < p.nseq; k++)
        p.seq[k] = in->seq[k];
    p.tau = in->tau;
    p.lam = in->lam;
    p.dt = in->dt;
    p.dt_value = in->dt ? 1.0 : in->dt_value;
    p.candidate_g = in->candidate_g;
    p.reverse = in->reverse;
    return p;
}

static void lr_grads(const lr_run *r, bool cpu, fx_linrec_grads *g)
{
#define T(q) (cpu ? &r->q.cpu : &r->q.dut)
    memset(g, 0, sizeof *g);
    for (int k = 0; k < fx_linrec_nseq(r->kind); k++)
        g->seq[k] = *T(dseq[k]);
    if (r->kind == FX_LINREC_LIQUID) {
        g->tau = *T(dtau);
        g->lam = *T(dlam);
        if (r->dt_tensor)
            g->dt = *T(ddt);
    }
    if (r->h0)
        g->h0 = *T(dinit);
#undef T
}

static void lr_ops(lr_run *r, bool cpu, lane *l)
{
#define T(q) (cpu ? &r->q.cpu : &r->q.dut)
    fx_status st;
    fx_status_clear(&st);
    fx_linrec_inputs in;
    lr_inputs(r, cpu, false, &in);
    const fx_exec *ex = NULL;
    if (l) {
        fx_linrec_fwd_args fa = {.p = lr_problem(r, &in), .h0 = in.h0, .h = T(h), .state = T(state)};
        ex = lane_exec(l, l->dev->backend->linrec->forward_scratch(&l->ex, &fa));
    }
    fx_op_linrec_forward_into(ex, &in, 0, T(h), T(state), &st);
    FX_CK_OK(st);
    fx_linrec_grads g;
    lr_grads(r, cpu, &g);
    if (l) {
        fx_linrec_bwd_args ba = {.p = lr_problem(r, &in), .h0 = in.h0, .h = T(h), .dh = T(dh)};
        for (int k = 0; k < ba.p.nseq; k++)
            ba.dseq[k] = &g.seq[k];
        ba.dtau = in.kind == FX_LINREC_LIQUID ? &g.tau : NULL;
        ba.dlam = in.kind == FX_LINREC_LIQUID ? &g.lam : NULL;
        ba.ddt = r->dt_tensor ? &g.dt : NULL;
        ex = lane_exec(l, l->dev->backend->linrec->backward_scratch(&l->ex, &ba));
    }
    fx_linrec_grad_outs outs = fx_linrec_grad_outs_of(&g);
    fx_op_linrec_backward_into(ex, &in, T(h), T(dh), NULL, 0, &outs, &st);
    FX_CK_OK(st);
    fx_linrec_inputs sin;
    lr_inputs(r, cpu, true, &sin);
    fx_op_linrec_step_into(l ? lane_exec(l, 0) : NULL, &sin, T(sstate), T(sh), &st);
    FX_CK_OK(st);
#undef T
}

static void lr_check(const lr_run *r)
{
    char what[96];
    const char *op = fx_linrec_op_name(r->kind);
#define CHECK(name, p, tol)                                   \
    do {                                                      \
        snprintf(what, sizeof what, "%s %s", op, name);       \
        pair_check(what, p, tol);                             \
    } while (0)
    CHECK("h", &r->h, 1e-5);
    CHECK("state", &r->state, 1e-5);
    for (int k = 0; k < fx_linrec_nseq(r->kind); k++)
        CHECK(fx_linrec_seq_name(r->kind, k), &r->dseq[k], 1e-5);
    if (r->kind == FX_LINREC_LIQUID) {
        CHECK("dtau", &r->dtau, sum_tol(r->B * r->L));
        CHECK("da", &r->dlam, sum_tol(r->B * r->L));
        if (r->dt_tensor)
            CHECK("ddt", &r->ddt, sum_tol(r->H));
    }
    if (r->h0)
        CHECK("dh0", &r->dinit, 1e-5);
    CHECK("step h", &r->sh, 1e-5);
    CHECK("step state", &r->sstate, 1e-5);
#undef CHECK
}

static void lr_free(lr_run *r)
{
    for (int k = 0; k < FX_LINREC_MAX_SEQ; k++) {
        pair_free(&r->seq[k]);
        pair_free(&r->dseq[k]);
        pair_free(&r->sseq[k]);
    }
    pair *all[] = {&r->tau, &r->lam, &r->dt, &r->init, &r->h, &r->state, &r->dh, &r->dtau,
                   &r->dlam, &r->ddt, &r->dinit, &r->sdt, &r->sstate, &r->sh};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        pair_free(all[i]);
}

START_TEST(linear_recurrences_on_two_caller_streams)
{
    fx_device *dev = fx_test_device();
    int kind = _i;
    /* A long sequence (several time tiles: the look-back statuses in the
     * arena on CUDA) beside a short, odd one. */
    lr_run runs[2];
    lane lanes[2];
    lr_make(dev, kind, 2, 4099, 96, true, true, &runs[0]);
    lr_make(dev, kind, 3, 17, 33, false, false, &runs[1]);
    for (int i = 0; i < 2; i++)
        lane_open(dev, &lanes[i]);
    own_stream_done(dev);
    for (int i = 0; i < 2; i++)
        lr_ops(&runs[i], false, &lanes[i]);
    for (int i = 0; i < 2; i++) {
        lr_ops(&runs[i], true, NULL);
        lane_wait(&lanes[i]);
        lr_check(&runs[i]);
        lane_close(&lanes[i]);
        lr_free(&runs[i]);
    }
}
END_TEST

/* ---- GRU and LSTM ---- */

typedef struct rnn_run {
    int cell;
    int64_t layers, B, L, I, H;
    pair x, h0, c0, dy, w[2][4];
    pair y, h_n, c_n, saved, dx, dh0, dc0, dw[2][4];
    pair sx, sh, sc, sy; /* one step */
} rnn_run;

static void rnn_make(fx_device *dev, int cell, int64_t layers, int64_t B, int64_t L, int64_t I, int64_t H,
                     rnn_run *r)
{
    memset(r, 0, sizeof *r);
    *r = (rnn_run){.cell = cell, .layers = layers, .B = B, .L = L, .I = I, .H = H};
    const fx_dtype f = FX_F32;
    const int64_t G = fx_rnn_gates(cell), xd[3] = {B, L, I}, yd[3] = {B, L, H}, sd[3] = {layers, B, H};
    const int64_t x2[2] = {B, I}, y2[2] = {B, H};
    const double ws = 1.0 / sqrt((double)H);
    pair_make(dev, f, 3, xd, -1, 1, &r->x);
    pair_make(dev, f, 3, sd, -1, 1, &r->h0);
    pair_make(dev, f, 3, yd, -1, 1, &r->dy);
    pair_out(dev, f, 3, yd, &r->y);
    pair_out(dev, f, 3, sd, &r->h_n);
    pair_out(dev, f, 3, xd, &r->dx);
    pair_out(dev, f, 3, sd, &r->dh0);
    if (cell == FX_RNN_LSTM) {
        pair_make(dev, f, 3, sd, -1, 1, &r->c0);
        pair_out(dev, f, 3, sd, &r->c_n);
        pair_out(dev, f, 3, sd, &r->dc0);
        pair_make(dev, f, 3, sd, -1, 1, &r->sc);
    }
    for (int64_t l = 0; l < layers; l++) {
        const int64_t dims[4][2] = {{G * H, l ? H : I}, {G * H, H}, {G * H, 0}, {G * H, 0}};
        for (int p = 0; p < 4; p++) {
            pair_make(dev, f, p < 2 ? 2 : 1, dims[p], -ws, ws, &r->w[l][p]);
            pair_out(dev, f, p < 2 ? 2 : 1, dims[p], &r->dw[l][p]);
        }
    }
    const fx_rnn_dims n = {cell, layers, B, L, I, H};
    int64_t saved[4];
    fx_rnn_saved_shape(&n, saved);
    pair_out(dev, f, 4, saved, &r->saved);
    pair_make(dev, f, 2, x2, -1, 1, &r->sx);
    pair_make(dev, f, 3, sd, -1, 1, &r->sh);
    pair_out(dev, f, 2, y2, &r->sy);
}

static void rnn_ops(rnn_run *r, bool cpu, lane *l)
{
#define T(q) (cpu ? &r->q.cpu : &r->q.dut)
    const bool lstm = r->cell == FX_RNN_LSTM;
    fx_rnn_layer layers[2];
    fx_rnn_layer_grads grads[2];
    for (int64_t i = 0; i < r->layers; i++) {
        layers[i] = (fx_rnn_layer){T(w[i][0]), T(w[i][1]), T(w[i][2]), T(w[i][3])};
        grads[i] = (fx_rnn_layer_grads){T(dw[i][0]), T(dw[i][1]), T(dw[i][2]), T(dw[i][3])};
    }
    fx_rnn_inputs in = {.cell = r->cell, .layers = r->layers, .layer = layers, .x = T(x), .h0 = T(h0),
                        .c0 = lstm ? T(c0) : NULL};
    fx_status st;
    fx_status_clear(&st);
    const fx_exec *ex = l ? lane_exec(l, fx_op_rnn_forward_scratch(&l->ex, &in, true)) : NULL;
    fx_op_rnn_forward_into(ex, &in, T(y), T(h_n), lstm ? T(c_n) : NULL, T(saved), &st);
    FX_CK_OK(st);
    fx_rnn_grad_outs g = {.dx = T(dx), .dh0 = T(dh0), .dc0 = lstm ? T(dc0) : NULL, .layer = grads};
    ex = l ? lane_exec(l, fx_op_rnn_backward_scratch(&l->ex, &in, true, false, false)) : NULL;
    fx_op_rnn_backward_into(ex, &in, T(saved), T(dy), NULL, NULL, &g, &st);
    FX_CK_OK(st);
    fx_rnn_inputs step = in;
    step.x = T(sx);
    step.h0 = step.c0 = NULL;
    ex = l ? lane_exec(l, fx_op_rnn_step_scratch(&l->ex, &step)) : NULL;
    fx_op_rnn_step_into(ex, &step, T(sh), lstm ? T(sc) : NULL, T(sy), &st);
    FX_CK_OK(st);
#undef T
}

static void rnn_check(const rnn_run *r)
{
    const char *op = fx_rnn_cell_name(r->cell);
    char what[96];
    const double sums = sum_tol(r->B * r->L);
#define CHECK(name, p, tol)                                   \
    do {                                                      \
        snprintf(what, sizeof what, "%s %s", op, name);       \
        pair_check(what, p, tol);                             \
    } while (0)
    CHECK("y", &r->y, 1e-5);
    CHECK("h_n", &r->h_n, 1e-5);
    CHECK("saved", &r->saved, 1e-5);
    CHECK("dx", &r->dx, 1e-5);
    CHECK("dh0", &r->dh0, 1e-5);
    CHECK("step y", &r->sy, 1e-5);
    CHECK("step h", &r->sh, 1e-5);
    if (r->cell == FX_RNN_LSTM) {
        CHECK("c_n", &r->c_n, 1e-5);
        CHECK("dc0", &r->dc0, 1e-5);
        CHECK("step c", &r->sc, 1e-5);
    }
    for (int64_t l = 0; l < r->layers; l++)
        for (int p = 0; p < 4; p++)
            CHECK("a parameter's gradient", &r->dw[l][p], sums);
#undef CHECK
}

static void rnn_free(rnn_run *r)
{
    pair *all[] = {&r->x, &r->h0, &r->c0, &r->dy, &r->y, &r->h_n, &r->c_n, &r->saved, &r->dx,
                   &r->dh0, &r->dc0, &r->sx, &r->sh, &r->sc, &r->sy};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        pair_free(all[i]);
    for (int l = 0; l < 2; l++)
        for (int p = 0; p < 4; p++) {
            pair_free(&r->w[l][p]);
            pair_free(&r->dw[l][p]);
        }
}

/* A GRU on one stream beside an LSTM on another, each op with an arena of
 * exactly what its query names (the GEMMs' workspace, the tagged states,
 * the persistent kernel's counters), enqueued in turn. */
START_TEST(gru_and_lstm_on_two_caller_streams)
{
    fx_device *dev = fx_test_device();
    rnn_run runs[2];
    lane lanes[2];
    rnn_make(dev, FX_RNN_GRU, 2, 3, 21, 10, 24, &runs[0]);
    rnn_make(dev, FX_RNN_LSTM, 1, 2, 9, 7, 13, &runs[1]);
    for (int i = 0; i < 2; i++)
        lane_open(dev, &lanes[i]);
    own_stream_done(dev);
    for (int i = 0; i < 2; i++)
        rnn_ops(&runs[i], false, &lanes[i]);
    for (int i = 0; i < 2; i++) {
        rnn_ops(&runs[i], true, NULL);
        lane_wait(&lanes[i]);
        rnn_check(&runs[i]);
        lane_close(&lanes[i]);
        rnn_free(&runs[i]);
    }
}
END_TEST

/* ---- elementwise ops and the optimizers ---- */

START_TEST(elementwise_and_optimizer_on_a_caller_stream)
{
    fx_device *dev = fx_test_device();
    fx_status st;
    fx_status_clear(&st);
    lane l;
    lane_open(dev, &l);
    int64_t dims[2] = {37, 129};
    pair a, b, sum, scaled, half;
    pair_make(dev, FX_F32, 2, dims, -1, 1, &a);
    pair_make(dev, FX_F32, 2, dims, -1, 1, &b);
    pair_out(dev, FX_F32, 2, dims, &sum);
    pair_out(dev, FX_F32, 2, dims, &scaled);
    pair_out(dev, FX_BF16, 2, dims, &half);
    fx_exec cpu_ex;
    ck_assert_ptr_nonnull(fx_exec_resolve(fx_test_oracle(), NULL, &cpu_ex, &st));

    /* AdamW on two parameters, one step on fusex's stream (the table goes
     * up), then three on the lane, against four on the CPU. The lane's
     * steps alternate between two sets of gradients, so the table goes up
     * again between steps still queued on the lane. */
    int64_t pdims[2][1] = {{1000}, {70000}};
    pair p[2], g[2], g2[2];
    for (int i = 0; i < 2; i++) {
        pair_make(dev, FX_F32, 1, pdims[i], -1, 1, &p[i]);
        pair_make(dev, FX_F32, 1, pdims[i], -1, 1, &g[i]);
        pair_make(dev, FX_F32, 1, pdims[i], -1, 1, &g2[i]);
    }
    fx_tensor dp[2] = {p[0].dut, p[1].dut}, dg[2] = {g[0].dut, g[1].dut}, dg2[2] = {g2[0].dut, g2[1].dut};
    fx_tensor cp[2] = {p[0].cpu, p[1].cpu}, cg[2] = {g[0].cpu, g[1].cpu}, cg2[2] = {g2[0].cpu, g2[1].cpu};
    fx_optim_config cfg = {.defaults = fx_optim_default_hyper(FX_OPTIM_ADAMW)};
    fx_optim_hyper h = cfg.defaults;
    h.lr = 1e-2;
    h.clip = true;
    h.max_grad_norm = 1.0;
    fx_optim_state *sd, *sc;
    ck_assert_int_eq(fx_op_optim_init(FX_OPTIM_ADAMW, dp, 2, &cfg, &sd, &st), FX_OK);
    ck_assert_int_eq(fx_op_optim_init(FX_OPTIM_ADAMW, cp, 2, &cfg, &sc, &st), FX_OK);
    ck_assert_int_eq(fx_op_optim_step(sd, FX_OPTIM_ADAMW, dp, 2, dg, 2, &h, &st), FX_OK);
    own_stream_done(dev);

    const fx_backend *k = dev->backend;
    ck_assert_int_eq(k->binary(lane_exec(&l, 0), FX_ADD, &a.dut, &b.dut, &sum.dut, &st), FX_OK);
    ck_assert_int_eq(k->scale(lane_exec(&l, 0), &a.dut, -1.75, &scaled.dut, &st), FX_OK);
    ck_assert_int_eq(k->cast(lane_exec(&l, 0), &b.dut, &half.dut, &st), FX_OK);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(fx_op_optim_step_on(lane_exec(&l, 0), sd, FX_OPTIM_ADAMW, dp, 2, i % 2 ? dg : dg2, 2, &h, &st),
                         FX_OK);
    FX_CK_OK(st);

    const fx_backend *c = fx_test_oracle()->backend;
    c->binary(&cpu_ex, FX_ADD, &a.cpu, &b.cpu, &sum.cpu, &st);
    c->scale(&cpu_ex, &a.cpu, -1.75, &scaled.cpu, &st);
    c->cast(&cpu_ex, &b.cpu, &half.cpu, &st);
    fx_op_optim_step(sc, FX_OPTIM_ADAMW, cp, 2, cg, 2, &h, &st);
    for (int i = 0; i < 3; i++)
        fx_op_optim_step(sc, FX_OPTIM_ADAMW, cp, 2, i % 2 ? cg : cg2, 2, &h, &st);
    FX_CK_OK(st);
    lane_wait(&l);
    pair_check("add", &sum, 1e-7);
    pair_check("scale", &scaled, 1e-7);
    pair_check("cast", &half, 1e-7);
    for (int i = 0; i < 2; i++)
        pair_check("AdamW parameter", &p[i], 1e-5);
    fx_optim_state_free(sd);
    fx_optim_state_free(sc);
    pair *all[] = {&a, &b, &sum, &scaled, &half, &p[0], &p[1], &g[0], &g[1], &g2[0], &g2[1]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        pair_free(all[i]);
    lane_close(&l);
}
END_TEST


/* ---- the layers (conv, norm, linear), through their descriptions ---- */

/* Each lane's problem: the layouts' sizes, two different shapes (a dim
 * of 37: the single-channel kernels; a row of 1030: several packs). */
static const fx_test_size layer_names[2][8] = {
    {{"batch", 2}, {"seqlen", 45}, {"dim", 64}, {"width", 4}, {"width - 1", 3}, {"hidden", 96}, {"in", 48},
     {"out", 40}},
    {{"batch", 3}, {"seqlen", 37}, {"dim", 37}, {"width", 7}, {"width - 1", 6}, {"hidden", 1030}, {"in", 33},
     {"out", 17}},
};
static const int64_t layer_leading[2][2] = {{5, 3}, {7, 1}};

/* A described op's call on both devices: inputs (the same values),
 * results poisoned; a forward's backward call through its context. */
typedef struct op_pair {
    fx_op_call dut, cpu;
    fx_tensor in_dut[FX_OP_MAX_IO], in_cpu[FX_OP_MAX_IO];
    fx_tensor out_dut[FX_OP_MAX_IO], out_cpu[FX_OP_MAX_IO];
    int64_t terms; /* what the reduced results sum over, at most */
} op_pair;

typedef struct layer_run {
    op_pair fwd, bwd;
    fx_op_ctx *ctx_dut, *ctx_cpu;
    size_t fwd_bytes, bwd_bytes;
} layer_run;

static void tensor_pair(fx_device *dev, fx_dtype type, int rank, const int64_t *dims, fx_tensor *dut, fx_tensor *cpu)
{
    int64_t n = numel(rank, dims);
    double *v = values(n, -1, 1);
    fx_test_tensor(dev, type, rank, dims, v, dut);
    fx_test_tensor(fx_test_oracle(), type, rank, dims, v, cpu);
    free(v);
}

/* The call's results on both devices, poisoned (a step's new_state is its
 * state, in place). */
static void results_of(fx_device *dev, op_pair *p)
{
    fx_status st;
    fx_status_clear(&st);
    fx_op_spec specs[FX_OP_MAX_IO];
    ck_assert_msg(fx_op_check(&p->dut, specs, &st) == FX_OK, "%s: %s", p->dut.op->name, st.msg);
    const fx_op_desc *d = p->dut.op;
    for (int r = 0; r < d->nresults; r++) {
        if (!specs[r].present)
            continue;
        if (d->results[r].role == FX_IO_STATE) {
            int s = fx_op_input_index(d, "state");
            p->dut.out[r] = p->dut.in[s];
            p->cpu.out[r] = p->cpu.in[s];
            continue;
        }
        fx_test_poisoned(dev, specs[r].dtype, specs[r].rank, specs[r].dims, &p->out_dut[r]);
        fx_test_poisoned(fx_test_oracle(), specs[r].dtype, specs[r].rank, specs[r].dims, &p->out_cpu[r]);
        p->dut.out[r] = &p->out_dut[r];
        p->cpu.out[r] = &p->out_cpu[r];
    }
}

/* Every optional input given, every option flag set, an enum at gelu
 * (lane 0; its last choice where it has none) or at its first (lane 1). */
static void layer_make(fx_device *dev, const fx_op_desc *d, int k, layer_run *r)
{
    memset(r, 0, sizeof *r);
    const fx_test_sizes sizes = {layer_names[k], 8, layer_leading[k], 2};
    op_pair *f = &r->fwd;
    fx_op_call_init(&f->dut, d, dev);
    fx_op_call_init(&f->cpu, d, fx_test_oracle());
    for (int a = 0; a < d->nattrs; a++) {
        const fx_op_attr *at = &d->attrs[a];
        /* Every flag on (all inputs given, every option taken), except
         * TF32's: its products are not f32's, as the CPU's are. */
        double v = at->kind == FX_ATTR_FLAG && strcmp(at->name, "allow_tf32") ? 1 : at->dflt;
        if (at->kind == FX_ATTR_ENUM) {
            int gelu = fx_op_choice_index(at, "gelu");
            v = k ? 0 : gelu >= 0 ? gelu : fx_op_choice_count(at) - 1;
        }
        f->dut.attrs[a] = f->cpu.attrs[a] = v;
    }
    f->terms = 1;
    for (int i = 0; i < d->ninputs; i++) {
        int64_t dims[FX_MAX_RANK];
        int rank = fx_test_layout(d->inputs[i].layout, &sizes, dims);
        tensor_pair(dev, FX_F32, rank, dims, &f->in_dut[i], &f->in_cpu[i]);
        f->dut.in[i] = &f->in_dut[i];
        f->cpu.in[i] = &f->in_cpu[i];
        if (numel(rank, dims) > f->terms)
            f->terms = numel(rank, dims);
    }
    results_of(dev, f);
    lane probe; /* the queries read the context's device only */
    memset(&probe, 0, sizeof probe);
    probe.ex.device = dev->ordinal;
    r->fwd_bytes = fx_op_scratch(&probe.ex, &f->dut);
    if (!d->backward)
        return;
    fx_status st;
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_ctx_new(&f->dut, &r->ctx_dut, &st), FX_OK);
    ck_assert_int_eq(fx_op_ctx_new(&f->cpu, &r->ctx_cpu, &st), FX_OK);
    const fx_op_desc *b = fx_op_find(d->backward);
    op_pair *g = &r->bwd;
    const fx_tensor *cot_dut[FX_OP_MAX_IO] = {0}, *cot_cpu[FX_OP_MAX_IO] = {0};
    for (int i = 0; i < b->ninputs; i++)
        if (b->inputs[i].role == FX_IO_COTANGENT) {
            const fx_tensor *like = f->dut.out[fx_op_result_index(d, b->inputs[i].name + 1)];
            tensor_pair(dev, like->dtype, like->rank, like->dims, &g->in_dut[i], &g->in_cpu[i]);
            cot_dut[i] = &g->in_dut[i];
            cot_cpu[i] = &g->in_cpu[i];
        }
    ck_assert_int_eq(fx_op_ctx_backward(r->ctx_dut, cot_dut, &g->dut, &st), FX_OK);
    ck_assert_int_eq(fx_op_ctx_backward(r->ctx_cpu, cot_cpu, &g->cpu, &st), FX_OK);
    g->terms = f->terms;
    results_of(dev, g);
    r->bwd_bytes = fx_op_scratch(&probe.ex, &g->dut);
}

static void op_pair_run(op_pair *p, lane *l, size_t bytes)
{
    fx_status st;
    fx_status_clear(&st);
    fx_op_run_into(lane_exec(l, bytes), &p->dut, &st);
    ck_assert_msg(st.code == FX_OK, "%s on a caller's stream: %s", p->dut.op->name, st.msg);
    fx_op_run_into(NULL, &p->cpu, &st);
    ck_assert_msg(st.code == FX_OK, "%s on the cpu: %s", p->cpu.op->name, st.msg);
}

/* Every result against the CPU's: a step's state too; a result without
 * the inputs' leading axes (a parameter's gradient) is a sum. */
static void op_pair_check(const op_pair *p)
{
    const fx_op_desc *d = p->dut.op;
    for (int r = 0; r < d->nresults; r++) {
        if (!p->dut.out[r])
            continue;
        pair q = {.dut = *p->dut.out[r], .cpu = *p->cpu.out[r], .n = p->dut.out[r]->numel};
        const char *layout = d->results[r].layout;
        const bool summed = !strstr(layout, "batch") && !strstr(layout, "...") && !strstr(layout, "rows");
        char what[96];
        snprintf(what, sizeof what, "%s %s", d->name, d->results[r].name);
        pair_check(what, &q, summed ? sum_tol(p->terms) : 2e-5);
    }
}

static void op_pair_free(op_pair *p)
{
    for (int i = 0; i < FX_OP_MAX_IO; i++) {
        fx_tensor_release(&p->in_dut[i]);
        fx_tensor_release(&p->in_cpu[i]);
        fx_tensor_release(&p->out_dut[i]);
        fx_tensor_release(&p->out_cpu[i]);
    }
}

/* Each layer op (a forward with its backward, a step) of two shapes on two
 * caller streams at once, on arenas of exactly its scratch, against the
 * CPU's: the path an XLA custom call takes (fx_op_run_into). */
START_TEST(layers_on_two_caller_streams)
{
    fx_device *dev = fx_test_device();
    const fx_op_desc *d = fx_op_at(_i);
    if (d->dir == FX_OP_BWD ||
        (strcmp(d->family, "conv") && strcmp(d->family, "norm") && strcmp(d->family, "linear")))
        return;
    layer_run runs[2];
    lane lanes[2];
    for (int k = 0; k < 2; k++) {
        layer_make(dev, d, k, &runs[k]);
        size_t bytes = runs[k].fwd_bytes > runs[k].bwd_bytes ? runs[k].fwd_bytes : runs[k].bwd_bytes;
        lane_open_sized(dev, bytes, &lanes[k]);
    }
    own_stream_done(dev);
    for (int k = 0; k < 2; k++)
        op_pair_run(&runs[k].fwd, &lanes[k], runs[k].fwd_bytes);
    for (int k = 0; k < 2 && d->backward; k++)
        op_pair_run(&runs[k].bwd, &lanes[k], runs[k].bwd_bytes);
    for (int k = 0; k < 2; k++) {
        lane_wait(&lanes[k]);
        op_pair_check(&runs[k].fwd);
        if (d->backward)
            op_pair_check(&runs[k].bwd);
        lane_close(&lanes[k]);
        fx_op_ctx_free(runs[k].ctx_dut);
        fx_op_ctx_free(runs[k].ctx_cpu);
        op_pair_free(&runs[k].fwd);
        op_pair_free(&runs[k].bwd);
    }
}
END_TEST

/* ---- scratch: the queries are enough, and too little is refused ---- */

/* On dev: a backend that sums its reduced gradients in scratch asks for more
 * than the arena's alignment and fails, naming scratch, with less; one that
 * asks for none (the CPU fast path, whose workspaces are its threads' own)
 * runs with an arena of nothing but that alignment. */
static void scratch_refused_on(fx_device *dev)
{
    ssm_spec s = {2, 45, 64, 48, 2, false};
    ssm_run r;
    lane l;
    ssm_make(dev, &s, &r);
    lane_open(dev, &l);
    own_stream_done(dev);
    fx_ssm_inputs in;
    ssm_inputs(&r, false, false, &in);
    fx_ssm_grad_outs g = ssm_grads(&r, false);
    fx_ssm_bwd_args q = {
        .fwd = {.n = {s.B, s.L, s.D, s.N, s.G}, .x = in.x, .dt = in.dt, .a = in.a, .b = in.b, .c = in.c,
                .saved = &r.saved.dut},
        .dy = &r.dy.dut, .dx = g.x, .ddt = g.dt, .da = g.a, .db = g.b, .dc = g.c};
    size_t need = dev->backend->ssm->backward_scratch(&l.ex, &q);
    fx_status st;
    fx_status_clear(&st);
    fx_op_ssm_backward_into(lane_exec(&l, FX_SCRATCH_ALIGN), &in, &r.saved.dut, &r.dy.dut, NULL, &g, &st);
    if (dev == fx_cpu_device()) {
        ck_assert_uint_eq(need, 0);
        FX_CK_OK(st);
    } else {
        ck_assert_uint_gt(need, FX_SCRATCH_ALIGN);
        /* An arena short of the sums (what such a backend takes first) fails. */
        ck_assert_int_eq(st.code, FX_EINTERNAL);
        ck_assert_msg(strstr(st.msg, "scratch") != NULL, "message: %s", st.msg);
    }
    lane_close(&l);
    ssm_free(&r);
}

START_TEST(too_little_scratch_is_refused)
{
    scratch_refused_on(fx_test_device());
    if (fx_test_device() == fx_cpu_device())
        scratch_refused_on(fx_test_oracle());
}
END_TEST

Suite *fx_suite_exec(void)
{
    Suite *s = suite_create("exec");
    TCase *tc = tcase_create("caller streams, outputs and scratch");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, selective_scan_on_two_caller_streams);
    tcase_add_loop_test(tc, linear_recurrences_on_two_caller_streams, 0, FX_LINREC_KIND_COUNT);
    tcase_add_test(tc, gru_and_lstm_on_two_caller_streams);
    tcase_add_test(tc, elementwise_and_optimizer_on_a_caller_stream);
    tcase_add_loop_test(tc, layers_on_two_caller_streams, 0, fx_op_count());
    tcase_add_test(tc, too_little_scratch_is_refused);
    suite_add_tcase(s, tc);
    return s;
}
