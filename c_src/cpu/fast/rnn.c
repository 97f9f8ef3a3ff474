/* The fast GRU and LSTM (fusex_rnn.h): f32 states and arithmetic, every
 * product through the system BLAS (fx_fast_gemm). Per layer the input
 * projections of the whole sequence are one product; each step is then
 * one product of the batch's states with W_hh and the gates, vectorised
 * along the hidden axis of each batch row. The backward runs the reverse
 * recurrence the same way (one product a step for dh), then forms dW_ih,
 * dW_hh and the input gradient as three products over the whole sequence;
 * the bias gradients are column sums in f64 in row order. Operands that
 * are not f32 (bf16, f16 weights and inputs) are converted once a call.
 * Every array lives in the caller's scratch, kept between calls. */
#include <limits.h>

#include "cpu/fast/fast.h"
#include "fusex_rnn.h"

static int64_t in_max(const fx_rnn_dims *n) { return n->input > n->hidden ? n->input : n->hidden; }

/* ---- scratch: f32 arrays carved from the caller's block ---- */

/* n elements of t from i0 into dst as f32 (zeros where t is NULL). */
static void load_into(const fx_tensor *t, int64_t i0, int64_t n, float *dst)
{
    if (n <= 0) /* an empty tensor has no data to read (memcpy's NULL) */
        return;
    if (!t) {
        memset(dst, 0, sizeof(float) * (size_t)n);
        return;
    }
    const float *p = fx_fast_load(t, i0, n, dst);
    if (p != dst)
        memcpy(dst, p, sizeof(float) * (size_t)n);
}

/* One layer's parameters as f32. */
typedef struct params {
    const float *w_ih, *w_hh, *b_ih, *b_hh;
    float *w_ih_buf, *w_hh_buf, *b_ih_buf, *b_hh_buf;
} params;

static void take_params(fx_carve *c, int64_t rows, int64_t K, int64_t H, params *p)
{
    p->w_ih_buf = fx_carve_take(c, rows * K);
    p->w_hh_buf = fx_carve_take(c, rows * H);
    p->b_ih_buf = fx_carve_take(c, rows);
    p->b_hh_buf = fx_carve_take(c, rows);
}

static void load_params(const fx_rnn_layer *l, int64_t rows, int64_t width, int64_t H, params *p)
{
    p->w_ih = fx_fast_load(l->w_ih, 0, rows * width, p->w_ih_buf);
    p->w_hh = fx_fast_load(l->w_hh, 0, rows * H, p->w_hh_buf);
    load_into(l->b_ih, 0, rows, p->b_ih_buf);
    load_into(l->b_hh, 0, rows, p->b_hh_buf);
    p->b_ih = p->b_ih_buf;
    p->b_hh = p->b_hh_buf;
}

/* The caller's scratch for `floats` f32 (never a zero-byte block). */
static float *call_floats(size_t floats)
{
    const size_t bytes = fx_size_mul((int64_t)(floats > 16 ? floats : 16), sizeof(float));
    return bytes == SIZE_MAX ? NULL : fx_fast_call_scratch(bytes);
}

/* C = A · Wᵀ (+ beta C): A [m, k] at lda, W [n, k]. */
static void product_t(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *w, float *c,
                      int64_t ldc)
{
    const fx_fast_gemm_args g = {.trans_b = true, .m = m, .n = n, .k = k, .a = a, .lda = lda, .b = w, .ldb = k,
                                 .c = c, .ldc = ldc};
    fx_fast_gemm(&g);
}

/* ---- forward ---- */

typedef struct fwd_arrays {
    params p;
    float *seq[2]; /* layer inputs and outputs [B*L][K], ping-pong */
    float *ax;     /* [B*L][G*H] */
    float *ah;     /* [B][G*H] */
    float *h, *c;  /* [B][H] */
    float *save;   /* [S]: a saved row */
} fwd_arrays;

