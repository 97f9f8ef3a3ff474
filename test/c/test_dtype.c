/* bf16 / f16 conversions: exhaustive round trips, rounding, specials. */
#include <math.h>

#include "fusex_dtype.h"
#include "testutil.h"

START_TEST(f16_round_trips_every_pattern)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fx_f16_to_f32((uint16_t)h);
        if (isnan(f)) {
            ck_assert((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0);
            ck_assert(isnan(fx_f16_to_f32(fx_f32_to_f16(f))));
            continue;
        }
        ck_assert_msg(fx_f32_to_f16(f) == h, "f16 0x%04x -> %g -> 0x%04x", h, (double)f,
                      fx_f32_to_f16(f));
    }
}
END_TEST

START_TEST(bf16_round_trips_every_pattern)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fx_bf16_to_f32((uint16_t)h);
        if (isnan(f)) {
            ck_assert(isnan(fx_bf16_to_f32(fx_f32_to_bf16(f))));
            continue;
        }
        ck_assert_uint_eq(fx_f32_to_bf16(f), h);
    }
}
END_TEST

START_TEST(f16_known_values)
{
    ck_assert_uint_eq(fx_f32_to_f16(1.0f), 0x3c00);
    ck_assert_uint_eq(fx_f32_to_f16(-2.0f), 0xc000);
    ck_assert_uint_eq(fx_f32_to_f16(65504.0f), 0x7bff);    /* largest finite */
    ck_assert_uint_eq(fx_f32_to_f16(65520.0f), 0x7c00);    /* ties up to inf */
    ck_assert_uint_eq(fx_f32_to_f16(65519.0f), 0x7bff);
    ck_assert_uint_eq(fx_f32_to_f16(INFINITY), 0x7c00);
    ck_assert_uint_eq(fx_f32_to_f16(-INFINITY), 0xfc00);
    ck_assert_uint_eq(fx_f32_to_f16(ldexpf(1.0f, -24)), 0x0001); /* smallest subnormal */
    ck_assert_uint_eq(fx_f32_to_f16(ldexpf(1.0f, -25)), 0x0000); /* tie to even: 0 */
    ck_assert_uint_eq(fx_f32_to_f16(ldexpf(3.0f, -25)), 0x0002); /* 1.5 ulp ties to 2 */
    ck_assert_uint_eq(fx_f32_to_f16(ldexpf(1.0f, -14)), 0x0400); /* smallest normal */
    ck_assert_uint_eq(fx_f32_to_f16(-0.0f), 0x8000);
    /* 1 + 2^-11 is halfway between 1 and 1+2^-10: ties to even (1.0) */
    ck_assert_uint_eq(fx_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00);
    ck_assert_uint_eq(fx_f32_to_f16(1.0f + ldexpf(3.0f, -11)), 0x3c02);
    ck_assert(isnan(fx_f16_to_f32(fx_f32_to_f16(NAN))));
}
END_TEST

START_TEST(bf16_known_values)
{
    ck_assert_uint_eq(fx_f32_to_bf16(1.0f), 0x3f80);
    ck_assert_uint_eq(fx_f32_to_bf16(-1.0f), 0xbf80);
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even */
    ck_assert_uint_eq(fx_f32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3f80);
    ck_assert_uint_eq(fx_f32_to_bf16(1.0f + ldexpf(3.0f, -8)), 0x3f82);
    ck_assert_uint_eq(fx_f32_to_bf16(3.4e38f), 0x7f80); /* rounds past the max: inf */
    ck_assert(isnan(fx_bf16_to_f32(fx_f32_to_bf16(NAN))));
    ck_assert(isnan(fx_bf16_to_f32(fx_f32_to_bf16(fx_bits_to_f32(0x7f800001u)))));
}
END_TEST

START_TEST(rounding_error_is_half_ulp)
{
    for (int i = 0; i < 100000; i++) {
        float f = (float)fx_rand_uniform(-1000.0, 1000.0);
        float b = fx_bf16_to_f32(fx_f32_to_bf16(f));
        float h = fx_f16_to_f32(fx_f32_to_f16(f));
        ck_assert(fabsf(b - f) <= fabsf(f) * ldexpf(1.0f, -8));
        ck_assert(fabsf(h - f) <= fmaxf(fabsf(f) * ldexpf(1.0f, -11), ldexpf(1.0f, -25)));
    }
}
END_TEST

START_TEST(names_and_sizes)
{
    ck_assert_str_eq(fx_dtype_name(FX_BF16), "{bf,16}");
    ck_assert_str_eq(fx_dtype_name(FX_U8), "{u,8}");
    ck_assert_uint_eq(fx_dtype_size(FX_S64), 8);
    ck_assert_int_eq(fx_dtype_from_nx("bf", 16), FX_BF16);
    ck_assert_int_eq(fx_dtype_from_nx("f", 16), FX_F16);
    ck_assert_int_eq(fx_dtype_from_nx("f", 8), -1);
    ck_assert_int_eq(fx_dtype_from_nx("u", 16), -1);
    ck_assert(fx_dtype_is_float(FX_F16) && !fx_dtype_is_float(FX_S32));
}
END_TEST

START_TEST(integer_stores_saturate)
{
    int32_t i32;
    uint8_t u8;
    fx_store_f64(&i32, FX_S32, 0, 1e12);
    ck_assert_int_eq(i32, INT32_MAX);
    fx_store_f64(&i32, FX_S32, 0, NAN);
    ck_assert_int_eq(i32, 0);
    fx_store_f64(&u8, FX_U8, 0, -3.0);
    ck_assert_uint_eq(u8, 0);
    fx_store_f64(&u8, FX_U8, 0, 300.0);
    ck_assert_uint_eq(u8, 255);
}
END_TEST

Suite *fx_suite_dtype(void)
{
    Suite *s = suite_create("dtype");
    TCase *tc = tcase_create("conversions");
    tcase_add_test(tc, f16_round_trips_every_pattern);
    tcase_add_test(tc, bf16_round_trips_every_pattern);
    tcase_add_test(tc, f16_known_values);
    tcase_add_test(tc, bf16_known_values);
    tcase_add_test(tc, rounding_error_is_half_ulp);
    tcase_add_test(tc, names_and_sizes);
    tcase_add_test(tc, integer_stores_saturate);
    suite_add_tcase(s, tc);
    return s;
}
