/* Replays: the same call gives the same bits, whatever the scheduling. A
 * training run replays only if every sum over batch, time, channels or
 * blocks is taken in a fixed order (no float atomics into a result, no
 * look-back whose rounding depends on which tile it found done), so each
 * op here runs several times on fusex's own stream and then on two caller
 * streams at once (each with an arena of exactly its scratch query, as in
 * test_exec.c), and every output must equal the first run's bit for bit.
 *
 * On a GPU the repeats (50, with larger shapes beside the small ones) and
 * the concurrent streams change the order in which blocks run; in the CPU
 * emulator (`make test-emu`, a random but
 * replayable interleaving, FUSEX_EMU_SEED) every launch takes a new
 * interleaving of its blocks and threads, so an order-dependent reduction
 * fails here within a few repeats. The shapes are chosen so that every
 * reduced gradient has at least three terms from different blocks (two
 * terms added into zero commute), and the linear recurrences run with
 * many time tiles so that their look-back has windows to walk. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/linrec.h"
#include "core/ops.h"
#include "core/ssm.h"
#include "testutil.h"

#define ARENA_BYTES ((size_t)32 << 20)

/* Runs on fusex's own stream: on a GPU, where a repeat costs microseconds
 * and an order-dependent sum differs in only some runs, many; in the
 * emulator, whose every launch is a new interleaving, a few. */
static int repeats(void)
{
    const fx_device *dev = fx_test_device();
    return dev->kind != FX_DEVICE_CUDA ? 2 : fx_test_emulated() ? 4 : 50;
}

/* Shapes large enough for a GPU's scheduling to vary (thousands of blocks
 * adding into the same sums): on a real GPU only. */
static bool gpu_only_skipped(bool gpu_only)
{
    const fx_device *dev = fx_test_device();
    if (!gpu_only || (dev->kind == FX_DEVICE_CUDA && !fx_test_emulated()))
        return false;
    fprintf(stderr, "replay: (a GPU's shape, skipped here)\n");
    return true;
}

/* ---- caller streams with arenas (test_exec.c's lanes) ---- */

typedef struct lane {
    fx_device *dev;
    void *stream;
    fx_tensor memory;
    fx_scratch_arena arena;
    fx_exec ex;
} lane;

static void lane_open(fx_device *dev, lane *l)
{
    fx_status st;
    fx_status_clear(&st);
    memset(l, 0, sizeof *l);
    l->dev = dev;
    if (dev->backend->stream_create) {
        dev->backend->stream_create(dev->ordinal, &l->stream, &st);
        FX_CK_OK(st);
    }
    int64_t bytes[1] = {(int64_t)ARENA_BYTES};
    ck_assert_int_eq(fx_tensor_alloc(dev, FX_U8, 1, bytes, &l->memory, &st), FX_OK);
    l->ex.device = dev->ordinal;
    l->ex.stream = l->stream;
}

static const fx_exec *lane_exec(lane *l, size_t bytes)
{
    ck_assert_msg(bytes <= ARENA_BYTES, "a scratch query of %zu bytes", bytes);
    l->arena.base = l->memory.data;
    l->arena.size = bytes;
    l->arena.used = 0;
    l->ex.scratch = fx_scratch_arena_use(&l->arena);
    return &l->ex;
}

static void lane_close(lane *l)
{
    fx_status st;
    fx_status_clear(&st);
    if (l->stream) {
        l->dev->backend->stream_synchronize(l->dev->ordinal, l->stream, &st);
        FX_CK_OK(st);
    }
    fx_tensor_release(&l->memory);
    if (l->stream)
        l->dev->backend->stream_destroy(l->dev->ordinal, l->stream);
}

static void own_stream_done(fx_device *dev)
{
    fx_status st;
    fx_status_clear(&st);
    fx_op_synchronize(dev, &st);
    FX_CK_OK(st);
}

/* ---- tensors and their bits ---- */

static int64_t numel(int rank, const int64_t *dims)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= dims[i];
    return n;
}

static void input(fx_device *dev, int rank, const int64_t *dims, double lo, double hi, fx_tensor *t)
{
    const int64_t n = numel(rank, dims);
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    fx_fill_uniform(v, n, lo, hi);
    fx_test_tensor(dev, FX_F32, rank, dims, v, t);
    free(v);
}

