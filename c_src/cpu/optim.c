/* The optimizer reference: the formulas of docs/OPTIMIZERS.md in f64, one
 * element at a time, OpenMP over the same work list the GPU uses. States
 * are stored in f32 (as on the GPU); everything between a load and a store
 * is f64. */
#include <math.h>
#include <stdlib.h>

#include "fusex_dtype.h"
#include "cpu/cpu.h"
#include "fusex_optim.h"

static inline double load_float(const void *p, fx_dtype t, int64_t i)
{
    switch (t) {
    case FX_F32: return ((const float *)p)[i];
    case FX_BF16: return fx_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return fx_f16_to_f32(((const uint16_t *)p)[i]);
    }
}

/* A 16-bit param is rounded from its f32 master, as the GPU does. */
static inline void store_param16(void *p, fx_dtype t, int64_t i, float master)
{
    ((uint16_t *)p)[i] = t == FX_BF16 ? fx_f32_to_bf16(master) : fx_f32_to_f16(master);
}

/* [begin, end) of work item k within its tensor. */
static const fx_optim_slot *chunk_range(const fx_optim_args *a, int64_t k, int64_t *begin,
                                        int64_t *end)
{
    const fx_optim_slot *slot = &a->slots[a->chunk_tensor[k]];
    *begin = (k - slot->chunk_begin) * FX_OPTIM_CHUNK;
    *end = *begin + FX_OPTIM_CHUNK < slot->numel ? *begin + FX_OPTIM_CHUNK : slot->numel;
    return slot;
}

/* Below this much work a parallel region costs more than the loop. */
static bool worth_threads(const fx_optim_args *a)
{
    int64_t total = 0;
    for (uint32_t i = 0; i < a->ntensors; i++)
        total += a->slots[i].numel;
    return total > FX_CPU_PARALLEL_MIN;
}

/* ---- the norm pass: sum of squares and the non-finite check ---- */

/* Per-block partial sums (block k takes chunks k, k + blocks, ...), added
 * in block order into the state's partial sums, so the norm does not
 * depend on the thread count and the step needs no scratch. */
static void norm_pass(const fx_optim_args *a, double *sumsq, bool *bad)
{
    int64_t blocks = a->blocks, n = a->nchunks;
    int any_bad = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : any_bad) if (worth_threads(a))
    for (int64_t k = 0; k < blocks; k++) {
        double sum = 0;
        for (int64_t chunk = k; chunk < n; chunk += blocks) {
            int64_t begin, end;
            const fx_optim_slot *slot = chunk_range(a, chunk, &begin, &end);
            for (int64_t i = begin; i < end; i++) {
                double g = load_float(slot->grad, a->grad_dtype, i);
                any_bad |= !isfinite(g);
                sum += g * g;
            }
        }
        a->partial_sq[k] = sum;
    }
    double total = 0;
    for (int64_t k = 0; k < blocks; k++)
        total += a->partial_sq[k];
    *sumsq = total;
    *bad = any_bad != 0;
}

/* torch.nn.utils.clip_grad_norm_: min(1, max_norm / (norm + 1e-6)), where
 * a NaN norm gives a NaN factor (torch.clamp keeps NaN). */
static double clip_factor(double max_norm, double norm)
{
    double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 || isnan(coef) ? coef : 1.0;
}

/* ---- AdamW ---- */

typedef struct adamw_coeffs {
    double beta1, beta2, eps;
    double decay;     /* 1 - lr * weight_decay */
    double step_size; /* lr / (1 - beta1^t) */
    double bc2_sqrt;  /* sqrt(1 - beta2^t) */
    bool amsgrad;
} adamw_coeffs;

