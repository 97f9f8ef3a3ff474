/* The CPU reference for the GRU and LSTM layers (include/fusex_rnn.h):
 * f64 throughout, written to be read.
 *
 * Each layer's parameters and input sequence are first converted to f64
 * arrays in the context's scratch, so the inner loops are plain dot
 * products. The forward runs the batch rows as independent tasks (each
 * walks the whole sequence of one row); the backward does the same for the
 * reverse recurrence, writing each step's gate gradients, and then forms
 * the weight gradients row by row of the weights (each task owns one row
 * of dw and sums it over batch and time in a fixed order) and the input
 * gradient step by step. Nothing depends on the thread count.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "fusex_dtype.h"
#include "fusex_rnn.h"

static double at(const fx_tensor *t, int64_t i) { return fx_load_f64(t->data, t->dtype, i); }
static double at_or_zero(const fx_tensor *t, int64_t i) { return t ? at(t, i) : 0.0; }
static void put(const fx_tensor *t, int64_t i, double v) { fx_store_f64(t->data, t->dtype, i, v); }

static double sigmoid(double x)
{
    if (x >= 0)
        return 1.0 / (1.0 + exp(-x));
    const double e = exp(x);
    return e / (1.0 + e);
}

static double dot(const double *a, const double *b, int64_t n)
{
    double s = 0;
    for (int64_t k = 0; k < n; k++)
        s += a[k] * b[k];
    return s;
}

/* `count` elements of t from `offset` into dst as f64. */
static void load_f64(const fx_tensor *t, int64_t offset, int64_t count, double *dst)
{
    for (int64_t i = 0; i < count; i++)
        dst[i] = at(t, offset + i);
}

/* ---- scratch: f64 arrays carved from one allocation of the context ---- */

typedef struct carve {
    double *next;
    size_t doubles; /* total asked, for the size query */
} carve;

static double *take(carve *c, int64_t count)
{
    double *p = c->next;
    if (p)
        c->next += count;
    c->doubles = fx_size_add(c->doubles, (size_t)count);
    return p;
}

/* One layer's parameters as f64: w_ih [G*H][in], w_hh [G*H][H], biases
 * (zeros where absent). */
typedef struct params64 {
    double *w_ih, *w_hh, *b_ih, *b_hh;
} params64;

static params64 take_params(carve *c, int64_t rows, int64_t in_max, int64_t hidden)
{
    params64 p;
    p.w_ih = take(c, rows * in_max);
    p.w_hh = take(c, rows * hidden);
    p.b_ih = take(c, rows);
    p.b_hh = take(c, rows);
    return p;
}

static void load_params(const fx_rnn_layer *layer, int64_t rows, int64_t in, int64_t hidden, params64 *p)
{
    load_f64(layer->w_ih, 0, rows * in, p->w_ih);
    load_f64(layer->w_hh, 0, rows * hidden, p->w_hh);
    for (int64_t r = 0; r < rows; r++) {
        p->b_ih[r] = at_or_zero(layer->b_ih, r);
        p->b_hh[r] = at_or_zero(layer->b_hh, r);
    }
}

static int64_t in_max(const fx_rnn_dims *n) { return n->input > n->hidden ? n->input : n->hidden; }

/* ---- forward ---- */

typedef struct fwd_scratch {
    params64 p;
    double *seq[2]; /* layer inputs and outputs [batch][seqlen][in_max], ping-pong */
    double *work;   /* per batch row: ax, ah [G*H], h, c [H], a saved row */
} fwd_scratch;

static int64_t work_per_row(const fx_rnn_dims *n)
{
    return 2 * fx_rnn_gates(n->cell) * n->hidden + 2 * n->hidden + fx_rnn_saved_width(n->cell, n->hidden);
}

