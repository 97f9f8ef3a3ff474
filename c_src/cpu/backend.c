/* The CPU backend: host memory, synchronous ops. Its device 0 ("cpu") runs
 * the fast f32 kernels of c_src/cpu/fast on their thread pool; device 1
 * ("{cpu, reference}") the f64-accumulating oracle (OpenMP where it pays),
 * the reference every other path is tested against. The families without
 * a fast kernel run the oracle on both. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpu/cpu.h"
#include "cpu/fast/fast.h"
#include "fusex_dtype.h"
#include "fusex_exec.h"
#include "fusex_linear.h"

int fx_cpu_threads(void) { return omp_get_max_threads(); }

static int cpu_init(fx_status *st)
{
    (void)st;
    return FX_OK;
}

static void cpu_shutdown(void) { fx_pool_shutdown(); }

/* The fast path and the oracle (FX_CPU_FAST, FX_CPU_REFERENCE). */
static int cpu_device_count(void) { return 2; }

static int cpu_device_info(int dev, fx_device_info *info, fx_status *st)
{
    (void)st;
    snprintf(info->name, sizeof info->name, "host CPU (%ld cores), %s", sysconf(_SC_NPROCESSORS_ONLN),
             dev == FX_CPU_REFERENCE ? "f64-accumulating reference" : "f32 fast path");
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
    long page = sysconf(_SC_PAGESIZE);
    info->memory_total = (uint64_t)pages * (uint64_t)page;
    info->memory_free = (uint64_t)avail * (uint64_t)page;
    info->threads = dev == FX_CPU_REFERENCE ? fx_cpu_threads() : fx_pool_threads();
    return FX_OK;
}

static int cpu_alloc(int dev, size_t nbytes, void **ptr, fx_status *st)
{
    (void)dev;
    size_t rounded = (nbytes + 63) & ~(size_t)63;
    *ptr = aligned_alloc(64, rounded);
    if (!*ptr)
        return fx_fail(st, FX_ENOMEM, "out of host memory allocating %zu bytes", nbytes);
    return FX_OK;
}

static void cpu_release(int dev, void *ptr)
{
    (void)dev;
    free(ptr);
}

static int cpu_memcpy(int dev, void *dst, const void *src, size_t nbytes, fx_status *st)
{
    (void)dev;
    (void)st;
    memcpy(dst, src, nbytes);
    return FX_OK;
}

/* Device copies: views of one buffer may overlap. */
static int cpu_copy(const fx_exec *ex, void *dst, const void *src, size_t nbytes, fx_status *st)
{
    (void)ex;
    (void)st;
    memmove(dst, src, nbytes);
    return FX_OK;
}

static int cpu_fill_zero(const fx_exec *ex, void *dst, size_t nbytes, fx_status *st)
{
    (void)ex;
    (void)st;
    memset(dst, 0, nbytes);
    return FX_OK;
}

/* Scratch is host memory, taken and given back around the op's work. */
static int heap_scratch_alloc(void *ctx, size_t nbytes, void **ptr, fx_status *st)
{
    (void)ctx;
    size_t rounded = fx_scratch_piece(nbytes);
    if (rounded == SIZE_MAX) { /* fx_size_mul/fx_size_add saturated: a count overflowed */
        *ptr = NULL;
        return fx_fail(st, FX_ENOMEM, "out of host memory: the op's scratch does not fit in the address space");
    }
    *ptr = aligned_alloc(FX_SCRATCH_ALIGN, rounded);
    if (!*ptr)
        return fx_fail(st, FX_ENOMEM, "out of host memory for %zu bytes of scratch", nbytes);
    return FX_OK;
}

static void heap_scratch_release(void *ctx, void *ptr)
{
    (void)ctx;
    free(ptr);
}

static int cpu_exec_default(int dev, fx_exec *ex, fx_status *st)
{
    (void)st;
    ex->device = dev;
    ex->stream = NULL;
    ex->scratch.alloc = heap_scratch_alloc;
    ex->scratch.release = heap_scratch_release;
    ex->scratch.ctx = NULL;
    ex->cache = NULL;
    return FX_OK;
}

static int cpu_synchronize(int dev, fx_status *st)
{
    (void)dev;
    (void)st;
    return FX_OK;
}

static int cpu_is_idle(int dev, int *idle, fx_status *st)
{
    (void)dev;
    (void)st;
    *idle = 1; /* CPU work is synchronous */
    return FX_OK;
}

/* CPU work is synchronous, so an event is just the host clock. */
static int cpu_event_create(int dev, void **event, fx_status *st)
{
    (void)dev;
    *event = calloc(1, sizeof(struct timespec));
    return *event ? FX_OK : fx_fail(st, FX_ENOMEM, "out of host memory for an event");
}

static void cpu_event_destroy(int dev, void *event)
{
    (void)dev;
    free(event);
}

static int cpu_event_record(int dev, void *event, fx_status *st)
{
    (void)dev;
    (void)st;
    clock_gettime(CLOCK_MONOTONIC, (struct timespec *)event);
    return FX_OK;
}

static int cpu_event_elapsed_us(int dev, void *start, void *stop, double *us, fx_status *st)
{
    (void)dev;
    (void)st;
    const struct timespec *a = start, *b = stop;
    *us = (double)(b->tv_sec - a->tv_sec) * 1e6 + (double)(b->tv_nsec - a->tv_nsec) / 1e3;
    return FX_OK;
}

