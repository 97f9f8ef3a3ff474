/* The CPU backend's fast path: f32 accumulation (as the CUDA kernels
 * accumulate), loops the compiler vectorises over contiguous channels or
 * states, a persistent thread pool, no allocation on the hot path.
 * docs/CPU.md has the design and the error bounds; the f64 oracle
 * (the files of c_src/cpu) stays what the tests compare against.
 *
 * What lives here: the pool, per-thread scratch, row loads and stores that
 * convert bf16/f16 on load, and the approximations of exp, log, sigmoid and
 * softplus (plain arithmetic, so that a loop of them vectorises). */
#ifndef FX_CPU_FAST_H
#define FX_CPU_FAST_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu/cpu.h"
#include "fusex_dtype.h"

/* The kernels are built twice, for x86-64-v3 (AVX2, FMA, F16C) and the
 * baseline, the CPU's picked when the library loads. */
#if defined(__x86_64__) && defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
#define FX_FAST_KERNEL __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FX_FAST_KERNEL
#endif

/* Inlined into its caller whatever the compiler's estimate: a loop helper
 * called from an FX_FAST_KERNEL must be compiled inside each clone (an out
 * of line copy is built for the baseline alone). */
#define FX_INLINE static inline __attribute__((always_inline))

/* ---- the pool ---- */

/* fn(ctx, lo, hi, part) over [lo, hi) of [0, n). */
typedef void (*fx_pool_fn)(void *ctx, int64_t lo, int64_t hi);

/* Runs fn over [0, n) in contiguous chunks, one a thread, each boundary a
 * multiple of `align` (but n itself). `work` is the call's cost in
 * element-steps: below FX_POOL_MIN_WORK, or while another call holds the
 * pool, or with one thread, it all runs inline on the caller, so a tiny
 * call costs a function call and never waits for a thread. Chunks get at
 * least FX_POOL_MIN_WORK of work each, so a call only wakes the threads it
 * can keep busy. The caller runs the first chunk. */
void fx_pool_run(int64_t n, int64_t align, int64_t work, fx_pool_fn fn, void *ctx);

/* Below this many element-steps (~50 µs of one core's work) a call runs
 * inline: waking a sleeping thread costs tens of microseconds when the
 * machine is busy. */
#define FX_POOL_MIN_WORK ((int64_t)1 << 16)

/* Threads the pool runs on (the caller's included): the cores this process
 * may use, or FUSEX_CPU_THREADS. */
int fx_pool_threads(void);
/* Joins the threads (the backend's shutdown); a later call starts them again. */
void fx_pool_shutdown(void);

/* Per-thread scratch of at least `bytes` (64-byte aligned), kept and grown
 * as calls need it: after the first call of a shape nothing is allocated.
 * NULL when memory runs out. Each call of a thread gets the same block:
 * one a task. */
void *fx_fast_scratch(size_t bytes);
/* A second such block of the calling thread, for what a whole call keeps
 * (per-batch partial sums reduced at its end) beside its tasks' scratch. */
void *fx_fast_call_scratch(size_t bytes);

/* ---- rows: bf16 / f16 convert on load ---- */

/* Elements [i0, i0 + n) of t as f32: t's own memory where it is f32, else
 * converted into buf. */
const float *fx_fast_load(const fx_tensor *t, int64_t i0, int64_t n, float *buf);
/* Where an output row of n elements at i0 is written: t's own memory where
 * it is f32, else buf, which fx_fast_store then converts into t. */
static inline float *fx_fast_out(const fx_tensor *t, int64_t i0, float *buf)
{
    return t->dtype == FX_F32 ? (float *)t->data + i0 : buf;
}
void fx_fast_store(const fx_tensor *t, int64_t i0, int64_t n, const float *row);
/* n elements with stride `stride` (a transposed read or write). */
void fx_fast_load_strided(const fx_tensor *t, int64_t i0, int64_t stride, int64_t n, float *out);
void fx_fast_store_strided(const fx_tensor *t, int64_t i0, int64_t stride, int64_t n, const float *v);
/* One element, or dflt where t is NULL. */
float fx_fast_at(const fx_tensor *t, int64_t i, float dflt);