static void carve_forward(carve *c, const fx_rnn_dims *n, fwd_scratch *s)
{
    const int64_t rows = fx_rnn_gates(n->cell) * n->hidden, steps = n->batch * n->seqlen;
    s->p = take_params(c, rows, in_max(n), n->hidden);
    s->seq[0] = take(c, steps * in_max(n));
    s->seq[1] = take(c, steps * in_max(n));
    s->work = take(c, n->batch * work_per_row(n));
}

/* One step of one cell for one batch row: ax, ah hold the pre-activations
 * (biases included); h and c are updated in place; `save` (or NULL) gets
 * the row fx_rnn_saved_width describes, h_t excluded. */
static void cell_step(int cell, int64_t H, const double *ax, const double *ah, double *h, double *c, double *save)
{
    for (int64_t j = 0; j < H; j++) {
        if (cell == FX_RNN_GRU) {
            const double r = sigmoid(ax[j] + ah[j]);
            const double z = sigmoid(ax[H + j] + ah[H + j]);
            const double hn = ah[2 * H + j];
            const double nn = tanh(ax[2 * H + j] + r * hn);
            h[j] = (1.0 - z) * nn + z * h[j];
            if (save) {
                save[j] = r;
                save[H + j] = z;
                save[2 * H + j] = nn;
                save[3 * H + j] = hn;
            }
        } else {
            const double i = sigmoid(ax[j] + ah[j]);
            const double f = sigmoid(ax[H + j] + ah[H + j]);
            const double g = tanh(ax[2 * H + j] + ah[2 * H + j]);
            const double o = sigmoid(ax[3 * H + j] + ah[3 * H + j]);
            c[j] = f * c[j] + i * g;
            h[j] = o * tanh(c[j]);
            if (save) {
                save[j] = i;
                save[H + j] = f;
                save[2 * H + j] = g;
                save[3 * H + j] = o;
                save[4 * H + j] = c[j];
            }
        }
    }
}

/* Layer l over the whole sequence of batch row b: reads `in` [.][seqlen][in_max]
 * (width `width`), writes its h_t to `out` and, for the last layer, y. */
static void forward_row(const fx_rnn_fwd_args *a, const fwd_scratch *s, int64_t l, int64_t b, const double *in,
                        int64_t width, double *out, fx_watch *w)
{
    const fx_rnn_dims *n = &a->n;
    const int64_t H = n->hidden, L = n->seqlen, rows = fx_rnn_gates(n->cell) * H, K = in_max(n);
    const int64_t S = fx_rnn_saved_width(n->cell, H);
    double *ax = s->work + b * work_per_row(n), *ah = ax + rows, *h = ah + rows, *c = h + H, *save = c + H;
    const int64_t state = (l * n->batch + b) * H;
    for (int64_t j = 0; j < H; j++) {
        h[j] = at_or_zero(a->h0, state + j);
        c[j] = at_or_zero(a->c0, state + j);
    }
    for (int64_t t = 0; t < L; t++) {
        if (fx_watch_gone(w))
            return;
        const int64_t row = b * L + t;
        const double *x_t = in + row * K;
        for (int64_t r = 0; r < rows; r++) {
            ax[r] = s->p.b_ih[r] + dot(s->p.w_ih + r * width, x_t, width);
            ah[r] = s->p.b_hh[r] + dot(s->p.w_hh + r * H, h, H);
        }
        cell_step(n->cell, H, ax, ah, h, c, a->saved ? save : NULL);
        if (a->saved) {
            memcpy(save + S - H, h, sizeof(double) * (size_t)H);
            const int64_t base = (l * n->batch * L + row) * S;
            for (int64_t i = 0; i < S; i++)
                put(a->saved, base + i, save[i]);
        }
        memcpy(out + row * K, h, sizeof(double) * (size_t)H);
        if (l == n->layers - 1)
            for (int64_t j = 0; j < H; j++)
                put(a->y, row * H + j, h[j]);
    }
    for (int64_t j = 0; j < H; j++) {
        if (a->h_n)
            put(a->h_n, state + j, h[j]);
        if (a->c_n)
            put(a->c_n, state + j, c[j]);
    }
}

