/* Row losses on the CPU (both devices): f64 sums over each row, in order. */
#include <math.h>

#include "cpu/cpu.h"
#include "fusex_dtype.h"
#include "fusex_loss.h"

static void mse_row(const fx_loss_args *a, int64_t r)
{
    const fx_dtype t = a->y->dtype;
    double sum = 0;
    for (int64_t c = 0; c < a->classes; c++) {
        const int64_t i = r * a->classes + c;
        const double d = fx_load_f64(a->y->data, t, i) - fx_load_f64(a->targets->data, t, i);
        sum += d * d;
        if (a->dy)
            fx_store_f64(a->dy->data, t, i, a->grad_scale * 2.0 * d);
    }
    fx_store_f64(a->row_loss->data, t, r, sum);
}

static void cross_entropy_row(const fx_loss_args *a, int64_t r)
{
    const fx_dtype t = a->y->dtype;
    const int64_t base = r * a->classes;
    const int32_t label = ((const int32_t *)a->targets->data)[r];
    double top = fx_load_f64(a->y->data, t, base), total = 0;
    for (int64_t c = 1; c < a->classes; c++)
        top = fmax(top, fx_load_f64(a->y->data, t, base + c));
    for (int64_t c = 0; c < a->classes; c++)
        total += exp(fx_load_f64(a->y->data, t, base + c) - top);
    const bool valid = label >= 0 && label < a->classes;
    const double picked = valid ? fx_load_f64(a->y->data, t, base + label) : NAN;
    fx_store_f64(a->row_loss->data, t, r, log(total) + top - picked);
    if (!a->dy)
        return;
    for (int64_t c = 0; c < a->classes; c++) {
        const double p = exp(fx_load_f64(a->y->data, t, base + c) - top) / total;
        fx_store_f64(a->dy->data, t, base + c, valid ? a->grad_scale * (p - (c == label)) : NAN);
    }
}

static int cpu_loss_rows(const fx_exec *ex, const fx_loss_args *a, fx_status *st)
{
    (void)ex;
    (void)st;
    const bool parallel = a->rows * a->classes > FX_CPU_PARALLEL_MIN;
#pragma omp parallel for if (parallel)
    for (int64_t r = 0; r < a->rows; r++) {
        if (a->kind == FX_LOSS_MSE)
            mse_row(a, r);
        else
            cross_entropy_row(a, r);
    }
    return FX_OK;
}

const struct fx_loss_ops fx_cpu_loss_ops = {.rows = cpu_loss_rows};
