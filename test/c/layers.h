/* Helpers the layer suites share (test_linear.c, test_conv.c,
 * test_norm.c): host values rounded to a type, and a caller's launch
 * context (its own stream, an arena of exactly the scratch an op's query
 * names) as test_exec.c builds one. */
#ifndef FX_TEST_LAYERS_H
#define FX_TEST_LAYERS_H

#include <math.h>
#include <stdbool.h>

#include "core/runtime.h"
#include "testutil.h"

/* malloc'd, zeroed (at least one element). */
double *fx_lt_alloc(int64_t n);
/* v as the type stores it. */
double fx_lt_round(fx_dtype t, double v);
/* n values uniform in [lo, hi) / standard normal, rounded to t. */
double *fx_lt_uniform(int64_t n, double lo, double hi, fx_dtype t);
double *fx_lt_normal(int64_t n, fx_dtype t);
/* The rel-L2 tolerance of an output of type t computed in f32 (f64: tight). */
double fx_lt_tolerance(fx_dtype t);

/* ck_assert that rel-L2(got, want) <= tol, naming what and the case. */
#define FX_LT_CLOSE(what, got, want, n, tol, casename)                                                   \
    do {                                                                                                 \
        double fx_e_ = fx_rel_l2((got), (want), (n));                                                    \
        ck_assert_msg(fx_e_ <= (tol), "%s: rel-L2 %.3g > %.3g for %s (seed %llu)", (what), fx_e_,        \
                      (double)(tol), (casename), (unsigned long long)fx_test_seed());                    \
    } while (0)

/* For an output that is a sum of `terms` values of unit scale (the suites
 * draw their cotangents so): rel-L2 within tol, or an absolute error
 * within f32's rounding of the terms (1e-6 an element and term), so a sum
 * that nearly cancels to a small value is not asked a relative accuracy
 * its terms cannot give. */
#define FX_LT_CLOSE_SUM(what, got, want, n, terms, tol, casename)                                        \
    do {                                                                                                 \
        double fx_d_ = fx_l2_diff((got), (want), (n)), fx_r_ = fx_l2((want), (n));                       \
        double fx_f_ = (tol) < 1e-4 ? 1e-6 * sqrt((double)(n) * (double)(terms)) : 0;                   \
        ck_assert_msg(!isinf(fx_d_) && !isnan(fx_d_) && fx_d_ <= (tol) * fx_r_ + fx_f_,                  \
                      "%s: |diff| %.3g > %.3g |ref| + %.3g (|ref| %.3g) for %s (seed %llu)", (what),     \
                      fx_d_, (double)(tol), fx_f_, fx_r_, (casename), (unsigned long long)fx_test_seed()); \
    } while (0)

/* A caller's context on dev: a stream of its own where the device has
 * streams, scratch from an arena of exactly `bytes` of device memory. */
typedef struct fx_lt_caller {
    fx_device *dev;
    void *stream;
    fx_tensor memory;
    fx_scratch_arena arena;
    fx_exec ex;
} fx_lt_caller;

void fx_lt_caller_open(fx_device *dev, size_t bytes, fx_lt_caller *c);
/* Waits for the work on the caller's stream, then frees it all. Also
 * checks that the op took no more than the arena (it cannot: the arena
 * refuses). */
void fx_lt_caller_close(fx_lt_caller *c);
/* Work on fusex's own stream is done (uploads before a caller's stream
 * reads them). */
void fx_lt_own_stream_done(fx_device *dev);

/* Runs `call` expecting a badarg with exactly `msg`. */
void fx_lt_expect_error(int rc, const fx_status *st, const char *msg);

#endif
