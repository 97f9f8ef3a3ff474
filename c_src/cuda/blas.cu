// blas.cuh on cuBLASLt (the CPU emulator has test/emu/blas.cc instead).
//
// Row-major onto column-major. fusex's matrices are row-major; cuBLASLt's
// are column-major. A row-major [r, c] matrix with row stride ld is, read
// in place, the column-major [c, r] matrix with leading dimension ld: its
// transpose. So the row-major product C = opA(A) · opB(B) is computed as
// the column-major product Cᵀ = opB(B)ᵀ · opA(A)ᵀ, with nothing moved:
//
//   cuBLASLt's A  := our B, op tb: B stored [k, n] is column-major [n, k]
//                    (op N gives n x k); stored [n, k] is column-major
//                    [k, n] (op T gives n x k)
//   cuBLASLt's B  := our A, op ta: A stored [m, k] is column-major [k, m];
//                    stored [k, m] is column-major [m, k] (op T: k x m)
//   cuBLASLt's D  := Cᵀ, column-major [n, m] with leading dimension ldc
//   (m, n, k)     := (n, m, k)
//
// and a bias over C's columns is one over Dᵀ's rows, which is what
// cuBLASLt's bias epilogue adds (a vector of D's row count).
//
// Handles: one cuBLASLt handle a device, made the first time a product
// runs there and shared by every thread (cuBLASLt keeps no per-call state
// in it: the stream, workspace and descriptors come with each call). The
// descriptors are initialised on the stack for each call (no allocation).
// The algorithm for a shape is asked of the heuristics once and cached
// with the device (the query costs tens of microseconds, more than a small
// product); the key holds everything the heuristics look at, the operands'
// alignments included, so a given shape, type and alignment always runs
// the same algorithm: results do not change from call to call.
//
// Determinism and accuracy: split-K reductions are allowed only in the
// compute type through the workspace (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE,
// a separate deterministic step); the in-place and output-type schemes,
// which would accumulate partial sums in a 16-bit output, are excluded.
//
// Where the heuristics find no cuBLASLt algorithm (some unaligned 16-bit
// layouts), the product runs unfused through cuBLASLt, and failing that
// through cuBLAS's cublasGemmStridedBatchedEx (its default algorithm, which
// is deterministic; one handle a device under a lock, since a cuBLAS
// handle holds its stream and workspace), the epilogue in our kernel.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <mutex>

#include "cuda/blas_plan.cuh"
#include "cuda/launch.cuh"

