/* Test tool: the tensorvault CLI (the same dispatcher, tv__cli_main) with a
 * crash hook installed, for the kill -9 tests. Shipped binaries have no hook
 * and never read these variables.
 *   TV_TEST_CRASH_AT=POINT[#N]  kill -9 self at the Nth (default first) time
 *                               the named crash point is reached
 *   TV_TEST_CRASH_TRACE=FILE    append every crash point reached, one a line
 * Crash point names: see the list in core/src/util/sys.h. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "util/sys.h"

static char g_want[128];
static long g_want_nth = 1;
static long g_hits;
static const char *g_trace;

static void crash_hook(const char *point)
{
    if (g_trace) {
        int fd = open(g_trace, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) {
            char line[160];
            int n = snprintf(line, sizeof line, "%s\n", point);
            if (n > 0 && write(fd, line, (size_t)n) < 0)
                perror("tensorvault_crashtest: trace");
            close(fd);
        }
    }
    if (g_want[0] && strcmp(g_want, point) == 0 && ++g_hits == g_want_nth) {
        fprintf(stderr, "tensorvault: test crash point '%s': kill -9 self\n", point);
        kill(getpid(), SIGKILL);
    }
}

int main(int argc, char **argv)
{
    const char *at = getenv("TV_TEST_CRASH_AT");
    g_trace = getenv("TV_TEST_CRASH_TRACE");
    if (at && *at) {
        snprintf(g_want, sizeof g_want, "%s", at);
        char *hash = strchr(g_want, '#');
        if (hash) {
            *hash = '\0';
            g_want_nth = strtol(hash + 1, NULL, 10);
            if (g_want_nth < 1) {
                fprintf(stderr, "tensorvault_crashtest: bad TV_TEST_CRASH_AT '%s'\n", at);
                return 2;
            }
        }
    }
    if (g_want[0] || g_trace)
        tv__sys_crash_hook = crash_hook;
    return tv__cli_main(argc, argv);
}