static size_t carve_forward(fx_carve *c, const fx_rnn_dims *n, fwd_arrays *v)
{
    const int64_t H = n->hidden, rows = fx_rnn_gates(n->cell) * H, steps = n->batch * n->seqlen, K = in_max(n);
    take_params(c, rows, K, H, &v->p);
    v->seq[0] = fx_carve_take(c, steps * K);
    v->seq[1] = fx_carve_take(c, steps * K);
    v->ax = fx_carve_take(c, steps * rows);
    v->ah = fx_carve_take(c, n->batch * rows);
    v->h = fx_carve_take(c, n->batch * H);
    v->c = fx_carve_take(c, n->batch * H);
    v->save = fx_carve_take(c, fx_rnn_saved_width(n->cell, H));
    return c->floats;
}

/* One step of one batch row's cell: ax, ah the pre-activations without
 * their biases; h, c updated; save (or NULL) gets the saved row but h_t. */
FX_FAST_KERNEL
static void cell_step(int cell, int64_t H, const float *restrict ax, const float *restrict ah,
                      const float *restrict bi, const float *restrict bh, float *restrict h, float *restrict c,
                      float *restrict save)
{
    if (cell == FX_RNN_GRU) {
#pragma omp simd
        for (int64_t j = 0; j < H; j++) {
            const float r = fx_fast_sigmoid(ax[j] + bi[j] + ah[j] + bh[j]);
            const float z = fx_fast_sigmoid(ax[H + j] + bi[H + j] + ah[H + j] + bh[H + j]);
            const float hn = ah[2 * H + j] + bh[2 * H + j];
            const float nn = fx_fast_tanh(ax[2 * H + j] + bi[2 * H + j] + r * hn);
            h[j] = (1.0f - z) * nn + z * h[j];
            if (save) {
                save[j] = r;
                save[H + j] = z;
                save[2 * H + j] = nn;
                save[3 * H + j] = hn;
            }
        }
        return;
    }
#pragma omp simd
    for (int64_t j = 0; j < H; j++) {
        const float i = fx_fast_sigmoid(ax[j] + bi[j] + ah[j] + bh[j]);
        const float f = fx_fast_sigmoid(ax[H + j] + bi[H + j] + ah[H + j] + bh[H + j]);
        const float g = fx_fast_tanh(ax[2 * H + j] + bi[2 * H + j] + ah[2 * H + j] + bh[2 * H + j]);
        const float o = fx_fast_sigmoid(ax[3 * H + j] + bi[3 * H + j] + ah[3 * H + j] + bh[3 * H + j]);
        c[j] = f * c[j] + i * g;
        h[j] = o * fx_fast_tanh(c[j]);
        if (save) {
            save[j] = i;
            save[H + j] = f;
            save[2 * H + j] = g;
            save[3 * H + j] = o;
            save[4 * H + j] = c[j];
        }
    }
}

/* Layer l over the whole sequence: reads v->seq[l % 2] (width `width`),
 * writes its h_t into v->seq[(l + 1) % 2]. */
static void forward_layer(const fx_rnn_fwd_args *a, fwd_arrays *v, int64_t l, int64_t width, fx_watch *w)
{
    const fx_rnn_dims *n = &a->n;
    const int64_t B = n->batch, L = n->seqlen, H = n->hidden, rows = fx_rnn_gates(n->cell) * H, K = in_max(n);
    const int64_t S = fx_rnn_saved_width(n->cell, H);
    const float *in = v->seq[l % 2];
    float *out = v->seq[(l + 1) % 2];
    product_t(B * L, rows, width, in, K, v->p.w_ih, v->ax, rows);
    for (int64_t b = 0; b < B; b++) {
        load_into(a->h0, (l * B + b) * H, H, v->h + b * H);
        load_into(a->c0, (l * B + b) * H, H, v->c + b * H);
    }
    for (int64_t t = 0; t < L && !fx_watch_gone(w); t++) {
        product_t(B, rows, H, v->h, H, v->p.w_hh, v->ah, rows);
        for (int64_t b = 0; b < B; b++) {
            const int64_t row = b * L + t;
            cell_step(n->cell, H, v->ax + row * rows, v->ah + b * rows, v->p.b_ih, v->p.b_hh, v->h + b * H,
                      v->c + b * H, a->saved ? v->save : NULL);
            memcpy(out + row * K, v->h + b * H, sizeof(float) * (size_t)H);
            if (a->saved) {
                memcpy(v->save + S - H, v->h + b * H, sizeof(float) * (size_t)H);
                fx_fast_store(a->saved, (l * B * L + row) * S, S, v->save);
            }
        }
    }
    for (int64_t b = 0; b < B; b++) {
        const int64_t state = (l * B + b) * H;
        if (a->h_n)
            fx_fast_store(a->h_n, state, H, v->h + b * H);
        if (a->c_n)
            fx_fast_store(a->c_n, state, H, v->c + b * H);
    }
}

