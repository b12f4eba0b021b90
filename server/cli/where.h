/* Where the CLI finds tensorvaultd and its admin token from any directory:
 * the fast-path socket, the HTTP API (a UNIX socket or an http(s) URL) and
 * the token, each looked for in one order: the command-line flag, the
 * TENSORVAULT_* variable, the installed default (/run/tensorvault,
 * /var/lib/tensorvault), then ./var (where a daemon started in this
 * directory with its embedded default keeps them). The Python package and
 * the installed daemon's configuration use the same order and paths.
 *
 * Invariants: the first place that exists is taken and later ones are not
 * used; a flag or variable is taken as given (a socket it names that is not
 * there is an error naming it, never skipped); every lookup records each
 * place it looked at and what it found there, so that a "no daemon" or "no
 * token" error can list them with the variable to set. */
#ifndef TV_CLI_WHERE_H
#define TV_CLI_WHERE_H

#include <stdbool.h>
#include <stddef.h>

#include "tensorvault/errors.h"

#define TV__CLI_INSTALLED_SOCKET "/run/tensorvault/tensorvault.sock"
#define TV__CLI_INSTALLED_HTTP   "/run/tensorvault/http.sock"
#define TV__CLI_INSTALLED_TOKEN  "/var/lib/tensorvault/admin.token"
#define TV__CLI_DEV_SOCKET       "var/run/tensorvault.sock" /* relative to the working directory */
#define TV__CLI_DEV_HTTP         "var/run/http.sock"
#define TV__CLI_DEV_TOKEN        "var/admin.token"

#define TV__CLI_WHERE_MAX   4096 /* a path or URL, NUL included */
#define TV__CLI_LOOKED_MAX  2048 /* the list of places looked at */
#define TV__CLI_SECRET_MAX  256  /* a token's bytes */
#define TV__CLI_DEFAULT_URL "http://127.0.0.1:8470"

/* What a lookup found. */
typedef struct tv__cli_where {
    char value[TV__CLI_WHERE_MAX];   /* the socket path, URL, or token file; "" when none */
    char from[48];                   /* "--url", "$TENSORVAULT_URL", "the installed default", ... */
    bool found;                      /* value names something (the default URL always does) */
    bool is_unix;                    /* http: value is a UNIX socket path, not a URL */
    char looked[TV__CLI_LOOKED_MAX]; /* "--url: not given; $TENSORVAULT_URL: unset; ..." */
} tv__cli_where;

/* The defaults a lookup tries after the flag and the variable: the
 * installed path, then the one under ./var (relative paths are taken from
 * the working directory and recorded absolute). */
typedef struct tv__cli_defaults {
    const char *installed;
    const char *dev;
} tv__cli_defaults;

extern const tv__cli_defaults tv__cli_socket_defaults, tv__cli_http_defaults,
    tv__cli_token_defaults;

/* The fast-path socket: flag (its name in flag_name, e.g. "--socket";
 * NULL or "" when not given), $TENSORVAULT_SOCKET, then the defaults that
 * exist as UNIX sockets. w->found false when none did (the caller may read
 * a store instead, or fail with tv__cli_where_fail). Returns 0. */
int tv__cli_find_socket(const char *flag, const char *flag_name, const tv__cli_defaults *d,
                        tv__cli_where *w);

/* The HTTP API: --url (flag), $TENSORVAULT_URL, then the defaults that
 * exist as UNIX sockets, then TV__CLI_DEFAULT_URL. A URL is http:// or
 * https://; "unix:PATH", or a path starting with '/' or '.', names a UNIX
 * socket. Returns 0 (w->found always true), or TV_E_INVALID_ARG naming a
 * value that is neither (file://, ftp://, HOST:PORT, ...) or too long. */
int tv__cli_find_http(const char *flag, const tv__cli_defaults *d, tv__cli_where *w, tv_error *err);

/* The admin token: --token-file FILE (flag), $TENSORVAULT_TOKEN (the
 * secret itself), $TENSORVAULT_TOKEN_FILE, then the default files that
 * exist and can be read. The secret (first line, blanks trimmed) goes to
 * secret (secret_len bytes); "" and w->found false when there is none.
 * Returns 0, or an error naming a flag's or variable's file that cannot
 * be read or holds no token (-errno, TV_E_INVALID_ARG). */
int tv__cli_find_token(const char *flag, const tv__cli_defaults *d, tv__cli_where *w, char *secret,
                       size_t secret_len, tv_error *err);

/* Appends to err's message (code kept) "; looked at: W->looked; HINT", so
 * that the error names every place and what to set. Returns err's code. */
int tv__cli_where_fail(tv_error *err, const tv__cli_where *w, const char *hint);

/* "/abs/cwd/" + rel into out (rel unchanged when absolute or the working
 * directory is unknown). Returns out. */
const char *tv__cli_abs(const char *rel, char *out, size_t len);

#endif
