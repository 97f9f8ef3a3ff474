/*
 * fusex's XLA handlers called the way XLA calls them, without XLA: call
 * frames built by hand (operands, results, attributes sorted by name)
 * against a stand-in FFI API (fake_xla_api.c: errors, the execution
 * context's stream, device ordinal and scratch allocator, and registration
 * with its metadata query).
 *
 *   ffi_call_test        (linked against priv/fusex_xla.so)
 *
 * Host: every target with seeded inputs and NaN-poisoned results (each
 * result must be written whole), a scan against exact values, attributes
 * of other integer and float widths, a step whose new_state aliases its
 * state, registration (every op's two handlers, FFI API 0.2, no traits;
 * again a no-op), problems with nothing to scan (batch or seqlen 0) whose final state and
 * summed gradients are still results, written as zeros or h0 / dstate,
 * the loader, errors (code and message), the saved states' shape for
 * sizes no scan has, and the front ends' exports (the ops' index,
 * descriptions and handlers; the check entry, whose message on bad inputs
 * is the handler's).
 *
 * Built with -DFX_XLA_TEST_CUDA (make test-xla-c-gpu, linked with the CUDA
 * runtime) it also runs every target's CUDA handler on a stream of its own
 * (a foreign stream, as XLA's), with scratch from an arena on the device,
 * and compares each result with the Host handler's on the same inputs:
 * rel-L2 f32 <= 1e-5 (sums of n f32 terms: * max(1, sqrt(n) / 4)), bf16
 * <= 1e-2, NaN never passes. Run under compute-sanitizer by make sanitize.
 * FUSEX_SEED fixes the seed (printed).
 */
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_xla_api.h"
#include "fusex.h"
#include "fusex_dtype.h"
#include "fusex_xla.h"

#ifdef FX_XLA_TEST_CUDA
#include <cuda_runtime.h>
#endif

static int failures, checks;
static uint64_t rng_state;

#define MAX_BUF 64
#define MAX_ATTR 12

static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "  FAIL ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    failures++;
}

/* ---- random values (xorshift64*, Box-Muller) ---- */

static double uniform01(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}

