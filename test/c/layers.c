#include "layers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/ops.h"
#include "fusex_dtype.h"

double *fx_lt_alloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

double fx_lt_round(fx_dtype t, double v)
{
    char buf[8];
    fx_store_f64(buf, t, 0, v);
    return fx_load_f64(buf, t, 0);
}

double *fx_lt_uniform(int64_t n, double lo, double hi, fx_dtype t)
{
    double *v = fx_lt_alloc(n);
    for (int64_t i = 0; i < n; i++)
        v[i] = fx_lt_round(t, fx_rand_uniform(lo, hi));
    return v;
}

double *fx_lt_normal(int64_t n, fx_dtype t)
{
    double *v = fx_lt_alloc(n);
    for (int64_t i = 0; i < n; i++)
        v[i] = fx_lt_round(t, fx_rand_normal());
    return v;
}

double fx_lt_tolerance(fx_dtype t) { return t == FX_F64 ? 1e-12 : t == FX_F32 ? 1e-5 : 1e-2; }

void fx_lt_caller_open(fx_device *dev, size_t bytes, fx_lt_caller *c)
{
    fx_status st;
    fx_status_clear(&st);
    memset(c, 0, sizeof *c);
    c->dev = dev;
    if (dev->backend->stream_create) {
        dev->backend->stream_create(dev->ordinal, &c->stream, &st);
        FX_CK_OK(st);
    }
    int64_t dims[1] = {(int64_t)bytes};
    ck_assert_int_eq(fx_tensor_alloc(dev, FX_U8, 1, dims, &c->memory, &st), FX_OK);
    c->arena.base = c->memory.data;
    c->arena.size = bytes;
    c->arena.used = 0;
    c->ex.device = dev->ordinal;
    c->ex.stream = c->stream;
    c->ex.scratch = fx_scratch_arena_use(&c->arena);
    c->ex.cache = NULL;
}

void fx_lt_caller_close(fx_lt_caller *c)
{
    fx_status st;
    fx_status_clear(&st);
    if (c->stream) {
        c->dev->backend->stream_synchronize(c->dev->ordinal, c->stream, &st);
        FX_CK_OK(st);
    }
    ck_assert_msg(c->arena.used <= c->arena.size, "arena overrun: %zu of %zu", c->arena.used, c->arena.size);
    fx_tensor_release(&c->memory);
    if (c->stream)
        c->dev->backend->stream_destroy(c->dev->ordinal, c->stream);
}

void fx_lt_own_stream_done(fx_device *dev)
{
    fx_status st;
    fx_status_clear(&st);
    fx_op_synchronize(dev, &st);
    FX_CK_OK(st);
}

void fx_lt_expect_error(int rc, const fx_status *st, const char *msg)
{
    ck_assert_msg(rc == FX_EBADARG && st->code == FX_EBADARG, "expected badarg \"%s\", got code %d: %s", msg, st->code,
                  st->msg);
    ck_assert_msg(strcmp(st->msg, msg) == 0, "expected \"%s\", got \"%s\"", msg, st->msg);
}