static size_t forward_doubles(const fx_rnn_dims *n)
{
    carve c = {0};
    fwd_scratch s;
    carve_forward(&c, n, &s);
    return c.doubles;
}

static size_t scratch_of(size_t doubles)
{
    const size_t bytes = fx_size_mul((int64_t)(doubles > (size_t)INT64_MAX ? INT64_MAX : doubles), sizeof(double));
    return bytes == SIZE_MAX ? SIZE_MAX : fx_size_add(FX_SCRATCH_ALIGN, fx_scratch_piece(bytes));
}

static int take_scratch(const fx_exec *ex, size_t doubles, void **mem, fx_status *st)
{
    const size_t bytes = fx_size_mul((int64_t)(doubles > (size_t)INT64_MAX ? INT64_MAX : doubles), sizeof(double));
    if (bytes == SIZE_MAX)
        return fx_fail(st, FX_ENOMEM, "the scratch of a recurrence this size does not fit a size_t");
    return fx_scratch_alloc(ex, bytes, mem, st);
}

/* Parallel over batch rows where the work pays for the team. */
static bool worth_threads(const fx_rnn_dims *n)
{
    const int64_t rows = fx_rnn_gates(n->cell) * n->hidden;
    return n->batch > 1 && n->batch * n->seqlen * rows * (in_max(n) + n->hidden) > FX_CPU_PARALLEL_MIN;
}

static int cpu_forward(const fx_exec *ex, const fx_rnn_fwd_args *a, fx_status *st)
{
    const fx_rnn_dims *n = &a->n;
    const int64_t B = n->batch, L = n->seqlen, K = in_max(n), rows = fx_rnn_gates(n->cell) * n->hidden;
    void *mem;
    if (take_scratch(ex, forward_doubles(n), &mem, st))
        return st->code;
    carve c = {.next = mem};
    fwd_scratch s;
    carve_forward(&c, n, &s);
    for (int64_t i = 0; i < B * L; i++)
        load_f64(a->x, i * n->input, n->input, s.seq[0] + i * K);
    fx_watch w;
    fx_watch_begin(&w);
    const bool threads = worth_threads(n);
    for (int64_t l = 0; l < n->layers && !fx_watch_gone(&w); l++) {
        const int64_t width = l == 0 ? n->input : n->hidden;
        load_params(&a->layer[l], rows, width, n->hidden, &s.p);
        const double *in = s.seq[l % 2];
        double *out = s.seq[(l + 1) % 2];
#pragma omp parallel for schedule(dynamic) if (threads)
        for (int64_t b = 0; b < B; b++)
            forward_row(a, &s, l, b, in, width, out, &w);
    }
    fx_scratch_release(ex, mem);
    return fx_watch_end(&w, fx_rnn_gates(n->cell) == 3 ? "gru" : "lstm", st);
}

static size_t cpu_forward_scratch(const fx_exec *ex, const fx_rnn_fwd_args *a)
{
    (void)ex;
    return scratch_of(forward_doubles(&a->n));
}

/* ---- step: a forward of one frame whose initial and final states are the
 * same tensors (each batch row reads its states before it writes them) */

static fx_rnn_fwd_args step_as_forward(const fx_rnn_step_args *a)
{
    fx_rnn_fwd_args f;
    memset(&f, 0, sizeof f);
    f.n = a->n;
    f.n.seqlen = 1;
    f.layer = a->layer;
    f.x = a->x;
    f.h0 = a->h;
    f.c0 = a->c;
    f.y = a->y;
    f.h_n = a->h;
    f.c_n = a->c;
    return f;
}

static int cpu_step(const fx_exec *ex, const fx_rnn_step_args *a, fx_status *st)
{
    fx_rnn_fwd_args f = step_as_forward(a);
    return cpu_forward(ex, &f, st);
}

static size_t cpu_step_scratch(const fx_exec *ex, const fx_rnn_step_args *a)
{
    fx_rnn_fwd_args f = step_as_forward(a);
    return cpu_forward_scratch(ex, &f);
}

