#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fusex_dtype.h"
#include "core/ops.h"

static uint64_t seed, state;

uint64_t fx_test_seed(void)
{
    if (!seed) {
        const char *env = getenv("FUSEX_SEED");
        seed = env && *env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) * 2654435761u;
        if (!seed)
            seed = 1;
        state = seed;
        fprintf(stderr, "fusex C tests: FUSEX_SEED=%llu\n", (unsigned long long)seed);
    }
    return seed;
}

static uint64_t next_u64(void)
{ /* splitmix64 */
    fx_test_seed();
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double fx_rand_uniform(double lo, double hi)
{
    return lo + (hi - lo) * ((double)(next_u64() >> 11) / 9007199254740992.0);
}

double fx_rand_normal(void)
{
    double u = fx_rand_uniform(1e-12, 1.0), v = fx_rand_uniform(0.0, 1.0);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

void fx_fill_uniform(double *out, int64_t n, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = fx_rand_uniform(lo, hi);
}

fx_device *fx_test_device(void)
{
    const char *want = getenv("FUSEX_DEVICE");
    if (want && strcmp(want, "cpu:reference") == 0)
        return fx_test_oracle();
    if (want && strncmp(want, "cuda", 4) == 0) {
        fx_device *dev = fx_device_find(FX_DEVICE_CUDA, 0);
        if (!dev) {
            fprintf(stderr, "FUSEX_DEVICE=%s but CUDA is unavailable: %s\n", want,
                    fx_cuda_unavailable_reason());
            abort();
        }
        return dev;
    }
    return fx_cpu_device();
}

fx_device *fx_test_oracle(void)
{
    fx_device *dev = fx_cpu_reference_device();
    if (!dev) {
        fprintf(stderr, "the CPU backend has no reference device\n");
        abort();
    }
    return dev;
}

int fx_test_quick(void)
{
    const char *q = getenv("FUSEX_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

int fx_test_emulated(void)
{
    const fx_device *dev = fx_test_device();
    return dev->kind == FX_DEVICE_CUDA && strstr(dev->backend->name, "emulated") != NULL;
}

/* A tensor of `dtype` and `dims` on `dev` holding `values` (f64, converted),
 * or, with no values, every byte 0xff: NaN in every float type. */
static void upload_host(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims,
                        const double *values, fx_tensor *out)
{
    fx_status st;
    fx_status_clear(&st);
    int64_t numel;
    size_t nbytes;
    ck_assert_int_eq(fx_shape_nbytes("test", dtype, rank, dims, &numel, &nbytes, &st), FX_OK);
    void *host = malloc(nbytes ? nbytes : 1);
    if (values)
        for (int64_t i = 0; i < numel; i++)
            fx_store_f64(host, dtype, i, values[i]);
    else
        memset(host, 0xff, nbytes);
    fx_op_from_host(dev, dtype, rank, dims, host, nbytes, out, &st);
    free(host);
    FX_CK_OK(st);
}

void fx_test_tensor(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims,
                    const double *values, fx_tensor *out)
{
    upload_host(dev, dtype, rank, dims, values, out);
}

void fx_test_poisoned(fx_device *dev, fx_dtype dtype, int rank, const int64_t *dims,
                      fx_tensor *out)
{
    upload_host(dev, dtype, rank, dims, NULL, out);
}

double *fx_test_read(const fx_tensor *t)
{
    fx_status st;
    fx_status_clear(&st);
    void *host = malloc(t->nbytes ? t->nbytes : 1);
    fx_op_to_host(t, host, &st);
    FX_CK_OK(st);
    double *out = malloc(sizeof(double) * (size_t)(t->numel ? t->numel : 1));
    for (int64_t i = 0; i < t->numel; i++)
        out[i] = fx_load_f64(host, t->dtype, i);
    free(host);
    return out;
}

double fx_l2(const double *v, int64_t n)
{
    double sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += v[i] * v[i];
    return sqrt(sum);
}

double fx_l2_diff(const double *a, const double *b, int64_t n)
{
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = a[i] - b[i];
        sum += isnan(e) ? INFINITY : e * e;
    }
    return sqrt(sum);
}

double fx_rel_l2(const double *a, const double *b, int64_t n)
{
    double diff = fx_l2_diff(a, b, n), ref = fx_l2(b, n);
    if (isinf(diff)) /* a NaN in a or b */
        return INFINITY;
    if (ref == 0)
        return diff == 0 ? 0 : INFINITY;
    return diff / ref;
}

static int64_t size_named(const fx_test_sizes *s, const char *name, size_t len)
{
    for (int i = 0; i < s->nnames; i++)
        if (strlen(s->names[i].name) == len && strncmp(s->names[i].name, name, len) == 0)
            return s->names[i].size;
    char *end;
    long long v = strtoll(name, &end, 10);
    ck_assert_msg(end == name + len, "a layout's size %.*s the test does not know", (int)len, name);
    return v;
}

int fx_test_layout(const char *layout, const fx_test_sizes *s, int64_t dims[FX_MAX_RANK])
{
    int rank = 0;
    const char *p = layout;
    ck_assert_msg(*p == '[', "layout %s", layout);
    p++;
    while (*p && *p != ']') {
        while (*p == ' ' || *p == ',')
            p++;
        if (*p == '[') { /* an optional axis: left out */
            p = strchr(p, ']') + 1;
            continue;
        }
        const char *start = p;
        while (*p && *p != ',' && *p != ']')
            p++;
        const size_t len = (size_t)(p - start);
        if (len == 3 && strncmp(start, "...", 3) == 0) {
            for (int k = 0; k < s->nleading && rank < FX_MAX_RANK; k++)
                dims[rank++] = s->leading[k];
            continue;
        }
        ck_assert_msg(rank < FX_MAX_RANK, "layout %s: more than %d axes", layout, FX_MAX_RANK);
        /* "3*hidden": a multiple of a size */
        char *times;
        long long factor = strtoll(start, &times, 10);
        if (times > start && *times == '*')
            dims[rank++] = factor * size_named(s, times + 1, len - (size_t)(times + 1 - start));
        else
            dims[rank++] = size_named(s, start, len);
    }
    return rank;
}
