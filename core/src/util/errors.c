/* Error names and descriptions for every return code. Invariant: the table
 * in errors.h is the only source of library codes; errno values are named
 * through strerrorname_np-like mapping of the common ones. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tensorvault/errors.h"
#include "tensorvault/version.h"
#include "util/internal.h"

/* The reserved range of library codes (errors.h). */
#define TV__LIBRARY_CODE(c) ((c) <= -1000 && (c) >= -1999)

TV_API const char *tv_version(void)
{
    return TV_VERSION_STRING;
}

TV_API const char *tv_strerror(int code)
{
    if (code == 0)
        return "success";
    switch (code) {
#define TV__ERR_STR(name, value, desc)                                                             \
    case value:                                                                                    \
        return desc;
        TV_ERROR_TABLE(TV__ERR_STR)
#undef TV__ERR_STR
    default:
        break;
    }
    /* errno values only: an unassigned library code is not "Unknown error 1005". */
    if (code < 0 && code > -4096 && !TV__LIBRARY_CODE(code))
        return strerror(-code);
    return "unknown error";
}

TV_API const char *tv_err_name(int code)
{
    if (code == 0)
        return "OK";
    switch (code) {
#define TV__ERR_NAME(name, value, desc)                                                            \
    case value:                                                                                    \
        return #name;
        TV_ERROR_TABLE(TV__ERR_NAME)
#undef TV__ERR_NAME
    default:
        break;
    }
    if (code < 0 && code > -4096 && !TV__LIBRARY_CODE(code)) {
        const char *n = strerrorname_np(-code);
        if (n)
            return n;
    }
    return "UNKNOWN";
}

int tv__seterr(tv_error *err, int code, const char *fmt, ...)
{
    if (err) {
        /* Formatted aside first: an argument may be err->msg itself. */
        char msg[sizeof(err->msg)];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        memcpy(err->msg, msg, sizeof(msg));
        err->code = code;
    }
    return code;
}

int tv__seterr_wrap(tv_error *err, int code, const char *fmt, ...)
{
    if (err) {
        char prefix[sizeof(err->msg)], old[sizeof(err->msg)];
        memcpy(old, err->msg, sizeof(old));
        old[sizeof(old) - 1] = '\0';
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(prefix, sizeof(prefix), fmt, ap);
        va_end(ap);
        /* "prefix: old", truncated to the buffer. */
        size_t at = strlen(prefix), cap = sizeof(err->msg) - 1;
        memcpy(err->msg, prefix, at);
        if (old[0] && at + 2 <= cap) {
            memcpy(err->msg + at, ": ", 2);
            at += 2;
            size_t n = strlen(old);
            if (n > cap - at)
                n = cap - at;
            memcpy(err->msg + at, old, n);
            at += n;
        }
        err->msg[at] = '\0';
        err->code = code;
    }
    return code;
}
