/* The CPU backend's fast path: f32 accumulation (as the CUDA kernels
 * accumulate), loops the compiler vectorises over contiguous channels or
 * states, a persistent thread pool, no allocation on the hot path.
 * docs/CPU.md has the design and the error bounds; the f64 oracle
 * (the files of c_src/cpu) stays what the tests compare against.
 *
 * What lives here: the pool, per-thread scratch, row loads and stores that
 * convert bf16/f16 on load, the matrix products (the system BLAS, loaded at
 * run time, split over the pool), and the approximations of exp, log,
 * sigmoid, softplus and tanh (plain arithmetic, so that a loop of them
 * vectorises). */
#ifndef FX_CPU_FAST_H
#define FX_CPU_FAST_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "cpu/cpu.h"
#include "fusex_activation.h"
#include "fusex_dtype.h"
#include "fusex_exec.h"

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

/* ---- matrix products: the system BLAS ----
 * Loaded with dlopen on first use: FUSEX_BLAS names the library (or
 * "none"), else libopenblas.so.0, then libblas.so.3 (a CBLAS with
 * cblas_sgemm and cblas_sgemv). A threaded OpenBLAS is set to one thread:
 * fusex splits the products over its own pool. Without one, the families
 * whose fast path rests on products (linear, GRU, LSTM) run the oracle. */

/* f32 arrays carved from one block of a caller's scratch, 64-byte aligned:
 * first with `next` NULL to count the floats a call needs, then over the
 * block itself. */
typedef struct fx_carve {
    float *next;
    size_t floats;
} fx_carve;

static inline float *fx_carve_take(fx_carve *c, int64_t count)
{
    float *p = c->next;
    const size_t rounded = ((size_t)count + 15) & ~(size_t)15;
    if (p)
        c->next += rounded;
    c->floats = fx_size_add(c->floats, rounded);
    return p;
}

/* Whether a BLAS was loaded (loads it on the first call). */
bool fx_blas_available(void);
/* What was loaded ("OpenBLAS 0.3.21 ... (libopenblas.so.0)"), or why none. */
const char *fx_blas_name(void);

/* C [m, n] = opA(A) [m, k] · opB(B) [k, n] + beta C, f32, row-major (A
 * stored [m, k], or [k, m] when trans_a; B [k, n], or [n, k] when trans_b);
 * beta 0 never reads C. */
typedef struct fx_fast_gemm_args {
    bool trans_a, trans_b;
    int64_t m, n, k;
    const float *a;
    int64_t lda;
    const float *b;
    int64_t ldb;
    float *c;
    int64_t ldc;
    float beta;
} fx_fast_gemm_args;

/* The product through the BLAS (which must be loaded), in tiles of C whose
 * edges depend on the shape alone, the tiles split over the pool where the
 * product is large enough to pay for a wake-up: every element of C is the
 * same one BLAS call's whatever the threads, so results do not depend on
 * the thread count. A one-row product is a matrix-vector product. */
void fx_fast_gemm(const fx_fast_gemm_args *g);

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
 *   fx_fast_tanh      <= 4 ulp (Cephes' odd polynomial below 0.625, exp's
 *                     error plus a division's above)
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

/* tanh (Cephes' tanhf): an odd polynomial below 0.625, 1 - 2 / (exp(2|x|) + 1)
 * above, the sign put back. */
FX_INLINE float fx_fast_tanh(float x)
{
    float ax = fabsf(x), s = x * x;
    float p = -5.70498872745e-3f;
    p = p * s + 2.06390887954e-2f;
    p = p * s - 5.37397155531e-2f;
    p = p * s + 1.33314422036e-1f;
    p = p * s - 3.33332819422e-1f;
    float small = p * s * x + x;
    float big = 1.0f - 2.0f / (fx_fast_exp(2.0f * ax) + 1.0f);
    big = x < 0.0f ? -big : big;
    return ax > 0.625f ? big : small;
}

FX_INLINE float fx_fast_silu_grad(float z)
{
    float s = fx_fast_sigmoid(z);
    return s * (1.0f + z * (1.0f - s));
}

/* The activations of fusex_activation.h and their derivatives (from the
 * pre-activation u, or from the output y where that determines it). */
FX_INLINE float fx_fast_activate(int act, float u)
{
    switch (act) {
    case FX_ACT_RELU: return u > 0.0f ? u : 0.0f;
    case FX_ACT_GELU: return 0.5f * u * (1.0f + fx_fast_tanh(0.7978845608f * (u + 0.044715f * u * u * u)));
    case FX_ACT_SILU: return fx_fast_silu(u);
    case FX_ACT_TANH: return fx_fast_tanh(u);
    case FX_ACT_SIGMOID: return fx_fast_sigmoid(u);
    default: return u;
    }
}

FX_INLINE float fx_fast_activate_grad(int act, float u)
{
    switch (act) {
    case FX_ACT_RELU: return u > 0.0f ? 1.0f : 0.0f;
    case FX_ACT_GELU: {
        const float k0 = 0.7978845608f, k1 = 0.044715f, t = fx_fast_tanh(k0 * (u + k1 * u * u * u));
        return 0.5f * (1.0f + t) + 0.5f * u * (1.0f - t * t) * k0 * (1.0f + 3.0f * k1 * u * u);
    }
    case FX_ACT_SILU: return fx_fast_silu_grad(u);
    case FX_ACT_TANH: {
        const float t = fx_fast_tanh(u);
        return 1.0f - t * t;
    }
    case FX_ACT_SIGMOID: {
        const float s = fx_fast_sigmoid(u);
        return s * (1.0f - s);
    }
    default: return 1.0f;
    }
}

FX_INLINE float fx_fast_activate_grad_at_output(int act, float y)
{
    switch (act) {
    case FX_ACT_RELU: return y > 0.0f ? 1.0f : 0.0f;
    case FX_ACT_TANH: return 1.0f - y * y;
    case FX_ACT_SIGMOID: return y * (1.0f - y);
    default: return 1.0f;
    }
}

/* ---- the op tables ---- */

extern const struct fx_linrec_ops fx_cpu_fast_linrec_ops;
extern const struct fx_ssm_ops fx_cpu_fast_ssm_ops;
extern const struct fx_optim_ops fx_cpu_fast_optim_ops;
extern const struct fx_linear_ops fx_cpu_fast_linear_ops;
extern const struct fx_conv_ops fx_cpu_fast_conv_ops;
extern const struct fx_norm_ops fx_cpu_fast_norm_ops;
extern const struct fx_rnn_ops fx_cpu_fast_rnn_ops;

#endif