static int fast_forward(const fx_rnn_fwd_args *a, fx_status *st)
{
    const fx_rnn_dims *n = &a->n;
    const int64_t B = n->batch, L = n->seqlen, H = n->hidden, K = in_max(n), rows = fx_rnn_gates(n->cell) * H;
    fx_carve size = {0};
    fwd_arrays v;
    const size_t floats = carve_forward(&size, n, &v);
    fx_carve c = {call_floats(floats), 0};
    if (!c.next)
        return fx_fail(st, FX_ENOMEM, "out of host memory for a recurrence's %zu f32 of workspace", floats);
    carve_forward(&c, n, &v);
    for (int64_t i = 0; i < B * L; i++)
        load_into(a->x, i * n->input, n->input, v.seq[0] + i * K);
    fx_watch w;
    fx_watch_begin(&w);
    for (int64_t l = 0; l < n->layers && !fx_watch_gone(&w); l++) {
        const int64_t width = l == 0 ? n->input : H;
        load_params(&a->layer[l], rows, width, H, &v.p);
        forward_layer(a, &v, l, width, &w);
    }
    const float *top = v.seq[n->layers % 2];
    for (int64_t i = 0; i < B * L && !fx_watch_gone(&w); i++)
        fx_fast_store(a->y, i * H, H, top + i * K);
    return fx_watch_end(&w, n->cell == FX_RNN_GRU ? "gru" : "lstm", st);
}

/* ---- backward (the equations of c_src/cpu/rnn.c) ---- */

typedef struct bwd_arrays {
    params p;
    float *in;        /* the layer's input [B*L][K] */
    float *hprev;     /* h_{t-1} [B*L][H] */
    float *dout, *din; /* the layer output's and input's gradients [B*L][K] */
    float *dax, *dah; /* [B*L][G*H] */
    float *dh, *dc;   /* [B][H] */
    float *next;      /* [B][H]: what reaches h_{t-1} past W_hh */
    float *sr;        /* [S]: a saved row */
    double *dbias;    /* [G*H] */
} bwd_arrays;

static size_t carve_backward(fx_carve *c, const fx_rnn_dims *n, bwd_arrays *v)
{
    const int64_t H = n->hidden, rows = fx_rnn_gates(n->cell) * H, steps = n->batch * n->seqlen, K = in_max(n);
    take_params(c, rows, K, H, &v->p);
    v->in = fx_carve_take(c, steps * K);
    v->hprev = fx_carve_take(c, steps * H);
    v->dout = fx_carve_take(c, steps * K);
    v->din = fx_carve_take(c, steps * K);
    v->dax = fx_carve_take(c, steps * rows);
    v->dah = fx_carve_take(c, steps * rows);
    v->dh = fx_carve_take(c, n->batch * H);
    v->dc = fx_carve_take(c, n->batch * H);
    v->next = fx_carve_take(c, n->batch * H);
    v->sr = fx_carve_take(c, 2 * fx_rnn_saved_width(n->cell, H));
    v->dbias = (double *)fx_carve_take(c, 2 * rows);
    return c->floats;
}

