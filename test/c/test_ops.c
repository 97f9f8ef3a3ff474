/* Op layer: transfers, cast, elementwise maths and their validation, on the
 * device under test, checked against the CPU backend. */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fusex_dtype.h"
#include "core/ops.h"
#include "testutil.h"

static const fx_dtype all_types[] = {FX_F32, FX_F64, FX_BF16, FX_F16, FX_S32, FX_S64, FX_U8};
#define NTYPES (int)(sizeof all_types / sizeof all_types[0])

/* Sizes around the staging chunk (4 MiB) and tiny ones. */
START_TEST(transfer_round_trips)
{
    fx_device *dev = fx_test_device();
    size_t sizes[] = {0, 1, 3, 4096, 65537, (4u << 20) - 1, (4u << 20) + 3, (9u << 20) + 7,
                      (17u << 20) + 1};
    int count = fx_test_quick() ? 6 : (int)(sizeof sizes / sizeof sizes[0]);
    for (int k = 0; k < count; k++) {
        size_t n = sizes[k];
        unsigned char *src = malloc(n + 1), *back = malloc(n + 1);
        for (size_t i = 0; i < n; i++)
            src[i] = (unsigned char)(fx_rand_uniform(0, 256));
        memset(back, 0xAB, n + 1);
        fx_status st;
        fx_status_clear(&st);
        fx_tensor t, c;
        int64_t dims[1] = {(int64_t)n};
        ck_assert_int_eq(fx_op_from_host(dev, FX_U8, 1, dims, src, n, &t, &st), FX_OK);
        ck_assert_int_eq(fx_op_copy_to(&t, dev, &c, &st), FX_OK); /* on-device copy */
        ck_assert_int_eq(fx_op_to_host(&c, back, &st), FX_OK);
        ck_assert_msg(memcmp(src, back, n) == 0, "round trip of %zu bytes differs", n);
        ck_assert_uint_eq(back[n], 0xAB); /* nothing written past the end */
        fx_tensor_release(&t);
        fx_tensor_release(&c);
        free(src);
        free(back);
    }
}
END_TEST

/* The upload that must not wait (a normal scheduler's): the same checks;
 * on a backend that can upload without waiting, an idle device's small
 * upload is done and reads back; otherwise nothing is made and no memory
 * is kept. */
START_TEST(try_from_host_never_waits)
{
    fx_device *dev = fx_test_device();
    fx_status st;
    fx_status_clear(&st);
    unsigned char src[1000], back[1000];
    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (unsigned char)fx_rand_uniform(0, 256);
    int64_t dims[1] = {(int64_t)sizeof src}, wrong[1] = {999};
    fx_tensor t;
    bool done = true;
    ck_assert_int_eq(fx_op_try_from_host(dev, FX_U8, 1, wrong, src, sizeof src, &t, &done, &st),
                     FX_EBADARG);
    ck_assert_str_eq(st.msg, "data: expected 999 bytes (shape {999} of {u,8}), got 1000 bytes");
    ck_assert_ptr_null(t.buffer);

    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_synchronize(dev, &st), FX_OK);
    long long live0 = atomic_load(&dev->live_tensors), alloc0 = atomic_load(&dev->allocated);
    ck_assert_int_eq(fx_op_try_from_host(dev, FX_U8, 1, dims, src, sizeof src, &t, &done, &st), FX_OK);
    ck_assert(done == (dev->backend->try_upload != NULL));
    if (!done) {
        ck_assert_ptr_null(t.buffer);
        ck_assert_int_eq(atomic_load(&dev->allocated), alloc0);
        ck_assert_int_eq(atomic_load(&dev->live_tensors), live0);
        return;
    }
    ck_assert_int_eq(fx_op_to_host(&t, back, &st), FX_OK);
    ck_assert(memcmp(src, back, sizeof src) == 0);
    fx_tensor_release(&t);
}
END_TEST