namespace fx::cuda::blas {
namespace {

// The most workspace a product is given: what cuBLASLt's Hopper kernels
// use at most for their split-K partial sums.
constexpr size_t kWorkspace = (size_t)32 << 20;
constexpr int kCacheSlots = 256; // cached algorithms a device (a power of two)
constexpr int kCacheProbe = 8;

// Everything the heuristics see of a product: all int64, no padding, so
// keys compare and hash as bytes.
struct Key {
    int64_t ta, tb, m, n, k, lda, ldb, ldc;
    int64_t ab_type, c_type, compute, epilogue, aux, fused;
    int64_t batch, stride_a, stride_b, stride_c;
    int64_t align_a, align_b, align_c, align_d, align_bias, align_aux;
};

struct Entry {
    bool used;
    bool found; // false: the heuristics had no algorithm (cached too)
    Key key;
    cublasLtMatmulAlgo_t algo;
    size_t workspace;
};

struct DeviceBlas {
    std::mutex lock; // the handles' creation and the cache
    bool lt_ready, v2_ready;
    cublasLtHandle_t lt;
    cublasHandle_t v2;
    std::mutex v2_lock; // a cuBLAS call: its handle's stream and workspace
    Entry cache[kCacheSlots];
};

DeviceBlas devices[FX_CUDA_MAX_DEVICES];

cudaDataType_t cuda_type(fx_dtype t)
{
    switch (t) {
    case FX_BF16: return CUDA_R_16BF;
    case FX_F16: return CUDA_R_16F;
    default: return CUDA_R_32F;
    }
}

// A cuBLAS status as the op's failure: memory is the device's out of
// memory, anything else names the call.
int blas_fail(Device *d, cublasStatus_t status, const char *call, const char *what, fx_status *st)
{
    if (status == CUBLAS_STATUS_ALLOC_FAILED) {
        char where[128];
        snprintf(where, sizeof where, "%s (%s)", call, what);
        return fail(d, cudaErrorMemoryAllocation, where, st);
    }
    if (status == CUBLAS_STATUS_EXECUTION_FAILED) {
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess)
            return fail(d, err, call, st);
    }
    return fx_fail(st, status == CUBLAS_STATUS_NOT_SUPPORTED ? FX_EBADARG : FX_EINTERNAL, "%s: %s failed: %s", what,
                   call, cublasGetStatusString(status));
}

#define FX_BLAS_TRY(d, call, what, st)                                       \
    do {                                                                     \
        const cublasStatus_t fx_status_ = (call);                            \
        if (fx_status_ != CUBLAS_STATUS_SUCCESS)                             \
            return blas_fail(d, fx_status_, #call, what, st);                \
    } while (0)

DeviceBlas *device_blas(Device *d, bool v2, const char *what, fx_status *st)
{
    DeviceBlas *b = &devices[d->ordinal];
    std::lock_guard<std::mutex> held(b->lock);
    if (!b->lt_ready) {
        const cublasStatus_t s = cublasLtCreate(&b->lt);
        if (s != CUBLAS_STATUS_SUCCESS) {
            blas_fail(d, s, "cublasLtCreate", what, st);
            return nullptr;
        }
        b->lt_ready = true;
    }
    if (v2 && !b->v2_ready) {
        cublasStatus_t s = cublasCreate(&b->v2);
        if (s == CUBLAS_STATUS_SUCCESS) {
            // Reductions in a 16-bit output's precision would lose bits the
            // f32 accumulation keeps.
            s = cublasSetMathMode(b->v2, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                                         CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
            if (s != CUBLAS_STATUS_SUCCESS)
                (void)cublasDestroy(b->v2);
        }
        if (s != CUBLAS_STATUS_SUCCESS) {
            blas_fail(d, s, "cublasCreate", what, st);
            return nullptr;
        }
        b->v2_ready = true;
    }
    return b;
}

// The largest power of two up to 256 dividing every address an operand's
// batches start at.
int64_t alignment(const void *p, int64_t stride, int64_t batch, size_t elem)
{
    uint64_t bits = (uint64_t)(uintptr_t)p | 256u;
    if (batch > 1)
        bits |= (uint64_t)stride * elem;
    return (int64_t)(bits & (~bits + 1));
}

uint64_t hash_key(const Key &key)
{
    const unsigned char *bytes = reinterpret_cast<const unsigned char *>(&key);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof key; i++)
        h = (h ^ bytes[i]) * 1099511628211ull;
    return h;
}

// The cached algorithm for `key` into *out; false when not cached.
bool cache_find(DeviceBlas *b, const Key &key, uint64_t h, Entry *out)
{
    std::lock_guard<std::mutex> held(b->lock);
    for (int i = 0; i < kCacheProbe; i++) {
        const Entry &e = b->cache[(h + (uint64_t)i) & (kCacheSlots - 1)];
        if (e.used && memcmp(&e.key, &key, sizeof key) == 0) {
            *out = e;
            return true;
        }
    }
    return false;
}

// Into a free slot of the key's probe, or over its first (a cache of
// recent shapes, not all).
void cache_put(DeviceBlas *b, const Entry &entry, uint64_t h)
{
    std::lock_guard<std::mutex> held(b->lock);
    Entry *slot = &b->cache[h & (kCacheSlots - 1)];
    for (int i = 0; i < kCacheProbe; i++) {
        Entry *e = &b->cache[(h + (uint64_t)i) & (kCacheSlots - 1)];
        if (!e->used || memcmp(&e->key, &entry.key, sizeof entry.key) == 0) {
            slot = e;
            break;
        }
    }
    *slot = entry;
}

cublasLtEpilogue_t lt_epilogue(const detail::Plan &p)
{
    if (p.product_act == FX_ACT_GELU) {
        if (p.product_aux)
            return p.product_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        return p.product_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    }
    if (p.product_act == FX_ACT_RELU)
        return p.product_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    return p.product_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

cublasComputeType_t compute_type(const Gemm &g)
{
    return g.ab_type == FX_F32 && g.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

// One product's cuBLASLt descriptors, on the stack.
struct LtCall {
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t a, b, c, d;
    const void *c_ptr;
};

template <typename V>
cublasStatus_t set_desc(cublasLtMatmulDescOpaque_t *desc, cublasLtMatmulDescAttributes_t attr, const V &value)
{
    return cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof value);
}

cublasStatus_t layout(cublasLtMatrixLayoutOpaque_t *l, fx_dtype type, int64_t rows, int64_t cols, int64_t ld,
                      int64_t batch, int64_t stride)
{
    cublasStatus_t s = cublasLtMatrixLayoutInit(l, cuda_type(type), (uint64_t)rows, (uint64_t)cols, ld);
    if (s != CUBLAS_STATUS_SUCCESS || batch == 1)
        return s;
    const int32_t count = (int32_t)batch;
    s = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
    return s;
}

// The descriptors of g (column-major, as the head of this file says) with
// the part of the epilogue plan p fuses.
int describe(Device *dev, const Gemm &g, const detail::Plan &p, LtCall *call, const char *what, fx_status *st)
{
    FX_BLAS_TRY(dev, cublasLtMatmulDescInit(&call->desc, compute_type(g), CUDA_R_32F), what, st);
    const cublasOperation_t op_a = g.tb == Trans::kT ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = g.ta == Trans::kT ? CUBLAS_OP_T : CUBLAS_OP_N;
    FX_BLAS_TRY(dev, set_desc(&call->desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a), what, st);
    FX_BLAS_TRY(dev, set_desc(&call->desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b), what, st);
    const uint32_t epilogue = lt_epilogue(p);
    FX_BLAS_TRY(dev, set_desc(&call->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue), what, st);
    if (p.product_bias)
        FX_BLAS_TRY(dev, set_desc(&call->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias), what, st);
    if (p.product_aux) {
        const int64_t ld = g.ldc, stride = g.batch > 1 ? g.stride_c : 0;
        FX_BLAS_TRY(dev, set_desc(&call->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux), what, st);
        FX_BLAS_TRY(dev, set_desc(&call->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ld), what, st);
        if (g.batch > 1)
            FX_BLAS_TRY(dev, set_desc(&call->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, stride), what, st);
    }
    // cuBLASLt's A is our B and its B our A.
    FX_BLAS_TRY(dev,
                layout(&call->a, g.ab_type, detail::stored_cols(g.tb, g.k, g.n), detail::stored_rows(g.tb, g.k, g.n),
                       g.ldb, g.batch, g.stride_b),
                what, st);
    FX_BLAS_TRY(dev,
                layout(&call->b, g.ab_type, detail::stored_cols(g.ta, g.m, g.k), detail::stored_rows(g.ta, g.m, g.k),
                       g.lda, g.batch, g.stride_a),
                what, st);
    FX_BLAS_TRY(dev, layout(&call->c, g.c_type, g.n, g.m, g.ldc, g.batch, g.stride_c), what, st);
    FX_BLAS_TRY(dev, layout(&call->d, g.c_type, g.n, g.m, g.ldc, g.batch, g.stride_c), what, st);
    // beta 0 never reads C: C is D then, so the product works in place.
    call->c_ptr = g.beta != 0.0f ? g.c : p.product_out;
    return FX_OK;
}

Key key_of(const Gemm &g, const detail::Plan &p, const LtCall &call, bool fused)
{
    const size_t ab = fx_dtype_size(g.ab_type), c = fx_dtype_size(g.c_type);
    Key key;
    memset(&key, 0, sizeof key);
    key.ta = (int64_t)g.ta;
    key.tb = (int64_t)g.tb;
    key.m = g.m;
    key.n = g.n;
    key.k = g.k;
    key.lda = g.lda;
    key.ldb = g.ldb;
    key.ldc = g.ldc;
    key.ab_type = g.ab_type;
    key.c_type = g.c_type;
    key.compute = compute_type(g);
    key.epilogue = lt_epilogue(p);
    key.aux = p.product_aux;
    key.fused = fused;
    key.batch = g.batch;
    if (g.batch > 1) {
        key.stride_a = g.stride_a;
        key.stride_b = g.stride_b;
        key.stride_c = g.stride_c;
    }
    key.align_a = alignment(g.a, g.stride_a, g.batch, ab);
    key.align_b = alignment(g.b, g.stride_b, g.batch, ab);
    key.align_c = alignment(call.c_ptr, g.stride_c, g.batch, c);
    key.align_d = alignment(p.product_out, g.stride_c, g.batch, c);
    // The bias and aux pointers are the other addresses the heuristics read.
    key.align_bias = p.product_bias ? alignment(g.bias, 0, 1, 1) : 0;
    key.align_aux = p.product_aux ? alignment(g.aux, g.stride_c, g.batch, c) : 0;
    return key;
}

// The cached (or newly found) algorithm for the call; e->found false when
// cuBLASLt has none.
int find_algo(Device *dev, DeviceBlas *b, const Gemm &g, const detail::Plan &p, const LtCall &call, bool fused,
              Entry *e, const char *what, fx_status *st)
{
    const Key key = key_of(g, p, call, fused);
    const uint64_t h = hash_key(key);
    if (cache_find(b, key, h, e))
        return FX_OK;
    cublasLtMatmulPreferenceOpaque_t pref;
    FX_BLAS_TRY(dev, cublasLtMatmulPreferenceInit(&pref), what, st);
    const uint64_t max_workspace = kWorkspace;
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    const uint32_t aligns[4] = {(uint32_t)key.align_b, (uint32_t)key.align_a, (uint32_t)key.align_c,
                                (uint32_t)key.align_d}; // cuBLASLt's A is our B
    const cublasLtMatmulPreferenceAttributes_t align_attrs[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    FX_BLAS_TRY(dev,
                cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
                                                     sizeof max_workspace),
                what, st);
    FX_BLAS_TRY(dev,
                cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                     sizeof schemes),
                what, st);
    for (int i = 0; i < 4; i++)
        FX_BLAS_TRY(dev, cublasLtMatmulPreferenceSetAttribute(&pref, align_attrs[i], &aligns[i], sizeof aligns[i]),
                    what, st);
    cublasLtMatmulHeuristicResult_t result;
    memset(&result, 0, sizeof result);
    int count = 0;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(
        b->lt, const_cast<cublasLtMatmulDescOpaque_t *>(&call.desc), const_cast<cublasLtMatrixLayoutOpaque_t *>(&call.a),
        const_cast<cublasLtMatrixLayoutOpaque_t *>(&call.b), const_cast<cublasLtMatrixLayoutOpaque_t *>(&call.c),
        const_cast<cublasLtMatrixLayoutOpaque_t *>(&call.d), &pref, 1, &result, &count);
    if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED)
        return blas_fail(dev, s, "cublasLtMatmulAlgoGetHeuristic", what, st);
    memset(e, 0, sizeof *e);
    e->used = true;
    e->key = key;
    e->found = s == CUBLAS_STATUS_SUCCESS && count > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (e->found) {
        e->algo = result.algo;
        e->workspace = result.workspaceSize;
    }
    cache_put(b, *e, h);
    return FX_OK;
}

int run_lt(const Run &r, DeviceBlas *b, const Gemm &g, const detail::Plan &p, const LtCall &call, const Entry &e,
           const char *what, fx_status *st)
{
    void *workspace = nullptr;
    if (take_scratch(r, e.workspace, what, &workspace, st))
        return st->code;
    const float alpha = g.alpha, beta = g.beta;
    const cublasStatus_t s = cublasLtMatmul(
        b->lt, const_cast<cublasLtMatmulDescOpaque_t *>(&call.desc), &alpha, g.b,
        const_cast<cublasLtMatrixLayoutOpaque_t *>(&call.a), g.a, const_cast<cublasLtMatrixLayoutOpaque_t *>(&call.b),
        &beta, call.c_ptr, const_cast<cublasLtMatrixLayoutOpaque_t *>(&call.c), p.product_out,
        const_cast<cublasLtMatrixLayoutOpaque_t *>(&call.d), &e.algo, workspace, e.workspace, r.stream);
    give_back(r, workspace);
    if (s != CUBLAS_STATUS_SUCCESS)
        return blas_fail(r.d, s, "cublasLtMatmul", what, st);
    return FX_OK;
}

// The plain product through cuBLAS, into p.product_out (C read in place:
// only where that is C, or beta is 0).
int run_v2(const Run &r, const Gemm &g, const detail::Plan &p, const char *what, fx_status *st)
{
    if (g.beta != 0.0f && p.product_out != g.c)
        return fx_fail(st, FX_EBADARG,
                       "%s: no cuBLASLt algorithm for this layout, and cuBLAS cannot keep the pre-activation (aux) "
                       "with beta != 0",
                       what);
    DeviceBlas *b = device_blas(r.d, true, what, st);
    if (!b)
        return st->code;
    void *workspace = nullptr;
    if (take_scratch(r, kWorkspace, what, &workspace, st))
        return st->code;
    const float alpha = g.alpha, beta = g.beta;
    const cublasComputeType_t compute = compute_type(g);
    cublasStatus_t s;
    {
        std::lock_guard<std::mutex> held(b->v2_lock);
        s = cublasSetStream(b->v2, r.stream);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasSetWorkspace(b->v2, workspace, kWorkspace);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasGemmStridedBatchedEx_64(
                b->v2, g.tb == Trans::kT ? CUBLAS_OP_T : CUBLAS_OP_N, g.ta == Trans::kT ? CUBLAS_OP_T : CUBLAS_OP_N,
                g.n, g.m, g.k, &alpha, g.b, cuda_type(g.ab_type), g.ldb, g.stride_b, g.a, cuda_type(g.ab_type), g.lda,
                g.stride_a, &beta, p.product_out, cuda_type(g.c_type), g.ldc, g.stride_c, g.batch, compute,
                CUBLAS_GEMM_DEFAULT);
        // The workspace goes back once this product is enqueued: the next
        // user of the handle sets its own.
        (void)cublasSetWorkspace(b->v2, nullptr, 0);
    }
    give_back(r, workspace);
    if (s != CUBLAS_STATUS_SUCCESS)
        return blas_fail(r.d, s, "cublasGemmStridedBatchedEx", what, st);
    return FX_OK;
}

// The product part of plan p: cuBLASLt where it has an algorithm, else
// false in *ran (nothing enqueued).
int try_lt(const Run &r, DeviceBlas *b, const Gemm &g, const detail::Plan &p, bool fused, bool *ran, const char *what,
           fx_status *st)
{
    *ran = false;
    LtCall call;
    Entry e;
    if (describe(r.d, g, p, &call, what, st) || find_algo(r.d, b, g, p, call, fused, &e, what, st))
        return st->code;
    if (!e.found)
        return FX_OK;
    *ran = true;
    return run_lt(r, b, g, p, call, e, what, st);
}

} // namespace

