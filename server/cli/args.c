/* Option and value parsing for the CLI; see args.h for the grammars. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "util/internal.h"

int tv__cli_usage(const char *cmd, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "tensorvault: %s: %s\n", cmd, msg);
    return 2;
}

/* The index of the option arg[0..nl) names, or -1. */
static int find_opt(const tv__cli_args *a, const char *arg, size_t nl)
{
    for (size_t k = 0; k < a->n_opts; k++)
        if (strlen(a->opts[k].name) == nl && !strncmp(a->opts[k].name, arg, nl))
            return (int)k;
    return -1;
}

/* Whether arg looks like an option of this command ("--store", "--store=x",
 * "-o"): then it cannot be the value of the option before it. */
static bool is_known_opt(const tv__cli_args *a, const char *arg)
{
    if (arg[0] != '-' || !arg[1])
        return false;
    const char *eq = strchr(arg, '=');
    return find_opt(a, arg, eq ? (size_t)(eq - arg) : strlen(arg)) >= 0;
}

/* An optional value ("[SOCKET]") is the next argument only when that names
 * an existing UNIX socket: anything else is left as a positional. */
static bool takes_optional(const tv__cli_args *a, const char *next)
{
    struct stat st;
    return !is_known_opt(a, next) && stat(next, &st) == 0 && S_ISSOCK(st.st_mode);
}

int tv__cli_parse(const char *cmd, int argc, char **argv, tv__cli_args *a)
{
    bool opts_done = false;
    a->n_pos = 0;
    if (a->n_opts > TV__CLI_MAX_OPTS)
        a->n_opts = TV__CLI_MAX_OPTS; /* a table bug; the tests check every table */
    for (size_t k = 0; k < TV__CLI_MAX_OPTS; k++)
        a->values[k] = NULL;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!opts_done && !strcmp(arg, "--")) {
            opts_done = true;
            continue;
        }
        /* "--long", "--long=value", and short options declared as such ("-o");
         * a lone "-" is a positional, and so is "-1" (no option starts with a
         * digit), for the positional's own parser to name. */
        if (!opts_done && arg[0] == '-' && arg[1] && !(arg[1] >= '0' && arg[1] <= '9')) {
            const char *eq = strchr(arg, '=');
            size_t nl = eq ? (size_t)(eq - arg) : strlen(arg);
            int k = find_opt(a, arg, nl);
            if (k < 0)
                return tv__cli_usage(cmd, "unknown option '%.*s'", (int)nl, arg);
            const tv__cli_opt *o = &a->opts[k];
            if (a->values[k])
                return tv__cli_usage(cmd, "%s given twice", o->name);
            if (!o->metavar) {
                if (eq)
                    return tv__cli_usage(cmd, "%s takes no value", o->name);
                a->values[k] = "1";
                continue;
            }
            const char *v = NULL;
            if (eq)
                v = eq + 1;
            else if (o->metavar[0] == '[') /* optional value: "" when absent */
                v = i + 1 < argc && takes_optional(a, argv[i + 1]) ? argv[++i] : "";
            else if (i + 1 < argc && !is_known_opt(a, argv[i + 1]))
                v = argv[++i];
            if (!v)
                return tv__cli_usage(cmd, "%s needs a value", o->name);
            if (!*v && (eq || o->metavar[0] != '['))
                return tv__cli_usage(cmd, "%s needs a non-empty value", o->name);
            a->values[k] = v;
        } else {
            if (a->n_pos == TV_ARRAY_LEN(a->pos))
                return tv__cli_usage(cmd, "too many arguments (unexpected '%s')", arg);
            a->pos[a->n_pos++] = arg;
        }
    }
    return 0;
}

const char *tv__cli_get(const tv__cli_args *a, const char *name)
{
    int k = find_opt(a, name, strlen(name));
    return k < 0 ? NULL : a->values[k];
}

bool tv__cli_flag(const tv__cli_args *a, const char *name)
{
    return tv__cli_get(a, name) != NULL;
}

/* Appends s to buf (used bytes in *off), truncating. */
static void append(char *buf, size_t len, size_t *off, const char *s)
{
    int w = snprintf(buf + *off, len - *off, "%s", s);
    *off = w < 0 || (size_t)w >= len - *off ? len - 1 : *off + (size_t)w;
}

const char *tv__cli_usage_line(const char *name, bool store, const char *positionals,
                               const tv__cli_opt *opts, size_t n_opts, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    append(buf, len, &off, name);
    if (store)
        append(buf, len, &off, " --store DIR");
    if (positionals && *positionals) {
        append(buf, len, &off, " ");
        append(buf, len, &off, positionals);
    }
    for (size_t k = 0; k < n_opts; k++) {
        const tv__cli_opt *o = &opts[k];
        if ((store && !strcmp(o->name, "--store")) || (o->usage && !*o->usage))
            continue;
        append(buf, len, &off, " ");
        if (o->usage) {
            append(buf, len, &off, o->usage);
            continue;
        }
        append(buf, len, &off, "[");
        append(buf, len, &off, o->name);
        if (o->metavar) {
            append(buf, len, &off, " ");
            append(buf, len, &off, o->metavar);
        }
        append(buf, len, &off, "]");
    }
    return buf;
}

