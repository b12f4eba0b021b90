/* Hex encoder and exact decoder; see hex.h. */
#include <errno.h>
#include <string.h>

#include "util/hex.h"

void tv__hex_encode(const uint8_t *in, size_t len, bool upper, char *out)
{
    const char *d = upper ? "0123456789ABCDEF" : "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        out[2 * i] = d[in[i] >> 4];
        out[2 * i + 1] = d[in[i] & 15];
    }
    out[2 * len] = '\0';
}

int tv__hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int tv__hex_decode(const char *s, size_t s_len, uint8_t *out, size_t out_len)
{
    if (!s || out_len > SIZE_MAX / 2 || s_len != 2 * out_len)
        return -EINVAL;
    /* Validate first so a bad digit leaves out untouched. */
    for (size_t i = 0; i < s_len; i++)
        if (tv__hex_digit(s[i]) < 0)
            return -EINVAL;
    for (size_t i = 0; i < out_len; i++)
        out[i] = (uint8_t)(tv__hex_digit(s[2 * i]) << 4 | tv__hex_digit(s[2 * i + 1]));
    return 0;
}