static void output(fx_device *dev, int rank, const int64_t *dims, fx_tensor *t)
{
    fx_test_poisoned(dev, FX_F32, rank, dims, t);
}

/* An output's values as first computed, to hold later runs to. */
typedef struct kept {
    const char *name;
    double *v; /* f32 values widened: exact, so equal doubles are equal bits */
    int64_t n;
} kept;

static kept keep(const char *name, const fx_tensor *t)
{
    kept k = {name, fx_test_read(t), t->numel};
    return k;
}

/* `t` holds the bits `k` holds; `run` says which repeat it was. */
static void expect_same(const kept *k, const fx_tensor *t, const char *op, const char *run)
{
    double *v = fx_test_read(t);
    int64_t first = -1;
    for (int64_t i = 0; i < k->n && first < 0; i++)
        if (memcmp(&v[i], &k->v[i], sizeof(double)) != 0)
            first = i;
    ck_assert_msg(first < 0, "%s %s: %s differs from the first run at element %lld (%.9g, then %.9g; seed %llu)",
                  op, k->name, run, (long long)first, first < 0 ? 0.0 : k->v[first], first < 0 ? 0.0 : v[first],
                  (unsigned long long)fx_test_seed());
    free(v);
}

/* ---- the selective scan ---- */

typedef struct ssm_case {
    int64_t B, L, D, N, G;
    const char *what; /* which kernels the shape takes on CUDA */
    bool gpu_only;
} ssm_case;

enum { SSM_GRADS = 9 };

typedef struct ssm_set {
    fx_tensor y, state, saved;
    fx_tensor g[SSM_GRADS]; /* dx ddt da db dc dd dz ddt_bias dh0 */
} ssm_set;

static const char *const ssm_grad_names[SSM_GRADS] = {"dx", "ddt", "da", "db", "dc", "dd", "dz", "ddt_bias", "dh0"};

typedef struct ssm_data {
    fx_tensor x, dt, a, b, c, d, z, bias, h0, dy;
    fx_ssm_inputs in;
    fx_ssm_dims n;
} ssm_data;

static void ssm_set_make(fx_device *dev, const ssm_data *s, ssm_set *o)
{
    const fx_ssm_dims *n = &s->n;
    int64_t btd[3] = {n->batch, n->seqlen, n->dim}, dn[2] = {n->dim, n->dstate}, d1[1] = {n->dim};
    int64_t bc[4] = {n->batch, n->seqlen, n->groups, n->dstate}, st3[3] = {n->batch, n->dim, n->dstate};
    int64_t saved[4];
    fx_ssm_saved_shape(n, FX_F32, saved);
    output(dev, 3, btd, &o->y);
    output(dev, 3, st3, &o->state);
    output(dev, 4, saved, &o->saved);
    const int rank[SSM_GRADS] = {3, 3, 2, 4, 4, 1, 3, 1, 3};
    const int64_t *dims[SSM_GRADS] = {btd, btd, dn, bc, bc, d1, btd, d1, st3};
    for (int i = 0; i < SSM_GRADS; i++)
        output(dev, rank[i], dims[i], &o->g[i]);
}

static void ssm_set_free(ssm_set *o)
{
    fx_tensor_release(&o->y);
    fx_tensor_release(&o->state);
    fx_tensor_release(&o->saved);
    for (int i = 0; i < SSM_GRADS; i++)
        fx_tensor_release(&o->g[i]);
}

static fx_ssm_grad_outs ssm_outs(const ssm_set *o)
{
    fx_ssm_grad_outs g = {.x = &o->g[0], .dt = &o->g[1], .a = &o->g[2], .b = &o->g[3], .c = &o->g[4],
                          .d = &o->g[5], .z = &o->g[6], .dt_bias = &o->g[7], .h0 = &o->g[8]};
    return g;
}

