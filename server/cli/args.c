/* Option parsing for the CLI; see args.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"

int tv_cli_parse(const char *cmd, int argc, char **argv, tv_cli_args *a)
{
    a->n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        /* "--long", "--long=value", and short options declared as such ("-o"). */
        if (arg[0] == '-' && arg[1] && (arg[1] != '-' || arg[2])) {
            const char *eq = strchr(arg, '=');
            size_t nl = eq ? (size_t)(eq - arg) : strlen(arg);
            tv_cli_opt *o = NULL;
            for (size_t k = 0; k < a->n_opts; k++)
                if (strlen(a->opts[k].name) == nl && !strncmp(a->opts[k].name, arg, nl))
                    o = &a->opts[k];
            if (!o) {
                fprintf(stderr, "tensorvault: %s: unknown option '%.*s'\n", cmd, (int)nl, arg);
                return 2;
            }
            if (!o->takes_value) {
                if (eq) {
                    fprintf(stderr, "tensorvault: %s: %s takes no value\n", cmd, o->name);
                    return 2;
                }
                o->value = "1";
            } else if (eq) {
                o->value = eq + 1;
            } else if (i + 1 < argc) {
                o->value = argv[++i];
            } else {
                fprintf(stderr, "tensorvault: %s: %s needs a value\n", cmd, o->name);
                return 2;
            }
        } else {
            if (a->n_pos == sizeof(a->pos) / sizeof(a->pos[0])) {
                fprintf(stderr, "tensorvault: %s: too many arguments\n", cmd);
                return 2;
            }
            a->pos[a->n_pos++] = arg;
        }
    }
    return 0;
}

const char *tv_cli_get(const tv_cli_args *a, const char *name)
{
    for (size_t k = 0; k < a->n_opts; k++)
        if (!strcmp(a->opts[k].name, name))
            return a->opts[k].value;
    return NULL;
}

bool tv_cli_flag(const tv_cli_args *a, const char *name)
{
    return tv_cli_get(a, name) != NULL;
}

int tv_cli_parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -1;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
    }
    if (shift && *end == 'i')
        end++;
    if (*end == 'B')
        end++;
    if (*end)
        return -1;
    if (shift && v > (UINT64_MAX >> shift))
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
}