/* One batch row's gate gradients at step t: g = dL/dh_t in total. */
FX_FAST_KERNEL
static void gate_grads(int cell, int64_t H, const float *restrict sv, const float *restrict sv_prev_c,
                       const float *restrict hp, const float *restrict g, float *restrict dc, float *restrict dax,
                       float *restrict dah, float *restrict next)
{
    if (cell == FX_RNN_GRU) {
#pragma omp simd
        for (int64_t j = 0; j < H; j++) {
            const float r = sv[j], z = sv[H + j], nn = sv[2 * H + j], hn = sv[3 * H + j];
            const float dn = g[j] * (1.0f - z), dz = g[j] * (hp[j] - nn);
            const float dan = dn * (1.0f - nn * nn);
            const float dar = dan * hn * r * (1.0f - r), daz = dz * z * (1.0f - z);
            dax[j] = dah[j] = dar;
            dax[H + j] = dah[H + j] = daz;
            dax[2 * H + j] = dan;
            dah[2 * H + j] = dan * r;
            next[j] = g[j] * z;
        }
        return;
    }
#pragma omp simd
    for (int64_t j = 0; j < H; j++) {
        const float i = sv[j], f = sv[H + j], gg = sv[2 * H + j], o = sv[3 * H + j], ct = sv[4 * H + j];
        const float tc = fx_fast_tanh(ct);
        const float dct = dc[j] + g[j] * o * (1.0f - tc * tc);
        dax[j] = dah[j] = dct * gg * i * (1.0f - i);
        dax[H + j] = dah[H + j] = dct * sv_prev_c[j] * f * (1.0f - f);
        dax[2 * H + j] = dah[2 * H + j] = dct * i * (1.0f - gg * gg);
        dax[3 * H + j] = dah[3 * H + j] = g[j] * tc * o * (1.0f - o);
        dc[j] = dct * f;
        next[j] = 0.0f;
    }
}

/* The layer's input and h_{t-1} sequences, and its states' gradients. */
static void load_layer(const fx_rnn_bwd_args *a, bwd_arrays *v, int64_t l)
{
    const fx_rnn_fwd_args *f = &a->fwd;
    const fx_rnn_dims *n = &f->n;
    const int64_t B = n->batch, L = n->seqlen, H = n->hidden, K = in_max(n), steps = B * L;
    const int64_t S = fx_rnn_saved_width(n->cell, H);
    for (int64_t i = 0; i < steps; i++) {
        const int64_t b = i / L, t = i % L;
        if (l == 0)
            load_into(f->x, i * n->input, n->input, v->in + i * K);
        else
            load_into(f->saved, ((l - 1) * steps + i) * S + S - H, H, v->in + i * K);
        if (t > 0)
            load_into(f->saved, (l * steps + i - 1) * S + S - H, H, v->hprev + i * H);
        else
            load_into(f->h0, (l * B + b) * H, H, v->hprev + i * H);
    }
    for (int64_t b = 0; b < B; b++) {
        load_into(a->dh_n, (l * B + b) * H, H, v->dh + b * H);
        load_into(a->dc_n, (l * B + b) * H, H, v->dc + b * H);
    }
}

/* The reverse recurrence of layer l: every step's gate gradients. */
static void backward_steps(const fx_rnn_bwd_args *a, bwd_arrays *v, int64_t l, fx_watch *w)
{
    const fx_rnn_fwd_args *f = &a->fwd;
    const fx_rnn_dims *n = &f->n;
    const int64_t B = n->batch, L = n->seqlen, H = n->hidden, rows = fx_rnn_gates(n->cell) * H, K = in_max(n);
    const int64_t S = fx_rnn_saved_width(n->cell, H);
    float *sv = v->sr, *cprev = v->sr + S;
    for (int64_t t = L - 1; t >= 0 && !fx_watch_gone(w); t--) {
        for (int64_t b = 0; b < B; b++) {
            const int64_t row = b * L + t;
            load_into(f->saved, (l * B * L + row) * S, S, sv);
            if (n->cell == FX_RNN_LSTM) {
                if (t > 0)
                    load_into(f->saved, (l * B * L + row - 1) * S + 4 * H, H, cprev);
                else
                    load_into(f->c0, (l * B + b) * H, H, cprev);
            }
            float *dh = v->dh + b * H; /* becomes g: the output's gradient plus what came back */
            const float *dout = v->dout + row * K;
            for (int64_t j = 0; j < H; j++)
                dh[j] += dout[j];
            gate_grads(n->cell, H, sv, cprev, v->hprev + row * H, dh, v->dc + b * H, v->dax + row * rows,
                       v->dah + row * rows, v->next + b * H);
        }
        /* dh_{t-1} = next + dah_t W_hh: dah_t's rows lie L rows apart */
        memcpy(v->dh, v->next, sizeof(float) * (size_t)(B * H));
        const fx_fast_gemm_args g2 = {.m = B, .n = H, .k = rows, .a = v->dah + t * rows, .lda = L * rows,
                                      .b = v->p.w_hh, .ldb = H, .c = v->dh, .ldc = H, .beta = 1.0f};
        fx_fast_gemm(&g2);
    }
}