static adamw_coeffs adamw_coeffs_for(const fx_optim_hyper *h, int64_t t)
{
    adamw_coeffs k;
    k.beta1 = h->beta1;
    k.beta2 = h->beta2;
    k.eps = h->eps;
    k.decay = 1.0 - h->lr * h->weight_decay;
    k.step_size = h->lr / (1.0 - pow(h->beta1, (double)t));
    k.bc2_sqrt = sqrt(1.0 - pow(h->beta2, (double)t));
    k.amsgrad = h->amsgrad;
    return k;
}

/* One element; p is the f32 param or master. */
static void adamw_element(const adamw_coeffs *k, double g, float *p, float *m, float *v,
                          float *vmax)
{
    double param = (double)*p * k->decay;
    double m1 = k->beta1 * *m + (1.0 - k->beta1) * g;
    double v1 = k->beta2 * *v + (1.0 - k->beta2) * g * g;
    double vused = v1;
    if (k->amsgrad) {
        /* torch.maximum: NaN in either operand wins. */
        double vm = *vmax;
        vused = v1 > vm || isnan(v1) ? v1 : vm;
        *vmax = (float)vused;
    }
    double denom = sqrt(vused) / k->bc2_sqrt + k->eps;
    *p = (float)(param - k->step_size * (m1 / denom));
    *m = (float)m1;
    *v = (float)v1;
}

/* ---- SGD ---- */

typedef struct sgd_coeffs {
    double lr, weight_decay, momentum, dampening;
    bool nesterov, first; /* first: the momentum buffer starts as the gradient */
} sgd_coeffs;

static sgd_coeffs sgd_coeffs_for(const fx_optim_hyper *h, int64_t t)
{
    return (sgd_coeffs){h->lr, h->weight_decay, h->momentum, h->dampening, h->nesterov, t == 1};
}

static void sgd_element(const sgd_coeffs *k, double g, float *p, float *buf)
{
    double param = *p;
    g += k->weight_decay * param;
    if (k->momentum != 0) {
        double b = k->first ? g : k->momentum * *buf + (1.0 - k->dampening) * g;
        *buf = (float)b;
        g = k->nesterov ? g + k->momentum * b : b;
    }
    *p = (float)(param - k->lr * g);
}

/* ---- the update pass ---- */

static void update_chunk(const fx_optim_args *a, int64_t chunk, double clip,
                         const adamw_coeffs *ka, const sgd_coeffs *ks)
{
    int64_t begin, end;
    const fx_optim_slot *slot = chunk_range(a, chunk, &begin, &end);
    bool master = slot->master != NULL;
    for (int64_t i = begin; i < end; i++) {
        double g = load_float(slot->grad, a->grad_dtype, i) * clip;
        if (a->hyper.maximize)
            g = -g;
        float *p = master ? &slot->master[i] : &((float *)slot->param)[i];
        if (a->kind == FX_OPTIM_ADAMW)
            adamw_element(ka, g, p, &slot->buf0[i], &slot->buf1[i],
                          slot->buf2 ? &slot->buf2[i] : NULL);
        else
            sgd_element(ks, g, p, slot->buf0 ? &slot->buf0[i] : NULL);
        if (master)
            store_param16(slot->param, a->param_dtype, i, *p);
    }
}

/* Needs no scratch: its partial sums live in the state. */
static int cpu_optim_step(const fx_exec *ex, const fx_optim_args *a, fx_status *st)
{
    (void)ex;
    (void)st;
    double clip = 1.0;
    if (a->prepass) {
        double sumsq = 0;
        bool bad = false;
        norm_pass(a, &sumsq, &bad);
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
    adamw_coeffs ka = adamw_coeffs_for(&a->hyper, t);
    sgd_coeffs ks = sgd_coeffs_for(&a->hyper, t);
    int64_t n = a->nchunks;
#pragma omp parallel for schedule(dynamic, 1) if (worth_threads(a))
    for (int64_t k = 0; k < n; k++)
        update_chunk(a, k, clip, &ka, &ks);
    *a->step = t;
    return FX_OK;
}

const struct fx_optim_ops fx_cpu_optim_ops = {
    .step = cpu_optim_step,
};
