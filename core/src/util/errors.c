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
    if (code < 0 && code > -4096)
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
    if (code < 0 && code > -4096) {
        const char *n = strerrorname_np(-code);
        if (n)
            return n;
    }
    return "UNKNOWN";
}

int tv__seterr(tv_error *err, int code, const char *fmt, ...)
{
    if (err) {
        err->code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
    }
    return code;
}
