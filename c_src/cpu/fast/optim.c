/* The fast optimizer step (fusex_optim.h): the formulas of
 * docs/OPTIMIZERS.md in f32, as the CUDA kernels compute them, over the
 * same work list, vectorised along each chunk, chunks split over the
 * pool. The norm pass sums each chunk's squares in f32 (16 384 elements
 * in vector lanes) and the chunks' sums in f64 in block order, so the norm
 * does not depend on the thread count. */
#include <math.h>
#include <stdatomic.h>

#include "cpu/fast/fast.h"
#include "fusex_optim.h"

#define PIECE 1024 /* elements converted and updated at once */

static int64_t total_elements(const fx_optim_args *a)
{
    int64_t total = 0;
    for (uint32_t i = 0; i < a->ntensors; i++)
        total += a->slots[i].numel;
    return total;
}

static const fx_optim_slot *chunk_range(const fx_optim_args *a, int64_t k, int64_t *begin, int64_t *end)
{
    const fx_optim_slot *slot = &a->slots[a->chunk_tensor[k]];
    *begin = (k - slot->chunk_begin) * FX_OPTIM_CHUNK;
    *end = *begin + FX_OPTIM_CHUNK < slot->numel ? *begin + FX_OPTIM_CHUNK : slot->numel;
    return slot;
}

/* n gradients from i as f32. */
static const float *grads(const fx_optim_args *a, const fx_optim_slot *slot, int64_t i, int64_t n, float *buf)
{
    fx_tensor t = {.data = (void *)slot->grad, .dtype = a->grad_dtype};
    return fx_fast_load(&t, i, n, buf);
}

/* ---- the norm pass ---- */

typedef struct norm_job {
    const fx_optim_args *a;
} norm_job;

FX_FAST_KERNEL
static void norm_blocks(void *ctx, int64_t lo, int64_t hi)
{
    const fx_optim_args *a = ((const norm_job *)ctx)->a;
    _Alignas(64) float buf[PIECE];
    for (int64_t k = lo; k < hi; k++) {
        double sum = 0.0;
        uint32_t bad = 0;
        for (int64_t chunk = k; chunk < a->nchunks; chunk += a->blocks) {
            int64_t begin, end;
            const fx_optim_slot *slot = chunk_range(a, chunk, &begin, &end);
            float s = 0.0f, nonfinite = 0.0f;
            for (int64_t i = begin; i < end; i += PIECE) {
                int64_t n = end - i < PIECE ? end - i : PIECE;
                const float *restrict g = grads(a, slot, i, n, buf);
#pragma omp simd reduction(+ : s, nonfinite)
                for (int64_t j = 0; j < n; j++) {
                    s += g[j] * g[j];
                    nonfinite += g[j] - g[j]; /* 0 for finite, NaN for Inf or NaN */
                }
            }
            sum += s;
            bad |= nonfinite != 0.0f;
        }
        a->partial_sq[k] = sum;
        a->partial_bad[k] = bad;
    }
}

static void norm_pass(const fx_optim_args *a, int64_t work, double *sumsq, bool *bad)
{
    norm_job job = {a};
    fx_pool_run(a->blocks, 1, work, norm_blocks, &job);
    double total = 0;
    bool any = false;
    for (int64_t k = 0; k < a->blocks; k++) {
        total += a->partial_sq[k];
        any |= a->partial_bad[k] != 0;
    }
    *sumsq = total;
    *bad = any;
}

static double clip_factor(double max_norm, double norm)
{
    double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 || isnan(coef) ? coef : 1.0;
}

/* ---- the update ---- */

typedef struct coeffs {
    float clip; /* the gradient's factor: clip, negated when maximizing */
    /* AdamW */
    float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, step_size, inv_bc2_sqrt;
    /* SGD */
    float lr, weight_decay, momentum, one_minus_dampening;
    bool amsgrad, nesterov, first;
} coeffs;

typedef struct update_job {
    const fx_optim_args *a;
    coeffs k;
} update_job;

FX_INLINE void adamw_piece(const coeffs *k, int64_t n, const float *restrict g, float *restrict p,
                               float *restrict m, float *restrict v, float *restrict vmax)
{
    if (vmax) {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) {
            float gj = g[j] * k->clip;
            float m1 = k->beta1 * m[j] + k->one_minus_beta1 * gj;
            float v1 = k->beta2 * v[j] + k->one_minus_beta2 * gj * gj;
            float vm = vmax[j];
            float vu = v1 > vm || v1 != v1 ? v1 : vm; /* torch.maximum: NaN wins */
            vmax[j] = vu;
            float denom = sqrtf(vu) * k->inv_bc2_sqrt + k->eps;
            p[j] = p[j] * k->decay - k->step_size * (m1 / denom);
            m[j] = m1;
            v[j] = v1;
        }
        return;
    }