START_TEST(copy_between_devices)
{
    fx_device *dev = fx_test_device(), *cpu = fx_test_oracle();
    int64_t dims[2] = {7, 13};
    double values[91];
    fx_fill_uniform(values, 91, -5, 5);
    fx_tensor host, there, back;
    fx_status st;
    fx_status_clear(&st);
    fx_test_tensor(cpu, FX_F64, 2, dims, values, &host);
    ck_assert_int_eq(fx_op_copy_to(&host, dev, &there, &st), FX_OK);
    ck_assert_ptr_eq(there.device, dev);
    ck_assert_int_eq(fx_op_copy_to(&there, cpu, &back, &st), FX_OK);
    double *got = fx_test_read(&back);
    for (int i = 0; i < 91; i++)
        ck_assert_double_eq(got[i], values[i]);
    free(got);
    fx_tensor_release(&host);
    fx_tensor_release(&there);
    fx_tensor_release(&back);
}
END_TEST

static double random_value_for(fx_dtype t)
{
    switch (t) {
    case FX_U8: return floor(fx_rand_uniform(0, 256));
    case FX_S32:
    case FX_S64: return floor(fx_rand_uniform(-1e6, 1e6));
    default: return fx_rand_normal() * 100.0;
    }
}

/* Equal bits, except that any NaN equals any NaN: CUDA's conversions make
 * the canonical NaN where the CPU keeps the payload. */
static int same_elements(const char *a, const char *b, fx_dtype t, int64_t n)
{
    size_t size = fx_dtype_size(t);
    for (int64_t i = 0; i < n; i++) {
        if (memcmp(a + i * size, b + i * size, size) == 0)
            continue;
        if (!fx_dtype_is_float(t) || !isnan(fx_load_f64(a, t, i)) || !isnan(fx_load_f64(b, t, i)))
            return 0;
    }
    return 1;
}

/* Cast every pair on the device and on the CPU: the bits must agree. */
START_TEST(cast_matches_cpu_bitwise)
{
    fx_device *dev = fx_test_device(), *cpu = fx_test_oracle();
    int64_t n = 1031;
    int64_t dims[1] = {n};
    double *values = malloc(sizeof(double) * (size_t)n);
    for (int a = 0; a < NTYPES; a++) {
        for (int64_t i = 0; i < n; i++)
            values[i] = i < 4 ? (double[]){1e12, -1e12, NAN, 0.5}[i] : random_value_for(all_types[a]);
        if (!fx_dtype_is_float(all_types[a]))
            for (int i = 0; i < 4; i++)
                values[i] = i;
        for (int b = 0; b < NTYPES; b++) {
            fx_status st;
            fx_status_clear(&st);
            fx_tensor src_d, src_c, out_d, out_c;
            fx_test_tensor(dev, all_types[a], 1, dims, values, &src_d);
            fx_test_tensor(cpu, all_types[a], 1, dims, values, &src_c);
            ck_assert_int_eq(fx_op_cast(&src_d, all_types[b], &out_d, &st), FX_OK);
            ck_assert_int_eq(fx_op_cast(&src_c, all_types[b], &out_c, &st), FX_OK);
            char *bd = malloc(out_d.nbytes), *bc = malloc(out_c.nbytes);
            fx_op_to_host(&out_d, bd, &st);
            fx_op_to_host(&out_c, bc, &st);
            FX_CK_OK(st);
            ck_assert_msg(same_elements(bd, bc, all_types[b], n), "cast %s -> %s differs from cpu",
                          fx_dtype_name(all_types[a]), fx_dtype_name(all_types[b]));
            free(bd);
            free(bc);
            fx_tensor_release(&src_d);
            fx_tensor_release(&src_c);
            fx_tensor_release(&out_d);
            fx_tensor_release(&out_c);
        }
    }
    free(values);
}
END_TEST

