// The GRU's and LSTM's launch plan, host side: which path a call takes (the
// persistent kernel, as a wavefront over the layers or one layer a launch,
// or the stepwise path), the persistent kernel's blocks, batch groups and
// shared memory, and the scratch each op takes. The scratch queries and the
// launchers (rnn/launchers.cuh) both read it, and the emulator runs the
// same plan on its device record.
#ifndef FX_CUDA_RNN_PLAN_CUH
#define FX_CUDA_RNN_PLAN_CUH

#include <limits.h>

#include "cuda/blas.cuh"
#include "cuda/rnn/persistent.cuh"

namespace fx::cuda::rnn {

inline int type_of(const fx_tensor *t) { return t ? (int)t->dtype : (int)FX_F32; }
inline const void *data_of(const fx_tensor *t) { return t ? t->data : nullptr; }

// Every size a kernel indexes with fits its counters: the gate rows and a
// layer's widths in an int (offsets are 64-bit).
inline int check_dims(const fx_rnn_dims &n, const char *op, fx_status *st)
{
    const int64_t limit = (int64_t)1 << 28;
    if (n.hidden >= limit || n.input >= limit)
        return fx_fail(st, FX_EBADARG, "%s: expected hidden and input below 2^28 on CUDA, got hidden %lld, input %lld",
                       op, (long long)n.hidden, (long long)n.input);
    return FX_OK;
}

// ---- the persistent kernel's launch ----

struct WavePlan {
    bool fits = false;
    bool mma = false;   // tensor-core products (Mma), else Ffma
    bool stage = false; // the weights in shared memory (else read in place: a step that does not fit)
    int layers = 0;     // in the launch
    int units = 0, tiles = 0, groups = 0, bt = 0;
    int64_t group_rows = 0, blocks = 0;
    int64_t wmax = 0;   // the widest on-chip projection (the shared memory's layout)
    size_t smem = 0;
};

// Blocks of `smem` dynamic bytes an SM keeps resident at once: by threads,
// by shared memory (what a block may opt into plus the 1 KB the SM keeps
// per block), and at most 2 (the kernels' launch bounds hold them to 128
// registers a thread).
inline int resident_per_sm(const Device *d, size_t smem)
{
    const size_t per_sm = d->shared_per_block_optin + 1024;
    int by_threads = d->max_threads_per_sm / kThreads;
    int by_smem = (int)(per_sm / (smem + 1024));
    int n = by_threads < by_smem ? by_threads : by_smem;
    return n < 2 ? n : 2;
}

// The batch rows a block's product takes at once: Ffma 1, 4 or 8; Mma
// n-tiles of 8, 1, 2 or 4 of them.
inline int batch_tile(int64_t rows, bool mma)
{
    if (mma)
        return rows <= 8 ? 8 : rows <= 16 ? 16 : 32;
    return rows <= 1 ? 1 : rows <= 4 ? 4 : 8;
}

inline int64_t staged_ld(int64_t k, bool mma) { return mma ? mma_ld(k) : k; }

// What a step of a persistent launch costs, in ns, to choose between
// plans: the block's products (CUDA cores: ~128 FMA a clock an SM at half
// use; tensor cores: ~1024 at half use) and the states every block reads
// from L2 (tagged words of 8 bytes, 4 for the tensor cores' 16-bit states;
// ~8 TB/s for the whole chip), over a fixed
// ~1 us for the trip the dependency takes. Only the order of plans
// matters: the constants are an H100/H200's, roughly.
inline double step_cost(int64_t rows, int64_t k, int64_t group_rows, int bt, int64_t blocks, bool mma)
{
    const double tiles = (double)((group_rows + bt - 1) / bt);
    const double macs = (double)rows * (double)k * tiles * bt;
    const double compute_ns = macs / ((mma ? 512.0 : 64.0) * 1.7);
    const double traffic_ns = (double)blocks * (double)group_rows * (double)k * (mma ? 4.0 : 8.0) / 8000.0;
    // each batch tile's loads and barriers: ~0.4 us of latency
    return 1000.0 + 400.0 * tiles + compute_ns + traffic_ns;
}

// A launch of `layers` layers of `hidden` units over `batch` rows on d:
// every block resident at once (one or two an SM), the batch in groups
// that meet only among themselves (each block then holds more units and
// reads fewer rows of the states), the plan of least step_cost that fits.
// `wmax`: the widest on-chip projection (0: none); `stage`: the weights in
// shared memory.
inline WavePlan wave_plan(const Device *d, int gates, int64_t hidden, int64_t batch, int layers, int64_t wmax,
                          int64_t esize, bool stage, bool mma)
{
    WavePlan best;
    double best_cost = 0;
    const bool lstm = gates == 4;
    for (int per_sm = 1; per_sm <= 2; per_sm++) {
        const int64_t capacity = (int64_t)d->sm_count * per_sm;
        for (int64_t groups = 1; groups <= batch && groups * layers <= capacity; groups *= 2) {
            const int64_t tiles_max = capacity / (layers * groups);
            WavePlan p;
            p.layers = layers;
            p.wmax = wmax;
            p.units = (int)((hidden + tiles_max - 1) / tiles_max);
            p.tiles = (int)((hidden + p.units - 1) / p.units);
            p.group_rows = (batch + groups - 1) / groups;
            p.groups = (int)((batch + p.group_rows - 1) / p.group_rows);
            p.mma = mma;
            p.stage = stage;
            p.blocks = (int64_t)p.groups * layers * p.tiles;
            // the widest batch tile that fits, down to the smallest
            for (p.bt = batch_tile(p.group_rows, mma); p.bt >= (mma ? 8 : 1); p.bt = p.bt > 4 ? p.bt / 2 : p.bt / 4) {
                p.smem = (size_t)wave_smem((int64_t)gates * p.units, staged_ld(hidden, mma), staged_ld(wmax, mma), p.bt,
                                           esize, mma ? esize : 4, stage, mma, p.group_rows * p.units, lstm)
                             .total;
                if (p.smem <= d->shared_per_block_optin && resident_per_sm(d, p.smem) >= per_sm)
                    break;
            }
            if (p.bt < (mma ? 8 : 1))
                continue;
            const double cost = step_cost((int64_t)gates * p.units, hidden + wmax, p.group_rows, p.bt, p.blocks, mma);
            if (!best.fits || cost < best_cost) {
                p.fits = true;
                best = p;
                best_cost = cost;
            }
        }
    }
    return best;
}

inline WavePlan back_plan(const Device *d, int gates, int64_t hidden, int64_t batch, int64_t esize, bool mma)
{
    WavePlan best;
    double best_cost = 0;
    for (int per_sm = 1; per_sm <= 2; per_sm++) {
        const int64_t capacity = (int64_t)d->sm_count * per_sm;
        for (int64_t groups = 1; groups <= batch && groups <= capacity; groups *= 2) {
            const int64_t tiles_max = capacity / groups;
            WavePlan p;
            p.layers = 1;
            p.units = (int)((hidden + tiles_max - 1) / tiles_max);
            p.tiles = (int)((hidden + p.units - 1) / p.units);
            p.group_rows = (batch + groups - 1) / groups;
            p.groups = (int)((batch + p.group_rows - 1) / p.group_rows);
            p.mma = mma;
            p.stage = true;
            p.blocks = (int64_t)p.groups * p.tiles;
            for (p.bt = batch_tile(p.group_rows, mma); p.bt >= (mma ? 8 : 1); p.bt = p.bt > 4 ? p.bt / 2 : p.bt / 4) {
                p.smem = (size_t)back_smem(p.units, staged_ld(gates * hidden, mma), p.bt, esize, mma ? esize : 4, mma)
                             .total;
                if (p.smem <= d->shared_per_block_optin && resident_per_sm(d, p.smem) >= per_sm)
                    break;
            }
            if (p.bt < (mma ? 8 : 1))
                continue;
            const double cost = step_cost(p.units, gates * hidden, p.group_rows, p.bt, p.blocks, mma);
            if (!best.fits || cost < best_cost) {
                p.fits = true;
                best = p;
                best_cost = cost;
            }
        }
    }
    return best;
}

// ---- which path ----

enum class Kind { kStepwise, kPersistent };

// How a forward (or a step: `step`, a sequence of one with every layer's
// projection on chip) runs: the persistent kernel over chunks of `wave`
// layers, or stepwise. `first` plans the chunk that holds layer 0 (its
// projection: gx, or x's `input` columns on chip for a step), `rest` the
// full chunks after it and `last` a shorter final chunk (layers % wave).
struct ForwardPlan {
    Kind kind = Kind::kStepwise;
    int wave = 1;
    WavePlan first, rest, last;
};

inline int64_t chunks_of(const fx_rnn_dims &n, int wave) { return (n.layers + wave - 1) / wave; }

// The plan of the chunk starting at layer l0.
inline const WavePlan &chunk_plan(const ForwardPlan &fp, const fx_rnn_dims &n, int64_t l0)
{
    if (l0 == 0)
        return fp.first;
    return l0 + fp.wave <= n.layers ? fp.rest : fp.last;
}

// The persistent path's time (ns): each chunk's steps (its sequence plus
// its wavefront's depth) at its plan's step_cost.
inline double persistent_cost(const ForwardPlan &fp, const fx_rnn_dims &n)
{
    double total = 0;
    for (int64_t l0 = 0; l0 < n.layers;) {
        const WavePlan &w = chunk_plan(fp, n, l0);
        const int gates = fx_rnn_gates(n.cell);
        total += (double)(n.seqlen + w.layers - 1) *
                 step_cost((int64_t)gates * w.units, n.hidden + w.wmax, w.group_rows, w.bt, w.blocks, w.mma);
        l0 += w.layers;
    }
    return total;
}

inline int forced_unfit(const fx_rnn_dims &n, const Device *d, int path, const char *op, fx_status *st)
{
    return fx_fail(st, FX_EBADARG,
                   "path: the persistent %s kernel%s does not fit hidden %lld, batch %lld on a device of %d SMs",
                   op, (path & FX_RNN_PATH_NO_WAVEFRONT) ? " (one layer a launch)" : "", (long long)n.hidden,
                   (long long)n.batch, d->sm_count);
}

inline int check_path(int path, fx_dtype dtype, fx_status *st)
{
    const int kind = FX_RNN_PATH_KIND(path);
    if (kind > FX_RNN_PATH_PERSISTENT_MMA || (path & ~(0x0f | FX_RNN_PATH_NO_WAVEFRONT)))
        return fx_fail(st, FX_EBADARG, "path: expected one of FX_RNN_PATH_*, got %#x", (unsigned)path);
    if (kind == FX_RNN_PATH_PERSISTENT_MMA && dtype == FX_F32)
        return fx_fail(st, FX_EBADARG, "path: tensor-core products take {bf,16} or {f,16} inputs, got {f,32}");
    return FX_OK;
}

// Tensor-core products: where forced, and by default for 16-bit inputs at
// training batches (16 rows and more), whose products the CUDA cores
// would take several times longer over; smaller batches keep h in f32 for
// the product. A step (a few rows, each weight used once) takes the CUDA
// cores.
inline bool use_mma(const fx_rnn_dims &n, int64_t esize, int path, bool step)
{
    if (step || esize != 2)
        return false;
    const int kind = FX_RNN_PATH_KIND(path);
    return kind == FX_RNN_PATH_PERSISTENT_MMA || (kind == FX_RNN_PATH_AUTO && n.batch >= 16);
}

// The stepwise path's time (ns) for the recurrences of every layer: per
// step a GEMM (cuBLAS: ~25 T FMA/s in f32, ~300 T on the tensor cores)
// and a pointwise kernel, ~6 us of latency for the two.
inline double stepwise_cost(const fx_rnn_dims &n, int64_t esize, int64_t hidden, bool forward)
{
    const double gh = (double)fx_rnn_gates(n.cell) * hidden;
    const double macs = (double)n.batch * gh * hidden, rate = esize == 4 ? 25e3 : 300e3;
    const double pointwise = (double)n.batch * gh * (forward ? 8.0 : 16.0) / 3000.0;
    return (double)n.layers * n.seqlen * (6000.0 + macs / rate + pointwise);
}

// AUTO takes the persistent kernels only up to this many rows. Measured
// on an H200 (H512, 2 layers, L60; H1024, L1024): at batch 1 the persistent
// forward is 3x the stepwise path's speed; from batch 16 up the stepwise
// path's cuBLAS products are as fast or faster (to 1.9x in a B64 LSTM's
// backward), which the step-cost model above does not see.
constexpr int64_t kAutoPersistentRows = 8;

struct ForwardPlan;
inline double persistent_cost(const ForwardPlan &fp, const fx_rnn_dims &n);

// Every chunk of `wave` layers planned; false where one does not fit.
inline bool plan_waves(const Device *d, const fx_rnn_dims &n, int64_t esize, bool step, bool stage, bool mma,
                       int wave, ForwardPlan *out)
{
    const int gates = fx_rnn_gates(n.cell);
    const int64_t layers = n.layers;
    ForwardPlan p;
    p.kind = Kind::kPersistent;
    p.wave = wave;
    const int first_layers = (int)(layers < wave ? layers : wave);
    // on chip: the projections of the layers above a chunk's first (hidden
    // wide) and, for a step, of the chunk's first too (input wide for layer 0)
    const int64_t wide = n.input > n.hidden ? n.input : n.hidden;
    const int64_t first_w = step ? wide : first_layers > 1 ? n.hidden : 0;
    p.first = wave_plan(d, gates, n.hidden, n.batch, first_layers, first_w, esize, stage, mma);
    bool fits = p.first.fits;
    const int tail = (int)(layers % wave);
    if (layers > wave && fits) {
        p.rest = wave_plan(d, gates, n.hidden, n.batch, wave, step || wave > 1 ? n.hidden : 0, esize, stage, mma);
        fits = p.rest.fits;
    }
    if (layers > wave && tail && fits) {
        p.last = wave_plan(d, gates, n.hidden, n.batch, tail, step || tail > 1 ? n.hidden : 0, esize, stage, mma);
        fits = p.last.fits;
    }
    if (fits)
        *out = p;
    return fits;
}

// The forward's (or the step's) plan: the widest wavefront that fits
// (every layer of a launch resident at once), else one layer a launch;
// with the weights staged in shared memory, or for a step that cannot
// stage them, read in place. A forced persistent path that does not fit
// fails in st; AUTO falls back to stepwise.
inline int plan_forward(const Device *d, const fx_rnn_dims &n, int64_t esize, int path, bool step, ForwardPlan *fp,
                        fx_status *st)
{
    *fp = ForwardPlan{};
    const int kind = FX_RNN_PATH_KIND(path);
    if (kind == FX_RNN_PATH_STEPWISE || (kind == FX_RNN_PATH_AUTO && !step && n.batch > kAutoPersistentRows))
        return FX_OK;
    const bool mma = use_mma(n, esize, path, step);
    const int widest = (path & FX_RNN_PATH_NO_WAVEFRONT) ? 1 : (int)(n.layers < kMaxWave ? n.layers : kMaxWave);
    for (int staged = 1; staged >= (step ? 0 : 1); staged--)
        for (int wave = widest; wave >= 1; wave = wave > 1 ? 1 : 0)
            if (plan_waves(d, n, esize, step, staged, mma, wave, fp)) {
                // AUTO: the stepwise path where its GEMMs (at cuBLAS's rate)
                // would take less than the persistent kernel's products
                // (large batches in f32)
                if (kind == FX_RNN_PATH_AUTO && !step &&
                    stepwise_cost(n, esize, n.hidden, true) < persistent_cost(*fp, n))
                    *fp = ForwardPlan{};
                return FX_OK;
            }
    if (kind != FX_RNN_PATH_AUTO)
        return forced_unfit(n, d, path, step ? "step" : "forward", st);
    return FX_OK;
}

struct BackwardPlan {
    Kind kind = Kind::kStepwise;
    WavePlan wave;
};

// The backward's products take the tensor cores for bf16 only: they round
// the gate gradients to the weights' type, and f16's five exponent bits
// flush the gradients that shrink step by step back to zero (the CUDA
// cores keep them in f32).
inline int plan_backward(const Device *d, const fx_rnn_dims &n, fx_dtype dtype, int path, BackwardPlan *bp,
                         fx_status *st)
{
    const int64_t esize = (int64_t)fx_dtype_size(dtype);
    *bp = BackwardPlan{};
    const int kind = FX_RNN_PATH_KIND(path);
    if (kind == FX_RNN_PATH_STEPWISE || (kind == FX_RNN_PATH_AUTO && n.batch > kAutoPersistentRows))
        return FX_OK;
    bp->wave = back_plan(d, fx_rnn_gates(n.cell), n.hidden, n.batch, esize,
                         dtype == FX_BF16 && use_mma(n, esize, path, false));
    const WavePlan &w = bp->wave;
    if (w.fits && (kind != FX_RNN_PATH_AUTO ||
                   (double)(n.seqlen + 1) * n.layers *
                           step_cost(w.units, fx_rnn_gates(n.cell) * n.hidden, w.group_rows, w.bt, w.blocks, w.mma) <=
                       stepwise_cost(n, esize, n.hidden, false))) {
        bp->kind = Kind::kPersistent;
        return FX_OK;
    }
    if (kind != FX_RNN_PATH_AUTO)
        return forced_unfit(n, d, path, "backward", st);
    return FX_OK;
}

// ---- scratch ----

// The pieces an op takes, each its own allocation (fx_scratch_piece).
struct Pieces {
    static constexpr int kMax = 16;
    size_t bytes[kMax];
    int count = 0;
    size_t total = FX_SCRATCH_ALIGN;
    int add(size_t b)
    {
        bytes[count] = b;
        total = fx_size_add(total, fx_scratch_piece(b));
        return count++;
    }
};

inline size_t elems(int64_t a, int64_t b, size_t esize) { return fx_size_mul((int64_t)fx_size_mul(a, b), (int64_t)esize); }

// The forward's pieces, in the launcher's order.
struct FwdPieces {
    Pieces p;
    int ws, gx, inter, ring, reads, h, h_ab, gh, c;
};

// The bytes of a tagged word of the engine a plan takes.
inline size_t slot_bytes(bool mma) { return mma ? 4 : 8; }

inline FwdPieces forward_pieces(const fx_rnn_dims &n, const ForwardPlan &fp, size_t esize, bool step)
{
    FwdPieces f;
    const int64_t G = fx_rnn_gates(n.cell), B = n.batch, L = step ? 1 : n.seqlen, H = n.hidden;
    f.ws = f.p.add(blas::workspace_bytes());
    // the projection of a chunk's first layer (stepwise: of every layer)
    f.gx = f.p.add(step && fp.kind == Kind::kPersistent ? 0 : elems(B * L, G * H, 4));
    // layer outputs between launches, two (one layer reads, the next writes)
    f.inter = f.p.add(n.layers > 1 ? elems(2 * B * L, H, esize) : 0);
    const bool persistent = fp.kind == Kind::kPersistent;
    const int64_t wave = persistent ? fp.wave : 0;
    int64_t groups = persistent ? fp.first.groups : 0;
    if (persistent && fp.rest.groups > groups)
        groups = fp.rest.groups;
    if (persistent && fp.last.groups > groups)
        groups = fp.last.groups;
    // the tagged states' ring and the layers' read counters
    f.ring = f.p.add(elems(wave * 2 * B, H, slot_bytes(persistent && fp.first.mma)));
    f.reads = f.p.add(elems(groups * wave, 1, sizeof(unsigned)));
    const bool stepwise = !persistent;
    f.h = f.p.add(stepwise && !step ? elems(B, H, 4) : 0);
    f.h_ab = f.p.add(stepwise && esize != 4 ? elems(B, H, esize) : 0);
    f.gh = f.p.add(stepwise ? elems(B, G * H, 4) : 0);
    f.c = f.p.add(stepwise && !step && n.cell == FX_RNN_LSTM ? elems(B, H, 4) : 0);
    return f;
}

struct BwdPieces {
    Pieces p;
    int ws, dax, dah, hprev, in_ab, dout, dhc, dcc, ring, w32, dah32;
};

inline BwdPieces backward_pieces(const fx_rnn_dims &n, const BackwardPlan &bp, size_t esize)
{
    BwdPieces f;
    const int64_t G = fx_rnn_gates(n.cell), B = n.batch, L = n.seqlen, H = n.hidden, BL = B * L;
    const bool persistent = bp.kind == Kind::kPersistent;
    // the GEMMs' workspace, which the bias gradients' column sums use too
    const size_t ws = blas::workspace_bytes(), sums = blas::column_sums_scratch(BL, G * H);
    f.ws = f.p.add(ws > sums ? ws : sums);
    f.dax = f.p.add(elems(BL, G * H, esize));
    f.dah = f.p.add(n.cell == FX_RNN_GRU ? elems(BL, G * H, esize) : 0);
    f.hprev = f.p.add(elems(BL, H, esize));
    f.in_ab = f.p.add(n.layers > 1 && esize != 4 ? elems(BL, H, esize) : 0);
    f.dout = f.p.add(n.layers > 1 ? elems(2 * BL, H, 4) : 0);
    f.dhc = f.p.add(elems(B, H, 4));
    f.dcc = f.p.add(n.cell == FX_RNN_LSTM ? elems(B, H, 4) : 0);
    f.ring = f.p.add(persistent ? elems(2 * B, G * H, slot_bytes(bp.wave.mma)) : 0); // tagged words
    // stepwise with a 16-bit T: the recurrent GEMM in f32 (W_hh widened)
    const bool wide = !persistent && esize != 4;
    f.w32 = f.p.add(wide ? elems(G * H, H, 4) : 0);
    f.dah32 = f.p.add(wide ? elems(B, G * H, 4) : 0);
    return f;
}

} // namespace fx::cuda::rnn

#endif
