// The parts of blas.cuh that are ours and not cuBLASLt's, compiled for the
// GPU and for the CPU emulator alike: the checks every product passes, the
// split of its epilogue between the product and a kernel (blas_plan.cuh),
// that kernel, and the deterministic column sums of a bias gradient.
#include "cuda/activation.cuh"
#include "cuda/blas_plan.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/launch.cuh"
#include "cuda/sums.cuh"

namespace fx::cuda::blas {

Epilogue epilogue_of(bool bias, int act)
{
    switch (act) {
    case FX_ACT_RELU: return bias ? Epilogue::kBiasRelu : Epilogue::kRelu;
    case FX_ACT_GELU: return bias ? Epilogue::kBiasGelu : Epilogue::kGelu;
    case FX_ACT_SILU: return bias ? Epilogue::kBiasSilu : Epilogue::kSilu;
    case FX_ACT_TANH: return bias ? Epilogue::kBiasTanh : Epilogue::kTanh;
    case FX_ACT_SIGMOID: return bias ? Epilogue::kBiasSigmoid : Epilogue::kSigmoid;
    default: return bias ? Epilogue::kBias : Epilogue::kNone;
    }
}

bool epilogue_has_bias(Epilogue e)
{
    switch (e) {
    case Epilogue::kBias:
    case Epilogue::kBiasRelu:
    case Epilogue::kBiasGelu:
    case Epilogue::kBiasSilu:
    case Epilogue::kBiasTanh:
    case Epilogue::kBiasSigmoid: return true;
    default: return false;
    }
}

int epilogue_activation(Epilogue e)
{
    switch (e) {
    case Epilogue::kBiasRelu:
    case Epilogue::kRelu: return FX_ACT_RELU;
    case Epilogue::kBiasGelu:
    case Epilogue::kGelu: return FX_ACT_GELU;
    case Epilogue::kBiasSilu:
    case Epilogue::kSilu: return FX_ACT_SILU;
    case Epilogue::kBiasTanh:
    case Epilogue::kTanh: return FX_ACT_TANH;
    case Epilogue::kBiasSigmoid:
    case Epilogue::kSigmoid: return FX_ACT_SIGMOID;
    default: return FX_ACT_NONE;
    }
}

namespace detail {

static bool is_compute_float(fx_dtype t) { return t == FX_F32 || t == FX_BF16 || t == FX_F16; }

static int expect_ld(const char *what, const char *name, int64_t ld, int64_t cols, fx_status *st)
{
    const int64_t least = cols > 1 ? cols : 1;
    if (ld >= least)
        return FX_OK;
    return fx_fail(st, FX_EBADARG, "%s: expected %s >= %lld (the stored rows' length), got %lld", what, name,
                   (long long)least, (long long)ld);
}

int check(const Gemm &g, const char *what, fx_status *st)
{
    if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 1)
        return fx_fail(st, FX_EBADARG, "%s: expected m, n, k >= 0 and batch >= 1, got m %lld, n %lld, k %lld, batch %lld",
                       what, (long long)g.m, (long long)g.n, (long long)g.k, (long long)g.batch);
    if (!is_compute_float(g.ab_type))
        return fx_fail(st, FX_EBADARG, "%s: expected A and B of type {f,32}, {bf,16} or {f,16}, got %s", what,
                       fx_dtype_name(g.ab_type));
    if (g.c_type != FX_F32 && g.c_type != g.ab_type)
        return fx_fail(st, FX_EBADARG, "%s: expected C of type {f,32} or %s (A's), got %s", what,
                       fx_dtype_name(g.ab_type), fx_dtype_name(g.c_type));
    if (epilogue_has_bias(g.epilogue) && (!g.bias || !is_compute_float(g.bias_type)))
        return fx_fail(st, FX_EBADARG, "%s: expected a bias of type {f,32}, {bf,16} or {f,16} for its epilogue, got %s",
                       what, g.bias ? fx_dtype_name(g.bias_type) : "none");
    if (expect_ld(what, "lda", g.lda, stored_cols(g.ta, g.m, g.k), st) ||
        expect_ld(what, "ldb", g.ldb, stored_cols(g.tb, g.k, g.n), st) || expect_ld(what, "ldc", g.ldc, g.n, st))
        return st->code;
    if (g.batch > INT32_MAX) // cuBLASLt's batch count is an int32
        return fx_fail(st, FX_EBADARG, "%s: expected at most %d batches, got %lld", what, INT32_MAX, (long long)g.batch);
    if (g.batch > 1 && (g.stride_a < 0 || g.stride_b < 0 || g.stride_c < 0))
        return fx_fail(st, FX_EBADARG, "%s: expected batch strides >= 0, got %lld, %lld, %lld", what,
                       (long long)g.stride_a, (long long)g.stride_b, (long long)g.stride_c);
    const bool empty = g.m == 0 || g.n == 0;
    if (!empty && (!g.c || (g.k > 0 && (!g.a || !g.b))))
        return fx_fail(st, FX_EBADARG, "%s: expected A, B and C to be given for a product of %lld x %lld x %lld", what,
                       (long long)g.m, (long long)g.n, (long long)g.k);
    return FX_OK;
}

Plan plan(const Gemm &g, bool fuse)
{
    Plan p = {};
    p.has_bias = epilogue_has_bias(g.epilogue);
    p.activation = epilogue_activation(g.epilogue);
    p.product = g.k > 0;
    if (!p.product) { // alpha·AB is 0: the kernel forms beta·C (+ bias) and the rest
        p.kernel = true;
        p.kernel_bias = p.has_bias;
        p.kernel_act = p.activation;
        return p;
    }
    // cuBLASLt adds a bias of D's type; its gelu-with-aux wants the aux
    // rows (and batches) a multiple of 8 elements apart.
    const bool bias_fusable = fuse && (!p.has_bias || g.bias_type == g.c_type);
    const bool act_fusable = p.activation == FX_ACT_NONE || p.activation == FX_ACT_RELU ||
                             p.activation == FX_ACT_GELU;
    const bool aux_fusable =
        p.activation == FX_ACT_GELU && g.ldc % 8 == 0 && (g.batch == 1 || g.stride_c % 8 == 0);
    p.product_bias = p.has_bias && bias_fusable;
    if (bias_fusable && act_fusable && (!g.aux || aux_fusable)) { // all of it in the product
        p.product_out = g.c;
        p.product_act = p.activation;
        p.product_aux = g.aux != nullptr;
        return p;
    }
    // The product (with the bias where it can) into aux when the
    // pre-activation is kept, else into C; the kernel does the rest.
    p.product_out = g.aux ? g.aux : g.c;
    p.product_act = FX_ACT_NONE;
    p.kernel_bias = p.has_bias && !p.product_bias;
    p.kernel_act = p.activation;
    p.kernel = g.aux || p.kernel_bias || p.kernel_act != FX_ACT_NONE;
    return p;
}

// C (and aux) from the pre-activation: the product's D (src, scale 1), or
// for k = 0 beta·C (scale beta; 0 reads nothing), then + bias, act.
struct EpilogueParams {
    const void *src;
    float src_scale;
    void *c, *aux;
    const void *bias;
    int bias_type;
    bool add_bias;
    int act;
    int64_t m, n, ldc, stride_c, batch;
};

template <typename C> __device__ inline void epilogue_at(const EpilogueParams &p, const C *src, C *c, C *aux,
                                                          bool write_aux, int64_t at, int64_t col)
{
    float pre = p.src_scale == 0.0f ? 0.0f : p.src_scale * Elem<C>::load(src[at]);
    if (p.add_bias)
        pre += load_any(p.bias, p.bias_type, col);
    if (write_aux)
        aux[at] = Elem<C>::store(pre);
    c[at] = Elem<C>::store(act::apply(p.act, pre));
}

// aux already holds the pre-activation when the product wrote it there
// and nothing is added.
inline __device__ bool epilogue_writes_aux(const EpilogueParams &p)
{
    return p.aux && !(p.src == p.aux && p.src_scale == 1.0f && !p.add_bias);
}

// Rows of at least kEpilogueRowCols columns: a block a row at a time, its
// threads along the row, so that an element's place costs no division (a
// 64-bit division an element made the kernel compute-bound: 265 µs over
// 16384 x 3072 bf16, against ~50 for its bytes).
constexpr int64_t kEpilogueRowCols = 128;

template <typename C> __global__ void epilogue_rows_kernel(const EpilogueParams p)
{
    const C *src = static_cast<const C *>(p.src);
    C *c = static_cast<C *>(p.c), *aux = static_cast<C *>(p.aux);
    const bool write_aux = epilogue_writes_aux(p);
    for (int64_t r = blockIdx.x; r < p.m * p.batch; r += gridDim.x) {
        const int64_t bt = r / p.m, row = r - bt * p.m, base = bt * p.stride_c + row * p.ldc;
        for (int64_t col = threadIdx.x; col < p.n; col += blockDim.x)
            epilogue_at(p, src, c, aux, write_aux, base + col, col);
    }
}

// Narrow rows: a thread an element.
template <typename C> __global__ void epilogue_kernel(const EpilogueParams p)
{
    const int64_t per = p.m * p.n, total = per * p.batch;
    const C *src = static_cast<const C *>(p.src);
    C *c = static_cast<C *>(p.c), *aux = static_cast<C *>(p.aux);
    const bool write_aux = epilogue_writes_aux(p);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t bt = i / per, rem = i - bt * per, row = rem / p.n, col = rem - row * p.n;
        epilogue_at(p, src, c, aux, write_aux, bt * p.stride_c + row * p.ldc + col, col);
    }
}