START_TEST(binary_ops_match_reference)
{
    fx_device *dev = fx_test_device();
    int64_t dims[3] = {3, 1, 67};
    int64_t n = 201;
    double a[201], b[201], want[201];
    for (int t = 0; t < NTYPES; t++) {
        fx_dtype type = all_types[t];
        for (int op = FX_ADD; op <= FX_MUL; op++) {
            for (int64_t i = 0; i < n; i++) {
                a[i] = type == FX_U8 ? floor(fx_rand_uniform(0, 15)) : floor(fx_rand_uniform(-50, 50));
                b[i] = type == FX_U8 ? floor(fx_rand_uniform(0, 15)) : floor(fx_rand_uniform(-50, 50));
                if (type == FX_U8 && op == FX_SUB && a[i] < b[i]) {
                    double tmp = a[i];
                    a[i] = b[i];
                    b[i] = tmp;
                }
                want[i] = op == FX_ADD ? a[i] + b[i] : op == FX_SUB ? a[i] - b[i] : a[i] * b[i];
            }
            fx_tensor ta, tb, out;
            fx_status st;
            fx_status_clear(&st);
            fx_test_tensor(dev, type, 3, dims, a, &ta);
            fx_test_tensor(dev, type, 3, dims, b, &tb);
            ck_assert_int_eq(fx_op_binary((fx_binop)op, &ta, &tb, &out, &st), FX_OK);
            double *got = fx_test_read(&out);
            /* Small integers are exact in every type except the 16-bit
             * floats, where products up to 2500 round. */
            fx_assert_close(got, want, n, type == FX_BF16 || type == FX_F16 ? 1e-2 : 0.0);
            free(got);
            fx_tensor_release(&ta);
            fx_tensor_release(&tb);
            fx_tensor_release(&out);
        }
    }
}
END_TEST

START_TEST(scale_matches_reference)
{
    fx_device *dev = fx_test_device();
    int64_t n = 4099;
    int64_t dims[1] = {n};
    double *x = malloc(sizeof(double) * (size_t)n), *want = malloc(sizeof(double) * (size_t)n);
    fx_dtype types[] = {FX_F32, FX_BF16, FX_F16, FX_F64};
    for (int t = 0; t < 4; t++) {
        fx_fill_uniform(x, n, -3, 3);
        for (int64_t i = 0; i < n; i++)
            want[i] = x[i] * -1.75;
        fx_tensor tx, out;
        fx_status st;
        fx_status_clear(&st);
        fx_test_tensor(dev, types[t], 1, dims, x, &tx);
        ck_assert_int_eq(fx_op_scale(&tx, -1.75, &out, &st), FX_OK);
        double *got = fx_test_read(&out);
        fx_assert_close(got, want, n, types[t] == FX_F64 ? 1e-15 : types[t] == FX_F32 ? 1e-6 : 1e-2);
        free(got);
        fx_tensor_release(&tx);
        fx_tensor_release(&out);
    }
    free(x);
    free(want);
}
END_TEST

START_TEST(validation_messages)
{
    fx_device *dev = fx_test_device();
    fx_status st;
    int64_t d3[1] = {3}, d4[1] = {4};
    double v[4] = {1, 2, 3, 4};
    fx_tensor a, b, c, out;
    fx_test_tensor(dev, FX_F32, 1, d3, v, &a);
    fx_test_tensor(dev, FX_F32, 1, d4, v, &b);
    fx_test_tensor(dev, FX_S32, 1, d3, v, &c);

    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_binary(FX_ADD, &a, &b, &out, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "b: expected shape {3} (the shape of a), got {4}");
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_binary(FX_ADD, &a, &c, &out, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "b: expected type {f,32}, got {s,32}");
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_scale(&c, 2.0, &out, &st), FX_EBADARG);
    ck_assert_ptr_nonnull(strstr(st.msg, "tensor: expected a float type"));
    fx_status_clear(&st);
    int64_t bad[2] = {2, 2};
    ck_assert_int_eq(fx_op_reshape(&a, 2, bad, &out, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "shape: expected 3 elements (as in {3}), got {2,2} with 4");
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_from_host(dev, FX_F32, 1, d3, v, 11, &out, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "data: expected 12 bytes (shape {3} of {f,32}), got 11 bytes");

    if (dev->kind != FX_DEVICE_CPU) {
        fx_tensor host;
        fx_test_tensor(fx_cpu_device(), FX_F32, 1, d3, v, &host);
        fx_status_clear(&st);
        ck_assert_int_eq(fx_op_binary(FX_ADD, &a, &host, &out, &st), FX_EBADARG);
        ck_assert_str_eq(st.msg, "b: expected a tensor on cuda:0 (where a is), got one on cpu");
        fx_tensor_release(&host);
    }
    fx_tensor_release(&a);
    fx_tensor_release(&b);
    fx_tensor_release(&c);
}
END_TEST

