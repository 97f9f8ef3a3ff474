/* Pointer interop in the core: local round trips on the device under test,
 * foreign host memory on the CPU, the live-allocation registry under
 * concurrent allocation, and the refusals. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/ops.h"
#include "core/pointer.h"
#include "testutil.h"

static fx_pointer local_pointer(uintptr_t addr)
{
    fx_pointer p;
    memset(&p, 0, sizeof p);
    p.kind = FX_PTR_LOCAL;
    p.address = addr;
    return p;
}

START_TEST(local_round_trip_and_write_through)
{
    fx_device *dev = fx_test_device();
    fx_status st;
    fx_status_clear(&st);
    int64_t dims[2] = {7, 13};
    double values[91];
    fx_fill_uniform(values, 91, -3, 3);
    fx_tensor owner, view, doubled;
    fx_test_tensor(dev, FX_F32, 2, dims, values, &owner);
    fx_pointer p;
    ck_assert_int_eq(fx_op_to_pointer(&owner, FX_PTR_LOCAL, true, &p, &st), FX_OK);
    ck_assert_uint_eq(p.size, 91 * 4);
    ck_assert(atomic_load(&owner.buffer->exported));
    ck_assert_int_eq(fx_op_from_pointer(dev, &p, FX_F32, 2, dims, true, &view, &st), FX_OK);
    ck_assert_ptr_eq(view.data, owner.data);
    ck_assert(view.buffer->borrowed);

    ck_assert_int_eq(fx_op_scale(&view, 2.0, &doubled, &st), FX_OK);
    ck_assert_int_eq(fx_op_copy_into(&doubled, &view, &st), FX_OK);
    double *got = fx_test_read(&owner);
    for (int i = 0; i < 91; i++)
        ck_assert_double_eq(got[i], (double)((float)values[i] * 2.0f));
    free(got);

    /* The view holds the owner's memory after the owner lets go. */
    long long alloc = atomic_load(&dev->allocated);
    fx_tensor_release(&owner);
    ck_assert_int_eq(atomic_load(&dev->allocated), alloc);
    fx_tensor_release(&view);
    ck_assert_int_eq(atomic_load(&dev->allocated), alloc - 91 * 4);
    fx_tensor_release(&doubled);

    /* Now the address lies in freed memory. */
    fx_tensor again;
    ck_assert_int_eq(fx_op_from_pointer(dev, &p, FX_F32, 2, dims, true, &again, &st), FX_EBADARG);
    ck_assert_ptr_nonnull(strstr(st.msg, "use-after-free of its owner"));
}
END_TEST

/* Host memory fusex never allocated: nothing to check beyond null and
 * alignment, and the view never frees it. Static storage, not malloc: the
 * host allocator may hand out a range fusex freed, which the freed ring
 * refuses as a use-after-free (docs/INTEROP.md's stated cpu limit). */
static double foreign[1001];

START_TEST(foreign_host_memory)
{
    fx_device *cpu = fx_test_oracle();
    fx_status st;
    fx_status_clear(&st);
    int64_t dims[1] = {1001};
    for (int i = 0; i < 1001; i++)
        foreign[i] = i * 0.5;
    fx_pointer p = local_pointer((uintptr_t)foreign);
    fx_tensor view, scaled;
    ck_assert_int_eq(fx_op_from_pointer(cpu, &p, FX_F64, 1, dims, true, &view, &st), FX_OK);
    long long alloc = atomic_load(&cpu->allocated);
    ck_assert_int_eq(fx_op_scale(&view, -1.0, &scaled, &st), FX_OK);
    ck_assert_int_eq(fx_op_copy_into(&scaled, &view, &st), FX_OK);
    for (int i = 0; i < 1001; i++)
        ck_assert_double_eq(foreign[i], -i * 0.5);
    fx_tensor_release(&scaled);
    fx_tensor_release(&view);
    ck_assert_int_eq(atomic_load(&cpu->allocated), alloc); /* the view counts nothing */
    foreign[0] = 1.0; /* still ours: the view did not free it */
    uintptr_t misaligned = (uintptr_t)foreign + 1;

    p.address = misaligned;
    ck_assert_int_eq(fx_op_from_pointer(cpu, &p, FX_F64, 1, dims, true, &view, &st), FX_EBADARG);
    ck_assert_ptr_nonnull(strstr(st.msg, "aligned to 8 bytes"));
}
END_TEST

