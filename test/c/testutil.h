/* Helpers shared by the Check suites: the device under test, seeded random
 * inputs, host<->device tensors, rel-L2 comparison. */
#ifndef FX_TESTUTIL_H
#define FX_TESTUTIL_H

#include <check.h>
#include <stdint.h>

#include "core/runtime.h"

/* cpu, or the CUDA device when FUSEX_DEVICE=cuda (the run aborts if it
 * was asked for and is unavailable). */
fx_device *fx_test_device(void);
/* The oracle the suites compare against: the CPU backend's reference path
 * ("cpu:reference", the f64-accumulating kernels), whatever the device
 * under test. */
fx_device *fx_test_oracle(void);
/* True when FUSEX_QUICK is set (compute-sanitizer runs: smaller sweeps). */
int fx_test_quick(void);
/* True when the device under test is the CPU emulator of the CUDA kernels
 * (test/emu, `make test-emu`): CUDA's code paths at a CPU's speed. Sweeps
 * sized for a GPU's throughput run smaller there (between their full and
 * their quick sizes); those that choose kernel paths run whole. */
int fx_test_emulated(void);

/* A deterministic generator; its seed comes from FUSEX_SEED or the clock
 * and is printed once per run so a failure can be replayed. */
uint64_t fx_test_seed(void);
double fx_rand_uniform(double lo, double hi);
double fx_rand_normal(void);
void fx_fill_uniform(double *out, int64_t n, double lo, double hi);

/* A tensor of `dtype` on `dev` holding `values` (converted from f64). */
void fx_test_tensor(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims,
                    const double *values, fx_tensor *out);
/* A tensor whose every byte is 0xFF (NaN for floats), so an element a
 * kernel forgets to write fails the comparison. */
void fx_test_poisoned(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims,
                      fx_tensor *out);
/* The tensor's elements as f64 (malloc'd; free it). */
double *fx_test_read(const fx_tensor *t);
/* ||a - b|| / ||b||; NaN anywhere gives +inf so it never passes. */
double fx_rel_l2(const double *a, const double *b, int64_t n);
/* ||v||, and ||a - b|| (+inf where a - b has a NaN). */
double fx_l2(const double *v, int64_t n);
double fx_l2_diff(const double *a, const double *b, int64_t n);

/* What a description's layout stands for (core/op.h): its named sizes
 * ("batch" -> 2, "width - 1" -> 3) and the leading axes of "...". */
typedef struct fx_test_size {
    const char *name;
    int64_t size;
} fx_test_size;

typedef struct fx_test_sizes {
    const fx_test_size *names;
    int nnames;
    const int64_t *leading;
    int nleading;
} fx_test_sizes;

/* "[batch, seqlen, [groups,] dstate]" -> {2, 37, 4} (optional axes left
 * out, "..." the leading axes, a number itself); the rank. A name `s`
 * does not know fails the test. */
int fx_test_layout(const char *layout, const fx_test_sizes *s, int64_t dims[FX_MAX_RANK]);

/* ck_assert with the measured error in the message. */
#define fx_assert_close(got, want, n, tol)                                          \
    do {                                                                            \
        double fx_err_ = fx_rel_l2((got), (want), (n));                             \
        ck_assert_msg(fx_err_ <= (tol), "rel-L2 %.3g > %.3g (seed %llu)", fx_err_,  \
                      (double)(tol), (unsigned long long)fx_test_seed());           \
    } while (0)

#define FX_CK_OK(st) ck_assert_msg((st).code == FX_OK, "status %d: %s", (st).code, (st).msg)

Suite *fx_suite_dtype(void);
Suite *fx_suite_runtime(void);
Suite *fx_suite_ops(void);
Suite *fx_suite_pointer(void);
Suite *fx_suite_optim(void);
Suite *fx_suite_linrec(void);
Suite *fx_suite_ssm(void);
Suite *fx_suite_rnn(void);
Suite *fx_suite_exec(void);
Suite *fx_suite_op(void);
Suite *fx_suite_linear(void);
Suite *fx_suite_norm(void);
Suite *fx_suite_conv(void);
Suite *fx_suite_replay(void);
Suite *fx_suite_model(void);
Suite *fx_suite_fast(void);

#endif