/* ---- backward ----
 * Per layer from the top, with g = dL/dh_t in total (the layer output's
 * gradient plus what flows back from step t + 1):
 *   GRU   dn = g (1 - z)   dz = g (h_{t-1} - n)   da_n = dn (1 - n^2)
 *         da_r = da_n ahn r (1 - r)   da_z = dz z (1 - z)
 *         input side (ax):  (da_r, da_z, da_n)
 *         hidden side (ah): (da_r, da_z, da_n r)
 *         dh_{t-1} = g z + W_hh^T dah
 *   LSTM  tc = tanh(c_t)   do = g tc   dc = dc_carry + g o (1 - tc^2)
 *         da = (dc g' i(1-i), dc c_{t-1} f(1-f), dc i (1-g'^2), do o(1-o))
 *         on both sides; dc_carry = dc f;  dh_{t-1} = W_hh^T da
 * then dW_ih = sum dax^T x, dW_hh = sum dah^T h_{t-1}, db = sum da, and
 * the layer input's gradient dax W_ih, which is the lower layer's. */

typedef struct bwd_scratch {
    params64 p;
    double *in;      /* the layer's input sequence [batch][seqlen][in_max] */
    double *hprev;   /* h_{t-1} [batch][seqlen][H] */
    double *dout;    /* the layer output's gradient [batch][seqlen][H] */
    double *din;     /* the layer input's gradient [batch][seqlen][in_max] */
    double *dax, *dah; /* [batch][seqlen][G*H] */
    double *work;    /* per batch row: dh, dc, next [H] */
} bwd_scratch;

static void carve_backward(carve *c, const fx_rnn_dims *n, bwd_scratch *s)
{
    const int64_t H = n->hidden, rows = fx_rnn_gates(n->cell) * H, steps = n->batch * n->seqlen;
    s->p = take_params(c, rows, in_max(n), H);
    s->in = take(c, steps * in_max(n));
    s->hprev = take(c, steps * H);
    s->dout = take(c, steps * H);
    s->din = take(c, steps * in_max(n));
    s->dax = take(c, steps * rows);
    s->dah = take(c, steps * rows);
    s->work = take(c, n->batch * 3 * H);
}

static size_t backward_doubles(const fx_rnn_dims *n)
{
    carve c = {0};
    bwd_scratch s;
    carve_backward(&c, n, &s);
    return c.doubles;
}

