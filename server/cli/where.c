/* Finding tensorvaultd's sockets, URL and admin token; see where.h. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/where.h"
#include "util/internal.h"

const tv__cli_defaults tv__cli_socket_defaults = {TV__CLI_INSTALLED_SOCKET, TV__CLI_DEV_SOCKET};
const tv__cli_defaults tv__cli_http_defaults = {TV__CLI_INSTALLED_HTTP, TV__CLI_DEV_HTTP};
const tv__cli_defaults tv__cli_token_defaults = {TV__CLI_INSTALLED_TOKEN, TV__CLI_DEV_TOKEN};

const char *tv__cli_abs(const char *rel, char *out, size_t len)
{
    char cwd[TV__CLI_WHERE_MAX];
    if (rel[0] == '/' || !getcwd(cwd, sizeof cwd))
        snprintf(out, len, "%s", rel);
    else
        snprintf(out, len, "%s/%s", strcmp(cwd, "/") ? cwd : "", rel);
    return out;
}

/* Appends "; " (unless first) and the formatted note to w->looked. */
static void note(tv__cli_where *w, const char *fmt, ...) TV_PRINTF(2, 3);
static void note(tv__cli_where *w, const char *fmt, ...)
{
    size_t used = strlen(w->looked);
    if (used && used + 2 < sizeof w->looked) {
        memcpy(w->looked + used, ", ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->looked + used, sizeof w->looked - used, fmt, ap);
    va_end(ap);
}

static void take(tv__cli_where *w, const char *value, const char *from)
{
    snprintf(w->value, sizeof w->value, "%s", value);
    snprintf(w->from, sizeof w->from, "%s", from);
    w->found = true;
}

static void reset(tv__cli_where *w)
{
    memset(w, 0, sizeof *w);
}

/* What stat says of path, for the list: "absent", "not a socket", ... */
static const char *what_is(const char *path, bool want_socket, bool *ok)
{
    struct stat st;
    *ok = false;
    if (stat(path, &st) != 0)
        return errno == ENOENT || errno == ENOTDIR ? "absent" : strerror(errno);
    if (want_socket && !S_ISSOCK(st.st_mode))
        return "not a socket";
    if (!want_socket && !S_ISREG(st.st_mode))
        return "not a regular file";
    *ok = true;
    return "found";
}

/* The installed default, then the one under ./var, that exists as a socket
 * (or a file): taken into w. */
static void try_defaults(tv__cli_where *w, const tv__cli_defaults *d, bool want_socket)
{
    const char *paths[2] = {d->installed, d->dev};
    const char *from[2] = {"the installed default", "./var"};
    for (size_t i = 0; i < 2 && !w->found; i++) {
        char abs[TV__CLI_WHERE_MAX];
        bool ok;
        if (!paths[i])
            continue;
        tv__cli_abs(paths[i], abs, sizeof abs);
        const char *why = what_is(abs, want_socket, &ok);
        if (ok)
            take(w, abs, from[i]);
        else
            note(w, "%s (%s)", abs, why);
    }
}

/* The flag, else the variable: true when one gave a value (taken). */
static bool given(tv__cli_where *w, const char *flag, const char *flag_name, const char *var)
{
    const char *env = getenv(var);
    if (flag && *flag) {
        take(w, flag, flag_name);
        return true;
    }
    if (env && *env) {
        char from[48];
        snprintf(from, sizeof from, "$%s", var);
        take(w, env, from);
        return true;
    }
    note(w, "$%s (unset)", var);
    return false;
}

int tv__cli_find_socket(const char *flag, const char *flag_name, const tv__cli_defaults *d,
                        tv__cli_where *w)
{
    reset(w);
    if (!given(w, flag, flag_name ? flag_name : "--socket", "TENSORVAULT_SOCKET"))
        try_defaults(w, d, true);
    if (w->found)
        note(w, "%s (%s)", w->value, w->from);
    return 0;
}

/* A URL or a socket path into w (is_unix); TV_E_INVALID_ARG otherwise. */
static int http_value(tv__cli_where *w, tv_error *err)
{
    char *v = w->value;
    if (strlen(v) >= sizeof w->value - 1)
        return tv__seterr(err, TV_E_INVALID_ARG, "URL '%.64s...' (%s) is too long", v, w->from);
    if (!strncmp(v, "http://", 7) || !strncmp(v, "https://", 8))
        return 0;
    if (!strncmp(v, "unix:", 5) && v[5]) {
        memmove(v, v + 5, strlen(v + 5) + 1);
        w->is_unix = true;
        return 0;
    }
    if ((v[0] == '/' || v[0] == '.') && !strstr(v, "://")) {
        w->is_unix = true;
        return 0;
    }
    return tv__seterr(
        err, TV_E_INVALID_ARG,
        "URL '%s' (%s) is not http://HOST:PORT, https://HOST:PORT or a UNIX socket path (unix:PATH, /PATH or ./PATH)",
        v, w->from);
}

int tv__cli_find_http(const char *flag, const tv__cli_defaults *d, tv__cli_where *w, tv_error *err)
{
    int rc = 0;
    reset(w);
    if (given(w, flag, "--url", "TENSORVAULT_URL")) {
        rc = http_value(w, err);
    } else {
        try_defaults(w, d, true);
        if (w->found)
            w->is_unix = true;
        else
            take(w, TV__CLI_DEFAULT_URL, "the built-in default");
    }
    note(w, "%s (%s)", w->value, w->from);
    return rc;
}

/* The first line of path, blanks trimmed, into secret. */
static int read_secret(const char *path, const char *from, char *secret, size_t len, tv_error *err)
{
    int rc = 0;
    secret[0] = '\0';
    FILE *f = fopen(path, "re");
    if (!f)
        return tv__seterr(err, -errno, "token file '%s' (%s): %s", path, from, strerror(errno));
    char line[TV__CLI_SECRET_MAX + 2];
    if (!fgets(line, sizeof line, f)) {
        rc = tv__seterr(err, TV_E_INVALID_ARG, "token file '%s' (%s) is empty", path, from);
        goto out;
    }
    size_t n = strcspn(line, "\r\n");
    if (n > TV__CLI_SECRET_MAX || n >= len) {
        rc = tv__seterr(err, TV_E_INVALID_ARG,
                        "token file '%s' (%s): the token is longer than %d bytes", path, from,
                        TV__CLI_SECRET_MAX);
        goto out;
    }
    line[n] = '\0';
    char *p = line;
    while (*p == ' ' || *p == '\t')
        p++;
    n = strlen(p);
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
        p[--n] = '\0';
    if (!n) {
        rc = tv__seterr(err, TV_E_INVALID_ARG, "token file '%s' (%s) holds no token", path, from);
        goto out;
    }
    memcpy(secret, p, n + 1);
out:
    fclose(f);
    return rc;
}

int tv__cli_find_token(const char *flag, const tv__cli_defaults *d, tv__cli_where *w, char *secret,
                       size_t secret_len, tv_error *err)
{
    reset(w);
    secret[0] = '\0';
    if (flag && *flag) {
        take(w, flag, "--token-file");
        return read_secret(flag, "--token-file", secret, secret_len, err);
    }
    const char *env = getenv("TENSORVAULT_TOKEN");
    if (env && *env) {
        if (strlen(env) > TV__CLI_SECRET_MAX || strlen(env) >= secret_len)
            return tv__seterr(err, TV_E_INVALID_ARG, "$TENSORVAULT_TOKEN is longer than %d bytes",
                              TV__CLI_SECRET_MAX);
        take(w, "$TENSORVAULT_TOKEN", "$TENSORVAULT_TOKEN");
        memcpy(secret, env, strlen(env) + 1);
        return 0;
    }
    note(w, "$TENSORVAULT_TOKEN (unset)");
    if (given(w, NULL, NULL, "TENSORVAULT_TOKEN_FILE"))
        return read_secret(w->value, w->from, secret, secret_len, err);
    /* A default file that exists but cannot be read (the installed one is
     * the daemon user's, mode 0600) is listed and passed over. */
    const char *paths[2] = {d->installed, d->dev};
    const char *from[2] = {"the installed default", "./var"};
    for (size_t i = 0; i < 2; i++) {
        char abs[TV__CLI_WHERE_MAX];
        bool ok;
        if (!paths[i])
            continue;
        tv__cli_abs(paths[i], abs, sizeof abs);
        const char *why = what_is(abs, false, &ok);
        if (ok && access(abs, R_OK) != 0) {
            ok = false;
            why = strerror(errno);
        }
        if (!ok) {
            note(w, "%s (%s)", abs, why);
            continue;
        }
        tv_error e = {0};
        if (read_secret(abs, from[i], secret, secret_len, &e)) {
            note(w, "%s (%s)", abs, e.msg);
            continue;
        }
        take(w, abs, from[i]);
        note(w, "%s (%s)", abs, from[i]);
        return 0;
    }
    return 0;
}

int tv__cli_where_fail(tv_error *err, const tv__cli_where *w, const char *hint)
{
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s", err->msg);
    return tv__seterr(err, err->code, "%s; %s; looked at: %s", msg, hint,
                      w->looked[0] ? w->looked : "nothing");
}