START_TEST(region_checks)
{
    fx_device *dev = fx_test_device();
    fx_status st;
    int64_t dims[1] = {16}, more[1] = {17}, four[1] = {4};
    fx_tensor owner, view;
    double zeros[16] = {0};
    fx_test_tensor(dev, FX_F32, 1, dims, zeros, &owner);
    uintptr_t base = (uintptr_t)owner.data;

    fx_status_clear(&st);
    fx_pointer p = local_pointer(base);
    ck_assert_int_eq(fx_op_from_pointer(dev, &p, FX_F32, 1, more, true, &view, &st), FX_EBADARG);
    ck_assert_ptr_nonnull(strstr(st.msg, "expected 68 bytes inside the fusex allocation of 64 bytes"));

    fx_status_clear(&st);
    p.address = base + 48;
    ck_assert_int_eq(fx_op_from_pointer(dev, &p, FX_F32, 1, four, true, &view, &st), FX_OK);
    fx_tensor_release(&view);
    p.address = base + 52;
    ck_assert_int_eq(fx_op_from_pointer(dev, &p, FX_F32, 1, four, true, &view, &st), FX_EBADARG);
    ck_assert_ptr_nonnull(strstr(st.msg, "got an address 52 bytes into it"));

    fx_status_clear(&st);
    p.address = base;
    p.size_known = true;
    p.size = 15;
    ck_assert_int_eq(fx_op_from_pointer(dev, &p, FX_F32, 1, four, true, &view, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "pointer: expected a region of at least 16 bytes (shape {4} of {f,32}), got 15 bytes");

    fx_status_clear(&st);
    p = local_pointer(0);
    ck_assert_int_eq(fx_op_from_pointer(dev, &p, FX_F32, 1, four, true, &view, &st), FX_EBADARG);
    ck_assert_str_eq(st.msg, "pointer: expected a non-null address, got 0");
    fx_tensor_release(&owner);
}
END_TEST

/* Threads allocate and free while others look addresses up: every lookup
 * of a live tensor must find it, and nothing may crash or leak. */
typedef struct registry_worker {
    fx_device *dev;
    int failures;
} registry_worker;

static void *registry_churn(void *arg)
{
    registry_worker *w = arg;
    fx_status st;
    for (int i = 0; i < 2000; i++) {
        fx_status_clear(&st);
        int64_t dims[1] = {1 + (i % 97)};
        fx_tensor t, view;
        if (fx_op_zeros(w->dev, FX_F32, 1, dims, &t, &st) != FX_OK) {
            w->failures++;
            continue;
        }
        fx_pointer p = local_pointer((uintptr_t)t.data + (uintptr_t)(dims[0] - 1) * 4);
        int64_t one[1] = {1};
        if (fx_op_from_pointer(w->dev, &p, FX_F32, 1, one, false, &view, &st) != FX_OK ||
            view.buffer->release_arg != t.buffer)
            w->failures++;
        else
            fx_tensor_release(&view);
        fx_tensor_release(&t);
    }
    return NULL;
}

START_TEST(registry_under_concurrency)
{
    fx_device *dev = fx_test_device();
    long long alloc = atomic_load(&dev->allocated);
    enum { THREADS = 4 };
    pthread_t threads[THREADS];
    registry_worker workers[THREADS];
    for (int i = 0; i < THREADS; i++) {
        workers[i] = (registry_worker){dev, 0};
        pthread_create(&threads[i], NULL, registry_churn, &workers[i]);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        ck_assert_int_eq(workers[i].failures, 0);
    }
    fx_status st;
    fx_status_clear(&st);
    fx_op_synchronize(dev, &st);
    ck_assert_int_eq(atomic_load(&dev->allocated), alloc);
}
END_TEST

START_TEST(cpu_refuses_ipc)
{
    fx_device *cpu = fx_test_oracle();
    fx_status st;
    fx_status_clear(&st);
    int64_t dims[1] = {4};
    fx_tensor t;
    ck_assert_int_eq(fx_op_zeros_flags(cpu, FX_F32, 1, dims, FX_ALLOC_IPC, &t, &st), FX_EBADARG);
    ck_assert_ptr_nonnull(strstr(st.msg, "ipc: expected a CUDA device"));
    fx_status_clear(&st);
    ck_assert_int_eq(fx_op_zeros(cpu, FX_F32, 1, dims, &t, &st), FX_OK);
    fx_pointer p;
    ck_assert_int_eq(fx_op_to_pointer(&t, FX_PTR_IPC, true, &p, &st), FX_EBADARG);
    ck_assert_ptr_nonnull(strstr(st.msg, "kind: expected local for a tensor on cpu"));
    fx_tensor_release(&t);
}
END_TEST

Suite *fx_suite_pointer(void)
{
    Suite *s = suite_create("pointer");
    TCase *tc = tcase_create("interop");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, local_round_trip_and_write_through);
    tcase_add_test(tc, foreign_host_memory);
    tcase_add_test(tc, region_checks);
    tcase_add_test(tc, registry_under_concurrency);
    tcase_add_test(tc, cpu_refuses_ipc);
    suite_add_tcase(s, tc);
    return s;
}