int run_epilogue(const Run &r, const Gemm &g, const Plan &p, const char *what, fx_status *st)
{
    if (!p.kernel || g.m == 0 || g.n == 0)
        return FX_OK;
    EpilogueParams e = {};
    e.src = p.product ? p.product_out : g.c;
    e.src_scale = p.product ? 1.0f : g.beta;
    e.c = g.c;
    e.aux = g.aux;
    e.bias = g.bias;
    e.bias_type = (int)g.bias_type;
    e.add_bias = p.kernel_bias;
    e.act = p.kernel_act;
    e.m = g.m;
    e.n = g.n;
    e.ldc = g.ldc;
    e.stride_c = g.batch > 1 ? g.stride_c : 0;
    e.batch = g.batch;
    const int64_t total = g.m * g.n * g.batch;
    if (g.n >= kEpilogueRowCols)
        return FX_DISPATCH_FLOAT(C, g.c_type, what, st, [&] {
            return launch<epilogue_rows_kernel<C>>(r, grid_for(r.d, g.m * g.batch * 256, 256), 256,
                                                   "blas epilogue kernel", st, e);
        });
    return FX_DISPATCH_FLOAT(C, g.c_type, what, st, [&] {
        return launch<epilogue_kernel<C>>(r, grid_for(r.d, total, 256), 256, "blas epilogue kernel", st, e);
    });
}

} // namespace detail

