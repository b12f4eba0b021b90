/* The safetensors dtype table. Invariant: the enum values of tv_dtype are
 * stored on disk and never renumbered; names match the format exactly. */
#include <string.h>

#include "st/st_internal.h"

static const struct {
    const char *name;
    unsigned bits;
} g_dtypes[TV_DTYPE_COUNT] = {
    [TV_DTYPE_BOOL] = {"BOOL", 8},
    [TV_DTYPE_U8] = {"U8", 8},
    [TV_DTYPE_I8] = {"I8", 8},
    [TV_DTYPE_F8_E5M2] = {"F8_E5M2", 8},
    [TV_DTYPE_F8_E4M3] = {"F8_E4M3", 8},
    [TV_DTYPE_F8_E8M0] = {"F8_E8M0", 8},
    [TV_DTYPE_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [TV_DTYPE_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
    [TV_DTYPE_I16] = {"I16", 16},
    [TV_DTYPE_U16] = {"U16", 16},
    [TV_DTYPE_F16] = {"F16", 16},
    [TV_DTYPE_BF16] = {"BF16", 16},
    [TV_DTYPE_I32] = {"I32", 32},
    [TV_DTYPE_U32] = {"U32", 32},
    [TV_DTYPE_F32] = {"F32", 32},
    [TV_DTYPE_C64] = {"C64", 64},
    [TV_DTYPE_F64] = {"F64", 64},
    [TV_DTYPE_I64] = {"I64", 64},
    [TV_DTYPE_U64] = {"U64", 64},
    [TV_DTYPE_F4] = {"F4", 4},
    [TV_DTYPE_F6_E2M3] = {"F6_E2M3", 6},
    [TV_DTYPE_F6_E3M2] = {"F6_E3M2", 6},
};

TV_API const char *tv_dtype_name(tv_dtype dt)
{
    return (unsigned)dt < TV_DTYPE_COUNT ? g_dtypes[dt].name : NULL;
}

TV_API unsigned tv_dtype_bits(tv_dtype dt)
{
    return (unsigned)dt < TV_DTYPE_COUNT ? g_dtypes[dt].bits : 0;
}

TV_API bool tv_dtype_byte_addressable(tv_dtype dt)
{
    return (unsigned)dt < TV_DTYPE_COUNT && g_dtypes[dt].bits % 8 == 0;
}

TV_API int tv_dtype_from_name(const char *s, size_t len, tv_dtype *out)
{
    for (unsigned i = 0; i < TV_DTYPE_COUNT; i++) {
        if (strlen(g_dtypes[i].name) == len && memcmp(g_dtypes[i].name, s, len) == 0) {
            *out = (tv_dtype)i;
            return 0;
        }
    }
    return TV_E_ST_DTYPE;
}
