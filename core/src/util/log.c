/* Logging: one line per event to stderr, journald-friendly. Invariant: a
 * single fprintf per line so concurrent threads do not interleave. */
#include <stdarg.h>
#include <stdio.h>

#include "util/internal.h"

static int g_level = TV_LOG_INFO;

void tv__log_set_level(int level)
{
    g_level = level;
}

void tv__log(int level, const char *fmt, ...)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    if (level < g_level || level < 0 || level > TV_LOG_ERROR)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "tensorvault[%s] %s\n", names[level], line);
}