/* The reverse recurrence of layer l for batch row b. */
static void backward_row(const fx_rnn_bwd_args *a, const bwd_scratch *s, int64_t l, int64_t b, fx_watch *w)
{
    const fx_rnn_fwd_args *f = &a->fwd;
    const fx_rnn_dims *n = &f->n;
    const int64_t H = n->hidden, L = n->seqlen, rows = fx_rnn_gates(n->cell) * H;
    const int64_t S = fx_rnn_saved_width(n->cell, H);
    double *dh = s->work + b * 3 * H, *dc = dh + H, *next = dc + H;
    const int64_t state = (l * n->batch + b) * H;
    for (int64_t j = 0; j < H; j++) {
        dh[j] = at_or_zero(a->dh_n, state + j);
        dc[j] = at_or_zero(a->dc_n, state + j);
    }
    for (int64_t t = L - 1; t >= 0; t--) {
        if (fx_watch_gone(w))
            return;
        const int64_t row = b * L + t, base = (l * n->batch * L + row) * S;
        const double *hp = s->hprev + row * H;
        double *dax = s->dax + row * rows, *dah = s->dah + row * rows;
        for (int64_t j = 0; j < H; j++) {
            const double g = s->dout[row * H + j] + dh[j];
            if (n->cell == FX_RNN_GRU) {
                const double r = at(f->saved, base + j), z = at(f->saved, base + H + j);
                const double nn = at(f->saved, base + 2 * H + j), hn = at(f->saved, base + 3 * H + j);
                const double dn = g * (1.0 - z), dz = g * (hp[j] - nn);
                const double dan = dn * (1.0 - nn * nn);
                const double dar = dan * hn * r * (1.0 - r), daz = dz * z * (1.0 - z);
                dax[j] = dah[j] = dar;
                dax[H + j] = dah[H + j] = daz;
                dax[2 * H + j] = dan;
                dah[2 * H + j] = dan * r;
                next[j] = g * z;
            } else {
                const double i = at(f->saved, base + j), fg = at(f->saved, base + H + j);
                const double gg = at(f->saved, base + 2 * H + j), o = at(f->saved, base + 3 * H + j);
                const double ct = at(f->saved, base + 4 * H + j);
                const double cp = t > 0 ? at(f->saved, base - S + 4 * H + j) : at_or_zero(f->c0, state + j);
                const double tc = tanh(ct);
                const double dct = dc[j] + g * o * (1.0 - tc * tc);
                dax[j] = dct * gg * i * (1.0 - i);
                dax[H + j] = dct * cp * fg * (1.0 - fg);
                dax[2 * H + j] = dct * i * (1.0 - gg * gg);
                dax[3 * H + j] = g * tc * o * (1.0 - o);
                for (int q = 0; q < 4; q++)
                    dah[q * H + j] = dax[q * H + j];
                dc[j] = dct * fg;
                next[j] = 0.0;
            }
        }
        for (int64_t r = 0; r < rows; r++) {
            const double d = dah[r];
            const double *wr = s->p.w_hh + r * H;
            for (int64_t k = 0; k < H; k++)
                next[k] += d * wr[k];
        }
        memcpy(dh, next, sizeof(double) * (size_t)H);
    }
    for (int64_t j = 0; j < H; j++) {
        if (a->dh0)
            put(a->dh0, state + j, dh[j]);
        if (a->dc0)
            put(a->dc0, state + j, dc[j]);
    }
}

/* Row r of one layer's weight and bias gradients, summed over batch and
 * time in order; the columns in chunks whose sums stay in a stack array. */
#define COLUMN_CHUNK 256

static void weight_sums(const double *d, int64_t rows, int64_t r, const double *src, int64_t ld, int64_t width,
                        int64_t steps, const fx_tensor *dw)
{
    double acc[COLUMN_CHUNK];
    for (int64_t k0 = 0; k0 < width; k0 += COLUMN_CHUNK) {
        const int64_t kn = width - k0 < COLUMN_CHUNK ? width - k0 : COLUMN_CHUNK;
        memset(acc, 0, sizeof acc);
        for (int64_t i = 0; i < steps; i++) {
            const double g = d[i * rows + r];
            const double *v = src + i * ld + k0;
            for (int64_t k = 0; k < kn; k++)
                acc[k] += g * v[k];
        }
        for (int64_t k = 0; k < kn; k++)
            put(dw, r * width + k0 + k, acc[k]);
    }
}

static void weight_row(const fx_rnn_bwd_args *a, const bwd_scratch *s, int64_t l, int64_t r, int64_t width)
{
    const fx_rnn_dims *n = &a->fwd.n;
    const int64_t H = n->hidden, rows = fx_rnn_gates(n->cell) * H, steps = n->batch * n->seqlen;
    const fx_rnn_layer_grads *g = &a->grad[l];
    weight_sums(s->dax, rows, r, s->in, in_max(n), width, steps, g->dw_ih);
    weight_sums(s->dah, rows, r, s->hprev, H, H, steps, g->dw_hh);
    double db_ih = 0, db_hh = 0;
    for (int64_t i = 0; i < steps; i++) {
        db_ih += s->dax[i * rows + r];
        db_hh += s->dah[i * rows + r];
    }
    if (g->db_ih)
        put(g->db_ih, r, db_ih);
    if (g->db_hh)
        put(g->db_hh, r, db_hh);
}