static double normal(void)
{
    double u = uniform01(), v = uniform01();
    return sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

/* ---- buffers and call frames ---- */

typedef struct buffer {
    const char *name;
    fx_dtype type;
    int rank;
    int64_t dims[FX_MAX_RANK];
    int64_t numel;
    size_t nbytes;
    void *host;   /* the values (operands) or the Host handler's result */
    void *device; /* CUDA copy; NULL on Host runs */
    int terms;    /* results: f32 terms each element sums on CUDA */
} buffer;

typedef struct attr {
    const char *name;
    char type; /* 'l' i64, 'i' i32, 'd' f64, 'f' f32, 's' string */
    int64_t i64;
    int32_t i32;
    double f64;
    float f32;
} attr;

typedef struct call {
    const char *target;
    buffer args[MAX_BUF], rets[MAX_BUF];
    int nargs, nrets;
    attr attrs[MAX_ATTR];
    int nattrs;
} call;

static int xla_type(fx_dtype t)
{
    switch (t) {
    case FX_F32: return XLA_FFI_DataType_F32;
    case FX_F64: return XLA_FFI_DataType_F64;
    case FX_BF16: return XLA_FFI_DataType_BF16;
    case FX_F16: return XLA_FFI_DataType_F16;
    case FX_S32: return XLA_FFI_DataType_S32;
    default: return XLA_FFI_DataType_INVALID;
    }
}

static double load(const buffer *b, int64_t i)
{
    switch (b->type) {
    case FX_F32: return ((const float *)b->host)[i];
    case FX_BF16: return fx_bf16_to_f32(((const uint16_t *)b->host)[i]);
    case FX_F16: return fx_f16_to_f32(((const uint16_t *)b->host)[i]);
    case FX_F64: return ((const double *)b->host)[i];
    default: return NAN;
    }
}

static void store(buffer *b, int64_t i, double v)
{
    switch (b->type) {
    case FX_F32: ((float *)b->host)[i] = (float)v; break;
    case FX_BF16: ((uint16_t *)b->host)[i] = fx_f32_to_bf16((float)v); break;
    case FX_F16: ((uint16_t *)b->host)[i] = fx_f32_to_f16((float)v); break;
    case FX_F64: ((double *)b->host)[i] = v; break;
    default: break;
    }
}

static buffer *add(buffer *list, int *n, const char *name, fx_dtype type, int rank, const int64_t *dims)
{
    buffer *b = &list[(*n)++];
    memset(b, 0, sizeof *b);
    b->name = name;
    b->type = type;
    b->rank = rank;
    b->numel = 1;
    for (int i = 0; i < rank; i++) {
        b->dims[i] = dims[i];
        b->numel *= dims[i];
    }
    b->nbytes = (size_t)b->numel * fx_dtype_size(type);
    b->host = calloc(1, b->nbytes ? b->nbytes : 1);
    if (!b->host) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    b->terms = 1;
    return b;
}

#define DIMS(...) ((const int64_t[]){__VA_ARGS__}), (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t))

/* An operand with values of `kind`: 'n' normal, 'a' -exp(normal / 2) (a
 * selective scan's a), 'p' in [0.5, 1] (a positive scale, a decay), 'q' in
 * [0.1, 1] (dt), 'h' |normal| / 2 (a selective scan's dt). */
static buffer *arg(call *c, const char *name, char kind, fx_dtype type, const int64_t *dims, int rank)
{
    buffer *b = add(c->args, &c->nargs, name, type, rank, dims);
    for (int64_t i = 0; i < b->numel; i++) {
        double v = kind == 'a'   ? -exp(normal() * 0.5)
                   : kind == 'p' ? 0.5 + 0.5 * uniform01()
                   : kind == 'q' ? 0.1 + 0.9 * uniform01()
                   : kind == 'h' ? fabs(normal()) * 0.5
                                 : normal();
        store(b, i, v);
    }
    return b;
}

static buffer *ret(call *c, const char *name, fx_dtype type, const int64_t *dims, int rank, int terms)
{
    buffer *b = add(c->rets, &c->nrets, name, type, rank, dims);
    b->terms = terms;
    return b;
}

/* An operand (or result) shaped and typed like another buffer. */
static buffer *like(buffer *list, int *n, const char *name, const buffer *src)
{
    buffer *b = add(list, n, name, src->type, src->rank, src->dims);
    memcpy(b->host, src->host, src->nbytes);
    return b;
}

static void flag(call *c, const char *name, int64_t v)
{
    c->attrs[c->nattrs++] = (attr){.name = name, .type = 'l', .i64 = v};
}

static void free_call(call *c)
{
    for (int i = 0; i < c->nargs; i++)
        free(c->args[i].host);
    for (int i = 0; i < c->nrets; i++)
        free(c->rets[i].host);
    c->nargs = c->nrets = 0;
}

static int by_name(const void *a, const void *b) { return strcmp(((const attr *)a)->name, ((const attr *)b)->name); }

/* Calls `handler` on the buffers' host (or device) memory; returns XLA's
 * error (NULL on success). */
static XLA_FFI_Error *invoke(XLA_FFI_Handler *handler, call *c, XLA_FFI_ExecutionContext *ctx, int on_device)
{
    XLA_FFI_Buffer args[MAX_BUF], rets[MAX_BUF];
    XLA_FFI_ArgType arg_types[MAX_BUF];
    XLA_FFI_RetType ret_types[MAX_BUF];
    void *arg_ptrs[MAX_BUF], *ret_ptrs[MAX_BUF];
    for (int i = 0; i < c->nargs; i++) {
        buffer *b = &c->args[i];
        args[i] = (XLA_FFI_Buffer){.struct_size = XLA_FFI_Buffer_STRUCT_SIZE, .dtype = xla_type(b->type),
                                   .data = on_device ? b->device : b->host, .rank = b->rank, .dims = b->dims};
        arg_types[i] = XLA_FFI_ArgType_BUFFER;
        arg_ptrs[i] = &args[i];
    }
    for (int i = 0; i < c->nrets; i++) {
        buffer *b = &c->rets[i];
        rets[i] = (XLA_FFI_Buffer){.struct_size = XLA_FFI_Buffer_STRUCT_SIZE, .dtype = xla_type(b->type),
                                   .data = on_device ? b->device : b->host, .rank = b->rank, .dims = b->dims};
        ret_types[i] = XLA_FFI_RetType_BUFFER;
        ret_ptrs[i] = &rets[i];
    }
    /* XLA passes attributes sorted by name. */
    attr sorted[MAX_ATTR];
    memcpy(sorted, c->attrs, sizeof(attr) * (size_t)c->nattrs);
    qsort(sorted, (size_t)c->nattrs, sizeof(attr), by_name);
    XLA_FFI_ByteSpan names[MAX_ATTR], *name_ptrs[MAX_ATTR], strings[MAX_ATTR];
    XLA_FFI_Scalar scalars[MAX_ATTR];
    XLA_FFI_AttrType attr_types[MAX_ATTR];
    void *attr_ptrs[MAX_ATTR];
    for (int i = 0; i < c->nattrs; i++) {
        attr *a = &sorted[i];
        names[i] = (XLA_FFI_ByteSpan){a->name, strlen(a->name)};
        name_ptrs[i] = &names[i];
        attr_types[i] = XLA_FFI_AttrType_SCALAR;
        switch (a->type) {
        case 'l': scalars[i] = (XLA_FFI_Scalar){XLA_FFI_DataType_S64, &a->i64}; break;
        case 'i': scalars[i] = (XLA_FFI_Scalar){XLA_FFI_DataType_S32, &a->i32}; break;
        case 'd': scalars[i] = (XLA_FFI_Scalar){XLA_FFI_DataType_F64, &a->f64}; break;
        case 'f': scalars[i] = (XLA_FFI_Scalar){XLA_FFI_DataType_F32, &a->f32}; break;
        default:
            strings[i] = (XLA_FFI_ByteSpan){"yes", 3};
            attr_types[i] = XLA_FFI_AttrType_STRING;
        }
        attr_ptrs[i] = attr_types[i] == XLA_FFI_AttrType_STRING ? (void *)&strings[i] : (void *)&scalars[i];
    }
    XLA_FFI_CallFrame frame;
    memset(&frame, 0, sizeof frame);
    frame.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
    frame.api = fake_xla_api();
    frame.ctx = ctx;
    frame.stage = XLA_FFI_ExecutionStage_EXECUTE;
    frame.args = (XLA_FFI_Args){XLA_FFI_Args_STRUCT_SIZE, NULL, c->nargs, arg_types, arg_ptrs};
    frame.rets = (XLA_FFI_Rets){XLA_FFI_Rets_STRUCT_SIZE, NULL, c->nrets, ret_types, ret_ptrs};
    frame.attrs = (XLA_FFI_Attrs){XLA_FFI_Attrs_STRUCT_SIZE, NULL, c->nattrs, attr_types, name_ptrs, attr_ptrs};
    return handler(&frame);
}

/* The handler of `target` ("fusex_mingru_fwd") for "host" or "cuda", as
 * the library gives it out by the op's index. */
static XLA_FFI_Handler *handler(const char *target, const char *platform)
{
    int op = fusex_xla_op_index(target);
    XLA_FFI_Handler *h = (XLA_FFI_Handler *)fusex_xla_op_handler(op, strcmp(platform, "host") == 0 ? 0 : 1);
    if (!h) {
        fprintf(stderr, "fusex_xla.so has no %s handler of %s\n", platform, target);
        exit(2);
    }
    return h;
}

/* Host scratch is the CPU backend's own: no XLA allocator on Host. */
static XLA_FFI_ExecutionContext host_ctx;

/* Runs the Host handler; poisons the results first (every element must be
 * written). Returns 0 on success. */
static int run_host(call *c)
{
    for (int i = 0; i < c->nrets; i++)
        for (int64_t k = 0; k < c->rets[i].numel; k++)
            store(&c->rets[i], k, NAN);
    XLA_FFI_Error *err = invoke(handler(c->target, "host"), c, &host_ctx, 0);
    checks++;
    if (err) {
        fail("%s (Host): %s", c->target, fake_xla_error_message(err));
        fake_xla_error_free(err);
        return -1;
    }
    for (int i = 0; i < c->nrets; i++)
        for (int64_t k = 0; k < c->rets[i].numel; k++)
            if (isnan(load(&c->rets[i], k))) {
                fail("%s (Host): result %s element %lld not written", c->target, c->rets[i].name, (long long)k);
                return -1;
            }
    return 0;
}

/* ---- CUDA: the same call on a foreign stream, against the Host's ---- */

#ifdef FX_XLA_TEST_CUDA

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

static cudaStream_t stream;

/* The scratch arena: XLA's allocator is stream-ordered, so what a call
 * took is free again once the stream has run past it. */
typedef struct arena {
    char *base;
    size_t size, used;
} arena;
static arena scratch;

static void *arena_alloc(void *user, size_t size, size_t align)
{
    arena *a = user;
    size_t start = (a->used + align - 1) / align * align;
    if (align == 0 || start + size > a->size)
        return NULL;
    a->used = start + size;
    return a->base + start;
}

static double rel_l2(const buffer *got, const buffer *want)
{
    double diff = 0, ref = 0;
    for (int64_t i = 0; i < got->numel; i++) {
        double g = load(got, i), w = load(want, i);
        if (isnan(g) || isnan(w))
            return INFINITY;
        diff += (g - w) * (g - w);
        ref += w * w;
    }
    return ref == 0 ? (diff == 0 ? 0 : INFINITY) : sqrt(diff / ref);
}

static void run_cuda_against_host(call *c)
{
    for (int i = 0; i < c->nargs; i++) {
        buffer *b = &c->args[i];
        CUDA_OK(cudaMalloc(&b->device, b->nbytes ? b->nbytes : 1));
        CUDA_OK(cudaMemcpy(b->device, b->host, b->nbytes, cudaMemcpyHostToDevice));
    }
    for (int i = 0; i < c->nrets; i++) {
        CUDA_OK(cudaMalloc(&c->rets[i].device, c->rets[i].nbytes ? c->rets[i].nbytes : 1));
        CUDA_OK(cudaMemset(c->rets[i].device, 0xff, c->rets[i].nbytes)); /* NaN in every float type */
    }
    XLA_FFI_ExecutionContext ctx = {.stream = stream, .device = 0, .alloc = arena_alloc, .user = &scratch};
    scratch.used = 0;
    XLA_FFI_Error *err = invoke(handler(c->target, "cuda"), c, &ctx, 1);
    checks++;
    if (err) {
        fail("%s (CUDA): %s", c->target, fake_xla_error_message(err));
        fake_xla_error_free(err);
    } else {
        CUDA_OK(cudaStreamSynchronize(stream));
        if (ctx.frees != ctx.allocations)
            fail("%s (CUDA): %d scratch allocations, %d given back", c->target, ctx.allocations, ctx.frees);
        /* Results computed from bf16 / f16 operands (an f32 state's
         * gradient through a bf16 layer's outputs, say) carry those
         * operands' rounding: bf16's tolerance, whatever the result's type. */
        bool low_precision = false;
        for (int i = 0; i < c->nargs; i++)
            low_precision |= c->args[i].type == FX_BF16 || c->args[i].type == FX_F16;
        for (int i = 0; i < c->nrets; i++) {
            buffer *want = &c->rets[i];
            buffer got = *want;
            got.host = malloc(got.nbytes ? got.nbytes : 1);
            CUDA_OK(cudaMemcpy(got.host, want->device, got.nbytes, cudaMemcpyDeviceToHost));
            double tol = want->type == FX_F32 && !low_precision ? 1e-5 : 1e-2;
            tol *= fmax(1.0, sqrt((double)want->terms) / 4);
            double e = rel_l2(&got, want);
            checks++;
            if (!(e <= tol))
                fail("%s: %s on CUDA vs Host: rel-L2 %.3g > %.3g", c->target, want->name, e, tol);
            free(got.host);
        }
    }
    for (int i = 0; i < c->nargs; i++)
        CUDA_OK(cudaFree(c->args[i].device));
    for (int i = 0; i < c->nrets; i++)
        CUDA_OK(cudaFree(c->rets[i].device));
}
#endif

/* Host, and on CUDA builds CUDA against it; frees the call. */
static void run(call *c)
{
    if (run_host(c) == 0) {
#ifdef FX_XLA_TEST_CUDA
        run_cuda_against_host(c);
#endif
    }
    free_call(c);
}

/* ---- the targets' calls ---- */

static void saved_shape(int64_t b, int64_t l, int64_t d, int64_t n, int64_t g, fx_dtype t, int64_t out[4])
{
    char msg[256];
    if (fusex_xla_ssm_saved_shape(b, l, d, n, g, fx_dtype_name(t), out, msg, sizeof msg)) {
        fprintf(stderr, "fusex_xla_ssm_saved_shape: %s\n", msg);
        exit(2);
    }
}

/* The selective scan's forward and, from its saved states, its backward;
 * then a step. Options on: d, z, dt_bias, softplus, h0, the final state. */
static void selective_scan(int64_t B, int64_t L, int64_t D, int64_t N, int64_t G, fx_dtype t)
{
    int64_t saved[4];
    saved_shape(B, L, D, N, G, t, saved);
    call f = {.target = "fusex_selective_scan_fwd"};
    int bc_rank = G > 1 ? 4 : 3;
    const int64_t bc[4] = {B, L, G > 1 ? G : N, N};
    arg(&f, "x", 'n', t, DIMS(B, L, D));
    arg(&f, "dt", 'n', t, DIMS(B, L, D));
    arg(&f, "a", 'a', FX_F32, DIMS(D, N));
    arg(&f, "b", 'n', t, bc, bc_rank);
    arg(&f, "c", 'n', t, bc, bc_rank);
    arg(&f, "d", 'n', FX_F32, DIMS(D));
    arg(&f, "z", 'n', t, DIMS(B, L, D));
    arg(&f, "dt_bias", 'n', FX_F32, DIMS(D));
    arg(&f, "h0", 'n', FX_F32, DIMS(B, D, N));
    ret(&f, "y", t, DIMS(B, L, D), 1);
    ret(&f, "state", FX_F32, DIMS(B, D, N), 1);
    int has_saved = saved[1] > 0; /* one chunk: no saved states (docs/XLA.md) */
    if (has_saved)
        ret(&f, "saved", FX_F32, saved, 4, 1);
    const char *flags[] = {"dt_softplus", "has_d", "has_z", "has_dt_bias", "has_h0", "return_state", "save"};
    for (int i = 0; i < 7; i++)
        flag(&f, flags[i], 1);
    if (run_host(&f) != 0) {
        free_call(&f);
        return;
    }
    /* The backward, on the forward's inputs and saved states. */
    call bw = {.target = "fusex_selective_scan_bwd"};
    for (int i = 0; i < f.nargs; i++)
        like(bw.args, &bw.nargs, f.args[i].name, &f.args[i]);
    if (has_saved)
        like(bw.args, &bw.nargs, "saved", &f.rets[2]);
    arg(&bw, "dy", 'n', t, DIMS(B, L, D));
    arg(&bw, "dstate", 'n', FX_F32, DIMS(B, D, N));
    int terms[9] = {1, 1, (int)(B * L), (int)(D / G), (int)(D / G), (int)(B * L), 1, (int)(B * L), 1};
    static const char *const grads[] = {"dx", "ddt", "da", "db", "dc", "dd", "dz", "ddt_bias", "dh0"};
    for (int i = 0; i < 9; i++)
        like(bw.rets, &bw.nrets, grads[i], &f.args[i])->terms = terms[i];
    for (int i = 0; i < 5; i++)
        flag(&bw, flags[i], 1);
    flag(&bw, "has_dstate", 1);
#ifdef FX_XLA_TEST_CUDA
    run_cuda_against_host(&f); /* the forward too, now that its saved states are taken */
#endif
    free_call(&f);
    run(&bw);

    call s = {.target = "fusex_selective_scan_step"};
    arg(&s, "state", 'n', FX_F32, DIMS(B, D, N));
    arg(&s, "x", 'n', t, DIMS(B, D));
    arg(&s, "dt", 'h', t, DIMS(B, D));
    arg(&s, "a", 'a', FX_F32, DIMS(D, N));
    const int64_t bcs[3] = {B, G > 1 ? G : N, N};
    arg(&s, "b", 'n', t, bcs, bc_rank - 1);
    arg(&s, "c", 'n', t, bcs, bc_rank - 1);
    arg(&s, "d", 'n', FX_F32, DIMS(D));
    ret(&s, "y", t, DIMS(B, D), 1);
    ret(&s, "new_state", FX_F32, DIMS(B, D, N), 1);
    flag(&s, "dt_softplus", 0);
    flag(&s, "has_d", 1);
    flag(&s, "has_z", 0);
    flag(&s, "has_dt_bias", 0);
    run(&s);
}

/* ---- empty problems: outputs the handler must still write ---- */

/* Result `name` holds `want`'s values, or zeros without `want`. */
static void expect_values(const call *c, const char *name, const buffer *want)
{
    for (int i = 0; i < c->nrets; i++) {
        const buffer *got = &c->rets[i];
        if (strcmp(got->name, name) != 0)
            continue;
        for (int64_t k = 0; k < got->numel; k++) {
            double w = want ? load(want, k) : 0.0, g = load(got, k);
            checks++;
            if (!(g == w)) {
                fail("%s: %s[%lld] %g, expected %g%s", c->target, name, (long long)k, g, w,
                     want ? " (its input)" : "");
                return;
            }
        }
        return;
    }
    fail("%s: no result %s", c->target, name);
}

static const buffer *find_arg(const call *c, const char *name)
{
    for (int i = 0; i < c->nargs; i++)
        if (strcmp(c->args[i].name, name) == 0)
            return &c->args[i];
    return NULL;
}

/* A selective scan with nothing to scan (batch or seqlen 0) whose
 * non-empty results are still results: the final state (h0, or zeros),
 * da, dd and ddt_bias (sums over no step: zeros), dh0 (dstate). */
static void empty_selective_scan(int64_t B, int64_t L, int has_h0)
{
    const int64_t D = 4, N = 3;
    call f = {.target = "fusex_selective_scan_fwd"};
    arg(&f, "x", 'n', FX_F32, DIMS(B, L, D));
    arg(&f, "dt", 'n', FX_F32, DIMS(B, L, D));
    arg(&f, "a", 'a', FX_F32, DIMS(D, N));
    arg(&f, "b", 'n', FX_F32, DIMS(B, L, N));
    arg(&f, "c", 'n', FX_F32, DIMS(B, L, N));
    arg(&f, "d", 'n', FX_F32, DIMS(D));
    arg(&f, "z", 'n', FX_F32, DIMS(B, L, D));
    arg(&f, "dt_bias", 'n', FX_F32, DIMS(D));
    if (has_h0)
        arg(&f, "h0", 'n', FX_F32, DIMS(B, D, N));
    ret(&f, "y", FX_F32, DIMS(B, L, D), 1);
    ret(&f, "state", FX_F32, DIMS(B, D, N), 1);
    const char *flags[] = {"dt_softplus", "has_d", "has_z", "has_dt_bias", "has_h0", "return_state", "save"};
    for (int i = 0; i < 7; i++)
        flag(&f, flags[i], i == 4 ? has_h0 : 1);
    int forward_ran = run_host(&f) == 0;
    if (forward_ran)
        expect_values(&f, "state", has_h0 ? find_arg(&f, "h0") : NULL);

    call bw = {.target = "fusex_selective_scan_bwd"};
    for (int i = 0; i < f.nargs; i++)
        like(bw.args, &bw.nargs, f.args[i].name, &f.args[i]);
    arg(&bw, "dy", 'n', FX_F32, DIMS(B, L, D));
    buffer *dstate = arg(&bw, "dstate", 'n', FX_F32, DIMS(B, D, N));
    static const char *const grads[] = {"dx", "ddt", "da", "db", "dc", "dd", "dz", "ddt_bias", "dh0"};
    for (int i = 0; i < f.nargs; i++)
        like(bw.rets, &bw.nrets, grads[i], &f.args[i]);
    for (int i = 0; i < 5; i++)
        flag(&bw, flags[i], i == 4 ? has_h0 : 1);
    flag(&bw, "has_dstate", 1);
#ifdef FX_XLA_TEST_CUDA
    if (forward_ran)
        run_cuda_against_host(&f);
#endif
    free_call(&f);
    if (run_host(&bw) == 0) {
        for (int i = 0; i < 8; i++)
            expect_values(&bw, grads[i], NULL);
        if (has_h0)
            expect_values(&bw, "dh0", dstate);
#ifdef FX_XLA_TEST_CUDA
        run_cuda_against_host(&bw);
#endif
    }
    free_call(&bw);
}

static const char *const seq_names[4][3] = {
    {"a", "b"}, {"z_logits", "cand"}, {"f_logits", "i_logits", "cand"}, {"f_logits"}};
static const int nseqs[4] = {2, 2, 3, 1};
static const char *const ops[4] = {"linear_scan", "mingru", "minlstm", "liquid"};

/* "dcand" for "cand": the backward's results are named after the inputs. */
static const char *grad_name(const char *input)
{
    static const char *const names[][2] = {
        {"a", "da"},       {"b", "db"},           {"z_logits", "dz_logits"}, {"cand", "dcand"}, {"f_logits", "df_logits"},
        {"i_logits", "di_logits"}, {"tau", "dtau"}, {"dt", "ddt"},           {"h0", "dh0"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(names[i][0], input) == 0)
            return names[i][1];
    return "?";
}

/* eps, a norm's f64 attribute. */
static void c_eps(call *c) { c->attrs[c->nattrs++] = (attr){.name = "eps", .type = 'd', .f64 = 1e-5}; }

static void op_attrs(call *c, int op, int candidate_g, int has_dt)
{
    flag(c, "reverse", 1);
    if (op == 1 || op == 2)
        flag(c, "candidate_g", candidate_g);
    if (op == 3) {
        flag(c, "has_dt", has_dt);
        c->attrs[c->nattrs++] = (attr){.name = "dt", .type = 'd', .f64 = 0.75};
    }
}

/* A linear recurrence's forward call over [B, L, H] of type t, with h0
 * (when has_h0), liquid's dt tensor, the output and the final state;
 * `target` holds its name. */
static void linrec_forward_call(call *f, char *target, size_t len, int op, int64_t B, int64_t L, int64_t H,
                                fx_dtype t, int has_h0)
{
    snprintf(target, len, "fusex_%s_fwd", ops[op]);
    *f = (call){.target = target};
    for (int i = 0; i < nseqs[op]; i++)
        arg(f, seq_names[op][i], op == 0 && i == 0 ? 'p' : 'n', t, DIMS(B, L, H));
    if (op == 3) {
        arg(f, "tau", 'p', t, DIMS(H));
        arg(f, "a", 'n', t, DIMS(H));
        arg(f, "dt", 'q', t, DIMS(B, L, 1));
    }
    if (has_h0)
        arg(f, "h0", 'n', FX_F32, DIMS(B, H));
    ret(f, "h", t, DIMS(B, L, H), 1);
    ret(f, "state", FX_F32, DIMS(B, H), 1);
    op_attrs(f, op, 1, 1);
    flag(f, "has_h0", has_h0);
    flag(f, "return_state", 1);
}

/* The backward call of forward f: its inputs, f's output, dh and dstate
 * (returned); a gradient for every input of f. */
static buffer *linrec_backward_call(call *bw, char *target, size_t len, const call *f, int op, int64_t B, int64_t L,
                                    int64_t H, fx_dtype t, int has_h0)
{
    snprintf(target, len, "fusex_%s_bwd", ops[op]);
    *bw = (call){.target = target};
    for (int i = 0; i < f->nargs; i++)
        like(bw->args, &bw->nargs, f->args[i].name, &f->args[i]);
    like(bw->args, &bw->nargs, "h", &f->rets[0]);
    arg(bw, "dh", 'n', t, DIMS(B, L, H));
    buffer *dstate = arg(bw, "dstate", 'n', FX_F32, DIMS(B, H));
    for (int i = 0; i < f->nargs; i++) {
        buffer *g = like(bw->rets, &bw->nrets, grad_name(f->args[i].name), &f->args[i]);
        /* liquid's tau and a sum over batch and time, dt over hidden */
        g->terms = op == 3 && (i == 1 || i == 2) ? (int)(B * L) : op == 3 && i == 3 ? (int)H : 1;
    }
    op_attrs(bw, op, 1, 1);
    flag(bw, "has_h0", has_h0);
    flag(bw, "has_dstate", 1);
    return dstate;
}

/* A linear recurrence's forward, its backward (on the forward's output)
 * and its step; h0, the final state, dstate, reverse, liquid's dt tensor. */
static void linrec(int op, int64_t B, int64_t L, int64_t H, fx_dtype t)
{
    char target[64], btarget[64];
    call f, bw;
    linrec_forward_call(&f, target, sizeof target, op, B, L, H, t, 1);
    if (run_host(&f) != 0) {
        free_call(&f);
        return;
    }
    linrec_backward_call(&bw, btarget, sizeof btarget, &f, op, B, L, H, t, 1);
#ifdef FX_XLA_TEST_CUDA
    run_cuda_against_host(&f);
#endif
    free_call(&f);
    run(&bw);

    char starget[64];
    snprintf(starget, sizeof starget, "fusex_%s_step", ops[op]);
    call s = {.target = starget};
    arg(&s, "state", 'n', FX_F32, DIMS(B, H));
    for (int i = 0; i < nseqs[op]; i++)
        arg(&s, seq_names[op][i], op == 0 && i == 0 ? 'p' : 'n', t, DIMS(B, H));
    if (op == 3) {
        arg(&s, "tau", 'p', t, DIMS(H));
        arg(&s, "a", 'n', t, DIMS(H));
    }
    ret(&s, "h", t, DIMS(B, H), 1);
    ret(&s, "new_state", FX_F32, DIMS(B, H), 1);
    op_attrs(&s, op, 0, 0);
    run(&s);
}

/* ---- the layers: causal conv1d and the norms ---- */

static void expect_error(call *c, const char *platform, XLA_FFI_Error_Code code, const char *message);

/* A causal conv1d's forward with every option, its backward (gradients
 * of every input from dy and dfinal_state) and a step with a bias. */
static void causal_conv1d(int64_t B, int64_t L, int64_t D, int64_t W, fx_dtype t)
{
    call f = {.target = "fusex_causal_conv1d_fwd"};
    arg(&f, "x", 'n', t, DIMS(B, L, D));
    arg(&f, "w", 'n', t, DIMS(D, W));
    arg(&f, "bias", 'n', t, DIMS(D));
    arg(&f, "initial_state", 'n', t, DIMS(B, D, W - 1));
    ret(&f, "y", t, DIMS(B, L, D), (int)W);
    ret(&f, "final_state", t, DIMS(B, D, W - 1), 1);
    flag(&f, "activation", 1);
    flag(&f, "has_bias", 1);
    flag(&f, "has_initial_state", 1);
    flag(&f, "return_state", 1);
    call bw = {.target = "fusex_causal_conv1d_bwd"};
    for (int i = 0; i < 4; i++)
        like(bw.args, &bw.nargs, f.args[i].name, &f.args[i]);
    arg(&bw, "dy", 'n', t, DIMS(B, L, D));
    arg(&bw, "dfinal_state", 'n', t, DIMS(B, D, W - 1));
    static const char *const grads[] = {"dx", "dw", "dbias", "dinitial_state"};
    for (int i = 0; i < 4; i++) /* dw and dbias sum over batch and time */
        like(bw.rets, &bw.nrets, grads[i], &f.args[i])->terms = i == 1 || i == 2 ? (int)(B * L) : (int)W;
    flag(&bw, "activation", 1);
    flag(&bw, "has_bias", 1);
    flag(&bw, "has_initial_state", 1);
    flag(&bw, "has_dfinal_state", 1);
    run(&f);
    run(&bw);
    call s = {.target = "fusex_causal_conv1d_step"};
    arg(&s, "state", 'n', t, DIMS(B, D, W - 1));
    arg(&s, "x", 'n', t, DIMS(B, D));
    arg(&s, "w", 'n', t, DIMS(D, W));
    arg(&s, "bias", 'n', t, DIMS(D));
    ret(&s, "y", t, DIMS(B, D), (int)W);
    ret(&s, "new_state", t, DIMS(B, D, W - 1), 1);
    flag(&s, "activation", 0);
    flag(&s, "has_bias", 1);
    run(&s);
}

/* ---- the GRU and the LSTM: a repeated group (the layers) by slot ---- */

static const char *const rnn_params[4] = {"w_ih", "w_hh", "b_ih", "b_hh"};
static const char *const rnn_grads[4] = {"dw_ih", "dw_hh", "db_ih", "db_hh"};

static void layers_attr(call *c, int64_t layers)
{
    c->attrs[c->nattrs++] = (attr){.name = "layers", .type = 'd', .f64 = (double)layers};
}

/* Layer l's parameters as operands (names from `names`: a slot's,
 * "layers[1].w_hh", is the message's, not the call's). */
static void rnn_layer_args(call *c, int lstm, int64_t l, int64_t I, int64_t H, fx_dtype t)
{
    const int64_t G = (lstm ? 4 : 3) * H, in = l == 0 ? I : H;
    arg(c, rnn_params[0], 'n', t, DIMS(G, in));
    arg(c, rnn_params[1], 'n', t, DIMS(G, H));
    arg(c, rnn_params[2], 'n', t, DIMS(G));
    arg(c, rnn_params[3], 'n', t, DIMS(G));
    for (int k = 0; k < 4; k++) { /* PyTorch's scale, 1/sqrt(hidden) */
        buffer *b = &c->args[c->nargs - 4 + k];
        for (int64_t i = 0; i < b->numel; i++)
            store(b, i, load(b, i) / sqrt((double)H));
    }
}

/* A stacked GRU or LSTM through the generic handlers: the training
 * forward (h0, c0, return_state, save), its backward on what it saved
 * (every gradient, dh_n and dc_n given), and a chain of steps from h0
 * (c0) whose outputs are the forward's y frame by frame and whose final
 * states are its h_n (c_n). */
static void rnn(int lstm, int64_t B, int64_t L, int64_t I, int64_t H, int64_t NL, fx_dtype t)
{
    const char *cell = lstm ? "lstm" : "gru";
    char target[64];
    const int nstates = lstm ? 2 : 1;
    const int64_t W = (lstm ? 6 : 5) * H;
    snprintf(target, sizeof target, "fusex_%s_fwd", cell);
    call f = {.target = target};
    arg(&f, "x", 'n', t, DIMS(B, L, I));
    arg(&f, "h0", 'n', FX_F32, DIMS(NL, B, H));
    if (lstm)
        arg(&f, "c0", 'n', FX_F32, DIMS(NL, B, H));
    for (int64_t l = 0; l < NL; l++)
        rnn_layer_args(&f, lstm, l, I, H, t);
    ret(&f, "y", t, DIMS(B, L, H), (int)H);
    ret(&f, "h_n", FX_F32, DIMS(NL, B, H), (int)H);
    if (lstm)
        ret(&f, "c_n", FX_F32, DIMS(NL, B, H), (int)H);
    ret(&f, "saved", FX_F32, DIMS(NL, B, L, W), (int)H);
    layers_attr(&f, NL);
    flag(&f, "has_h0", 1);
    if (lstm)
        flag(&f, "has_c0", 1);
    flag(&f, "return_state", 1);
    flag(&f, "save", 1);
    if (run_host(&f) != 0) {
        free_call(&f);
        return;
    }
    const int first = 1 + nstates; /* the layers' first slot */

    char bwd_target[64];
    snprintf(bwd_target, sizeof bwd_target, "fusex_%s_bwd", cell);
    call bw = {.target = bwd_target};
    for (int i = 0; i < first; i++)
        like(bw.args, &bw.nargs, f.args[i].name, &f.args[i]);
    like(bw.args, &bw.nargs, "saved", &f.rets[f.nrets - 1]);
    arg(&bw, "dy", 'n', t, DIMS(B, L, H));
    arg(&bw, "dh_n", 'n', FX_F32, DIMS(NL, B, H));
    if (lstm)
        arg(&bw, "dc_n", 'n', FX_F32, DIMS(NL, B, H));
    for (int i = first; i < f.nargs; i++)
        like(bw.args, &bw.nargs, f.args[i].name, &f.args[i]);
    static const char *const state_grads[] = {"dx", "dh0", "dc0"};
    for (int i = 0; i < first; i++)
        like(bw.rets, &bw.nrets, state_grads[i], &f.args[i])->terms = (int)(L * H);
    for (int i = first; i < f.nargs; i++) /* summed over batch and time */
        like(bw.rets, &bw.nrets, rnn_grads[(i - first) % 4], &f.args[i])->terms = (int)(B * L);
    layers_attr(&bw, NL);
    flag(&bw, "has_h0", 1);
    flag(&bw, "has_dh_n", 1);
    if (lstm) {
        flag(&bw, "has_c0", 1);
        flag(&bw, "has_dc_n", 1);
    }
    run(&bw);

    /* the steps, each from the last one's states */
    char step_target[64];
    snprintf(step_target, sizeof step_target, "fusex_%s_step", cell);
    buffer want_y = f.rets[0];
    double worst = 0;
    buffer states[2];
    for (int k = 0; k < nstates; k++)
        states[k] = f.args[1 + k];
    for (int64_t step = 0; step < L; step++) {
        call s = {.target = step_target};
        for (int k = 0; k < nstates; k++)
            like(s.args, &s.nargs, k ? "c" : "h", &states[k]);
        buffer *xt = arg(&s, "x", 'n', t, DIMS(B, I));
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < I; i++)
                store(xt, b * I + i, load(&f.args[0], (b * L + step) * I + i));
        for (int i = first; i < f.nargs; i++)
            like(s.args, &s.nargs, f.args[i].name, &f.args[i]);
        ret(&s, "y", t, DIMS(B, H), (int)H);
        ret(&s, "new_h", FX_F32, DIMS(NL, B, H), (int)H);
        if (lstm)
            ret(&s, "new_c", FX_F32, DIMS(NL, B, H), (int)H);
        layers_attr(&s, NL);
        if (run_host(&s) != 0) {
            free_call(&s);
            break;
        }
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++) {
                double g = load(&s.rets[0], b * H + h), w = load(&want_y, (b * L + step) * H + h);
                worst = fmax(worst, fabs(g - w) / fmax(1.0, fabs(w)));
            }
        if (step > 0)
            for (int k = 0; k < nstates; k++)
                free(states[k].host);
        for (int k = 0; k < nstates; k++) { /* keep the new states, free the rest */
            states[k] = s.rets[1 + k];
            s.rets[1 + k].host = malloc(1);
        }
        free_call(&s);
    }
    checks++;
    const double tol = t == FX_F32 ? 1e-5 : 1e-2;
    if (!(worst <= tol))
        fail("%s: the steps' y differs from the forward's by %g (tolerance %g)", step_target, worst, tol);
    for (int k = 0; k < nstates && states[k].host != f.args[1 + k].host; k++) {
        checks++;
        double diff = 0, ref = 0;
        for (int64_t i = 0; i < states[k].numel; i++) {
            double g = load(&states[k], i), w = load(&f.rets[1 + k], i);
            diff += (g - w) * (g - w);
            ref += w * w;
        }
        if (!(sqrt(diff) <= 1e-5 * sqrt(ref)))
            fail("%s: the steps' final %s differs from the forward's by %g", step_target, k ? "c" : "h",
                 sqrt(diff / ref));
        free(states[k].host);
    }
#ifdef FX_XLA_TEST_CUDA
    run_cuda_against_host(&f);
#endif
    free_call(&f);
}

