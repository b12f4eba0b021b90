/* Float32 conversion of raw safetensors elements. Every supported source
 * format (BF16, F16, F8_E4M3, F8_E5M2, F8_E8M0) is a subset of float32, so
 * the conversion is exact. NaNs follow the reference converters bit for
 * bit: BF16 and F16 (numpy) keep their payload shifted into place; the
 * 8-bit formats (ml_dtypes) give the canonical quiet NaN with the sign kept.
 * Inputs are little-endian. */
#include <string.h>

#include "tensorvault/tensorvault.h"
#include "util/endian.h"
#include "util/internal.h"
#include "xfer/xfer.h"

/* Stores go through memcpy: dst need not be 4-byte aligned. */
static inline void put(void *dst, size_t i, uint32_t u)
{
    memcpy((uint8_t *)dst + 4 * i, &u, 4);
}

/* IEEE binary16 -> binary32 bits. */
static inline uint32_t f16_bits(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0) {
        if (mant == 0)
            return sign;
        /* Subnormal: normalise. */
        int e = -1;
        do {
            e++;
            mant <<= 1;
        } while ((mant & 0x400) == 0);
        mant &= 0x3ff;
        return sign | (uint32_t)(112 - e) << 23 | mant << 13;
    }
    if (exp == 31)
        return sign | 0x7f800000u | mant << 13;
    return sign | (exp + 112) << 23 | mant << 13;
}

/* float8_e4m3fn: bias 7, no infinities, S.1111.111 is NaN. */
static inline uint32_t e4m3_bits(uint8_t b)
{
    uint32_t sign = (uint32_t)(b >> 7) << 31;
    uint32_t exp = (b >> 3) & 0xf, mant = b & 0x7;
    if (exp == 0xf && mant == 0x7)
        return sign | 0x7fc00000u;
    if (exp == 0) {
        if (mant == 0)
            return sign;
        int e = -1;
        do {
            e++;
            mant <<= 1;
        } while ((mant & 0x8) == 0);
        mant &= 0x7;
        return sign | (uint32_t)(120 - e) << 23 | mant << 20;
    }
    return sign | (exp + 120) << 23 | mant << 20;
}

/* float8_e8m0fnu: an unsigned power of two 2^(e - 127); 0xff is NaN. */
static inline uint32_t e8m0_bits(uint8_t b)
{
    if (b == 0xff)
        return 0x7fc00000u;
    if (b == 0)
        return 0x00400000u; /* 2^-127, a float32 subnormal */
    return (uint32_t)b << 23;
}

TV_API int tv_convert_f32(tv_dtype src_dtype, const void *src, size_t n, void *dst)
{
    const uint8_t *p = src;
    size_t out_len;
    if (__builtin_mul_overflow(n, (size_t)4, &out_len))
        return TV_E_OVERFLOW;
    if (n && (!src || !dst))
        return TV_E_INVALID_ARG;
    switch (src_dtype) {
    case TV_DTYPE_F32:
        memmove(dst, src, out_len);
        return 0;
    case TV_DTYPE_BF16:
        for (size_t i = 0; i < n; i++)
            put(dst, i, (uint32_t)tv__le16_get(p + 2 * i) << 16);
        return 0;
    case TV_DTYPE_F16:
        for (size_t i = 0; i < n; i++)
            put(dst, i, f16_bits(tv__le16_get(p + 2 * i)));
        return 0;
    case TV_DTYPE_F8_E5M2:
        /* E5M2 is the high byte of a binary16; NaNs are canonicalised. */
        for (size_t i = 0; i < n; i++) {
            uint32_t b = f16_bits((uint16_t)(p[i] << 8));
            if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu))
                b = (b & 0x80000000u) | 0x7fc00000u;
            put(dst, i, b);
        }
        return 0;
    case TV_DTYPE_F8_E4M3:
        for (size_t i = 0; i < n; i++)
            put(dst, i, e4m3_bits(p[i]));
        return 0;
    case TV_DTYPE_F8_E8M0:
        for (size_t i = 0; i < n; i++)
            put(dst, i, e8m0_bits(p[i]));
        return 0;
    default:
        return TV_E_NOT_SUPPORTED;
    }
}