#pragma omp simd
    for (int64_t j = 0; j < n; j++) {
        float gj = g[j] * k->clip;
        float m1 = k->beta1 * m[j] + k->one_minus_beta1 * gj;
        float v1 = k->beta2 * v[j] + k->one_minus_beta2 * gj * gj;
        float denom = sqrtf(v1) * k->inv_bc2_sqrt + k->eps;
        p[j] = p[j] * k->decay - k->step_size * (m1 / denom);
        m[j] = m1;
        v[j] = v1;
    }
}

FX_INLINE void sgd_piece(const coeffs *k, int64_t n, const float *restrict g, float *restrict p,
                             float *restrict buf)
{
    if (!buf) {
#pragma omp simd
        for (int64_t j = 0; j < n; j++)
            p[j] = p[j] - k->lr * (g[j] * k->clip + k->weight_decay * p[j]);
        return;
    }
#pragma omp simd
    for (int64_t j = 0; j < n; j++) {
        float gj = g[j] * k->clip + k->weight_decay * p[j];
        float b = k->first ? gj : k->momentum * buf[j] + k->one_minus_dampening * gj;
        buf[j] = b;
        p[j] = p[j] - k->lr * (k->nesterov ? gj + k->momentum * b : b);
    }
}

FX_FAST_KERNEL
static void update_chunks(void *ctx, int64_t lo, int64_t hi)
{
    const update_job *job = ctx;
    const fx_optim_args *a = job->a;
    _Alignas(64) float buf[PIECE];
    for (int64_t chunk = lo; chunk < hi; chunk++) {
        int64_t begin, end;
        const fx_optim_slot *slot = chunk_range(a, chunk, &begin, &end);
        float *params = slot->master ? slot->master : (float *)slot->param;
        for (int64_t i = begin; i < end; i += PIECE) {
            int64_t n = end - i < PIECE ? end - i : PIECE;
            const float *g = grads(a, slot, i, n, buf);
            if (a->kind == FX_OPTIM_ADAMW)
                adamw_piece(&job->k, n, g, params + i, slot->buf0 + i, slot->buf1 + i,
                            slot->buf2 ? slot->buf2 + i : NULL);
            else
                sgd_piece(&job->k, n, g, params + i, slot->buf0 ? slot->buf0 + i : NULL);
            if (slot->master) {
                fx_tensor t = {.data = slot->param, .dtype = a->param_dtype};
                fx_fast_store(&t, i, n, params + i);
            }
        }
    }
}

static coeffs coeffs_for(const fx_optim_hyper *h, int64_t t, double clip)
{
    coeffs k;
    k.clip = (float)(h->maximize ? -clip : clip);
    k.beta1 = (float)h->beta1;
    k.one_minus_beta1 = (float)(1.0 - h->beta1);
    k.beta2 = (float)h->beta2;
    k.one_minus_beta2 = (float)(1.0 - h->beta2);
    k.eps = (float)h->eps;
    k.decay = (float)(1.0 - h->lr * h->weight_decay);
    k.step_size = (float)(h->lr / (1.0 - pow(h->beta1, (double)t)));
    k.inv_bc2_sqrt = (float)(1.0 / sqrt(1.0 - pow(h->beta2, (double)t)));
    k.lr = (float)h->lr;
    k.weight_decay = (float)h->weight_decay;
    k.momentum = (float)h->momentum;
    k.one_minus_dampening = (float)(1.0 - h->dampening);
    k.amsgrad = h->amsgrad;
    k.nesterov = h->nesterov;
    k.first = t == 1;
    return k;
}

static int fast_step(const fx_optim_args *a)
{
    const int64_t work = total_elements(a) * 4;
    double clip = 1.0;
    if (a->prepass) {
        double sumsq = 0;
        bool bad = false;
        norm_pass(a, work, &sumsq, &bad);
        double norm = sqrt(sumsq);
        bool skip = bad && a->hyper.skip_nonfinite;
        *a->grad_norm = (float)norm;
        *a->skipped = skip;
        if (skip)
            return FX_OK;
        if (a->hyper.clip)
            clip = clip_factor(a->hyper.max_grad_norm, norm);
    } else {
        *a->grad_norm = -1.0f;
        *a->skipped = 0;
    }
    int64_t t = *a->step + 1;
    update_job job = {a, coeffs_for(&a->hyper, t, clip)};
    fx_pool_run(a->nchunks, 1, work * 4, update_chunks, &job);
    *a->step = t;
    return FX_OK;
}

static int cpu_step(const fx_exec *ex, const fx_optim_args *a, fx_status *st)
{
    if (ex->device == FX_CPU_REFERENCE)
        return fx_cpu_optim_ops.step(ex, a, st);
    return fast_step(a);
}

const struct fx_optim_ops fx_cpu_fast_optim_ops = {
    .step = cpu_step,
};
