/* The fast path's matrix products (fast.h): the system BLAS, found with
 * dlopen when a product is first needed, so that fusex builds and runs
 * without one. Its products are split in tiles of C over fusex's own pool;
 * a threaded OpenBLAS is asked for one thread, so that its threads never
 * compete with the pool's (or spin on cores the BEAM's schedulers want). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "cpu/fast/fast.h"

/* CBLAS's enumerations (cblas.h), which the library's ABI fixes. */
enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };

typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                         const float *b, int ldb, float beta, float *c, int ldc);
typedef void (*sgemv_fn)(int order, int trans, int m, int n, float alpha, const float *a, int lda, const float *x,
                         int incx, float beta, float *y, int incy);

static struct {
    sgemm_fn sgemm;
    sgemv_fn sgemv;
    char name[160];
} blas;

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

/* A threaded OpenBLAS runs every product on one thread: the pool splits them. */
static void single_threaded(void *lib)
{
    int (*parallel)(void) = (int (*)(void))dlsym(lib, "openblas_get_parallel");
    void (*set_threads)(int) = (void (*)(int))dlsym(lib, "openblas_set_num_threads");
    if (parallel && set_threads && parallel() != 0)
        set_threads(1);
}

static bool try_library(const char *file)
{
    void *lib = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return false;
    sgemm_fn gemm = (sgemm_fn)dlsym(lib, "cblas_sgemm");
    sgemv_fn gemv = (sgemv_fn)dlsym(lib, "cblas_sgemv");
    if (!gemm || !gemv) {
        dlclose(lib);
        return false;
    }
    single_threaded(lib);
    char *(*config)(void) = (char *(*)(void))dlsym(lib, "openblas_get_config");
    snprintf(blas.name, sizeof blas.name, "%s (%s)", config ? config() : "CBLAS", file);
    blas.sgemv = gemv;
    blas.sgemm = gemm;
    return true;
}

static void load_blas(void)
{
    const char *want = getenv("FUSEX_BLAS");
    if (want && *want) {
        if (strcmp(want, "none") == 0)
            snprintf(blas.name, sizeof blas.name, "none (FUSEX_BLAS=none)");
        else if (!try_library(want))
            snprintf(blas.name, sizeof blas.name, "none (FUSEX_BLAS=%.100s: no CBLAS there)", want);
        return;
    }
    if (!try_library("libopenblas.so.0") && !try_library("libblas.so.3"))
        snprintf(blas.name, sizeof blas.name, "none (neither libopenblas.so.0 nor libblas.so.3 has a CBLAS)");
}

bool fx_blas_available(void)
{
    pthread_once(&blas_once, load_blas);
    return blas.sgemm != NULL;
}

const char *fx_blas_name(void)
{
    pthread_once(&blas_once, load_blas);
    return blas.name;
}

/* ---- products in tiles over the pool ---- */

/* Rows of C a tile (several rows), or columns (one row: a matrix-vector
 * product). Fixed, so a tile's BLAS call does not depend on the threads. */
#define ROW_TILE 64
#define COL_TILE 256
/* Multiply-adds the BLAS does in the time of one of the pool's element-
 * steps (FX_POOL_MIN_WORK): a product of 2^20 multiply-adds (~25 µs on one
 * core, a 1 MiB weight read from L3) stays on the caller. */
#define MACS_PER_STEP 16

static int blas_int(int64_t v) { return v > 0 ? (int)v : 1; }

/* Rows [r0, r1) of C. */
static void row_tiles(const fx_fast_gemm_args *g, int64_t r0, int64_t r1)
{
    const float *a = g->trans_a ? g->a + r0 : g->a + r0 * g->lda;
    blas.sgemm(CBLAS_ROW_MAJOR, g->trans_a ? CBLAS_TRANS : CBLAS_NO_TRANS, g->trans_b ? CBLAS_TRANS : CBLAS_NO_TRANS,
               (int)(r1 - r0), (int)g->n, (int)g->k, 1.0f, a, blas_int(g->lda), g->b, blas_int(g->ldb), g->beta,
               g->c + r0 * g->ldc, blas_int(g->ldc));
}

/* Columns [c0, c1) of C's one row: y = opB(B)ᵀ a over those columns. */
static void col_tiles(const fx_fast_gemm_args *g, int64_t c0, int64_t c1)
{
    const int incx = g->trans_a ? blas_int(g->lda) : 1;
    if (g->trans_b) /* B stored [n, k]: its rows c0.. times a */
        blas.sgemv(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, (int)(c1 - c0), (int)g->k, 1.0f, g->b + c0 * g->ldb,
                   blas_int(g->ldb), g->a, incx, g->beta, g->c + c0, 1);
    else /* B stored [k, n]: its columns c0.. */
        blas.sgemv(CBLAS_ROW_MAJOR, CBLAS_TRANS, (int)g->k, (int)(c1 - c0), 1.0f, g->b + c0, blas_int(g->ldb), g->a,
                   incx, g->beta, g->c + c0, 1);
}

static void run_rows(void *ctx, int64_t lo, int64_t hi)
{
    const fx_fast_gemm_args *g = ctx;
    for (int64_t t = lo; t < hi; t++)
        row_tiles(g, t * ROW_TILE, t * ROW_TILE + ROW_TILE < g->m ? t * ROW_TILE + ROW_TILE : g->m);
}

static void run_cols(void *ctx, int64_t lo, int64_t hi)
{
    const fx_fast_gemm_args *g = ctx;
    for (int64_t t = lo; t < hi; t++)
        col_tiles(g, t * COL_TILE, t * COL_TILE + COL_TILE < g->n ? t * COL_TILE + COL_TILE : g->n);
}

/* C = beta C where nothing is summed (k 0). */
static void scale_only(const fx_fast_gemm_args *g)
{
    for (int64_t i = 0; i < g->m; i++) {
        float *c = g->c + i * g->ldc;
        for (int64_t j = 0; j < g->n; j++)
            c[j] = g->beta == 0.0f ? 0.0f : g->beta * c[j];
    }
}

void fx_fast_gemm(const fx_fast_gemm_args *g)
{
    if (g->m <= 0 || g->n <= 0)
        return;
    if (g->k <= 0) {
        scale_only(g);
        return;
    }
    const double macs = (double)g->m * (double)g->n * (double)g->k;
    const int64_t work = macs / MACS_PER_STEP > (double)(INT64_MAX / 2) ? INT64_MAX / 2 : (int64_t)(macs / MACS_PER_STEP);
    fx_fast_gemm_args args = *g;
    if (g->m == 1)
        fx_pool_run((g->n + COL_TILE - 1) / COL_TILE, 1, work, run_cols, &args);
    else
        fx_pool_run((g->m + ROW_TILE - 1) / ROW_TILE, 1, work, run_rows, &args);
}