static void ssm_forward(const ssm_data *s, ssm_set *o, lane *l)
{
    fx_status st;
    fx_status_clear(&st);
    const fx_exec *ex = NULL;
    if (l) {
        const fx_ssm_inputs *in = &s->in;
        fx_ssm_fwd_args q = {.n = s->n, .x = in->x, .dt = in->dt, .a = in->a, .b = in->b, .c = in->c, .d = in->d,
                             .z = in->z, .dt_bias = in->dt_bias, .h0 = in->h0, .dt_softplus = in->dt_softplus,
                             .y = &o->y, .state = &o->state, .saved = &o->saved};
        ex = lane_exec(l, l->dev->backend->ssm->forward_scratch(&l->ex, &q));
    }
    fx_op_ssm_forward_into(ex, &s->in, &o->y, &o->state, &o->saved, &st);
    FX_CK_OK(st);
}

/* The backward from `saved` (the first forward's), into o's gradients. */
static void ssm_backward(const ssm_data *s, const fx_tensor *saved, ssm_set *o, lane *l)
{
    fx_status st;
    fx_status_clear(&st);
    fx_ssm_grad_outs g = ssm_outs(o);
    const fx_exec *ex = NULL;
    if (l) {
        const fx_ssm_inputs *in = &s->in;
        fx_ssm_bwd_args q = {
            .fwd = {.n = s->n, .x = in->x, .dt = in->dt, .a = in->a, .b = in->b, .c = in->c, .d = in->d,
                    .z = in->z, .dt_bias = in->dt_bias, .h0 = in->h0, .dt_softplus = in->dt_softplus,
                    .saved = saved},
            .dy = &s->dy, .dx = g.x, .ddt = g.dt, .da = g.a, .db = g.b, .dc = g.c, .dd = g.d, .dz = g.z,
            .ddt_bias = g.dt_bias, .dh0 = g.h0};
        ex = lane_exec(l, l->dev->backend->ssm->backward_scratch(&l->ex, &q));
    }
    fx_op_ssm_backward_into(ex, &s->in, saved, &s->dy, NULL, &g, &st);
    FX_CK_OK(st);
}

static void ssm_expect_same(const kept *k, const ssm_set *o, const char *run, bool forward)
{
    if (forward) {
        expect_same(&k[0], &o->y, "selective_scan", run);
        expect_same(&k[1], &o->state, "selective_scan", run);
        expect_same(&k[2], &o->saved, "selective_scan", run);
        return;
    }
    for (int i = 0; i < SSM_GRADS; i++)
        expect_same(&k[3 + i], &o->g[i], "selective_scan_backward", run);
}

static const ssm_case ssm_cases[] = {
    {4, 45, 160, 16, 1, "dstate 16: 5 channel tiles a group, 4 batch rows", false},
    {3, 37, 96, 48, 1, "dstate 48: the sliced kernels, 3 slices", false},
    {3, 21, 96, 100, 2, "dstate 100: one-warp backward blocks", false},
    {5, 19, 72, 64, 3, "dstate 64: two-warp backward blocks", false},
    {8, 512, 1536, 16, 1, "dstate 16: 48 channel tiles a group", true},
    {2, 128, 512, 128, 1, "dstate 128: the sliced kernels, 8 slices", true},
};

