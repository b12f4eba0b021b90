/* Option and value parsers shared by the CLI subcommands: --flag,
 * --opt VALUE, --opt=VALUE, positionals, and the one parser of each value
 * kind (generation, model spec, rows, size, unsigned count, list).
 *
 * Invariants: unknown options, an option given twice, a missing or empty
 * value (but an optional one, metavar "[...]") and (checked by each command)
 * extra positionals are usage errors
 * (exit 2); a value parser accepts exactly the grammar documented here and
 * refuses everything else, overflow included, before anything is opened. */
#ifndef TV_CLI_ARGS_H
#define TV_CLI_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bounds the CLI checks before the library sees a value (the library
 * checks again). Staging memory is queue depth x chunk for get/bench and
 * 4 buffers x chunk for import. */
#define TV__CLI_MIN_CHUNK   ((uint64_t)4 << 10)
#define TV__CLI_MAX_CHUNK   ((uint64_t)1 << 30)
#define TV__CLI_MAX_STAGING ((uint64_t)1 << 30)
#define TV__CLI_IMPORT_BUFS 4
#define TV__CLI_MAX_QD      4096
#define TV__CLI_MAX_COUNT   10000000

/* The generation grammar, for messages and --help. */
#define TV__CLI_GEN_GRAMMAR                                                                        \
    "a generation is a number from 1, digits only (no sign, spaces or leading zeros)"

#define TV__CLI_ALIAS_LEN 72 /* an alias (64 bytes) or a generation, NUL included */

#define TV__CLI_ALIAS_GRAMMAR "a letter, then up to 63 letters, digits, '.', '_' or '-'; or active"

/* One option of a command's table. The usage line shows it as usage, or
 * (usage NULL) as "[NAME METAVAR]" / "[NAME]"; usage "" shows nothing (an
 * alias, or an option that a neighbour's usage text shows). help is the
 * option's line in the command's --help. */
typedef struct tv__cli_opt {
    const char *name;    /* "--store" */
    const char *metavar; /* "DIR" for an option with a value; NULL for a flag; "[SOCKET]"
                            (starting with '['): an optional value, taken from the next
                            argument only when that names an existing UNIX socket, else
                            the option's value is "" (--opt=VALUE always gives one) */
    const char *usage;
    const char *help; /* what it does: "read every object back and re-hash it" */
} tv__cli_opt;

#define TV__CLI_MAX_OPTS 24
#define TV__CLI_MAX_POS  8

typedef struct tv__cli_args {
    const tv__cli_opt *opts;
    size_t n_opts;                        /* at most TV__CLI_MAX_OPTS */
    const char *values[TV__CLI_MAX_OPTS]; /* per option, set when seen (flags get "1") */
    const char *pos[TV__CLI_MAX_POS];
    size_t n_pos;
} tv__cli_args;

/* Returns 0, or prints "tensorvault: CMD: reason" and returns 2 (usage):
 * unknown option, option given twice, value missing (end of arguments, or
 * the next argument is an option of this command) or empty, flag given a
 * value, more than 8 positionals. "--" ends the options. argv[0] is the
 * subcommand name. a->opts and a->n_opts name the table. */
int tv__cli_parse(const char *cmd, int argc, char **argv, tv__cli_args *a);
const char *tv__cli_get(const tv__cli_args *a, const char *name);
bool tv__cli_flag(const tv__cli_args *a, const char *name);

/* The usage line (after "tensorvault "): NAME, "--store DIR" when store,
 * the positionals text, then every option of the table in order. Returns
 * buf (truncated to len). */
const char *tv__cli_usage_line(const char *name, bool store, const char *positionals,
                               const tv__cli_opt *opts, size_t n_opts, char *buf, size_t len);

/* Prints "tensorvault: CMD: message" to stderr; returns 2 (usage). */
int tv__cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Positional count in [min, max], else a usage error naming the first
 * extra argument (or the usage line when too few). Returns 0 or 2. */