/* A layer's parameter of the wrong shape, named by its slot; too many
 * layers for the slots. */
static void rnn_errors(void)
{
    call c = {.target = "fusex_gru_fwd"};
    arg(&c, "x", 'n', FX_F32, DIMS(2, 3, 5));
    rnn_layer_args(&c, 0, 0, 5, 4, FX_F32);
    rnn_layer_args(&c, 0, 1, 5, 5, FX_F32); /* hidden 5 above a layer of 4 */
    ret(&c, "y", FX_F32, DIMS(2, 3, 4), 1);
    layers_attr(&c, 2);
    flag(&c, "has_h0", 0);
    flag(&c, "return_state", 0);
    flag(&c, "save", 0);
    expect_error(&c, "host", XLA_FFI_Error_Code_INVALID_ARGUMENT,
                 "fusex_gru_fwd: layers[1].w_ih: expected shape {12,4} ([3*hidden, hidden]), got {15,5}");
    c.attrs[0].f64 = 1; /* one layer: four operands too many */
    expect_error(&c, "host", XLA_FFI_Error_Code_INVALID_ARGUMENT,
                 "fusex_gru_fwd: operands: expected 5 (x, layers[0].w_ih, layers[0].w_hh, layers[0].b_ih, "
                 "layers[0].b_hh), got 9");
    c.attrs[0].f64 = 15;
    expect_error(&c, "host", XLA_FFI_Error_Code_INVALID_ARGUMENT,
                 "fusex_gru_fwd: layers: expected an integer from 1 to 14, got 15");
    free_call(&c);
}

