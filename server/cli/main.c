/* The tensorvault command's dispatcher, tv__cli_main (in the tv_server
 * library so test tools can run the same CLI; main() is cli/entry.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/cli.h"
#include "util/internal.h"
#include "tensorvault/errors.h"
#include "tensorvault/version.h"

static const tv_cli_cmd g_cmds[] = {
    {"inspect", tv_cli_inspect, "inspect PATH [--json]"},
    {"store", tv_cli_store,
     "store init --store DIR (--image FILE --size SIZE | --device PATH) [--region-offset BYTES] "
     "[--region-size BYTES]"},
    {"import", tv_cli_import,
     "import --store DIR NAME SRC [--activate] [--strict] [--replicas DEV,...]"},
    {"models", tv_cli_models, "models --store DIR"},
    {"generations", tv_cli_generations, "generations --store DIR NAME"},
    {"tensors", tv_cli_tensors, "tensors --store DIR NAME[@GEN]"},
    {"devices", tv_cli_devices, "devices --store DIR"},
    {"activate", tv_cli_activate, "activate --store DIR NAME GEN"},
    {"retire", tv_cli_retire, "retire --store DIR NAME GEN"},
    {"gc", tv_cli_gc, "gc --store DIR"},
    {"verify", tv_cli_verify, "verify --store DIR"},
    {"get", tv_cli_get_tensor, "get --store DIR NAME[@GEN] TENSOR -o FILE [--rows R0:R1 | --f32]"},
    {"bench", tv_cli_bench, "bench --store DIR NAME[@GEN] [--engine auto|uring|pread] [--qd N]"},
};

int tv__cli_err(tv_error *err, int code, const char *what)
{
    if (err) {
        err->code = code;
        snprintf(err->msg, sizeof(err->msg), "%s: %s", what, tv_strerror(code));
    }
    return code;
}

void tv_cli_fail(const char *cmd, bool json, int code, const char *msg)
{
    fprintf(stderr, "tensorvault: %s: %s: %s\n", cmd, tv_err_name(code), msg);
    if (json) {
        json_t *o = json_pack("{s:{s:s,s:i,s:s}}", "error", "code", tv_err_name(code), "errno",
                              code, "message", msg);
        if (o) {
            json_dumpf(o, stdout, JSON_INDENT(2));
            fputc('\n', stdout);
            json_decref(o);
        }
    }
}

static void usage(FILE *f)
{
    fprintf(f, "usage: tensorvault COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(g_cmds) / sizeof(g_cmds[0]); i++)
        fprintf(f, "  %s\n", g_cmds[i].usage);
    fprintf(f, "  version\n\nEvery command takes --json. --store defaults to $TENSORVAULT_STORE.\n");
}

static void set_log_level(void)
{
    /* The CLI is quiet by default: warnings and errors only. */
    const char *lv = getenv("TENSORVAULT_LOG");
    int level = TV_LOG_WARN;
    if (lv && !strcmp(lv, "debug"))
        level = TV_LOG_DEBUG;
    else if (lv && !strcmp(lv, "info"))
        level = TV_LOG_INFO;
    else if (lv && !strcmp(lv, "error"))
        level = TV_LOG_ERROR;
    tv__log_set_level(level);
}

int tv__cli_main(int argc, char **argv)
{
    set_log_level();
    if (argc < 2) {
        usage(stderr);
        return TV_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return TV_EXIT_OK;
    }
    if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
        printf("tensorvault %s\n", tv_version());
        return TV_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof(g_cmds) / sizeof(g_cmds[0]); i++)
        if (!strcmp(argv[1], g_cmds[i].name))
            return g_cmds[i].run(argc - 1, argv + 1);
    fprintf(stderr, "tensorvault: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return TV_EXIT_USAGE;
}