// ---- column sums ----

namespace {

constexpr int kSumCols = 32;         // columns a block (one a lane)
constexpr int kSumLanes = 8;         // rows summed side by side in a block
constexpr int64_t kRowsPerPart = 512; // rows one block sums, at least
constexpr int64_t kMaxParts = 128;    // blocks down a column, at most

int64_t sum_parts(int64_t rows)
{
    if (rows <= kRowsPerPart)
        return 1;
    const int64_t parts = (rows + kRowsPerPart - 1) / kRowsPerPart;
    return parts < kMaxParts ? parts : kMaxParts;
}

struct ColumnParams {
    const void *src;
    int64_t rows, cols, ld, rows_per_part, col_blocks;
    float *partial; // [parts, cols], or nullptr: one part, written to dst
    void *dst;
    int dst_type;
};

// A block of kSumCols * kSumLanes threads: lane y (a warp) of column x
// sums rows y, y + 8, ... of its part; the lanes are then added in order.
template <typename S> __global__ void column_sums_kernel(const ColumnParams p)
{
    __shared__ float lanes[kSumLanes][kSumCols + 1];
    const int x = threadIdx.x % kSumCols, y = threadIdx.x / kSumCols;
    const int64_t col_block = blockIdx.x % p.col_blocks, part = blockIdx.x / p.col_blocks;
    const int64_t col = col_block * kSumCols + x;
    const int64_t r0 = part * p.rows_per_part;
    const int64_t r1 = r0 + p.rows_per_part < p.rows ? r0 + p.rows_per_part : p.rows;
    const S *src = static_cast<const S *>(p.src);
    float sum = 0.0f;
    if (col < p.cols)
        for (int64_t row = r0 + y; row < r1; row += kSumLanes)
            sum += Elem<S>::load(src[row * p.ld + col]);
    lanes[y][x] = sum;
    __syncthreads();
    if (y != 0 || col >= p.cols)
        return;
    float total = 0.0f;
#pragma unroll
    for (int lane = 0; lane < kSumLanes; lane++)
        total += lanes[lane][x];
    if (p.partial)
        p.partial[part * p.cols + col] = total;
    else
        store_any(p.dst, p.dst_type, col, total);
}

} // namespace