int tv__cli_npos(const char *cmd, const tv__cli_args *a, size_t min, size_t max, const char *usage);

/* ---- value parsers: return 0, -EINVAL (grammar) or -ERANGE (overflow) ---- */

/* A generation number: [1-9][0-9]*, at most INT64_MAX. Refuses "", "0",
 * "01", "+1", "-1", " 1", "1 " and overflow. */
int tv__cli_parse_gen(const char *s, int64_t *gen);

/* "NAME" (gen 0 = the active generation) or "NAME@GEN", split at the last
 * '@' as tv_model_open does; NAME is non-empty and shorter than name_len.
 * -EINVAL for a bad NAME, or the generation parser's code for a bad GEN;
 * *gen_str (may be NULL) points at the text after '@' (NULL without one). */
int tv__cli_parse_spec(const char *spec, char *name, size_t name_len, int64_t *gen,
                       const char **gen_str);

/* "NAME", "NAME@GEN" or "NAME@ALIAS", split at the last '@': NAME is
 * non-empty and shorter than name_len; gen gets the generation spec
 * ("active" without '@'): a generation number (tv__cli_parse_gen grammar:
 * its code on a bad number), "active", or an alias name
 * [A-Za-z][A-Za-z0-9._-]{0,63}. -EINVAL for anything else. */
int tv__cli_parse_ref(const char *spec, char *name, size_t name_len, char *gen, size_t gen_len);

/* Decimal digits only (leading zeros allowed, no sign or space), at most
 * max: -ERANGE above it. */
int tv__cli_parse_uint(const char *s, uint64_t max, uint64_t *out);

/* "R0:R1", both decimal (tv__cli_parse_uint grammar), R0 <= R1 (R0 == R1
 * is an empty range, as numpy's a[r:r]). -ERANGE when a bound overflows
 * 64 bits; -EDOM when R0 > R1 (numpy would give an empty slice: refused
 * here as a likely typo); -EINVAL for anything else. */
int tv__cli_parse_rows(const char *s, uint64_t *r0, uint64_t *r1);

/* A size: decimal digits, optionally followed by a binary suffix K, M, G,
 * T or KiB, MiB, GiB, TiB in any case (k = kib = 1024; all powers of
 * 1024). "1GB", "1B", "1.5G", "1 G", signs, spaces, hex and exponents are
 * -EINVAL; a value or product above 2^64-1 is -ERANGE. */
int tv__cli_parse_size(const char *s, uint64_t *out);

/* A comma-separated list of non-empty, distinct items ("a,b,c"): copies s
 * into buf (buf_len bytes) and points items[] into it. Refuses "", ",",
 * "a,,b", "a,", ",a", duplicates and more than max_items items; *why (may
 * be NULL) gets a static reason. Returns 0 or -EINVAL (-ERANGE when s does
 * not fit buf or there are too many items). */
int tv__cli_parse_list(const char *s, char *buf, size_t buf_len, const char **items,
                       size_t max_items, size_t *n_items, const char **why);

/* A GEN argument, or NAME[@GEN]: a bad value prints a usage error naming
 * it and the grammar and returns 2; else 0. */
int tv__cli_gen(const char *cmd, const char *s, int64_t *gen);
int tv__cli_spec(const char *cmd, const char *spec, char *name, size_t name_len, int64_t *gen);

/* --NAME as a size in [min, max]: absent leaves *out untouched and returns
 * 0; a bad or out-of-range value prints a usage error naming the value and
 * the bounds and returns 2. */
int tv__cli_opt_size(const char *cmd, const tv__cli_args *a, const char *name, uint64_t min,
                     uint64_t max, uint64_t *out);
/* The same for a plain unsigned count. */
int tv__cli_opt_uint(const char *cmd, const tv__cli_args *a, const char *name, uint64_t min,
                     uint64_t max, uint64_t *out);

#endif