static int cpu_busy_wait(int dev, double us, fx_status *st)
{
    (void)dev;
    (void)us;
    (void)st;
    return FX_OK; /* nothing queues behind a synchronous device */
}

static int cpu_cast(const fx_exec *ex, const fx_tensor *src, const fx_tensor *dst, fx_status *st)
{
    (void)ex;
    (void)st;
    int64_t n = src->numel;
#pragma omp parallel for if (n > FX_CPU_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++)
        fx_store_f64(dst->data, dst->dtype, i, fx_load_f64(src->data, src->dtype, i));
    return FX_OK;
}

static double apply_binop(fx_binop op, double a, double b)
{
    switch (op) {
    case FX_ADD: return a + b;
    case FX_SUB: return a - b;
    default: return a * b;
    }
}

/* Integers go through int64 so that s64 values above 2^53 stay exact;
 * wrap-around on overflow matches Nx's integer semantics. */
static int64_t apply_int_binop(fx_binop op, int64_t a, int64_t b)
{
    uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
    switch (op) {
    case FX_ADD: return (int64_t)(ua + ub);
    case FX_SUB: return (int64_t)(ua - ub);
    default: return (int64_t)(ua * ub);
    }
}

static int64_t load_int(const void *p, fx_dtype t, int64_t i)
{
    switch (t) {
    case FX_S32: return ((const int32_t *)p)[i];
    case FX_S64: return ((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}

static void store_int(void *p, fx_dtype t, int64_t i, int64_t v)
{
    switch (t) {
    case FX_S32: ((int32_t *)p)[i] = (int32_t)v; break;
    case FX_S64: ((int64_t *)p)[i] = v; break;
    default: ((uint8_t *)p)[i] = (uint8_t)v; break;
    }
}

static int cpu_binary(const fx_exec *ex, fx_binop op, const fx_tensor *a, const fx_tensor *b,
                      const fx_tensor *out, fx_status *st)
{
    (void)ex;
    (void)st;
    int64_t n = a->numel;
    fx_dtype t = a->dtype;
    if (t == FX_F32) {
        const float *pa = a->data, *pb = b->data;
        float *po = out->data;
#pragma omp parallel for if (n > FX_CPU_PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++)
            po[i] = op == FX_ADD ? pa[i] + pb[i] : op == FX_SUB ? pa[i] - pb[i] : pa[i] * pb[i];
    } else if (fx_dtype_is_float(t)) {
#pragma omp parallel for if (n > FX_CPU_PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++)
            fx_store_f64(out->data, t, i,
                         apply_binop(op, fx_load_f64(a->data, t, i), fx_load_f64(b->data, t, i)));
    } else {
#pragma omp parallel for if (n > FX_CPU_PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++)
            store_int(out->data, t, i,
                      apply_int_binop(op, load_int(a->data, t, i), load_int(b->data, t, i)));
    }
    return FX_OK;
}

static int cpu_scale(const fx_exec *ex, const fx_tensor *src, double factor, const fx_tensor *dst,
                     fx_status *st)
{
    (void)ex;
    (void)st;
    int64_t n = src->numel;
    fx_dtype t = src->dtype;
#pragma omp parallel for if (n > FX_CPU_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) {
        /* Round to the element type as the CUDA kernel does: f32 maths for
         * the 16- and 32-bit types, f64 for f64. */
        double v = fx_load_f64(src->data, t, i);
        double r = t == FX_F64 ? v * factor : (double)((float)v * (float)factor);
        fx_store_f64(dst->data, t, i, r);
    }
    return FX_OK;
}

const fx_backend fx_cpu_backend = {
    .abi_version = FX_ABI_VERSION,
    .struct_size = sizeof(fx_backend),
    .name = "cpu",
    .init = cpu_init,
    .shutdown = cpu_shutdown,
    .device_count = cpu_device_count,
    .device_info = cpu_device_info,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_memcpy,
    .download = cpu_memcpy,
    .exec_default = cpu_exec_default,
    .copy = cpu_copy,
    .fill_zero = cpu_fill_zero,
    .synchronize = cpu_synchronize,
    .is_idle = cpu_is_idle,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .event_elapsed_us = cpu_event_elapsed_us,
    .busy_wait = cpu_busy_wait,
    .cast = cpu_cast,
    .binary = cpu_binary,
    .scale = cpu_scale,
    .ssm = &fx_cpu_fast_ssm_ops,
    .linrec = &fx_cpu_fast_linrec_ops,
    .optim = &fx_cpu_fast_optim_ops,
    .rnn = &fx_cpu_fast_rnn_ops,
    .conv = &fx_cpu_fast_conv_ops,
    .norm = &fx_cpu_fast_norm_ops,
    .linear = &fx_cpu_fast_linear_ops,
    .loss = &fx_cpu_loss_ops,
    /* Local pointers are host addresses; host memory has no IPC handle
     * here and nothing to check a foreign address against. */
    .alloc_exportable = NULL,
    .release_exportable = NULL,
    .ipc_export = NULL,
    .ipc_open = NULL,
    .ipc_close = NULL,
    .device_synchronize = cpu_synchronize,
    .pointer_check = NULL,
};