START_TEST(selective_scan_replays)
{
    fx_device *dev = fx_test_device();
    const ssm_case *c = &ssm_cases[_i];
    fprintf(stderr, "replay: selective_scan B%lld L%lld D%lld N%lld G%lld (%s)\n", (long long)c->B,
            (long long)c->L, (long long)c->D, (long long)c->N, (long long)c->G, c->what);
    if (gpu_only_skipped(c->gpu_only))
        return;
    ssm_data s;
    memset(&s, 0, sizeof s);
    s.n = (fx_ssm_dims){c->B, c->L, c->D, c->N, c->G};
    int64_t btd[3] = {c->B, c->L, c->D}, dn[2] = {c->D, c->N}, d1[1] = {c->D};
    int64_t bc[4] = {c->B, c->L, c->G, c->N}, st3[3] = {c->B, c->D, c->N};
    input(dev, 3, btd, -1, 1, &s.x);
    input(dev, 3, btd, -3.0, 0.5, &s.dt);
    input(dev, 2, dn, -2.0, -0.5, &s.a);
    input(dev, 4, bc, -1, 1, &s.b);
    input(dev, 4, bc, -1, 1, &s.c);
    input(dev, 1, d1, -1, 1, &s.d);
    input(dev, 3, btd, -2, 2, &s.z);
    input(dev, 1, d1, 0, 0.3, &s.bias);
    input(dev, 3, st3, -1, 1, &s.h0);
    input(dev, 3, btd, -1, 1, &s.dy);
    s.in = (fx_ssm_inputs){.x = &s.x, .dt = &s.dt, .a = &s.a, .b = &s.b, .c = &s.c, .d = &s.d, .z = &s.z,
                           .dt_bias = &s.bias, .h0 = &s.h0, .dt_softplus = true};

    ssm_set own, lanes_out[2];
    ssm_set_make(dev, &s, &own);
    kept k[3 + SSM_GRADS];
    char run[48];
    for (int r = 0; r < repeats(); r++) {
        ssm_forward(&s, &own, NULL);
        if (r == 0) {
            k[0] = keep("y", &own.y);
            k[1] = keep("state", &own.state);
            k[2] = keep("saved states", &own.saved);
        } else {
            snprintf(run, sizeof run, "repeat %d", r);
            ssm_expect_same(k, &own, run, true);
        }
    }
    for (int r = 0; r < repeats(); r++) {
        ssm_backward(&s, &own.saved, &own, NULL);
        if (r == 0) {
            for (int i = 0; i < SSM_GRADS; i++)
                k[3 + i] = keep(ssm_grad_names[i], &own.g[i]);
        } else {
            snprintf(run, sizeof run, "repeat %d", r);
            ssm_expect_same(k, &own, run, false);
        }
    }

    /* Both lanes enqueue before either is waited for: on a GPU their
     * launches run side by side. */
    lane lanes[2];
    for (int i = 0; i < 2; i++) {
        ssm_set_make(dev, &s, &lanes_out[i]);
        lane_open(dev, &lanes[i]);
    }
    own_stream_done(dev);
    for (int i = 0; i < 2; i++)
        ssm_forward(&s, &lanes_out[i], &lanes[i]);
    for (int i = 0; i < 2; i++)
        ssm_backward(&s, &own.saved, &lanes_out[i], &lanes[i]);
    for (int i = 0; i < 2; i++) {
        lane_close(&lanes[i]);
        snprintf(run, sizeof run, "caller stream %d", i);
        ssm_expect_same(k, &lanes_out[i], run, true);
        ssm_expect_same(k, &lanes_out[i], run, false);
        ssm_set_free(&lanes_out[i]);
    }
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        free(k[i].v);
    ssm_set_free(&own);
    fx_tensor *in[] = {&s.x, &s.dt, &s.a, &s.b, &s.c, &s.d, &s.z, &s.bias, &s.h0, &s.dy};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        fx_tensor_release(in[i]);
}
END_TEST

/* ---- the linear recurrences ---- */

typedef struct lr_case {
    int kind;
    int64_t B, L, H;
    int max_tile; /* fx_linrec_*_args.max_tile_steps */
    const char *what;
    bool gpu_only;
} lr_case;

static const lr_case lr_cases[] = {
    {FX_LINREC_LIQUID, 3, 40, 100, 0, "one time tile: sums over 4 channel tiles and 3 batch rows", false},
    {FX_LINREC_LIQUID, 2, 300, 37, 8, "many time tiles, one channel a lane", false},
    {FX_LINREC_LIQUID, 2, 300, 64, 8, "many time tiles, 4 channels a lane", false},
    {FX_LINREC_LIQUID, 3, 150, 64, FX_LINREC_TILES_STREAM, "the streaming kernels", false},
    {FX_LINREC_MINGRU, 2, 400, 40, 6, "many time tiles", false},
    {FX_LINREC_SCAN, 1, 500, 33, 4, "many time tiles", false},
    {FX_LINREC_LIQUID, 16, 1024, 1024, 0, "the streaming kernels as the plan picks them", true},
    {FX_LINREC_MINGRU, 1, 65536, 256, 0, "a long sequence over few channels: the look-back", true},
    {FX_LINREC_LIQUID, 2, 8192, 512, FX_LINREC_TILES_NO_STREAM, "many time tiles", true},
};

enum { LR_OUTS = 2 + FX_LINREC_MAX_SEQ + 4 }; /* h, state, dseq..., dtau, dlam, ddt, dh0 */

typedef struct lr_set {
    fx_tensor t[LR_OUTS];
} lr_set;

