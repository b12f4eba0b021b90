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
    {"inspect", tv_cli_inspect, TV_CLI_USAGE_INSPECT},
    {"store", tv_cli_store, TV_CLI_USAGE_STORE},
    {"import", tv_cli_import, TV_CLI_USAGE_IMPORT},
    {"models", tv_cli_models, TV_CLI_USAGE_MODELS},
    {"generations", tv_cli_generations, TV_CLI_USAGE_GENERATIONS},
    {"tensors", tv_cli_tensors, TV_CLI_USAGE_TENSORS},
    {"devices", tv_cli_devices, TV_CLI_USAGE_DEVICES},
    {"activate", tv_cli_activate, TV_CLI_USAGE_ACTIVATE},
    {"retire", tv_cli_retire, TV_CLI_USAGE_RETIRE},
    {"gc", tv_cli_gc, TV_CLI_USAGE_GC},
    {"verify", tv_cli_verify, TV_CLI_USAGE_VERIFY},
    {"get", tv_cli_get_tensor, TV_CLI_USAGE_GET},
    {"bench", tv_cli_bench, TV_CLI_USAGE_BENCH},
};

int tv__cli_err(tv_error *err, int code, const char *what)
{
    /* tv__seterr formats aside, so what may be err->msg itself. */
    return tv__seterr(err, code, "%s: %s", what, tv_strerror(code));
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

/* The value grammars every command shares (args.h has the parsers). */
static void notes(FILE *f)
{
    fputs("\nEvery command takes --json. --store defaults to $TENSORVAULT_STORE.\n", f);
    fputs("Options: each at most once; --opt VALUE or --opt=VALUE; -- ends the options.\n", f);
    fputs("SIZE: bytes, or digits with a binary suffix K, M, G, T or\n", f);
    fputs("  KiB, MiB, GiB, TiB in any case (all powers of 1024: 64K = 64kib = 65536);\n", f);
    fputs("  1GB, 1B, 1.5G, 1 G, signs and sizes above 2^64-1 are refused.\n", f);
    fputs("GEN: a generation number from 1, digits only (no sign, spaces, leading zeros).\n", f);
    fputs("R0:R1 (get --rows): rows [R0, R1) of dimension 0, decimal,\n", f);
    fputs("  0 <= R0 <= R1 <= dim 0; R0 == R1 writes nothing (numpy's a[r:r] is empty).\n", f);
    fputs("get, bench: --qd 1..4096 (default 32), --chunk 4K..1G (default 1M, rounded\n", f);
    fputs("  up to the device's io alignment), --qd x --chunk at most 1G.\n", f);
    fputs("import: --chunk 4K..256M (default 8M; 4 chunks in flight).\n", f);
    fputs("store init: --region-offset is a multiple of the device's io alignment.\n", f);
    fputs("Exit status: 0 success, 1 failure, 2 usage error.\n", f);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: tensorvault COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(g_cmds) / sizeof(g_cmds[0]); i++)
        fprintf(f, "  %s\n", g_cmds[i].usage);
    fprintf(f, "  version\n");
    notes(f);
}

/* `tensorvault CMD --help` (or -h right after CMD): its usage and the notes. */
static bool wants_help(int argc, char **argv)
{
    if (argc > 2 && !strcmp(argv[2], "-h"))
        return true;
    for (int i = 2; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--help"))
            return true;
    return false;
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
    if ((!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) && argc > 2) {
        fprintf(stderr, "tensorvault: version: unexpected argument '%s'\n", argv[2]);
        return TV_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
        printf("tensorvault %s\n", tv_version());
        return TV_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof(g_cmds) / sizeof(g_cmds[0]); i++) {
        if (strcmp(argv[1], g_cmds[i].name))
            continue;
        if (wants_help(argc, argv)) {
            printf("usage: tensorvault %s\n", g_cmds[i].usage);
            notes(stdout);
            return TV_EXIT_OK;
        }
        return g_cmds[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "tensorvault: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return TV_EXIT_USAGE;
}
