/* Shape maths, buffers, handles, memory accounting and the CUDA backend
 * loader's refusals. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ops.h"
#include "testutil.h"

START_TEST(shape_numel_and_overflow)
{
    fx_status st;
    int64_t numel;
    size_t nbytes;
    int64_t dims[3] = {2, 3, 4};
    fx_status_clear(&st);
    ck_assert_int_eq(fx_shape_nbytes("x", FX_F32, 3, dims, &numel, &nbytes, &st), FX_OK);
    ck_assert_int_eq(numel, 24);
    ck_assert_uint_eq(nbytes, 96);

    ck_assert_int_eq(fx_shape_nbytes("x", FX_F32, 0, dims, &numel, &nbytes, &st), FX_OK);
    ck_assert_int_eq(numel, 1); /* a scalar */

    int64_t zero[2] = {5, 0};
    ck_assert_int_eq(fx_shape_nbytes("x", FX_F32, 2, zero, &numel, &nbytes, &st), FX_OK);
    ck_assert_int_eq(numel, 0);

    int64_t neg[2] = {5, -1};
    ck_assert_int_eq(fx_shape_numel("x", 2, neg, &numel, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "x: expected non-negative dimensions, got -1 at axis 1");

    int64_t huge[3] = {1 << 20, 1 << 20, 1 << 20};
    fx_status_clear(&st);
    ck_assert_int_eq(fx_shape_numel("x", 3, huge, &numel, &st), FX_EBADARG);
    ck_assert_ptr_nonnull(strstr(st.msg, "at most 2^48 elements"));

    /* A zero dimension makes no elements, but the others still multiply
     * into the counts ops form (batch * dim * dstate): bounded too. */
    int64_t hollow[3] = {(int64_t)1 << 48, 0, (int64_t)1 << 22};
    fx_status_clear(&st);
    ck_assert_int_eq(fx_shape_numel("x", 3, hollow, &numel, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "x: expected nonzero dimensions whose product is at most 2^48, got "
                             "{281474976710656,0,4194304}");
    int64_t wide[3] = {(int64_t)1 << 40, 0, 64};
    fx_status_clear(&st);
    ck_assert_int_eq(fx_shape_numel("x", 3, wide, &numel, &st), FX_OK);
    ck_assert_int_eq(numel, 0);

    int64_t big[2] = {1 << 24, 1 << 23}; /* 2^47 elements fit, 2^50 bytes do not */
    fx_status_clear(&st);
    ck_assert_int_eq(fx_shape_nbytes("x", FX_S64, 2, big, &numel, &nbytes, &st), FX_EBADARG);
    ck_assert_ptr_nonnull(strstr(st.msg, "at most 2^48 bytes"));

    fx_status_clear(&st);
    ck_assert_int_eq(fx_shape_numel("x", FX_MAX_RANK + 1, dims, &numel, &st), FX_EBADARG);
}
END_TEST

START_TEST(format_shape)
{
    char buf[64];
    int64_t dims[3] = {8, 2048, 1536};
    fx_format_shape(buf, sizeof buf, 3, dims);
    ck_assert_str_eq(buf, "{8,2048,1536}");
    fx_format_shape(buf, sizeof buf, 0, dims);
    ck_assert_str_eq(buf, "{}");
}
END_TEST

START_TEST(handle_free_and_views)
{
    fx_device *dev = fx_test_device();
    fx_status st;
    fx_status_clear(&st);
    long long live0 = atomic_load(&dev->live_tensors), alloc0 = atomic_load(&dev->allocated);

    int64_t dims[2] = {3, 5};
    double values[15];
    fx_fill_uniform(values, 15, -1, 1);
    fx_tensor t, view, again;
    fx_test_tensor(dev, FX_F32, 2, dims, values, &t);
    fx_handle h;
    fx_handle_init(&h, &t);
    ck_assert_ptr_null(t.buffer);
    ck_assert_int_eq(atomic_load(&dev->live_tensors), live0 + 1);
    ck_assert_int_eq(atomic_load(&dev->allocated), alloc0 + 60);

    ck_assert_int_eq(fx_handle_acquire(&h, "x", &t, &st), FX_OK);
    int64_t flat[1] = {15};
    ck_assert_int_eq(fx_op_reshape(&t, 1, flat, &view, &st), FX_OK);
    fx_tensor_release(&t);

    /* Freeing the handle keeps the memory while the view holds it. */
    ck_assert(fx_handle_free(&h));
    ck_assert(!fx_handle_free(&h)); /* idempotent */
    ck_assert_int_eq(atomic_load(&dev->live_tensors), live0);
    ck_assert_int_eq(atomic_load(&dev->allocated), alloc0 + 60);
    ck_assert_int_eq(fx_handle_acquire(&h, "x", &again, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "x: expected a live tensor, got one released by fusex:free/1");

    double *got = fx_test_read(&view);
    for (int i = 0; i < 15; i++)
        ck_assert_double_eq((float)values[i], got[i]);
    free(got);
    fx_tensor_release(&view);
    ck_assert_int_eq(atomic_load(&dev->allocated), alloc0);
}
END_TEST

START_TEST(peak_tracks_high_water)
{
    fx_device *dev = fx_test_device();
    fx_status st;
    fx_status_clear(&st);
    int64_t dims[1] = {1 << 20};
    long long before = atomic_load(&dev->allocated);
    fx_tensor a, b;
    FX_CK_OK(st);
    ck_assert_int_eq(fx_op_zeros(dev, FX_F32, 1, dims, &a, &st), FX_OK);
    ck_assert_int_eq(fx_op_zeros(dev, FX_F32, 1, dims, &b, &st), FX_OK);
    ck_assert_int_ge(atomic_load(&dev->peak), before + (8 << 20));
    fx_tensor_release(&a);
    fx_tensor_release(&b);
    ck_assert_int_eq(atomic_load(&dev->allocated), before);
}
END_TEST

/* The CUDA backend loader's refusals, each with its reason (what
 * fx_cuda_unavailable_reason and the XLA handlers report); none touches a
 * real backend, so they hold on GPU machines too. */
START_TEST(cuda_backend_open_refusals)
{
    const char *env = getenv("FUSEX_DISABLE_CUDA");
    char *saved_env = env ? strdup(env) : NULL;
    const fx_backend *backend = (const fx_backend *)&backend; /* not NULL: must be cleared */
    char why[1024], want[256];

    setenv("FUSEX_DISABLE_CUDA", "1", 1);
    ck_assert_int_eq(fx_cuda_backend_open("libm.so.6", &backend, why, sizeof why), 0);
    ck_assert_ptr_null(backend);
    ck_assert_str_eq(why, "disabled by FUSEX_DISABLE_CUDA=1");

    setenv("FUSEX_DISABLE_CUDA", "0", 1); /* "0" is not a request */
    backend = (const fx_backend *)&backend;
    ck_assert_int_eq(fx_cuda_backend_open("/nonexistent/fusex_cuda.so", &backend, why, sizeof why), 0);
    ck_assert_ptr_null(backend);
    ck_assert_msg(strncmp(why, "no CUDA backend: /nonexistent/fusex_cuda.so", 43) == 0 &&
                      strstr(why, "(built only where nvcc is found)"),
                  "missing library: %s", why);

    /* A library that loads but has no fusex backend entry point. */
    ck_assert_int_eq(fx_cuda_backend_open("libm.so.6", &backend, why, sizeof why), 0);
    ck_assert_ptr_null(backend);
    snprintf(want, sizeof want, "libm.so.6 is not a compatible fusex CUDA backend (ABI %d)", FX_ABI_VERSION);
    ck_assert_str_eq(why, want);

    if (saved_env)
        setenv("FUSEX_DISABLE_CUDA", saved_env, 1);
    else
        unsetenv("FUSEX_DISABLE_CUDA");
    free(saved_env);
}
END_TEST

Suite *fx_suite_runtime(void)
{
    Suite *s = suite_create("runtime");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, shape_numel_and_overflow);
    tcase_add_test(tc, format_shape);
    tcase_add_test(tc, handle_free_and_views);
    tcase_add_test(tc, peak_tracks_high_water);
    tcase_add_test(tc, cuda_backend_open_refusals);
    suite_add_tcase(s, tc);
    return s;
}