size_t workspace_bytes() { return kWorkspace; }

int gemm(const Run &r, const Gemm &g, const char *what, fx_status *st)
{
    if (detail::check(g, what, st))
        return st->code;
    if (g.m == 0 || g.n == 0)
        return FX_OK;
    detail::Plan p = detail::plan(g, true);
    if (p.product) {
        DeviceBlas *b = device_blas(r.d, false, what, st);
        if (!b)
            return st->code;
        bool ran = false;
        if (try_lt(r, b, g, p, true, &ran, what, st))
            return st->code;
        if (!ran) { // unfused: a plain product, the epilogue ours
            p = detail::plan(g, false);
            if (try_lt(r, b, g, p, false, &ran, what, st) || (!ran && run_v2(r, g, p, what, st)))
                return st->code;
        }
    }
    return detail::run_epilogue(r, g, p, what, st);
}

void shutdown()
{
    for (DeviceBlas &b : devices) {
        std::lock_guard<std::mutex> held(b.lock);
        if (b.lt_ready)
            (void)cublasLtDestroy(b.lt);
        if (b.v2_ready)
            (void)cublasDestroy(b.v2);
        b.lt_ready = b.v2_ready = false;
        memset(b.cache, 0, sizeof b.cache);
    }
}

} // namespace fx::cuda::blas
