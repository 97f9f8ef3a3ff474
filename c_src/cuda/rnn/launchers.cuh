// The GRU's and LSTM's launchers, one set per input type T (instantiated
// by rnn_f32.cu, rnn_bf16.cu, rnn_f16.cu): each layer's input projection
// over all time steps as one GEMM (blas.cuh), the recurrence as the plan
// (rnn/plan.cuh) picks it, the weight gradients as GEMMs over all time
// steps, the bias gradients as column sums in a fixed order. Work goes
// only through launch.cuh and blas.cuh, scratch only through scratch.cuh.
#ifndef FX_CUDA_RNN_LAUNCHERS_CUH
#define FX_CUDA_RNN_LAUNCHERS_CUH

#include "cuda/launch.cuh"
#include "cuda/rnn/plan.cuh"
#include "cuda/rnn/stepwise.cuh"

namespace fx::cuda::rnn {

template <typename T> int forward(const Run &r, const fx_rnn_fwd_args *a, fx_status *st);
template <typename T> int backward(const Run &r, const fx_rnn_bwd_args *a, fx_status *st);
template <typename T> int step(const Run &r, const fx_rnn_step_args *a, fx_status *st);

namespace detail {

template <typename T> constexpr fx_dtype dtype_of()
{
    return std::is_same<T, float>::value ? FX_F32 : std::is_same<T, __half>::value ? FX_F16 : FX_BF16;
}

// An op's scratch: its pieces taken in order, given back (stream-ordered)
// when the op's work is enqueued.
struct Taken {
    const Run *r = nullptr;
    void *ptr[Pieces::kMax] = {};
    int count = 0;
    Taken() = default;
    Taken(const Taken &) = delete;
    Taken &operator=(const Taken &) = delete;
    ~Taken()
    {
        for (int i = count - 1; i >= 0; i--)
            give_back(*r, ptr[i]);
    }
    template <typename P = void> P *at(int piece) const { return static_cast<P *>(ptr[piece]); }
};

inline int take_all(const Run &r, const Pieces &p, const char *what, Taken &t, fx_status *st)
{
    t.r = &r;
    for (int i = 0; i < p.count; i++) {
        if (take_scratch(r, p.bytes[i], what, &t.ptr[i], st))
            return st->code;
        t.count = i + 1;
    }
    return FX_OK;
}

// The GEMMs' workspace: one piece of the op's scratch that every product
// of the op uses in turn (they are ordered on one stream, as cuBLAS reuses
// its own workspace), handed out by a bump allocator that starts over
// whenever all it gave is back.
struct GemmSlot {
    char *base;
    size_t bytes, used;
    int live;
};

inline int slot_alloc(void *ctx, size_t nbytes, void **ptr, fx_status *st)
{
    GemmSlot *s = static_cast<GemmSlot *>(ctx);
    const size_t piece = fx_scratch_piece(nbytes);
    if (piece == SIZE_MAX || piece > s->bytes - s->used)
        return fx_fail(st, FX_EINTERNAL, "GEMM workspace: %zu bytes asked of %zu with %zu in use", nbytes, s->bytes,
                       s->used);
    *ptr = s->base + s->used;
    s->used += piece;
    s->live++;
    return FX_OK;
}

inline void slot_release(void *ctx, void *)
{
    GemmSlot *s = static_cast<GemmSlot *>(ctx);
    if (--s->live == 0)
        s->used = 0;
}

struct GemmRun {
    GemmSlot slot;
    fx_exec ex;
    Run run;
    GemmRun(const Run &r, void *ws, size_t bytes)
    {
        slot = GemmSlot{static_cast<char *>(ws), fx_scratch_piece(bytes), 0, 0};
        ex = *r.ex;
        ex.scratch.alloc = slot_alloc;
        ex.scratch.release = slot_release;
        ex.scratch.ctx = &slot;
        run = r;
        run.ex = &ex;
    }
    GemmRun(const GemmRun &) = delete;
};

// C[m, n] = opA(A) opB(B) + beta C, row-major (blas.cuh).
inline int mm(const GemmRun &g, blas::Trans ta, blas::Trans tb, int64_t m, int64_t n, int64_t k, const void *a,
              int64_t lda, const void *b, int64_t ldb, void *c, int64_t ldc, fx_dtype ab, fx_dtype c_type, float beta,
              const char *what, fx_status *st)
{
    blas::Gemm p;
    p.ta = ta;
    p.tb = tb;
    p.m = m;
    p.n = n;
    p.k = k;
    p.a = a;
    p.lda = lda;
    p.b = b;
    p.ldb = ldb;
    p.c = c;
    p.ldc = ldc;
    p.ab_type = ab;
    p.c_type = c_type;
    p.beta = beta;
    return blas::gemm(g.run, p, what, st);
}

// gx [rows, G*hidden] (f32) = in [rows, width] w_ih^T: a layer's input
// projection over every time step at once (zeros for an input of width 0).
template <typename T>
int project(const Run &r, const GemmRun &g, const void *in, int64_t width, const fx_tensor *w_ih, float *gx,
            int64_t rows, int64_t gh, fx_status *st)
{
    if (width == 0)
        return fill_zero(r, gx, (size_t)(rows * gh) * sizeof(float), "rnn input projection", st);
    return mm(g, blas::Trans::kN, blas::Trans::kT, rows, gh, width, in, width, w_ih->data, width, gx, gh,
              dtype_of<T>(), FX_F32, 0.f, "rnn input projection", st);
}

// A layer's slice of a [layers, batch, hidden] tensor of any type.
inline const void *layer_of(const fx_tensor *t, int64_t l, int64_t per_layer)
{
    return t ? static_cast<const char *>(t->data) + l * per_layer * (int64_t)fx_dtype_size(t->dtype) : nullptr;
}

inline float *layer_f32(const fx_tensor *t, int64_t l, int64_t per_layer)
{
    return t ? static_cast<float *>(t->data) + l * per_layer : nullptr;
}

inline bool overlaps(const fx_tensor *a, const fx_tensor *b)
{
    if (!a || !b || a->nbytes == 0 || b->nbytes == 0)
        return false;
    const uintptr_t a0 = (uintptr_t)a->data, b0 = (uintptr_t)b->data;
    return a0 < b0 + b->nbytes && b0 < a0 + a->nbytes;
}

template <typename T> int launch_wave(const Run &r, const WavePlan &wp, const WaveParams &p, fx_status *st)
{
    const char *what = "rnn persistent forward";
    if constexpr (!std::is_same<T, float>::value)
        if (wp.mma)
            switch (wp.bt) {
            case 8: return launch_cooperative<wave_forward<T, Mma<T, 1>>>(r, wp.blocks, kThreads, wp.smem, what, st, p);
            case 16: return launch_cooperative<wave_forward<T, Mma<T, 2>>>(r, wp.blocks, kThreads, wp.smem, what, st, p);
            default: return launch_cooperative<wave_forward<T, Mma<T, 4>>>(r, wp.blocks, kThreads, wp.smem, what, st, p);
            }
    switch (wp.bt) {
    case 1: return launch_cooperative<wave_forward<T, Ffma<T, 1>>>(r, wp.blocks, kThreads, wp.smem, what, st, p);
    case 4: return launch_cooperative<wave_forward<T, Ffma<T, 4>>>(r, wp.blocks, kThreads, wp.smem, what, st, p);
    default: return launch_cooperative<wave_forward<T, Ffma<T, 8>>>(r, wp.blocks, kThreads, wp.smem, what, st, p);
    }
}

template <typename T> int launch_back(const Run &r, const WavePlan &wp, const BackParams &p, fx_status *st)
{
    const char *what = "rnn persistent backward";
    if constexpr (!std::is_same<T, float>::value)
        if (wp.mma)
            switch (wp.bt) {
            case 8: return launch_cooperative<wave_backward<T, Mma<T, 1>>>(r, wp.blocks, kThreads, wp.smem, what, st, p);
            case 16: return launch_cooperative<wave_backward<T, Mma<T, 2>>>(r, wp.blocks, kThreads, wp.smem, what, st, p);
            default: return launch_cooperative<wave_backward<T, Mma<T, 4>>>(r, wp.blocks, kThreads, wp.smem, what, st, p);
            }
    switch (wp.bt) {
    case 1: return launch_cooperative<wave_backward<T, Ffma<T, 1>>>(r, wp.blocks, kThreads, wp.smem, what, st, p);
    case 4: return launch_cooperative<wave_backward<T, Ffma<T, 4>>>(r, wp.blocks, kThreads, wp.smem, what, st, p);
    default: return launch_cooperative<wave_backward<T, Ffma<T, 8>>>(r, wp.blocks, kThreads, wp.smem, what, st, p);
    }
}

// The parts of one launch of wave_forward that do not depend on the op.
inline WaveParams wave_params(const fx_rnn_dims &n, const WavePlan &wp, int64_t seqlen, void *ring, unsigned *reads)
{
    WaveParams p = {};
    p.cell = n.cell;
    p.layers = wp.layers;
    p.batch = n.batch;
    p.seqlen = seqlen;
    p.hidden = n.hidden;
    p.ring = ring;
    p.reads = reads;
    p.units = wp.units;
    p.tiles = wp.tiles;
    p.groups = wp.groups;
    p.group_rows = wp.group_rows;
    p.wmax = wp.wmax;
    return p;
}

// A launch's tagged ring and read counters start at zero: no word carries
// a tag of this launch, no step is read.
inline int clear_wave(const Run &r, const WavePlan &wp, const WaveParams &p, fx_status *st)
{
    const size_t words = (size_t)(p.layers * 2 * p.batch * p.hidden);
    if (fill_zero(r, p.ring, slot_bytes(wp.mma) * words, "rnn state ring", st) ||
        fill_zero(r, p.reads, sizeof(unsigned) * (size_t)(p.groups * p.layers), "rnn read counters", st))
        return st->code;
    return FX_OK;
}

// A layer's parameters; `width`: its on-chip projection's (0: none).
inline void set_params(WaveLayer &w, const fx_rnn_layer &ly, const WavePlan &wp, int64_t width)
{
    const int64_t esize = (int64_t)fx_dtype_size(ly.w_hh->dtype), hidden = ly.w_hh->dims[1];
    w.vec_hh = stage_vec(ly.w_hh->data, hidden, staged_ld(hidden, wp.mma), esize);
    w.vec_ih = width ? stage_vec(ly.w_ih->data, width, staged_ld(wp.wmax, wp.mma), esize) : 0;
    w.w_hh = ly.w_hh->data;
    w.b_ih = data_of(ly.b_ih);
    w.b_hh = data_of(ly.b_hh);
    w.b_ih_type = type_of(ly.b_ih);
    w.b_hh_type = type_of(ly.b_hh);
}

} // namespace detail

// ---- forward ----

template <typename T> int forward(const Run &r, const fx_rnn_fwd_args *a, fx_status *st)
{
    using namespace detail;
    const fx_rnn_dims &n = a->n;
    ForwardPlan fp;
    if (check_dims(n, "rnn forward", st) || check_path(a->path, dtype_of<T>(), st) ||
        plan_forward(r.d, n, sizeof(T), a->path, false, &fp, st))
        return st->code;
    const FwdPieces f = forward_pieces(n, fp, sizeof(T), false);
    Taken tk;
    if (take_all(r, f.p, "rnn forward", tk, st))
        return st->code;
    GemmRun g(r, tk.ptr[f.ws], f.p.bytes[f.ws]);
    const int64_t B = n.batch, L = n.seqlen, H = n.hidden, GH = fx_rnn_gates(n.cell) * H;
    const int64_t S = fx_rnn_saved_width(n.cell, H), per_layer = B * H;
    T *inter[2] = {tk.at<T>(f.inter), tk.at<T>(f.inter) ? tk.at<T>(f.inter) + B * L * H : nullptr};
    float *gx = tk.at<float>(f.gx);
    const void *in = a->x->data;
    int64_t width = n.input;
    if (fp.kind == Kind::kPersistent) {
        const bool defer = overlaps(a->h0, a->h_n) || overlaps(a->c0, a->c_n);
        int chunk = 0;
        for (int64_t l0 = 0; l0 < n.layers; chunk++) {
            const WavePlan &wp = chunk_plan(fp, n, l0);
            if (project<T>(r, g, in, width, a->layer[l0].w_ih, gx, B * L, GH, st))
                return st->code;
            WaveParams p = wave_params(n, wp, L, tk.ptr[f.ring], tk.at<unsigned>(f.reads));
            p.gx = gx;
            p.stage = wp.stage;
            p.defer_final = defer;
            for (int i = 0; i < wp.layers; i++) {
                const int64_t l = l0 + i;
                WaveLayer &w = p.layer[i];
                set_params(w, a->layer[l], wp, i > 0 ? H : 0);
                w.w_ih = i > 0 ? a->layer[l].w_ih->data : nullptr;
                w.in_width = i > 0 ? H : 0;
                w.h0 = layer_of(a->h0, l, per_layer);
                w.c0 = layer_of(a->c0, l, per_layer);
                w.h0_type = type_of(a->h0);
                w.c0_type = type_of(a->c0);
                w.h_n = layer_f32(a->h_n, l, per_layer);
                w.c_n = layer_f32(a->c_n, l, per_layer);
                w.saved = a->saved ? static_cast<float *>(a->saved->data) + l * B * L * S : nullptr;
                w.out = l == n.layers - 1 ? a->y->data : i == wp.layers - 1 ? inter[chunk % 2] : nullptr;
            }
            if (clear_wave(r, wp, p, st) || launch_wave<T>(r, wp, p, st))
                return st->code;
            in = inter[chunk % 2];
            width = H;
            l0 += wp.layers;
        }
        return FX_OK;
    }
    // stepwise: per step a GEMM and the gate kernel
    float *h = tk.at<float>(f.h), *c = tk.at<float>(f.c), *gh = tk.at<float>(f.gh);
    void *h_ab = tk.ptr[f.h_ab];
    const unsigned grid = grid_for(r.d, B * H, 256);
    for (int64_t l = 0; l < n.layers; l++) {
        const fx_rnn_layer &ly = a->layer[l];
        if (project<T>(r, g, in, width, ly.w_ih, gx, B * L, GH, st) ||
            launch<load_state<T>>(r, grid, 256, "rnn state", st, h, h_ab, layer_of(a->h0, l, per_layer),
                                  type_of(a->h0), B * H) ||
            (c && launch<load_state<T>>(r, grid, 256, "rnn state", st, c, (void *)nullptr,
                                        layer_of(a->c0, l, per_layer), type_of(a->c0), B * H)))
            return st->code;
        GateStep p = {};
        p.cell = n.cell;
        p.batch = B;
        p.seqlen = L;
        p.hidden = H;
        p.gx = gx;
        p.gh = gh;
        p.b_ih = data_of(ly.b_ih);
        p.b_hh = data_of(ly.b_hh);
        p.b_ih_type = type_of(ly.b_ih);
        p.b_hh_type = type_of(ly.b_hh);
        p.h = h;
        p.h_ab = h_ab;
        p.c = c;
        p.out = l == n.layers - 1 ? a->y->data : inter[l % 2];
        p.saved = a->saved ? static_cast<float *>(a->saved->data) + l * B * L * S : nullptr;
        p.h_n = layer_f32(a->h_n, l, per_layer);
        p.c_n = layer_f32(a->c_n, l, per_layer);
        const void *h_in = h_ab ? h_ab : h;
        for (int64_t t = 0; t < L; t++) {
            p.t = t;
            if (mm(g, blas::Trans::kN, blas::Trans::kT, B, GH, H, h_in, H, ly.w_hh->data, H, gh, GH, dtype_of<T>(),
                   FX_F32, 0.f, "rnn recurrent product", st) ||
                launch<gate_step<T>>(r, grid, 256, "rnn gates", st, p))
                return st->code;
        }
        in = p.out;
        width = H;
    }
    return FX_OK;
}

// ---- step: every layer one frame, the states in place ----

template <typename T> int step(const Run &r, const fx_rnn_step_args *a, fx_status *st)
{
    using namespace detail;
    const fx_rnn_dims &n = a->n;
    ForwardPlan fp;
    if (check_dims(n, "rnn step", st) || check_path(a->path, dtype_of<T>(), st) ||
        plan_forward(r.d, n, sizeof(T), a->path, true, &fp, st))
        return st->code;
    const FwdPieces f = forward_pieces(n, fp, sizeof(T), true);
    Taken tk;
    if (take_all(r, f.p, "rnn step", tk, st))
        return st->code;
    GemmRun g(r, tk.ptr[f.ws], f.p.bytes[f.ws]);
    const int64_t B = n.batch, H = n.hidden, GH = fx_rnn_gates(n.cell) * H, per_layer = B * H;
    T *inter[2] = {tk.at<T>(f.inter), tk.at<T>(f.inter) ? tk.at<T>(f.inter) + B * H : nullptr};
    const void *in = a->x->data;
    int64_t width = n.input;
    if (fp.kind == Kind::kPersistent) {
        int chunk = 0;
        for (int64_t l0 = 0; l0 < n.layers; chunk++) {
            const WavePlan &wp = chunk_plan(fp, n, l0);
            WaveParams p = wave_params(n, wp, 1, tk.ptr[f.ring], tk.at<unsigned>(f.reads));
            p.x = in;
            p.stage = wp.stage;
            p.defer_final = 1; // the final states are the initial ones
            for (int i = 0; i < wp.layers; i++) {
                const int64_t l = l0 + i;
                WaveLayer &w = p.layer[i];
                set_params(w, a->layer[l], wp, i == 0 ? width : H);
                w.w_ih = a->layer[l].w_ih->data;
                w.in_width = i == 0 ? width : H;
                w.h0 = layer_of(a->h, l, per_layer);
                w.c0 = layer_of(a->c, l, per_layer);
                w.h0_type = w.c0_type = FX_F32;
                w.h_n = layer_f32(a->h, l, per_layer);
                w.c_n = layer_f32(a->c, l, per_layer);
                w.out = l == n.layers - 1 ? a->y->data : i == wp.layers - 1 ? inter[chunk % 2] : nullptr;
            }
            if (clear_wave(r, wp, p, st) || launch_wave<T>(r, wp, p, st))
                return st->code;
            in = inter[chunk % 2];
            width = H;
            l0 += wp.layers;
        }
        return FX_OK;
    }
    float *gx = tk.at<float>(f.gx), *gh = tk.at<float>(f.gh);
    void *h_ab = tk.ptr[f.h_ab];
    const unsigned grid = grid_for(r.d, B * H, 256);
    for (int64_t l = 0; l < n.layers; l++) {
        const fx_rnn_layer &ly = a->layer[l];
        float *h = layer_f32(a->h, l, per_layer);
        GateStep p = {};
        p.cell = n.cell;
        p.batch = B;
        p.seqlen = 1;
        p.hidden = H;
        p.gx = gx;
        p.gh = gh;
        p.b_ih = data_of(ly.b_ih);
        p.b_hh = data_of(ly.b_hh);
        p.b_ih_type = type_of(ly.b_ih);
        p.b_hh_type = type_of(ly.b_hh);
        p.h = h;
        p.c = layer_f32(a->c, l, per_layer);
        p.out = l == n.layers - 1 ? a->y->data : inter[l % 2];
        // the GEMM reads h_{t-1} in T: an f32 state as it is, else a copy
        if (project<T>(r, g, in, width, ly.w_ih, gx, B, GH, st) ||
            (h_ab && launch<load_state<T>>(r, grid, 256, "rnn state", st, (float *)nullptr, h_ab, (const void *)h,
                                           (int)FX_F32, B * H)) ||
            mm(g, blas::Trans::kN, blas::Trans::kT, B, GH, H, h_ab ? h_ab : (const void *)h, H, ly.w_hh->data, H, gh,
               GH, dtype_of<T>(), FX_F32, 0.f, "rnn recurrent product", st) ||
            launch<gate_step<T>>(r, grid, 256, "rnn gates", st, p))
            return st->code;
        in = p.out;
        width = H;
    }
    return FX_OK;
}

// ---- backward ----

template <typename T> int backward(const Run &r, const fx_rnn_bwd_args *a, fx_status *st)
{
    using namespace detail;
    const fx_rnn_fwd_args &fw = a->fwd;
    const fx_rnn_dims &n = fw.n;
    BackwardPlan bp;
    if (check_dims(n, "rnn backward", st) || check_path(fw.path, dtype_of<T>(), st) ||
        plan_backward(r.d, n, dtype_of<T>(), fw.path, &bp, st))
        return st->code;
    const BwdPieces f = backward_pieces(n, bp, sizeof(T));
    Taken tk;
    if (take_all(r, f.p, "rnn backward", tk, st))
        return st->code;
    GemmRun g(r, tk.ptr[f.ws], f.p.bytes[f.ws]);
    const fx_dtype ab = dtype_of<T>();
    const bool lstm = n.cell == FX_RNN_LSTM;
    const int64_t B = n.batch, L = n.seqlen, H = n.hidden, GH = fx_rnn_gates(n.cell) * H, BL = B * L;
    const int64_t S = fx_rnn_saved_width(n.cell, H), per_layer = B * H;
    T *dax = tk.at<T>(f.dax), *dah = lstm ? dax : tk.at<T>(f.dah), *hprev = tk.at<T>(f.hprev);
    float *dout[2] = {tk.at<float>(f.dout), tk.at<float>(f.dout) ? tk.at<float>(f.dout) + BL * H : nullptr};
    float *dhc = tk.at<float>(f.dhc), *dcc = tk.at<float>(f.dcc);
    const float *saved = static_cast<const float *>(fw.saved->data);
    const unsigned grid = grid_for(r.d, B * H, 256);
    for (int64_t l = n.layers - 1; l >= 0; l--) {
        const fx_rnn_layer &ly = fw.layer[l];
        const fx_rnn_layer_grads &gr = a->grad[l];
        const float *saved_l = saved + l * BL * S;
        // the gradient reaching this layer's outputs: dy at the top, else
        // the layer above's input gradient
        const void *dout_l = l == n.layers - 1 ? data_of(a->dy) : dout[l % 2];
        const int dout_type = l == n.layers - 1 ? (int)ab : (int)FX_F32;
        if (bp.kind == Kind::kPersistent) {
            const WavePlan &wp = bp.wave;
            BackParams p = {};
            p.cell = n.cell;
            p.batch = B;
            p.seqlen = L;
            p.hidden = H;
            p.w_hh = ly.w_hh->data;
            p.saved = saved_l;
            p.h0 = layer_of(fw.h0, l, per_layer);
            p.c0 = layer_of(fw.c0, l, per_layer);
            p.h0_type = type_of(fw.h0);
            p.c0_type = type_of(fw.c0);
            p.dout = dout_l;
            p.dout_type = dout_type;
            p.dh_n = layer_of(a->dh_n, l, per_layer);
            p.dc_n = layer_of(a->dc_n, l, per_layer);
            p.dh_n_type = type_of(a->dh_n);
            p.dc_n_type = type_of(a->dc_n);
            p.dax = dax;
            p.dah = lstm ? nullptr : dah;
            p.hprev = hprev;
            p.dh0 = const_cast<void *>(layer_of(a->dh0, l, per_layer));
            p.dc0 = const_cast<void *>(layer_of(a->dc0, l, per_layer));
            p.dh0_type = type_of(a->dh0);
            p.dc0_type = type_of(a->dc0);
            p.ring = tk.ptr[f.ring];
            p.dhc = dhc;
            p.dcc = dcc;
            p.units = wp.units;
            p.tiles = wp.tiles;
            p.groups = wp.groups;
            p.group_rows = wp.group_rows;
            if (fill_zero(r, p.ring, slot_bytes(wp.mma) * (size_t)(2 * B * GH), "rnn state ring", st) ||
                launch_back<T>(r, wp, p, st))
                return st->code;
        } else {
            GradStep p = {};
            p.cell = n.cell;
            p.batch = B;
            p.seqlen = L;
            p.hidden = H;
            p.saved = saved_l;
            p.h0 = layer_of(fw.h0, l, per_layer);
            p.c0 = layer_of(fw.c0, l, per_layer);
            p.h0_type = type_of(fw.h0);
            p.c0_type = type_of(fw.c0);
            p.dout = dout_l;
            p.dout_type = dout_type;
            p.dhc = dhc;
            p.dcc = dcc;
            p.dax = dax;
            p.dah = lstm ? nullptr : dah;
            p.hprev = hprev;
            // the recurrent GEMM: dah_t and W_hh in f32 (widened for a 16-bit T)
            float *w32 = tk.at<float>(f.w32);
            p.dah32 = tk.at<float>(f.dah32);
            const void *w_rec = w32 ? (const void *)w32 : ly.w_hh->data;
            const void *dah_rec = p.dah32 ? (const void *)p.dah32 : (const void *)dah;
            const int64_t ld_rec = p.dah32 ? GH : L * GH, step_rec = p.dah32 ? 0 : GH;
            if ((w32 && launch<widen<T>>(r, grid_for(r.d, GH * H, 256), 256, "rnn w_hh", st, w32,
                                         static_cast<const T *>(ly.w_hh->data), GH * H)) ||
                launch<load_state<T>>(r, grid, 256, "rnn state", st, dhc, (void *)nullptr,
                                      layer_of(a->dh_n, l, per_layer), type_of(a->dh_n), B * H) ||
                (lstm && launch<load_state<T>>(r, grid, 256, "rnn state", st, dcc, (void *)nullptr,
                                               layer_of(a->dc_n, l, per_layer), type_of(a->dc_n), B * H)))
                return st->code;
            for (int64_t t = L - 1; t >= 0; t--) {
                p.t = t;
                // dhc (h_{t-1}'s direct part) += dah_t W_hh
                if (launch<grad_step<T>>(r, grid, 256, "rnn gate gradients", st, p) ||
                    mm(g, blas::Trans::kN, blas::Trans::kN, B, H, GH,
                       static_cast<const char *>(dah_rec) + t * step_rec * (int64_t)sizeof(float), ld_rec, w_rec, H,
                       dhc, H, FX_F32, FX_F32, 1.f, "rnn recurrent gradient", st))
                    return st->code;
            }
            if ((a->dh0 && launch<store_state<>>(r, grid, 256, "rnn state", st, const_cast<void *>(layer_of(a->dh0, l, per_layer)),
                                                 (int)a->dh0->dtype, (const float *)dhc, B * H)) ||
                (a->dc0 && launch<store_state<>>(r, grid, 256, "rnn state", st, const_cast<void *>(layer_of(a->dc0, l, per_layer)),
                                                 (int)a->dc0->dtype, (const float *)dcc, B * H)))
                return st->code;
        }
        // the layer's input: x, or the layer below's h_t (saved, f32)
        const int64_t width = l == 0 ? n.input : H;
        const void *in = fw.x->data;
        int64_t ld_in = width;
        if (l > 0) {
            const float *below = saved + (l - 1) * BL * S + (S - H);
            if (ab == FX_F32) {
                in = below;
                ld_in = S;
            } else {
                T *in_ab = tk.at<T>(f.in_ab);
                if (launch<gather_rows<T>>(r, grid_for(r.d, BL * H, 256), 256, "rnn layer input", st, in_ab, below, BL,
                                           H, S))
                    return st->code;
                in = in_ab;
            }
        }
        // dW_hh = dah^T h_{t-1}, dW_ih = dax^T in, over every step at once
        if (mm(g, blas::Trans::kT, blas::Trans::kN, GH, H, BL, dah, GH, hprev, H, gr.dw_hh->data, H, ab, ab, 0.f,
               "rnn dw_hh", st) ||
            (width > 0 && mm(g, blas::Trans::kT, blas::Trans::kN, GH, width, BL, dax, GH, in, ld_in, gr.dw_ih->data,
                             width, ab, ab, 0.f, "rnn dw_ih", st)))
            return st->code;
        // the input's gradient: dx at the bottom, else the layer below's dout
        if (width > 0 && mm(g, blas::Trans::kN, blas::Trans::kN, BL, width, GH, dax, GH, ly.w_ih->data, width,
                            l == 0 ? a->dx->data : (void *)dout[(l - 1) % 2], width, ab, l == 0 ? ab : FX_F32, 0.f,
                            "rnn input gradient", st))
            return st->code;
        // the biases' gradients: column sums in a fixed order
        const T *bias_src[2] = {dax, dah};
        const fx_tensor *bias_dst[2] = {gr.db_ih, gr.db_hh};
        for (int i = 0; i < 2; i++) {
            if (!bias_dst[i])
                continue;
            blas::ColumnSums cs;
            cs.src = bias_src[i];
            cs.src_type = ab;
            cs.rows = BL;
            cs.cols = GH;
            cs.ld = GH;
            cs.dst = bias_dst[i]->data;
            cs.dst_type = bias_dst[i]->dtype;
            if (blas::column_sums(g.run, cs, "rnn bias gradients", st))
                return st->code;
        }
    }
    return FX_OK;
}

// Declares (KEYWORD extern) or defines the launchers for T.
#define FX_RNN_INSTANTIATION(KEYWORD, T)                                                       \
    KEYWORD template int forward<T>(const Run &, const fx_rnn_fwd_args *, fx_status *);       \
    KEYWORD template int backward<T>(const Run &, const fx_rnn_bwd_args *, fx_status *);      \
    KEYWORD template int step<T>(const Run &, const fx_rnn_step_args *, fx_status *);

FX_RNN_INSTANTIATION(extern, float)
FX_RNN_INSTANTIATION(extern, __nv_bfloat16)
FX_RNN_INSTANTIATION(extern, __half)

} // namespace fx::cuda::rnn

#endif
