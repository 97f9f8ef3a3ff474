/* Element types: sizes, names as Nx spells them, and the bf16/f16 <-> f32
 * conversions every CPU kernel uses. The conversions are exact software
 * versions (round to nearest even, NaN stays NaN) so results do not depend
 * on the host compiler's _Float16 support. */
#ifndef FX_DTYPE_H
#define FX_DTYPE_H

#include <stdint.h>
#include <string.h>

#include "fusex.h"

size_t fx_dtype_size(fx_dtype t);
/* "{f,32}", "{bf,16}", ... */
const char *fx_dtype_name(fx_dtype t);
int fx_dtype_is_float(fx_dtype t);
/* The Nx spelling's parts: kind "f", "bf", "s" or "u", and the bit width. */
const char *fx_dtype_kind(fx_dtype t);
int fx_dtype_bits(fx_dtype t);
/* Parses the Nx spelling (kind "f"/"bf"/"s"/"u" and bits); -1 when unknown. */
int fx_dtype_from_nx(const char *kind, int bits);

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

float fx_f16_to_f32(uint16_t h);
uint16_t fx_f32_to_f16(float f);

/* Generic element access, for reference paths and tests (slow, clear). */
double fx_load_f64(const void *base, fx_dtype t, int64_t i);
void fx_store_f64(void *base, fx_dtype t, int64_t i, double v);

#endif