size_t column_sums_scratch(int64_t rows, int64_t cols)
{
    const int64_t parts = sum_parts(rows);
    return parts == 1 ? 0 : fx_size_mul(fx_size_mul(parts, cols), (int64_t)sizeof(float));
}

int column_sums(const Run &r, const ColumnSums &s, const char *what, fx_status *st)
{
    if (s.cols == 0)
        return FX_OK;
    if (s.rows < 0 || s.cols < 0 || (s.rows > 0 && s.ld < s.cols) || !s.dst || (s.rows > 0 && !s.src))
        return fx_fail(st, FX_EBADARG, "%s: expected rows, cols >= 0 and ld >= cols, got %lld, %lld, %lld", what,
                       (long long)s.rows, (long long)s.cols, (long long)s.ld);
    const int64_t parts = sum_parts(s.rows);
    ColumnParams p = {};
    p.src = s.src;
    p.rows = s.rows;
    p.cols = s.cols;
    p.ld = s.ld;
    p.rows_per_part = parts == 1 ? (s.rows > 0 ? s.rows : 1) : (s.rows + parts - 1) / parts;
    p.col_blocks = (s.cols + kSumCols - 1) / kSumCols;
    p.dst = s.dst;
    p.dst_type = (int)s.dst_type;
    void *partial = nullptr;
    if (parts > 1 && take_scratch(r, column_sums_scratch(s.rows, s.cols), what, &partial, st))
        return st->code;
    p.partial = static_cast<float *>(partial);
    const int rc = FX_DISPATCH_FLOAT(S, s.src_type, what, st, [&] {
        return launch<column_sums_kernel<S>>(r, p.col_blocks * parts, kSumCols * kSumLanes, "column sums kernel", st,
                                             p);
    });
    if (rc == FX_OK && parts > 1) {
        SumRegions sums = {};
        sums.r[0] = SumRegion{p.partial, s.dst, s.cols, (int)parts, (int)s.dst_type};
        sums.count = 1;
        sums.total = s.cols;
        launch_sums(r, sums, what, st);
    }
    give_back(r, partial);
    return st->code;
}

} // namespace fx::cuda::blas
