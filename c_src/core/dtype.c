#include "core/dtype.h"

#include <math.h>

static const struct {
    const char *name;
    const char *kind;
    int bits;
    size_t size;
    int is_float;
} dtype_table[FX_DTYPE_COUNT] = {
    [FX_F32] = {"{f,32}", "f", 32, 4, 1},   [FX_F64] = {"{f,64}", "f", 64, 8, 1},
    [FX_BF16] = {"{bf,16}", "bf", 16, 2, 1}, [FX_F16] = {"{f,16}", "f", 16, 2, 1},
    [FX_S32] = {"{s,32}", "s", 32, 4, 0},   [FX_S64] = {"{s,64}", "s", 64, 8, 0},
    [FX_U8] = {"{u,8}", "u", 8, 1, 0},
};

size_t fx_dtype_size(fx_dtype t)
{
    return (unsigned)t < FX_DTYPE_COUNT ? dtype_table[t].size : 0;
}

const char *fx_dtype_name(fx_dtype t)
{
    return (unsigned)t < FX_DTYPE_COUNT ? dtype_table[t].name : "{?}";
}

int fx_dtype_is_float(fx_dtype t)
{
    return (unsigned)t < FX_DTYPE_COUNT && dtype_table[t].is_float;
}

const char *fx_dtype_kind(fx_dtype t)
{
    return (unsigned)t < FX_DTYPE_COUNT ? dtype_table[t].kind : "?";
}

int fx_dtype_bits(fx_dtype t) { return (unsigned)t < FX_DTYPE_COUNT ? dtype_table[t].bits : 0; }

int fx_dtype_from_nx(const char *kind, int bits)
{
    for (int t = 0; t < FX_DTYPE_COUNT; t++)
        if (dtype_table[t].bits == bits && strcmp(dtype_table[t].kind, kind) == 0)
            return t;
    return -1;
}

float fx_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1f) /* inf or NaN */
        return fx_bits_to_f32(sign | 0x7f800000u | (mantissa << 13) | (mantissa ? 0x400000u : 0));
    if (exponent == 0) { /* zero or subnormal: value = mantissa * 2^-24 */
        float magnitude = ldexpf((float)mantissa, -24);
        return sign ? -magnitude : magnitude;
    }
    return fx_bits_to_f32(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t fx_f32_to_f16(float f)
{
    uint32_t bits = fx_f32_to_bits(f);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t abs_bits = bits & 0x7fffffffu;
    if (abs_bits > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((abs_bits >> 13) & 0x3ffu));
    if (abs_bits >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (abs_bits < 0x38800000u) { /* below the smallest normal 2^-14 */
        /* Scale so the f16 subnormal step (2^-24) becomes 1 and let the
         * float->int conversion after rintf round to nearest even. */
        float scaled = fx_bits_to_f32(abs_bits) * 16777216.0f; /* 2^24 */
        return (uint16_t)(sign | (uint16_t)rintf(scaled));
    }
    /* Normal: rebias the exponent, round the 13 dropped bits to nearest even.
     * A carry out of the mantissa correctly bumps the exponent. */
    uint32_t rebased = abs_bits - (112u << 23);
    uint32_t rounding = 0x0fffu + ((rebased >> 13) & 1u);
    return (uint16_t)(sign | ((rebased + rounding) >> 13));
}

double fx_load_f64(const void *base, fx_dtype t, int64_t i)
{
    switch (t) {
    case FX_F32: return ((const float *)base)[i];
    case FX_F64: return ((const double *)base)[i];
    case FX_BF16: return fx_bf16_to_f32(((const uint16_t *)base)[i]);
    case FX_F16: return fx_f16_to_f32(((const uint16_t *)base)[i]);
    case FX_S32: return ((const int32_t *)base)[i];
    case FX_S64: return (double)((const int64_t *)base)[i];
    case FX_U8: return ((const uint8_t *)base)[i];
    default: return NAN;
    }
}

/* Integer stores saturate and map NaN to 0, as a defined answer to an
 * otherwise undefined C conversion. */
static int64_t saturate(double v, double lo, double hi)
{
    if (isnan(v)) return 0;
    if (v <= lo) return (int64_t)lo;
    if (v >= hi) return (int64_t)hi;
    return (int64_t)v;
}

void fx_store_f64(void *base, fx_dtype t, int64_t i, double v)
{
    switch (t) {
    case FX_F32: ((float *)base)[i] = (float)v; break;
    case FX_F64: ((double *)base)[i] = v; break;
    case FX_BF16: ((uint16_t *)base)[i] = fx_f32_to_bf16((float)v); break;
    case FX_F16: ((uint16_t *)base)[i] = fx_f32_to_f16((float)v); break;
    case FX_S32: ((int32_t *)base)[i] = (int32_t)saturate(v, -2147483648.0, 2147483647.0); break;
    case FX_S64:
        ((int64_t *)base)[i] = saturate(v, -9223372036854775808.0, 9223372036854774784.0);
        break;
    case FX_U8: ((uint8_t *)base)[i] = (uint8_t)saturate(v, 0.0, 255.0); break;
    default: break;
    }
}
