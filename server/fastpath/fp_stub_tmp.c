/* TEMPORARY stub of the fast-path server (fastpath.h) until the server
 * helper's fastpath.c is on main: the daemon links, logs that the fast path
 * is not built, and lists no sessions. Delete when fastpath.c lands. */
#include <string.h>

#include "fastpath/fastpath.h"
#include "tensorvault/errors.h"

int tv__fp_start(const tv__fp_opts *opts, tv__fp **out, tv_error *err)
{
    (void)opts;
    if (out)
        *out = NULL;
    return tv__seterr(err, TV_E_NOT_SUPPORTED, "the fast-path server is not built yet");
}

void tv__fp_stop(tv__fp *fp)
{
    (void)fp;
}

int tv__fp_sessions(tv__fp *fp, tv__fp_session_info **out, size_t *n)
{
    (void)fp;
    *out = NULL;
    *n = 0;
    return 0;
}

void tv__fp_sessions_free(tv__fp_session_info *s, size_t n)
{
    (void)s;
    (void)n;
}

void tv__fp_get_stats(const tv__fp *fp, tv__fp_stats *out)
{
    (void)fp;
    memset(out, 0, sizeof(*out));
}