typedef struct lr_data {
    lr_case c;
    fx_tensor seq[FX_LINREC_MAX_SEQ], tau, lam, dt, h0, dh;
} lr_data;

static const char *lr_out_name(const lr_data *d, int i)
{
    static const char *const names[LR_OUTS] = {"h", "state", NULL, NULL, NULL, "dtau", "da", "ddt", "dh0"};
    return i >= 2 && i < 2 + FX_LINREC_MAX_SEQ ? fx_linrec_seq_name(d->c.kind, i - 2) : names[i];
}

/* Whether output i exists for this recurrence. */
static bool lr_has(const lr_data *d, int i)
{
    if (i >= 2 && i < 2 + FX_LINREC_MAX_SEQ)
        return i - 2 < fx_linrec_nseq(d->c.kind);
    if (i >= 5 && i <= 7)
        return d->c.kind == FX_LINREC_LIQUID;
    return true;
}

static void lr_set_make(fx_device *dev, const lr_data *d, lr_set *o)
{
    const lr_case *c = &d->c;
    int64_t seq[3] = {c->B, c->L, c->H}, bh[2] = {c->B, c->H}, h1[1] = {c->H}, dt3[3] = {c->B, c->L, 1};
    memset(o, 0, sizeof *o);
    for (int i = 0; i < LR_OUTS; i++) {
        if (!lr_has(d, i))
            continue;
        if (i == 1 || i == 8)
            output(dev, 2, bh, &o->t[i]);
        else if (i == 5 || i == 6)
            output(dev, 1, h1, &o->t[i]);
        else if (i == 7)
            output(dev, 3, dt3, &o->t[i]);
        else
            output(dev, 3, seq, &o->t[i]);
    }
}

static void lr_set_free(lr_set *o)
{
    for (int i = 0; i < LR_OUTS; i++)
        fx_tensor_release(&o->t[i]);
}

static fx_linrec_inputs lr_inputs(const lr_data *d)
{
    fx_linrec_inputs in;
    memset(&in, 0, sizeof in);
    in.kind = d->c.kind;
    for (int k = 0; k < fx_linrec_nseq(d->c.kind); k++)
        in.seq[k] = &d->seq[k];
    if (d->c.kind == FX_LINREC_LIQUID) {
        in.tau = &d->tau;
        in.lam = &d->lam;
        in.dt = &d->dt;
    }
    in.h0 = &d->h0;
    return in;
}

static void lr_forward(lr_data *d, lr_set *o, lane *l)
{
    fx_status st;
    fx_status_clear(&st);
    const fx_linrec_inputs in = lr_inputs(d);
    const fx_exec *ex = NULL;
    if (l)
        ex = lane_exec(l, fx_op_linrec_forward_scratch(&l->ex, &in, d->c.max_tile, &o->t[0], &o->t[1]));
    fx_op_linrec_forward_into(ex, &in, d->c.max_tile, &o->t[0], &o->t[1], &st);
    FX_CK_OK(st);
}

/* The backward of `h` (the first forward's output) into o's gradients. */
static void lr_backward(const lr_data *d, const fx_tensor *h, lr_set *o, lane *l)
{
    fx_status st;
    fx_status_clear(&st);
    const fx_linrec_inputs in = lr_inputs(d);
    fx_linrec_grad_outs g;
    memset(&g, 0, sizeof g);
    for (int k = 0; k < fx_linrec_nseq(d->c.kind); k++)
        g.seq[k] = &o->t[2 + k];
    if (d->c.kind == FX_LINREC_LIQUID) {
        g.tau = &o->t[5];
        g.lam = &o->t[6];
        g.dt = &o->t[7];
    }
    g.h0 = &o->t[8];
    const fx_exec *ex = NULL;
    if (l)
        ex = lane_exec(l, fx_op_linrec_backward_scratch(&l->ex, &in, h, &d->dh, NULL, d->c.max_tile, &g));
    fx_op_linrec_backward_into(ex, &in, h, &d->dh, NULL, d->c.max_tile, &g, &st);
    FX_CK_OK(st);
}

static void lr_expect_same(const lr_data *d, const kept *k, const lr_set *o, const char *run, bool forward)
{
    const char *op = fx_linrec_op_name(d->c.kind);
    char what[64];
    snprintf(what, sizeof what, "%s%s", op, forward ? "" : " backward");
    for (int i = forward ? 0 : 2; i < (forward ? 2 : LR_OUTS); i++)
        if (lr_has(d, i))
            expect_same(&k[i], &o->t[i], what, run);
}