/* sum over rows of d [rows_n][cols] into t (f64, row order). */
FX_FAST_KERNEL
static void column_sums(int64_t rows_n, int64_t cols, const float *restrict d, double *restrict sum,
                        const fx_tensor *t)
{
    memset(sum, 0, sizeof(double) * (size_t)cols);
    for (int64_t r = 0; r < rows_n; r++) {
        const float *restrict row = d + r * cols;
#pragma omp simd
        for (int64_t c = 0; c < cols; c++)
            sum[c] += row[c];
    }
    for (int64_t c = 0; c < cols; c++)
        fx_store_f64(t->data, t->dtype, c, sum[c]);
}

/* dW = Dᵀ X into t (D [steps][rows] f32, X [steps][width] at ld), through
 * f32 scratch where t is not f32 (the weight buffers, free by now). */
static void weight_grad(int64_t steps, int64_t rows, int64_t width, const float *d, const float *x, int64_t ldx,
                        const fx_tensor *t, float *buf)
{
    float *out = t->dtype == FX_F32 ? (float *)t->data : buf;
    const fx_fast_gemm_args g = {.trans_a = true, .m = rows, .n = width, .k = steps, .a = d, .lda = rows, .b = x,
                                 .ldb = ldx, .c = out, .ldc = width};
    fx_fast_gemm(&g);
    if (out == buf)
        fx_fast_store(t, 0, rows * width, out);
}

static void layer_gradients(const fx_rnn_bwd_args *a, bwd_arrays *v, int64_t l, int64_t width)
{
    const fx_rnn_dims *n = &a->fwd.n;
    const int64_t H = n->hidden, rows = fx_rnn_gates(n->cell) * H, K = in_max(n), steps = n->batch * n->seqlen;
    const fx_rnn_layer_grads *g = &a->grad[l];
    /* the input gradient first: it reads W_ih, whose buffer dW_ih's conversion may reuse */
    const fx_fast_gemm_args din = {.m = steps, .n = width, .k = rows, .a = v->dax, .lda = rows, .b = v->p.w_ih,
                                   .ldb = width, .c = v->din, .ldc = K};
    fx_fast_gemm(&din);
    weight_grad(steps, rows, width, v->dax, v->in, K, g->dw_ih, v->p.w_ih_buf);
    weight_grad(steps, rows, H, v->dah, v->hprev, H, g->dw_hh, v->p.w_hh_buf);
    if (g->db_ih)
        column_sums(steps, rows, v->dax, v->dbias, g->db_ih);
    if (g->db_hh)
        column_sums(steps, rows, v->dah, v->dbias, g->db_hh);
    for (int64_t b = 0; b < n->batch; b++) {
        const int64_t state = (l * n->batch + b) * H;
        if (a->dh0)
            fx_fast_store(a->dh0, state, H, v->dh + b * H);
        if (a->dc0)
            fx_fast_store(a->dc0, state, H, v->dc + b * H);
    }
}