/* The layer input's gradient at step i: dax_i W_ih, into din (or dx). */
static void input_grad(const fx_rnn_bwd_args *a, const bwd_scratch *s, int64_t l, int64_t i, int64_t width)
{
    const fx_rnn_dims *n = &a->fwd.n;
    const int64_t rows = fx_rnn_gates(n->cell) * n->hidden, K = in_max(n);
    double *d = s->din + i * K;
    memset(d, 0, sizeof(double) * (size_t)width);
    for (int64_t r = 0; r < rows; r++) {
        const double g = s->dax[i * rows + r];
        const double *wr = s->p.w_ih + r * width;
        for (int64_t k = 0; k < width; k++)
            d[k] += g * wr[k];
    }
    if (l == 0)
        for (int64_t k = 0; k < width; k++)
            put(a->dx, i * n->input + k, d[k]);
}

static int cpu_backward(const fx_exec *ex, const fx_rnn_bwd_args *a, fx_status *st)
{
    const fx_rnn_fwd_args *f = &a->fwd;
    const fx_rnn_dims *n = &f->n;
    const int64_t B = n->batch, L = n->seqlen, H = n->hidden, K = in_max(n), steps = B * L;
    const int64_t rows = fx_rnn_gates(n->cell) * H, S = fx_rnn_saved_width(n->cell, H);
    void *mem;
    if (take_scratch(ex, backward_doubles(n), &mem, st))
        return st->code;
    carve c = {.next = mem};
    bwd_scratch s;
    carve_backward(&c, n, &s);
    for (int64_t i = 0; i < steps * H; i++)
        s.dout[i] = at_or_zero(a->dy, i);
    fx_watch w;
    fx_watch_begin(&w);
    const bool threads = worth_threads(n);
    for (int64_t l = n->layers - 1; l >= 0 && !fx_watch_gone(&w); l--) {
        const int64_t width = l == 0 ? n->input : H;
        load_params(&f->layer[l], rows, width, H, &s.p);
        /* the layer's input (x, or the layer below's saved h_t) and h_{t-1} */
        for (int64_t i = 0; i < steps; i++) {
            const int64_t b = i / L, t = i % L;
            if (l == 0)
                load_f64(f->x, i * n->input, n->input, s.in + i * K);
            else
                load_f64(f->saved, ((l - 1) * steps + i) * S + S - H, H, s.in + i * K);
            if (t > 0)
                load_f64(f->saved, (l * steps + i - 1) * S + S - H, H, s.hprev + i * H);
            else
                for (int64_t j = 0; j < H; j++)
                    s.hprev[i * H + j] = at_or_zero(f->h0, (l * B + b) * H + j);
        }
#pragma omp parallel for schedule(dynamic) if (threads)
        for (int64_t b = 0; b < B; b++)
            backward_row(a, &s, l, b, &w);
        if (fx_watch_gone(&w))
            break;
#pragma omp parallel for schedule(dynamic) if (threads)
        for (int64_t r = 0; r < rows; r++)
            weight_row(a, &s, l, r, width);
#pragma omp parallel for schedule(dynamic) if (threads)
        for (int64_t i = 0; i < steps; i++)
            input_grad(a, &s, l, i, width);
        /* the layer below's output gradient */
        for (int64_t i = 0; i < steps && l > 0; i++)
            memcpy(s.dout + i * H, s.din + i * K, sizeof(double) * (size_t)H);
    }
    fx_scratch_release(ex, mem);
    return fx_watch_end(&w, n->cell == FX_RNN_GRU ? "gru_backward" : "lstm_backward", st);
}

static size_t cpu_backward_scratch(const fx_exec *ex, const fx_rnn_bwd_args *a)
{
    (void)ex;
    return scratch_of(backward_doubles(&a->fwd.n));
}

const struct fx_rnn_ops fx_cpu_rnn_ops = {
    .forward = cpu_forward,
    .backward = cpu_backward,
    .step = cpu_step,
    .forward_scratch = cpu_forward_scratch,
    .backward_scratch = cpu_backward_scratch,
    .step_scratch = cpu_step_scratch,
};
