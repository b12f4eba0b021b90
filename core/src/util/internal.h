/* Cross-file internals of libtensorvault: export macro, error helpers,
 * checked arithmetic, logging.
 *
 * Invariants: every addition, multiplication and alignment on sizes or
 * offsets goes through the checked helpers here (they return true on
 * overflow, like the __builtin_*_overflow family they wrap); tv__seterr
 * always returns the code it stored so callers can `return tv__seterr(...)`. */
#ifndef TV_UTIL_INTERNAL_H
#define TV_UTIL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensorvault/errors.h"

#define TV_API          __attribute__((visibility("default")))
#define TV_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define TV_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Fills err (if non-NULL) with code and a formatted message; returns code. */
int tv__seterr(tv_error *err, int code, const char *fmt, ...) TV_PRINTF(3, 4);
/* Prefixes err's current message: "PREFIX: old message" (just PREFIX when
 * err has none), code replaced; the old message is copied aside first, so
 * fmt's arguments may include err->msg. Returns code. */
int tv__seterr_wrap(tv_error *err, int code, const char *fmt, ...) TV_PRINTF(3, 4);

static inline bool tv__add_u64(uint64_t a, uint64_t b, uint64_t *r)
{
    return __builtin_add_overflow(a, b, r);
}
static inline bool tv__mul_u64(uint64_t a, uint64_t b, uint64_t *r)
{
    return __builtin_mul_overflow(a, b, r);
}
/* align must be a power of two or any non-zero value; result is the next
 * multiple of align at or above v. */
static inline bool tv__align_up_u64(uint64_t v, uint64_t align, uint64_t *r)
{
    if (align == 0)
        return true;
    uint64_t rem = v % align;
    if (rem == 0) {
        *r = v;
        return false;
    }
    return tv__add_u64(v - rem, align, r);
}
static inline uint64_t tv__align_down_u64(uint64_t v, uint64_t align)
{
    return align ? v - v % align : v;
}
/* A canonical positive decimal (an id or generation number from text: a URL
 * segment, a cursor): 1..INT64_MAX, digits only, no sign, space or leading
 * zero. False for anything else (*out untouched). */
static inline bool tv__parse_pos_i64(const char *s, int64_t *out)
{
    uint64_t v = 0;
    size_t i = 0;
    if (!s || s[0] < '1' || s[0] > '9')
        return false;
    for (; s[i] >= '0' && s[i] <= '9'; i++) {
        if (i >= 19) /* more than 19 digits is over INT64_MAX */
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (s[i] || v > (uint64_t)INT64_MAX)
        return false;
    *out = (int64_t)v;
    return true;
}
static inline uint64_t tv__gcd_u64(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}
/* lcm with overflow check; lcm(0, x) is treated as overflow (invalid). */
static inline bool tv__lcm_u64(uint64_t a, uint64_t b, uint64_t *r)
{
    if (a == 0 || b == 0)
        return true;
    return tv__mul_u64(a / tv__gcd_u64(a, b), b, r);
}

enum tv_log_level { TV_LOG_DEBUG = 0, TV_LOG_INFO, TV_LOG_WARN, TV_LOG_ERROR };
/* One line per event to stderr: "tensorvault[level] message". */
void tv__log(int level, const char *fmt, ...) TV_PRINTF(2, 3);
void tv__log_set_level(int level);

#endif