/* rms_norm's or layer_norm's training forward with a bias, a residual
 * (of type `rt`; s in f32 when residual_in_f32) and a gate, and its
 * backward on what that forward returned (s, the statistics), dy and ds. */
static void norm(const char *op, int64_t rows, int64_t H, fx_dtype t, fx_dtype rt, int residual_in_f32)
{
    const int layer = strcmp(op, "layer_norm") == 0;
    const fx_dtype s_type = residual_in_f32 ? FX_F32 : rt;
    char target[64], btarget[64];
    snprintf(target, sizeof target, "fusex_%s_fwd", op);
    snprintf(btarget, sizeof btarget, "fusex_%s_bwd", op);
    call f = {.target = target};
    arg(&f, "x", 'n', t, DIMS(rows, H));
    arg(&f, "weight", 'p', FX_F32, DIMS(H));
    arg(&f, "bias", 'n', t, DIMS(H));
    arg(&f, "residual", 'n', rt, DIMS(rows, H));
    arg(&f, "gate", 'n', t, DIMS(rows, H));
    ret(&f, "y", t, DIMS(rows, H), (int)H);
    ret(&f, "s", s_type, DIMS(rows, H), 1);
    if (layer)
        ret(&f, "mean", FX_F32, DIMS(rows), (int)H);
    ret(&f, "rstd", FX_F32, DIMS(rows), (int)H);
    c_eps(&f);
    flag(&f, "residual_in_f32", residual_in_f32);
    if (!layer)
        flag(&f, "has_bias", 1);
    flag(&f, "has_residual", 1);
    flag(&f, "has_gate", 1);
    flag(&f, "save", 1);
    if (run_host(&f) != 0) {
        free_call(&f);
        return;
    }
    call bw = {.target = btarget};
    for (int i = 0; i < 5; i++)
        like(bw.args, &bw.nargs, f.args[i].name, &f.args[i]);
    for (int r = 1; r < f.nrets; r++) /* s, the statistics */
        like(bw.args, &bw.nargs, f.rets[r].name, &f.rets[r]);
    arg(&bw, "dy", 'n', t, DIMS(rows, H));
    arg(&bw, "ds", 'n', s_type, DIMS(rows, H));
    static const char *const grads[] = {"dx", "dweight", "dbias", "dresidual", "dgate"};
    for (int i = 0; i < 5; i++) /* dweight and dbias sum over the rows */
        like(bw.rets, &bw.nrets, grads[i], &f.args[i])->terms = i == 1 || i == 2 ? (int)rows : (int)H;
    c_eps(&bw);
    flag(&bw, "residual_in_f32", residual_in_f32);
    if (!layer)
        flag(&bw, "has_bias", 1);
    flag(&bw, "has_residual", 1);
    flag(&bw, "has_gate", 1);
    flag(&bw, "has_ds", 1);
#ifdef FX_XLA_TEST_CUDA
    run_cuda_against_host(&f);
#endif
    free_call(&f);
    run(&bw);
}