int tv__cli_npos(const char *cmd, const tv__cli_args *a, size_t min, size_t max, const char *usage)
{
    if (a->n_pos > max)
        return tv__cli_usage(cmd, "unexpected argument '%s' (usage: tensorvault %s)", a->pos[max],
                             usage);
    if (a->n_pos < min) {
        fprintf(stderr, "usage: tensorvault %s\n", usage);
        return 2;
    }
    return 0;
}

/* Scans the decimal digits at s; returns where they end. *overflow is set
 * when the value does not fit 64 bits (*v is then meaningless). */
static const char *scan_digits(const char *s, uint64_t *v, bool *overflow)
{
    *v = 0;
    *overflow = false;
    for (; *s >= '0' && *s <= '9'; s++)
        if (tv__mul_u64(*v, 10, v) || tv__add_u64(*v, (uint64_t)(*s - '0'), v))
            *overflow = true;
    return s;
}

int tv__cli_parse_uint(const char *s, uint64_t max, uint64_t *out)
{
    uint64_t v;
    bool ovf;
    if (!s || !out)
        return -EINVAL;
    const char *end = scan_digits(s, &v, &ovf);
    if (end == s || *end)
        return -EINVAL;
    if (ovf || v > max)
        return -ERANGE;
    *out = v;
    return 0;
}

int tv__cli_parse_gen(const char *s, int64_t *gen)
{
    uint64_t v;
    if (!s || !gen || s[0] < '1' || s[0] > '9')
        return -EINVAL;
    int rc = tv__cli_parse_uint(s, INT64_MAX, &v);
    if (rc)
        return rc;
    *gen = (int64_t)v;
    return 0;
}

int tv__cli_parse_spec(const char *spec, char *name, size_t name_len, int64_t *gen,
                       const char **gen_str)
{
    if (gen_str)
        *gen_str = NULL;
    if (!spec || !name || !gen)
        return -EINVAL;
    const char *at = strrchr(spec, '@');
    size_t nl = at ? (size_t)(at - spec) : strlen(spec);
    if (nl == 0 || nl >= name_len)
        return -EINVAL;
    int64_t g = 0;
    if (at) {
        if (gen_str)
            *gen_str = at + 1;
        int rc = tv__cli_parse_gen(at + 1, &g);
        if (rc)
            return rc;
    }
    memcpy(name, spec, nl);
    name[nl] = '\0';
    *gen = g;
    return 0;
}

int tv__cli_parse_ref(const char *spec, char *name, size_t name_len, char *gen, size_t gen_len)
{
    if (!spec || !name || !gen || gen_len < 7)
        return -EINVAL;
    const char *at = strrchr(spec, '@');
    size_t nl = at ? (size_t)(at - spec) : strlen(spec);
    if (nl == 0 || nl >= name_len)
        return -EINVAL;
    const char *g = at ? at + 1 : "active";
    size_t gl = strlen(g);
    if (gl == 0 || gl >= gen_len)
        return -EINVAL;
    if (g[0] >= '0' && g[0] <= '9') {
        int64_t n;
        int rc = tv__cli_parse_gen(g, &n);
        if (rc)
            return rc;
    } else {
        bool ok = (g[0] >= 'A' && g[0] <= 'Z') || (g[0] >= 'a' && g[0] <= 'z');
        for (size_t i = 1; ok && i < gl; i++)
            ok = (g[i] >= 'A' && g[i] <= 'Z') || (g[i] >= 'a' && g[i] <= 'z') ||
                 (g[i] >= '0' && g[i] <= '9') || g[i] == '.' || g[i] == '_' || g[i] == '-';
        if (!ok || gl > 64)
            return -EINVAL;
    }
    memcpy(name, spec, nl);
    name[nl] = '\0';
    memcpy(gen, g, gl + 1);
    return 0;
}

int tv__cli_parse_rows(const char *s, uint64_t *r0, uint64_t *r1)
{
    uint64_t a, b;
    bool ovf_a, ovf_b;
    if (!s || !r0 || !r1)
        return -EINVAL;
    const char *end = scan_digits(s, &a, &ovf_a);
    if (end == s || *end != ':')
        return -EINVAL;
    const char *second = end + 1;
    end = scan_digits(second, &b, &ovf_b);
    if (end == second || *end)
        return -EINVAL;
    if (ovf_a || ovf_b)
        return -ERANGE;
    if (a > b)
        return -EDOM;
    *r0 = a;
    *r1 = b;
    return 0;
}

/* s equals lower (which is lower case), ignoring the case of s. */
static bool ieq(const char *s, const char *lower)
{
    for (; *s && *lower; s++, lower++)
        if ((*s >= 'A' && *s <= 'Z' ? *s - 'A' + 'a' : *s) != *lower)
            return false;
    return *s == *lower;
}