static int fast_backward(const fx_rnn_bwd_args *a, fx_status *st)
{
    const fx_rnn_fwd_args *f = &a->fwd;
    const fx_rnn_dims *n = &f->n;
    const int64_t H = n->hidden, K = in_max(n), steps = n->batch * n->seqlen, rows = fx_rnn_gates(n->cell) * H;
    fx_carve size = {0};
    bwd_arrays v;
    const size_t floats = carve_backward(&size, n, &v);
    fx_carve c = {call_floats(floats), 0};
    if (!c.next)
        return fx_fail(st, FX_ENOMEM, "out of host memory for a recurrence backward's %zu f32 of workspace", floats);
    carve_backward(&c, n, &v);
    for (int64_t i = 0; i < steps; i++)
        load_into(a->dy, i * H, H, v.dout + i * K);
    fx_watch w;
    fx_watch_begin(&w);
    for (int64_t l = n->layers - 1; l >= 0 && !fx_watch_gone(&w); l--) {
        const int64_t width = l == 0 ? n->input : H;
        load_params(&f->layer[l], rows, width, H, &v.p);
        load_layer(a, &v, l);
        backward_steps(a, &v, l, &w);
        if (fx_watch_gone(&w))
            break;
        layer_gradients(a, &v, l, width);
        float *swap = v.dout; /* the layer below's output gradient */
        v.dout = v.din;
        v.din = swap;
    }
    for (int64_t i = 0; i < steps && !fx_watch_gone(&w); i++)
        fx_fast_store(a->dx, i * n->input, n->input, v.dout + i * K);
    return fx_watch_end(&w, n->cell == FX_RNN_GRU ? "gru_backward" : "lstm_backward", st);
}

/* ---- the table: the oracle for f64, the reference device, and where no
 * BLAS was found ---- */

static bool fits(const fx_rnn_dims *n)
{
    return n->batch * n->seqlen <= INT_MAX && fx_rnn_gates(n->cell) * n->hidden <= INT_MAX / n->seqlen &&
           in_max(n) <= INT_MAX;
}

static bool oracle(const fx_exec *ex, const fx_rnn_dims *n, fx_dtype x_type)
{
    return ex->device == FX_CPU_REFERENCE || x_type == FX_F64 || !fits(n) || !fx_blas_available();
}

static int cpu_forward(const fx_exec *ex, const fx_rnn_fwd_args *a, fx_status *st)
{
    return oracle(ex, &a->n, a->x->dtype) ? fx_cpu_rnn_ops.forward(ex, a, st) : fast_forward(a, st);
}

static int cpu_backward(const fx_exec *ex, const fx_rnn_bwd_args *a, fx_status *st)
{
    return oracle(ex, &a->fwd.n, a->fwd.x->dtype) ? fx_cpu_rnn_ops.backward(ex, a, st) : fast_backward(a, st);
}

/* A forward of one frame whose initial and final states are the same
 * tensors: each layer reads its states before it writes them. */
static int cpu_step(const fx_exec *ex, const fx_rnn_step_args *a, fx_status *st)
{
    if (oracle(ex, &a->n, a->x->dtype))
        return fx_cpu_rnn_ops.step(ex, a, st);
    fx_rnn_fwd_args f = {.n = a->n, .layer = a->layer, .x = a->x, .h0 = a->h, .c0 = a->c, .y = a->y,
                         .h_n = a->h, .c_n = a->c, .path = a->path};
    f.n.seqlen = 1;
    return fast_forward(&f, st);
}

/* The fast path's arrays live in the caller's own scratch. A query
 * without a context (NULL: the device's, either) answers for the oracle. */
static size_t cpu_forward_scratch(const fx_exec *ex, const fx_rnn_fwd_args *a)
{
    return !ex || oracle(ex, &a->n, a->x->dtype) ? fx_cpu_rnn_ops.forward_scratch(ex, a) : 0;
}

static size_t cpu_backward_scratch(const fx_exec *ex, const fx_rnn_bwd_args *a)
{
    return !ex || oracle(ex, &a->fwd.n, a->fwd.x->dtype) ? fx_cpu_rnn_ops.backward_scratch(ex, a) : 0;
}

static size_t cpu_step_scratch(const fx_exec *ex, const fx_rnn_step_args *a)
{
    return !ex || oracle(ex, &a->n, a->x->dtype) ? fx_cpu_rnn_ops.step_scratch(ex, a) : 0;
}

const struct fx_rnn_ops fx_cpu_fast_rnn_ops = {
    .forward = cpu_forward,
    .backward = cpu_backward,
    .step = cpu_step,
    .forward_scratch = cpu_forward_scratch,
    .backward_scratch = cpu_backward_scratch,
    .step_scratch = cpu_step_scratch,
};
