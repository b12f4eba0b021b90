/* The seeded name hash (see hash.h): a wyhash-style mix of 16-byte blocks
 * and a zero-padded tail. Words are loaded in host order; the formats that
 * store its results are little-endian-only, like every supported target. */
#include <string.h>

#include "util/hash.h"

static inline uint64_t mix(uint64_t a, uint64_t b)
{
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}

uint64_t tv__hash_bytes(const void *p, size_t n, uint64_t seed)
{
    const unsigned char *s = p;
    uint64_t h = seed ^ 0x9E3779B97F4A7C15ull ^ ((uint64_t)n * 0xA0761D6478BD642Full);
    while (n >= 16) {
        uint64_t a, b;
        memcpy(&a, s, 8);
        memcpy(&b, s + 8, 8);
        h = mix(a ^ h ^ 0xE7037ED1A0B428DBull, b ^ 0x8EBC6AF09C88C6E3ull);
        s += 16;
        n -= 16;
    }
    uint64_t a = 0, b = 0;
    if (n > 8) {
        memcpy(&a, s, 8);
        memcpy(&b, s + 8, n - 8);
    } else if (n > 0) {
        memcpy(&a, s, n);
    }
    h = mix(a ^ h ^ 0xE7037ED1A0B428DBull, b ^ 0x589965CC75374CC3ull);
    return mix(h ^ 0x1D8E4E27C47D124Full, 0x9E3779B97F4A7C15ull);
}