int tv__cli_parse_size(const char *s, uint64_t *out)
{
    static const struct {
        const char *suffix; /* lower case */
        unsigned shift;
    } units[] = {{"", 0},   {"k", 10},   {"kib", 10}, {"m", 20},  {"mib", 20},
                 {"g", 30}, {"gib", 30}, {"t", 40},   {"tib", 40}};
    uint64_t v;
    bool ovf;
    if (!s || !out)
        return -EINVAL;
    const char *end = scan_digits(s, &v, &ovf);
    if (end == s)
        return -EINVAL;
    for (size_t u = 0; u < TV_ARRAY_LEN(units); u++) {
        if (!ieq(end, units[u].suffix))
            continue;
        if (ovf || tv__mul_u64(v, (uint64_t)1 << units[u].shift, &v))
            return -ERANGE;
        *out = v;
        return 0;
    }
    return -EINVAL;
}

int tv__cli_parse_list(const char *s, char *buf, size_t buf_len, const char **items,
                       size_t max_items, size_t *n_items, const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    *why = "";
    if (!s || !buf || !items || !n_items)
        return -EINVAL;
    *n_items = 0;
    size_t len = strlen(s);
    if (len == 0) {
        *why = "empty list";
        return -EINVAL;
    }
    if (len >= buf_len) {
        *why = "list too long";
        return -ERANGE;
    }
    memcpy(buf, s, len + 1);
    size_t n = 0;
    char *p = buf;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        if (!*p) {
            *why = "empty item";
            return -EINVAL;
        }
        for (size_t k = 0; k < n; k++)
            if (!strcmp(items[k], p)) {
                *why = "item named twice";
                return -EINVAL;
            }
        if (n == max_items) {
            *why = "too many items";
            return -ERANGE;
        }
        items[n++] = p;
        if (!comma)
            break;
        p = comma + 1;
    }
    *n_items = n;
    return 0;
}

#define SIZE_GRAMMAR                                                                               \
    "digits with an optional binary suffix K, M, G, T or KiB, MiB, GiB, TiB, any case"

int tv__cli_opt_size(const char *cmd, const tv__cli_args *a, const char *name, uint64_t min,
                     uint64_t max, uint64_t *out)
{
    const char *s = tv__cli_get(a, name);
    uint64_t v;
    if (!s)
        return 0;
    int rc = tv__cli_parse_size(s, &v);
    if (rc == -ERANGE)
        return tv__cli_usage(cmd, "%s '%s' overflows 64 bits", name, s);
    if (rc)
        return tv__cli_usage(cmd, "bad %s '%s': %s", name, s, SIZE_GRAMMAR);
    if (v < min && max == UINT64_MAX)
        return tv__cli_usage(cmd, "%s '%s' must be at least %" PRIu64 " bytes", name, s, min);
    if (v < min || v > max)
        return tv__cli_usage(cmd, "%s '%s' is outside [%" PRIu64 ", %" PRIu64 "] bytes", name, s,
                             min, max);
    *out = v;
    return 0;
}

int tv__cli_opt_uint(const char *cmd, const tv__cli_args *a, const char *name, uint64_t min,
                     uint64_t max, uint64_t *out)
{
    const char *s = tv__cli_get(a, name);
    uint64_t v;
    if (!s)
        return 0;
    int rc = tv__cli_parse_uint(s, UINT64_MAX, &v);
    if (rc == -EINVAL)
        return tv__cli_usage(cmd, "bad %s '%s': digits only", name, s);
    if (rc || v < min || v > max)
        return tv__cli_usage(cmd, "%s '%s' is outside [%" PRIu64 ", %" PRIu64 "]", name, s, min,
                             max);
    *out = v;
    return 0;
}

int tv__cli_gen(const char *cmd, const char *s, int64_t *gen)
{
    int rc = tv__cli_parse_gen(s, gen);
    if (rc == -ERANGE)
        return tv__cli_usage(cmd, "generation '%s' is above %" PRId64, s, INT64_MAX);
    if (rc)
        return tv__cli_usage(cmd, "bad generation '%s': %s", s, TV__CLI_GEN_GRAMMAR);
    return 0;
}

int tv__cli_spec(const char *cmd, const char *spec, char *name, size_t name_len, int64_t *gen)
{
    const char *gs;
    int rc = tv__cli_parse_spec(spec, name, name_len, gen, &gs);
    if (rc == -ERANGE)
        return tv__cli_usage(cmd, "generation '%s' in '%s' is above %" PRId64, gs, spec, INT64_MAX);
    if (rc && gs)
        return tv__cli_usage(cmd, "bad generation '%s' in '%s': %s", gs, spec, TV__CLI_GEN_GRAMMAR);
    if (rc)
        return tv__cli_usage(cmd, "bad model '%s' (NAME or NAME@GEN)", spec);
    return 0;
}
