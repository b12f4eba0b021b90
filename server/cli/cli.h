/* The tensorvault command: shared declarations of its subcommands.
 * Invariant: every subcommand returns the process exit status (0 success,
 * 1 failure with one clear line on stderr, 2 usage error). */
#ifndef TV_CLI_H
#define TV_CLI_H

#include <stdbool.h>
#include <stdio.h>

#include "tensorvault/errors.h"

#define TV_EXIT_OK 0
#define TV_EXIT_FAIL 1
#define TV_EXIT_USAGE 2

/* Usage lines (after "tensorvault "), shared by --help and each command's
 * usage errors. */
/* clang-format off */
#define TV_CLI_USAGE_INSPECT "inspect PATH [--json]"
#define TV_CLI_USAGE_STORE "store init --store DIR (--image FILE --size SIZE | --device PATH) [--region-offset SIZE] [--region-size SIZE] [--force] [--json]"
#define TV_CLI_USAGE_IMPORT "import --store DIR NAME SRC [--activate] [--strict] [--replicas DEV,...] [--chunk SIZE] [--json]"
#define TV_CLI_USAGE_MODELS "models --store DIR [--json]"
#define TV_CLI_USAGE_GENERATIONS "generations --store DIR NAME [--json]"
#define TV_CLI_USAGE_TENSORS "tensors --store DIR NAME[@GEN] [--json]"
#define TV_CLI_USAGE_DEVICES "devices --store DIR [--json]"
#define TV_CLI_USAGE_ACTIVATE "activate --store DIR NAME GEN [--json]"
#define TV_CLI_USAGE_RETIRE "retire --store DIR NAME GEN [--json]"
#define TV_CLI_USAGE_GC "gc --store DIR [--json]"
#define TV_CLI_USAGE_VERIFY "verify --store DIR [--json]"
#define TV_CLI_USAGE_GET "get --store DIR NAME[@GEN] TENSOR -o FILE|- [--rows R0:R1 | --f32] [--engine auto|uring|pread] [--qd N] [--chunk SIZE] [--no-direct] [--json]"
#define TV_CLI_USAGE_BENCH "bench --store DIR NAME[@GEN] [--latency TENSOR [--count N]] [--fresh] [--copy-threads N] [--engine auto|uring|pread] [--qd N] [--chunk SIZE] [--no-direct] [--json]"
/* clang-format on */

typedef struct tv_cli_cmd {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *usage;
} tv_cli_cmd;

int tv_cli_inspect(int argc, char **argv);
int tv_cli_store(int argc, char **argv);
int tv_cli_import(int argc, char **argv);
int tv_cli_models(int argc, char **argv);
int tv_cli_generations(int argc, char **argv);
int tv_cli_tensors(int argc, char **argv);
int tv_cli_devices(int argc, char **argv);
int tv_cli_activate(int argc, char **argv);
int tv_cli_retire(int argc, char **argv);
int tv_cli_gc(int argc, char **argv);
int tv_cli_verify(int argc, char **argv);
int tv_cli_get_tensor(int argc, char **argv);
int tv_cli_bench(int argc, char **argv);

/* The whole CLI: dispatches argv[1] to its subcommand; returns the exit status. */
int tv__cli_main(int argc, char **argv);

/* Sets err to code with "what: strerror" and returns code. */
int tv__cli_err(tv_error *err, int code, const char *what);

/* 0 when dir looks like a store (a directory holding registry.db); else
 * TV_E_NOT_FOUND with "DIR is not a tensorvault store (reason)" for a
 * missing path, a file or a directory without registry.db, or -errno
 * naming dir when it cannot be examined (EACCES...). */
int tv__cli_check_store(const char *dir, tv_error *err);

/* Prints "tensorvault: CMD: NAME: message" to stderr and, with json, the
 * error object {"error":{"code","message"}} to stdout. */
void tv_cli_fail(const char *cmd, bool json, int code, const char *msg);

#endif