/* The layers' attributes and operands: an enum by index, the linear
 * layer no target. */
static void layer_errors(void)
{
    call c = {.target = "fusex_causal_conv1d_fwd"};
    arg(&c, "x", 'n', FX_F32, DIMS(2, 5, 3));
    arg(&c, "w", 'n', FX_F32, DIMS(3, 4));
    ret(&c, "y", FX_F32, DIMS(2, 5, 3), 1);
    flag(&c, "activation", 2);
    flag(&c, "has_bias", 0);
    flag(&c, "has_initial_state", 0);
    flag(&c, "return_state", 0);
    expect_error(&c, "host", XLA_FFI_Error_Code_INVALID_ARGUMENT,
                 "fusex_causal_conv1d_fwd: activation: expected 0 to 1 (none or silu), got 2");
    c.attrs[0] = (attr){.name = "activation", .type = 'd', .f64 = 1};
    expect_error(&c, "host", XLA_FFI_Error_Code_INVALID_ARGUMENT,
                 "fusex_causal_conv1d_fwd: activation: expected an integer attribute 0 to 1 (i64: none or silu), "
                 "got an f64");
    c.attrs[0] = (attr){.name = "activation", .type = 'i', .i32 = 1}; /* any integer width */
    run_host(&c);
    c.attrs[0] = c.attrs[3]; /* activation left out */
    c.nattrs = 3;
    expect_error(&c, "host", XLA_FFI_Error_Code_INVALID_ARGUMENT,
                 "fusex_causal_conv1d_fwd: activation: expected an attribute 0 to 1 (i64: none or silu), got none");
    c.nattrs = 4;
    c.attrs[0] = (attr){.name = "activation", .type = 'l'};
    c.args[1].dims[1] = 17;
    expect_error(&c, "host", XLA_FFI_Error_Code_INVALID_ARGUMENT,
                 "fusex_causal_conv1d_fwd: w: expected a width of 1 to 16 [dim, width], got shape {3,17}");
    c.args[1].dims[1] = 4;
    free_call(&c);
    c = (call){.target = "fusex_rms_norm_fwd"};
    arg(&c, "x", 'n', FX_F32, DIMS(4, 8));
    arg(&c, "weight", 'n', FX_F32, DIMS(8));
    ret(&c, "y", FX_F32, DIMS(4, 8), 1);
    c.attrs[c.nattrs++] = (attr){.name = "eps", .type = 'd', .f64 = -1};
    const char *flags[] = {"residual_in_f32", "has_bias", "has_residual", "has_gate", "save"};
    for (int i = 0; i < 5; i++)
        flag(&c, flags[i], 0);
    expect_error(&c, "host", XLA_FFI_Error_Code_INVALID_ARGUMENT,
                 "fusex_rms_norm_fwd: eps: expected a finite number >= 0, got -1");
    c.attrs[0].f64 = 1e-5;
    c.attrs[5].i64 = 1; /* save: rstd is a result */
    expect_error(&c, "host", XLA_FFI_Error_Code_INVALID_ARGUMENT,
                 "fusex_rms_norm_fwd: results: expected 2 (y, rstd), got 1");
    free_call(&c);
    checks++;
    if (fusex_xla_op_index("linear_fwd") != -1 || fusex_xla_op_index("fusex_linear_bwd") != -1)
        fail("the linear layer is an XLA target");
}

/* A linear recurrence with nothing to scan (batch or seqlen 0): the final
 * state (h0, or zeros), liquid's dtau and da (sums over no step: zeros)
 * and dh0 (dstate) are still written. */