/* ---- maths ----
 * Error bounds (relative, measured against f64 over the f32 range by
 * test_fast's accuracy case, which fails if they are passed):
 *   fx_fast_exp       <= 2 ulp (2.4e-7) for results >= FLT_MIN; below it
 *                     (inputs under -87.3) the result is correct to its
 *                     subnormal step; inf above 88.72, 0 below -104; NaN
 *                     stays NaN
 *   fx_fast_log       <= 2 ulp for normal positive inputs
 *   fx_fast_sigmoid   <= 4 ulp (exp's error plus a division's)
 *   fx_fast_softplus  <= 4 ulp (Goldberg's log1p from exp and log)
 * Cephes' minimax polynomials (exp degree 6 over [-ln2/2, ln2/2], log
 * degree 9 over [sqrt(1/2), sqrt(2)]) with Cody-Waite range reduction. */

FX_INLINE float fx_fast_bits_f(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

static inline uint32_t fx_fast_f_bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

FX_INLINE float fx_fast_exp(float x)
{
    /* x clamped (NaN passes: both comparisons are false) so that n stays
     * within [-150, 128]; 2^n is applied as two factors of normal range. */
    float xc = x > 88.7228391f ? 88.7228391f : x;
    xc = xc < -104.0f ? -104.0f : xc;
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float kf = xc * 1.44269504088896341f + magic;
    int32_t n = (int32_t)(fx_fast_f_bits(kf) - fx_fast_f_bits(magic));
    kf -= magic;
    float r = xc - kf * 0.693359375f;
    r = r - kf * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t n1 = n / 2, n2 = n - n1;
    float s1 = fx_fast_bits_f((uint32_t)(n1 + 127) << 23);
    float s2 = fx_fast_bits_f((uint32_t)(n2 + 127) << 23);
    float e = p * s1 * s2;
    return x > 88.7228391f ? INFINITY : e;
}

/* log(x) for x > 0 normal (the callers' arguments are >= 1). */
FX_INLINE float fx_fast_log(float x)
{
    uint32_t bits = fx_fast_f_bits(x);
    int32_t e = (int32_t)((bits >> 23) & 0xff) - 127;
    float m = fx_fast_bits_f((bits & 0x007fffffu) | 0x3f800000u); /* [1, 2) */
    int big = m > 1.41421356f;
    m = big ? m * 0.5f : m;
    float fe = (float)(e + big);
    float t = m - 1.0f, z = t * t;
    float p = 7.0376836292e-2f;
    p = p * t - 1.1514610310e-1f;
    p = p * t + 1.1676998740e-1f;
    p = p * t - 1.2420140846e-1f;
    p = p * t + 1.4249322787e-1f;
    p = p * t - 1.6668057665e-1f;
    p = p * t + 2.0000714765e-1f;
    p = p * t - 2.4999993993e-1f;
    p = p * t + 3.3333331174e-1f;
    float y = t * z * p;
    y += fe * -2.12194440e-4f;
    y += -0.5f * z;
    float r = t + y + fe * 0.693359375f;
    return x != x ? x : r; /* NaN stays NaN */
}

/* log(1 + e) for e >= 0 (Goldberg: log(w) * e / (w - 1) with w = 1 + e
 * is as accurate as log itself). */
FX_INLINE float fx_fast_log1p_pos(float e)
{
    float w = 1.0f + e;
    float d = w - 1.0f;
    float r = fx_fast_log(w) * (e / (d == 0.0f ? 1.0f : d));
    r = d == 0.0f ? e : r;
    return w == INFINITY ? w : r;
}

FX_INLINE float fx_fast_sigmoid(float x) { return 1.0f / (1.0f + fx_fast_exp(-x)); }

/* softplus with PyTorch's threshold (the identity above 20), as the
 * selective scan's oracle. */
FX_INLINE float fx_fast_softplus(float u)
{
    float e = fx_fast_exp(u > 20.0f ? 20.0f : u);
    float r = fx_fast_log1p_pos(e);
    return u > 20.0f ? u : r;
}

/* log(1 + exp(x)) for every x: max(x, 0) + log1p(exp(-|x|)). */
FX_INLINE float fx_fast_softplus_any(float x)
{
    float r = fx_fast_log1p_pos(fx_fast_exp(-fabsf(x)));
    return (x > 0.0f ? x : 0.0f) + r;
}

FX_INLINE float fx_fast_silu(float z) { return z * fx_fast_sigmoid(z); }

FX_INLINE float fx_fast_silu_grad(float z)
{
    float s = fx_fast_sigmoid(z);
    return s * (1.0f + z * (1.0f - s));
}

/* ---- the op tables ---- */

extern const struct fx_linrec_ops fx_cpu_fast_linrec_ops;
extern const struct fx_ssm_ops fx_cpu_fast_ssm_ops;
extern const struct fx_optim_ops fx_cpu_fast_optim_ops;

#endif
