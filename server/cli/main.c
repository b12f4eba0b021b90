/* Entry point of the tensorvault command: dispatches to subcommands. */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "tensorvault/errors.h"
#include "tensorvault/version.h"

static const tv_cli_cmd g_cmds[] = {
    {"inspect", tv_cli_inspect, "inspect PATH [--json]   list a checkpoint's tensors and shards"},
};

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
    fprintf(f, "  version\n");
}

int main(int argc, char **argv)
{
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