static void empty_linrec(int op, int64_t B, int64_t L, int has_h0)
{
    const int64_t H = 5;
    char target[64], btarget[64];
    call f, bw;
    linrec_forward_call(&f, target, sizeof target, op, B, L, H, FX_F32, has_h0);
    int forward_ran = run_host(&f) == 0;
    if (forward_ran)
        expect_values(&f, "state", has_h0 ? find_arg(&f, "h0") : NULL);
    buffer *dstate = linrec_backward_call(&bw, btarget, sizeof btarget, &f, op, B, L, H, FX_F32, has_h0);
#ifdef FX_XLA_TEST_CUDA
    if (forward_ran)
        run_cuda_against_host(&f);
#endif
    free_call(&f);
    if (run_host(&bw) == 0) {
        for (int i = 0; i < bw.nrets; i++)
            if (strcmp(bw.rets[i].name, "dh0") != 0)
                expect_values(&bw, bw.rets[i].name, NULL);
        if (has_h0)
            expect_values(&bw, "dh0", dstate);
#ifdef FX_XLA_TEST_CUDA
        run_cuda_against_host(&bw);
#endif
    }
    free_call(&bw);
}

/* ---- Host-only checks of the plumbing ---- */

/* h = cumulative sum of b where a = 1, forward and reverse: exact. */
static void exact_scan(void)
{
    for (int reverse = 0; reverse < 2; reverse++) {
        call c = {.target = "fusex_linear_scan_fwd"};
        buffer *a = arg(&c, "a", 'n', FX_F32, DIMS(2, 5, 3));
        buffer *b = arg(&c, "b", 'n', FX_F32, DIMS(2, 5, 3));
        for (int64_t i = 0; i < a->numel; i++) {
            store(a, i, 1.0);
            store(b, i, (double)(i % 7));
        }
        ret(&c, "h", FX_F32, DIMS(2, 5, 3), 1);
        ret(&c, "state", FX_F32, DIMS(2, 3), 1);
        flag(&c, "reverse", reverse);
        flag(&c, "has_h0", 0);
        flag(&c, "return_state", 1);
        if (run_host(&c) == 0) {
            for (int bt = 0; bt < 2; bt++)
                for (int ch = 0; ch < 3; ch++) {
                    double sum = 0;
                    for (int s = 0; s < 5; s++) {
                        int t = reverse ? 4 - s : s;
                        int64_t i = (bt * 5 + t) * 3 + ch;
                        sum += load(b, i);
                        checks++;
                        if (load(&c.rets[0], i) != sum)
                            fail("linear_scan%s: h[%d,%d,%d] %g, expected %g", reverse ? " reverse" : "", bt, t, ch,
                                 load(&c.rets[0], i), sum);
                    }
                    checks++;
                    if (load(&c.rets[1], bt * 3 + ch) != sum)
                        fail("linear_scan: state[%d,%d] %g, expected %g", bt, ch, load(&c.rets[1], bt * 3 + ch), sum);
                }
        }
        free_call(&c);
    }
}

/* liquid with its flags as i32 and dt as f32 equals the i64 / f64 call. */
static void attribute_widths(void)
{
    call c[2];
    uint64_t seed = rng_state;
    for (int k = 0; k < 2; k++) {
        rng_state = seed; /* the same inputs twice */
        c[k] = (call){.target = "fusex_liquid_fwd"};
        arg(&c[k], "f_logits", 'n', FX_F32, DIMS(2, 9, 4));
        arg(&c[k], "tau", 'p', FX_F32, DIMS(4));
        arg(&c[k], "a", 'n', FX_F32, DIMS(4));
        ret(&c[k], "h", FX_F32, DIMS(2, 9, 4), 1);
        if (k == 0) {
            flag(&c[k], "reverse", 0);
            flag(&c[k], "has_dt", 0);
            flag(&c[k], "has_h0", 0);
            flag(&c[k], "return_state", 0);
            c[k].attrs[c[k].nattrs++] = (attr){.name = "dt", .type = 'd', .f64 = 0.5};
        } else {
            const char *names[] = {"reverse", "has_dt", "has_h0", "return_state"};
            for (int i = 0; i < 4; i++)
                c[k].attrs[c[k].nattrs++] = (attr){.name = names[i], .type = 'i', .i32 = 0};
            c[k].attrs[c[k].nattrs++] = (attr){.name = "dt", .type = 'f', .f32 = 0.5f};
        }
        run_host(&c[k]);
    }
    checks++;
    if (memcmp(c[0].rets[0].host, c[1].rets[0].host, c[0].rets[0].nbytes) != 0)
        fail("liquid: i32 flags and an f32 dt give another result than i64 and f64");
    free_call(&c[0]);
    free_call(&c[1]);
}

/* A step (its state the first operand; its output, then new_state, the
 * results) whose new_state is its state (XLA aliased them) equals one
 * that copies; frees the call. */
static void expect_aliased_step(call *c)
{
    if (run_host(c) == 0) {
        const size_t state_bytes = c->args[0].nbytes, out_bytes = c->rets[0].nbytes;
        void *state_before = malloc(state_bytes ? state_bytes : 1), *out = malloc(out_bytes ? out_bytes : 1);
        memcpy(state_before, c->args[0].host, state_bytes);
        memcpy(out, c->rets[0].host, out_bytes);
        void *separate = c->rets[1].host;
        c->rets[1].host = c->args[0].host; /* aliased */
        XLA_FFI_Error *err = invoke(handler(c->target, "host"), c, &host_ctx, 0);
        checks++;
        if (err) {
            fail("%s aliased: %s", c->target, fake_xla_error_message(err));
            fake_xla_error_free(err);
        } else if (memcmp(c->args[0].host, separate, state_bytes) != 0 ||
                   memcmp(c->rets[0].host, out, out_bytes) != 0 ||
                   (state_bytes && memcmp(state_before, separate, state_bytes) == 0)) {
            fail("%s aliased: the state updated in place differs from the copy's", c->target);
        }
        c->rets[1].host = separate;
        free(state_before);
        free(out);
    }
    free_call(c);
}

static void aliased_step(void)
{
    call c = {.target = "fusex_mingru_step"};
    arg(&c, "state", 'n', FX_F32, DIMS(3, 5));
    arg(&c, "z_logits", 'n', FX_F32, DIMS(3, 5));
    arg(&c, "cand", 'n', FX_F32, DIMS(3, 5));
    ret(&c, "h", FX_F32, DIMS(3, 5), 1);
    ret(&c, "new_state", FX_F32, DIMS(3, 5), 1);
    flag(&c, "reverse", 0);
    flag(&c, "candidate_g", 0);
    expect_aliased_step(&c);
    /* a convolution's state: the oldest input leaves, the frame enters */
    c = (call){.target = "fusex_causal_conv1d_step"};
    arg(&c, "state", 'n', FX_F32, DIMS(2, 6, 3));
    arg(&c, "x", 'n', FX_F32, DIMS(2, 6));
    arg(&c, "w", 'n', FX_F32, DIMS(6, 4));
    ret(&c, "y", FX_F32, DIMS(2, 6), 1);
    ret(&c, "new_state", FX_F32, DIMS(2, 6, 3), 1);
    flag(&c, "activation", 1);
    flag(&c, "has_bias", 0);
    expect_aliased_step(&c);
}

static void expect_error(call *c, const char *platform, XLA_FFI_Error_Code code, const char *message)
{
    XLA_FFI_ExecutionContext ctx = host_ctx;
    XLA_FFI_Error *err = invoke(handler(c->target, platform), c, &ctx, 0);
    checks++;
    if (!err) {
        fail("expected the error \"%s\", got none", message);
        return;
    }
    if (fake_xla_error_code(err) != code || strcmp(fake_xla_error_message(err), message) != 0)
        fail("expected error %d \"%s\", got %d \"%s\"", code, message, fake_xla_error_code(err),
             fake_xla_error_message(err));
    fake_xla_error_free(err);
}

static void errors(void)
{
    call c = {.target = "fusex_mingru_fwd"};
    arg(&c, "z_logits", 'n', FX_F32, DIMS(2, 3, 4));
    arg(&c, "cand", 'n', FX_F16, DIMS(2, 3, 4));
    ret(&c, "h", FX_F32, DIMS(2, 3, 4), 1);
    flag(&c, "reverse", 0);
    flag(&c, "candidate_g", 0);
    flag(&c, "has_h0", 0);
    flag(&c, "return_state", 0);
    expect_error(&c, "host", XLA_FFI_Error_Code_INVALID_ARGUMENT,
                 "fusex_mingru_fwd: cand: expected type {f,32}, got {f,16}");
    c.attrs[1].i64 = 3;
    expect_error(&c, "host", XLA_FFI_Error_Code_INVALID_ARGUMENT, "fusex_mingru_fwd: candidate_g: expected 0 or 1, got 3");
    c.attrs[1].type = 's';
    expect_error(&c, "host", XLA_FFI_Error_Code_INVALID_ARGUMENT,
                 "fusex_mingru_fwd: candidate_g: expected an integer attribute 0 or 1 (i64), got a string");
    c.nattrs = 3;
    c.attrs[1] = (attr){.name = "return_state", .type = 'l'};
    expect_error(&c, "host", XLA_FFI_Error_Code_INVALID_ARGUMENT,
                 "fusex_mingru_fwd: candidate_g: expected an attribute 0 or 1 (i64), got none");
    c.nargs = 1;
    c.attrs[1] = (attr){.name = "candidate_g", .type = 'l'};
    c.nattrs = 4;
    c.attrs[3] = (attr){.name = "return_state", .type = 'l'};
    expect_error(&c, "host", XLA_FFI_Error_Code_INVALID_ARGUMENT,
                 "fusex_mingru_fwd: operands: expected 2 (z_logits, cand), got 1");
    c.nargs = 2;
    free_call(&c);
#ifndef FX_XLA_TEST_CUDA
    /* Without a loadable CUDA backend a CUDA call says why, nothing more. */
    const char *why = fusex_xla_cuda_unavailable_reason();
    checks++;
    if (!why) {
        printf("  (fusex_cuda.so loads here: the CUDA handlers are checked by the CUDA build)\n");
    } else {
        call d = {.target = "fusex_linear_scan_fwd"};
        arg(&d, "a", 'n', FX_F32, DIMS(1, 2, 3));
        arg(&d, "b", 'n', FX_F32, DIMS(1, 2, 3));
        ret(&d, "h", FX_F32, DIMS(1, 2, 3), 1);
        flag(&d, "reverse", 0);
        flag(&d, "has_h0", 0);
        flag(&d, "return_state", 0);
        char want[1200];
        snprintf(want, sizeof want,
                 "fusex_linear_scan_fwd: device: expected fusex's CUDA backend for XLA's CUDA platform, got none: %s",
                 why);
        want[FX_MSG_LEN - 1] = '\0'; /* fx_status's length */
        expect_error(&d, "cuda", XLA_FFI_Error_Code_INVALID_ARGUMENT, want);
        free_call(&d);
    }
#endif
}

