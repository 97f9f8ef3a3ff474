/* Element types: sizes, names as Nx spells them, and the exact software
 * bf16/f16 <-> f32 conversions (round to nearest even, NaN stays NaN), so
 * results do not depend on the host compiler's _Float16 support. Shared by
 * the op layer, the CPU backend and the XLA handlers; header-only so that
 * no layer depends on another for it. Valid C11 and C++. */
#ifndef FUSEX_DTYPE_H
#define FUSEX_DTYPE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fusex.h"

typedef struct fx_dtype_desc {
    const char *name; /* "{f,32}", "{bf,16}", ... */
    const char *kind; /* Nx's kind: "f", "bf", "s" or "u" */
    int bits;
    size_t size;
    int is_float;
} fx_dtype_desc;

static inline const fx_dtype_desc *fx_dtype_describe(fx_dtype t)
{
    static const fx_dtype_desc table[FX_DTYPE_COUNT] = {
        {"{f,32}", "f", 32, 4, 1},  {"{f,64}", "f", 64, 8, 1}, {"{bf,16}", "bf", 16, 2, 1},
        {"{f,16}", "f", 16, 2, 1},  {"{s,32}", "s", 32, 4, 0}, {"{s,64}", "s", 64, 8, 0},
        {"{u,8}", "u", 8, 1, 0},
    };
    static const fx_dtype_desc unknown = {"{?}", "?", 0, 0, 0};
    return (unsigned)t < FX_DTYPE_COUNT ? &table[t] : &unknown;
}

static inline size_t fx_dtype_size(fx_dtype t) { return fx_dtype_describe(t)->size; }
static inline const char *fx_dtype_name(fx_dtype t) { return fx_dtype_describe(t)->name; }
static inline int fx_dtype_is_float(fx_dtype t) { return fx_dtype_describe(t)->is_float; }
static inline const char *fx_dtype_kind(fx_dtype t) { return fx_dtype_describe(t)->kind; }
static inline int fx_dtype_bits(fx_dtype t) { return fx_dtype_describe(t)->bits; }

/* Parses the Nx spelling (kind "f"/"bf"/"s"/"u" and bits); -1 when unknown. */
static inline int fx_dtype_from_nx(const char *kind, int bits)
{
    for (int t = 0; t < FX_DTYPE_COUNT; t++)
        if (fx_dtype_bits((fx_dtype)t) == bits && strcmp(fx_dtype_kind((fx_dtype)t), kind) == 0)
            return t;
    return -1;
}

static inline float fx_bits_to_f32(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint32_t fx_f32_to_bits(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
}

static inline float fx_bf16_to_f32(uint16_t h)
{
    return fx_bits_to_f32((uint32_t)h << 16);
}

static inline uint16_t fx_f32_to_bf16(float f)
{
    uint32_t bits = fx_f32_to_bits(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign, force quiet */
        return (uint16_t)((bits >> 16) | 0x0040u);
    uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)((bits + rounding) >> 16);
}

static inline float fx_f16_to_f32(uint16_t h)
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

static inline uint16_t fx_f32_to_f16(float f)
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

/* Generic element access, for reference paths and tests (slow, clear).
 * Kept out of line: inlined where the type is known, the compiler checks
 * the branches of the other types against the buffer and warns. */
#if defined(__GNUC__)
#define FX_OUT_OF_LINE __attribute__((noinline, unused))
#else
#define FX_OUT_OF_LINE
#endif
static FX_OUT_OF_LINE double fx_load_f64(const void *base, fx_dtype t, int64_t i)
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
static inline int64_t fx_saturate_i64(double v, double lo, double hi)
{
    if (isnan(v)) return 0;
    if (v <= lo) return (int64_t)lo;
    if (v >= hi) return (int64_t)hi;
    return (int64_t)v;
}

static FX_OUT_OF_LINE void fx_store_f64(void *base, fx_dtype t, int64_t i, double v)
{
    switch (t) {
    case FX_F32: ((float *)base)[i] = (float)v; break;
    case FX_F64: ((double *)base)[i] = v; break;
    case FX_BF16: ((uint16_t *)base)[i] = fx_f32_to_bf16((float)v); break;
    case FX_F16: ((uint16_t *)base)[i] = fx_f32_to_f16((float)v); break;
    case FX_S32: ((int32_t *)base)[i] = (int32_t)fx_saturate_i64(v, -2147483648.0, 2147483647.0); break;
    case FX_S64:
        ((int64_t *)base)[i] = fx_saturate_i64(v, -9223372036854775808.0, 9223372036854774784.0);
        break;
    case FX_U8: ((uint8_t *)base)[i] = (uint8_t)fx_saturate_i64(v, 0.0, 255.0); break;
    default: break;
    }
}

#endif