START_TEST(linear_recurrence_replays)
{
    fx_device *dev = fx_test_device();
    lr_data d;
    memset(&d, 0, sizeof d);
    d.c = lr_cases[_i];
    const lr_case *c = &d.c;
    fprintf(stderr, "replay: %s B%lld L%lld H%lld, max_tile_steps %d (%s)\n", fx_linrec_op_name(c->kind),
            (long long)c->B, (long long)c->L, (long long)c->H, c->max_tile, c->what);
    if (gpu_only_skipped(c->gpu_only))
        return;
    int64_t seq[3] = {c->B, c->L, c->H}, bh[2] = {c->B, c->H}, h1[1] = {c->H}, dt3[3] = {c->B, c->L, 1};
    for (int k = 0; k < fx_linrec_nseq(c->kind); k++) {
        const bool coeff = c->kind == FX_LINREC_SCAN && k == 0;
        input(dev, 3, seq, coeff ? 0.5 : -2, coeff ? 1.0 : 2, &d.seq[k]);
    }
    if (c->kind == FX_LINREC_LIQUID) {
        input(dev, 1, h1, 0.5, 2.0, &d.tau);
        input(dev, 1, h1, -1, 1, &d.lam);
        input(dev, 3, dt3, 0.1, 1.0, &d.dt);
    }
    input(dev, 2, bh, -1, 1, &d.h0);
    input(dev, 3, seq, -1, 1, &d.dh);

    lr_set own, lanes_out[2];
    lr_set_make(dev, &d, &own);
    kept k[LR_OUTS];
    memset(k, 0, sizeof k);
    char run[48];
    for (int r = 0; r < repeats(); r++) {
        lr_forward(&d, &own, NULL);
        if (r == 0) {
            k[0] = keep("h", &own.t[0]);
            k[1] = keep("state", &own.t[1]);
        } else {
            snprintf(run, sizeof run, "repeat %d", r);
            lr_expect_same(&d, k, &own, run, true);
        }
    }
    for (int r = 0; r < repeats(); r++) {
        lr_backward(&d, &own.t[0], &own, NULL);
        if (r == 0) {
            for (int i = 2; i < LR_OUTS; i++)
                if (lr_has(&d, i))
                    k[i] = keep(lr_out_name(&d, i), &own.t[i]);
        } else {
            snprintf(run, sizeof run, "repeat %d", r);
            lr_expect_same(&d, k, &own, run, false);
        }
    }

    lane lanes[2];
    for (int i = 0; i < 2; i++) {
        lr_set_make(dev, &d, &lanes_out[i]);
        lane_open(dev, &lanes[i]);
    }
    own_stream_done(dev);
    for (int i = 0; i < 2; i++)
        lr_forward(&d, &lanes_out[i], &lanes[i]);
    for (int i = 0; i < 2; i++)
        lr_backward(&d, &own.t[0], &lanes_out[i], &lanes[i]);
    for (int i = 0; i < 2; i++) {
        lane_close(&lanes[i]);
        snprintf(run, sizeof run, "caller stream %d", i);
        lr_expect_same(&d, k, &lanes_out[i], run, true);
        lr_expect_same(&d, k, &lanes_out[i], run, false);
        lr_set_free(&lanes_out[i]);
    }
    for (int i = 0; i < LR_OUTS; i++)
        free(k[i].v);
    lr_set_free(&own);
    fx_tensor *in[] = {&d.seq[0], &d.seq[1], &d.seq[2], &d.tau, &d.lam, &d.dt, &d.h0, &d.dh};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        fx_tensor_release(in[i]);
}
END_TEST

Suite *fx_suite_replay(void)
{
    Suite *s = suite_create("replay");
    TCase *tc = tcase_create("the same bits run after run, stream beside stream");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, selective_scan_replays, 0, (int)(sizeof ssm_cases / sizeof ssm_cases[0]));
    tcase_add_loop_test(tc, linear_recurrence_replays, 0, (int)(sizeof lr_cases / sizeof lr_cases[0]));
    suite_add_tcase(s, tc);
    return s;
}