/* fusex_xla_ssm_saved_shape with sizes no scan has: -1, the reason, `out`
 * untouched. */
static void saved_shape_errors(void)
{
    static const struct {
        int64_t batch, seqlen, dim, dstate, groups;
        const char *dtype, *message;
    } bad[] = {
        {2, 100, 64, 16, 3, "float32", "b: expected dstate >= 1 and a number of groups that divides dim 64, got {2,100,3,16}"},
        {2, 100, 64, 16, 0, "float32", "b: expected dstate >= 1 and a number of groups that divides dim 64, got {2,100,0,16}"},
        {2, 100, 64, 16, -2, "float32", "b: expected dstate >= 1 and a number of groups that divides dim 64, got {2,100,-2,16}"},
        {2, 100, 64, 0, 1, "float32", "b: expected dstate >= 1 and a number of groups that divides dim 64, got {2,100,0}"},
        {2, 100, 64, -4, 2, "bfloat16", "b: expected dstate >= 1 and a number of groups that divides dim 64, got {2,100,2,-4}"},
        {-1, 100, 64, 16, 1, "float32", "x: expected non-negative dimensions, got -1 at axis 0"},
        {2, -100, 64, 16, 1, "float32", "x: expected non-negative dimensions, got -100 at axis 1"},
        {2, 100, -64, 16, 1, "float32", "x: expected non-negative dimensions, got -64 at axis 2"},
        {(int64_t)1 << 30, (int64_t)1 << 30, 64, 16, 1, "float32",
         "x: expected a shape of at most 2^48 elements, got {1073741824,1073741824,64}"},
        {1, 4, 64, (int64_t)1 << 47, 1, "float32",
         "b: expected a shape of at most 2^48 elements, got {1,4,140737488355328}"},
        {1, (int64_t)1 << 24, (int64_t)1 << 20, (int64_t)1 << 20, 1, "float32",
         "saved: expected a shape of at most 2^48 elements, got {1,1048575,1048576,1048576}"},
        {2, 100, 64, 16, 1, "int32", "x: expected type float32, bfloat16, float16 or float64, got int32"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t out[4] = {7, 7, 7, 7};
        char msg[256] = "";
        int rc = fusex_xla_ssm_saved_shape(bad[i].batch, bad[i].seqlen, bad[i].dim, bad[i].dstate, bad[i].groups,
                                           bad[i].dtype, out, msg, sizeof msg);
        checks++;
        if (rc != -1 || strcmp(msg, bad[i].message) != 0 || out[0] != 7 || out[1] != 7 || out[2] != 7 || out[3] != 7)
            fail("fusex_xla_ssm_saved_shape(%lld, %lld, %lld, %lld, %lld, %s): %d \"%s\" {%lld,%lld,%lld,%lld}, "
                 "expected -1 \"%s\", out untouched",
                 (long long)bad[i].batch, (long long)bad[i].seqlen, (long long)bad[i].dim, (long long)bad[i].dstate,
                 (long long)bad[i].groups, bad[i].dtype, rc, msg, (long long)out[0], (long long)out[1],
                 (long long)out[2], (long long)out[3], bad[i].message);
    }
    /* Empty problems are problems: nothing saved. */
    int64_t out[4];
    char msg[256] = "";
    checks++;
    if (fusex_xla_ssm_saved_shape(0, 0, 0, 16, 1, "float32", out, msg, sizeof msg) != 0 || out[0] != 0 ||
        out[1] != 0 || out[2] != 0 || out[3] != 16)
        fail("fusex_xla_ssm_saved_shape(0, 0, 0, 16, 1): \"%s\"", msg);
}

/* ---- the check entry and the descriptions ---- */

/* The names the description lists under `key` ("attrs", "inputs",
 * "results"), in order, from its JSON: each entry's first key is "name". */
static int json_names(const char *json, const char *key, const char *next, char names[][32], int max)
{
    char start[32], stop[32];
    snprintf(start, sizeof start, "\"%s\": [", key);
    snprintf(stop, sizeof stop, "\"%s\": ", next);
    const char *p = strstr(json, start), *end = p ? strstr(p, stop) : NULL;
    int n = 0;
    while (p && end && n < max && (p = strstr(p, "{\"name\": \"")) && p < end) {
        p += strlen("{\"name\": \"");
        const char *q = strchr(p, '"');
        snprintf(names[n++], 32, "%.*s", (int)(q - p), p);
        p = q;
    }
    return n;
}

/* fusex_xla_op_check on the shapes, types and attributes of `c` says what
 * the handler says of the call, without the target's name. */
static void check_entry_agrees(call *c)
{
    int op = fusex_xla_op_index(c->target);
    const char *json = fusex_xla_op_describe(op);
    char attrs[16][32], inputs[16][32];
    int na = json_names(json, "attrs", "inputs", attrs, 16), ni = json_names(json, "inputs", "results", inputs, 16);
    int32_t present[16] = {0}, dtypes[16] = {0}, ranks[16] = {0}, out_present[16], out_dtypes[16], out_ranks[16];
    int64_t dims[16 * 8] = {0}, out_dims[16 * 8];
    double values[16] = {0};
    for (int i = 0; i < ni; i++)
        for (int k = 0; k < c->nargs; k++)
            if (strcmp(c->args[k].name, inputs[i]) == 0) {
                present[i] = 1;
                dtypes[i] = (int32_t)c->args[k].type;
                ranks[i] = c->args[k].rank;
                memcpy(dims + i * 8, c->args[k].dims, sizeof(int64_t) * (size_t)c->args[k].rank);
            }
    for (int a = 0; a < na; a++)
        for (int k = 0; k < c->nattrs; k++)
            if (strcmp(c->attrs[k].name, attrs[a]) == 0)
                values[a] = c->attrs[k].type == 'd' ? c->attrs[k].f64 : (double)c->attrs[k].i64;
    char msg[512], want[600];
    int rc = fusex_xla_op_check(op, 0, present, dtypes, ranks, dims, values, out_present, out_dtypes, out_ranks,
                                out_dims, msg, sizeof msg);
    snprintf(want, sizeof want, "%s: %s", c->target, msg);
    checks++;
    if (rc != 1)
        fail("fusex_xla_op_check(%s): %d \"%s\", expected a bad argument", c->target, rc, msg);
    else
        expect_error(c, "host", XLA_FFI_Error_Code_INVALID_ARGUMENT, want);
}

static void check_entry(void)
{
    checks++;
    if (fusex_xla_op_count() != 28 || fusex_xla_op_index("fusex_mingru_fwd") != 6 ||
        fusex_xla_op_index("mingru_fwd") != 6 || fusex_xla_op_index("fusex_nothing") != -1 ||
        fusex_xla_op_index("fusex_layer_norm_bwd") != 21 || fusex_xla_op_index("fusex_lstm_step") != 27 ||
        fusex_xla_op_index("linear_fwd") != -1 || fusex_xla_op_describe(28) || fusex_xla_op_handler(28, 0) ||
        fusex_xla_op_handler(0, 2) ||
        strncmp(fusex_xla_op_describe(0), "{\"index\": 0, \"name\": \"selective_scan_fwd\"", 40) ||
        strcmp(fusex_xla_dtypes_json(), "[\"f32\", \"f64\", \"bf16\", \"f16\", \"s32\", \"s64\", \"u8\"]"))
        fail("the ops' index, descriptions, handlers or element types");
    /* the results' shapes: a forward that saves its states */
    int op = fusex_xla_op_index("selective_scan_fwd");
    int32_t present[9] = {1, 1, 1, 1, 1}, dtypes[9] = {0}, ranks[9] = {3, 3, 2, 3, 3};
    int64_t dims[9 * 8] = {1, 40, 4, 0, 0, 0, 0, 0, 1, 40, 4, 0, 0, 0, 0, 0, 4, 3, 0, 0, 0, 0, 0, 0,
                           1, 40, 3, 0, 0, 0, 0, 0, 1, 40, 3};
    double attrs[7] = {0, 1, 1, 1, 1, 0, 1}; /* presence says 1 without the inputs: computed, not read */
    int32_t out_present[3], out_dtypes[3], out_ranks[3];
    int64_t out_dims[3 * 8];
    char msg[256];
    int rc = fusex_xla_op_check(op, 0, present, dtypes, ranks, dims, attrs, out_present, out_dtypes, out_ranks,
                                out_dims, msg, sizeof msg);
    checks++;
    if (rc != 0 || !out_present[0] || out_present[1] || !out_present[2] || out_ranks[2] != 4 ||
        out_dims[16] != 1 || out_dims[17] != 2 || out_dims[18] != 4 || out_dims[19] != 3 || out_dtypes[2] != 0 ||
        out_ranks[1] != 0 || out_dtypes[1] != -1)
        fail("fusex_xla_op_check(selective_scan_fwd): %d \"%s\"", rc, msg);
    /* bad inputs: the handler's message is the check's */
    call c = {.target = "fusex_mingru_fwd"};
    arg(&c, "z_logits", 'n', FX_F32, DIMS(2, 3, 4));
    arg(&c, "cand", 'n', FX_F16, DIMS(2, 3, 4));
    ret(&c, "h", FX_F32, DIMS(2, 3, 4), 1);
    flag(&c, "reverse", 0);
    flag(&c, "candidate_g", 1);
    flag(&c, "has_h0", 0);
    flag(&c, "return_state", 0);
    check_entry_agrees(&c);
    free_call(&c);
    c = (call){.target = "fusex_liquid_step"};
    arg(&c, "state", 'n', FX_F32, DIMS(2, 4));
    arg(&c, "f_logits", 'n', FX_F32, DIMS(2, 4));
    arg(&c, "tau", 'p', FX_F32, DIMS(4));
    arg(&c, "a", 'n', FX_F32, DIMS(4));
    ret(&c, "h", FX_F32, DIMS(2, 4), 1);
    ret(&c, "new_state", FX_F32, DIMS(2, 4), 1);
    flag(&c, "reverse", 0);
    flag(&c, "has_dt", 0);
    c.attrs[c.nattrs++] = (attr){.name = "dt", .type = 'd', .f64 = -1};
    check_entry_agrees(&c);
    free_call(&c);
    c = (call){.target = "fusex_selective_scan_bwd"};
    arg(&c, "x", 'n', FX_F32, DIMS(1, 9, 4));
    arg(&c, "dt", 'h', FX_F32, DIMS(1, 9, 4));
    arg(&c, "a", 'a', FX_F32, DIMS(4, 3));
    arg(&c, "b", 'n', FX_F32, DIMS(1, 9, 3));
    arg(&c, "c", 'n', FX_F32, DIMS(1, 9, 3));
    arg(&c, "dy", 'n', FX_F32, DIMS(1, 9, 5));
    const char *grads[] = {"dx", "ddt", "da", "db", "dc"};
    for (int i = 0; i < 5; i++)
        ret(&c, grads[i], FX_F32, c.args[i].dims, c.args[i].rank, 1);
    const char *flags[] = {"dt_softplus", "has_d", "has_z", "has_dt_bias", "has_h0", "has_dstate"};
    for (int i = 0; i < 6; i++)
        flag(&c, flags[i], 0);
    check_entry_agrees(&c);
    free_call(&c);
    /* the layers: an enum out of range, a bias of the wrong size, a norm's ds without a residual */
    c = (call){.target = "fusex_causal_conv1d_fwd"};
    arg(&c, "x", 'n', FX_F32, DIMS(2, 5, 3));
    arg(&c, "w", 'n', FX_F32, DIMS(3, 4));
    arg(&c, "bias", 'n', FX_F32, DIMS(4));
    ret(&c, "y", FX_F32, DIMS(2, 5, 3), 1);
    flag(&c, "activation", 1);
    flag(&c, "has_bias", 1);
    flag(&c, "has_initial_state", 0);
    flag(&c, "return_state", 0);
    check_entry_agrees(&c); /* bias [4] for dim 3 */
    c.args[2].dims[0] = 3;
    c.attrs[0].i64 = 5;
    check_entry_agrees(&c);
    free_call(&c);
    c = (call){.target = "fusex_layer_norm_bwd"};
    arg(&c, "x", 'n', FX_F32, DIMS(3, 4));
    arg(&c, "weight", 'n', FX_F32, DIMS(4));
    arg(&c, "bias", 'n', FX_F32, DIMS(4));
    arg(&c, "mean", 'n', FX_F32, DIMS(3));
    arg(&c, "rstd", 'p', FX_F32, DIMS(3));
    arg(&c, "dy", 'n', FX_F32, DIMS(3, 4));
    arg(&c, "ds", 'n', FX_F32, DIMS(3, 4));
    ret(&c, "dx", FX_F32, DIMS(3, 4), 1);
    ret(&c, "dweight", FX_F32, DIMS(4), 1);
    ret(&c, "dbias", FX_F32, DIMS(4), 1);
    c_eps(&c);
    const char *norm_flags[] = {"residual_in_f32", "has_residual", "has_gate"};
    for (int i = 0; i < 3; i++)
        flag(&c, norm_flags[i], 0);
    flag(&c, "has_ds", 1);
    check_entry_agrees(&c);
    free_call(&c);
}

static void registration(void)
{
    char msg[512];
    checks++;
    if (fusex_xla_register_loaded("libfusex_no_such_xla.so", msg, sizeof msg) == 0 ||
        strcmp(msg, "libfusex_no_such_xla.so is not loaded in this process (load EXLA, whose NIF loads it, first)"))
        fail("the loader with no XLA loaded: \"%s\"", msg);
    for (int round = 0; round < 2; round++) {
        checks++;
        if (fusex_xla_register(fake_xla_api(), msg, sizeof msg) != 0)
            fail("fusex_xla_register: %s", msg);
        fake_registration regs[64];
        int n = fake_xla_registrations(regs, 64);
        checks++;
        if (n != 56)
            fail("registrations: %d, expected 56 (28 targets, two platforms)", n);
        for (int i = 0; i < n && i < 64; i++)
            if (regs[i].major != 0 || regs[i].minor != 2 || regs[i].traits != 0 ||
                regs[i].execute != handler(regs[i].name, strcmp(regs[i].platform, "Host") == 0 ? "host" : "cuda"))
                fail("registration of %s for %s: API %d.%d, traits %u", regs[i].name, regs[i].platform,
                     regs[i].major, regs[i].minor, regs[i].traits);
    }
}

int main(void)
{
    const char *seed_env = getenv("FUSEX_SEED");
    uint64_t seed = seed_env && *seed_env ? strtoull(seed_env, NULL, 10) : (uint64_t)time(NULL);
    rng_state = seed * 2654435761u + 1;
    Dl_info info;
    const char *path = dladdr((void *)fusex_xla_register, &info) && info.dli_fname ? info.dli_fname : "fusex_xla.so";
#ifdef FX_XLA_TEST_CUDA
    const char *why = fusex_xla_cuda_unavailable_reason();
    if (why) {
        fprintf(stderr, "FAIL: fusex's CUDA handlers cannot run: %s\n", why);
        return 1;
    }
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    scratch.size = (size_t)256 << 20;
    CUDA_OK(cudaMalloc((void **)&scratch.base, scratch.size));
    printf("fusex XLA handlers, Host and CUDA (a foreign stream), %s, FUSEX_SEED=%llu\n", path,
           (unsigned long long)seed);
#else
    printf("fusex XLA handlers, Host, %s, FUSEX_SEED=%llu\n", path, (unsigned long long)seed);
#endif
    registration();
    check_entry();
    exact_scan();
    attribute_widths();
    aliased_step();
    errors();
    saved_shape_errors();
    selective_scan(2, 67, 64, 16, 2, FX_F32);
    selective_scan(1, 33, 64, 48, 2, FX_F32);
    selective_scan(2, 19, 32, 16, 1, FX_BF16);
    selective_scan(3, 9, 8, 4, 1, FX_F32); /* one chunk: nothing saved */
    for (int op = 0; op < 4; op++) {
        linrec(op, 3, 129, 96, FX_F32);
        linrec(op, 2, 17, 16, FX_BF16);
    }
    layer_errors();
    causal_conv1d(2, 37, 64, 4, FX_F32);
    causal_conv1d(1, 3, 5, 7, FX_BF16); /* a sequence shorter than the state */
    causal_conv1d(2, 19, 37, 1, FX_F32); /* width 1: no state */
    rnn_errors();
    for (int lstm = 0; lstm < 2; lstm++) {
        rnn(lstm, 3, 7, 5, 37, 3, FX_F32);
        rnn(lstm, 1, 4, 3, 1, 1, FX_F32);
        rnn(lstm, 2, 5, 4, 16, 2, FX_BF16);
    }
    norm("rms_norm", 37, 96, FX_F32, FX_F32, 0);
    norm("rms_norm", 5, 1024, FX_BF16, FX_F32, 1);
    norm("layer_norm", 9, 65, FX_F32, FX_F32, 1);
    norm("layer_norm", 16, 256, FX_BF16, FX_BF16, 0);
    for (int has_h0 = 0; has_h0 < 2; has_h0++) {
        empty_selective_scan(2, 0, has_h0); /* seqlen 0 */
        empty_selective_scan(0, 3, has_h0); /* batch 0 */
        for (int op = 0; op < 4; op++) {
            empty_linrec(op, 2, 0, has_h0);
            empty_linrec(op, 0, 3, has_h0);
        }
    }
#ifdef FX_XLA_TEST_CUDA
    CUDA_OK(cudaFree(scratch.base));
    CUDA_OK(cudaStreamDestroy(stream));
#endif
    printf("fusex XLA handlers: %d checks, %d failures (FUSEX_SEED=%llu)\n", checks, failures,
           (unsigned long long)seed);
    return failures ? 1 : 0;
}