/* copy_into between views of one buffer at different offsets is a
 * memmove, either way round, on the device under test. */
START_TEST(copy_into_overlapping_views)
{
    fx_device *dev = fx_test_device();
    enum { N = 4099 };
    int64_t dims[1] = {N};
    double *v = malloc(sizeof(double) * N);
    for (int i = 0; i < N; i++)
        v[i] = i + 1;
    for (int shift = -3; shift <= 3; shift += 6) {
        fx_tensor t;
        fx_test_tensor(dev, FX_F32, 1, dims, v, &t);
        int len = N - 3, src_at = shift > 0 ? 0 : 3, dst_at = shift > 0 ? 3 : 0;
        fx_tensor src = t, dst = t;
        src.data = (float *)t.data + src_at;
        dst.data = (float *)t.data + dst_at;
        src.dims[0] = dst.dims[0] = src.numel = dst.numel = len;
        src.nbytes = dst.nbytes = sizeof(float) * (size_t)len;
        fx_status st;
        fx_status_clear(&st);
        fx_op_copy_into(&src, &dst, &st);
        FX_CK_OK(st);
        double *got = fx_test_read(&t);
        for (int i = 0; i < N; i++) {
            double want = i >= dst_at && i < dst_at + len ? v[i - dst_at + src_at] : v[i];
            ck_assert_msg(got[i] == want, "shift %d: [%d] = %g, want %g", shift, i, got[i], want);
        }
        free(got);
        fx_tensor_release(&t);
    }
    free(v);
}
END_TEST

START_TEST(empty_tensors)
{
    fx_device *dev = fx_test_device();
    fx_status st;
    fx_status_clear(&st);
    int64_t dims[2] = {0, 5};
    fx_tensor a, b, out, cast;
    ck_assert_int_eq(fx_op_zeros(dev, FX_F32, 2, dims, &a, &st), FX_OK);
    ck_assert_int_eq(fx_op_from_host(dev, FX_F32, 2, dims, "", 0, &b, &st), FX_OK);
    ck_assert_int_eq(fx_op_binary(FX_MUL, &a, &b, &out, &st), FX_OK);
    ck_assert_int_eq(fx_op_cast(&out, FX_BF16, &cast, &st), FX_OK);
    ck_assert_int_eq(cast.numel, 0);
    ck_assert_int_eq(fx_op_to_host(&cast, NULL, &st), FX_OK);
    fx_tensor_release(&a);
    fx_tensor_release(&b);
    fx_tensor_release(&out);
    fx_tensor_release(&cast);
}
END_TEST

Suite *fx_suite_ops(void)
{
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("tensor ops");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, transfer_round_trips);
    tcase_add_test(tc, try_from_host_never_waits);
    tcase_add_test(tc, copy_between_devices);
    tcase_add_test(tc, cast_matches_cpu_bitwise);
    tcase_add_test(tc, binary_ops_match_reference);
    tcase_add_test(tc, scale_matches_reference);
    tcase_add_test(tc, validation_messages);
    tcase_add_test(tc, empty_tensors);
    tcase_add_test(tc, copy_into_overlapping_views);
    suite_add_tcase(s, tc);
    return s;
}
