/* The CLI as a client of the one API (docs/openapi.yaml): mode selection (local
 * in-process api on --store, or a tensorvaultd over HTTP), token discovery,
 * one request/answer call, the text printer of the API's JSON documents
 * and the import/verify progress bar.
 * Invariants: both modes give the same JSON document for the same request;
 * an error answer becomes the TV_E_* code and message of its error object;
 * nothing here prints except the tv__cli_print* functions and the progress
 * bar (stderr). */
#ifndef TV_CLI_CLIENT_H
#define TV_CLI_CLIENT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "http/api.h"
#include "cli/cli.h"
#include "cli/http.h"
#include "cli/where.h"

#define TV__CLI_TOKEN_MAX TV__CLI_SECRET_MAX
#define TV__CLI_PATH_MAX  4096

/* The progress bar's state (stderr, on a terminal only). */
typedef struct tv__cli_progress {
    bool on;    /* draw at all (stderr is a terminal and not --json) */
    bool drawn; /* a line is on screen (ends with '\n' at the end) */
    double t0, last, last_t;
    uint64_t last_done;
} tv__cli_progress;

typedef struct tv__cli_client {
    bool local;
    bool url_given; /* --url on the command line: no fallback to local */
    bool writer;    /* local: open the store as writer */
    const char *store;
    tv__cli_where http;  /* the daemon's HTTP API: URL or UNIX socket, and where it came from */
    tv__cli_where token; /* the token file (or variable) and where it came from */
    char url[TV__CLI_WHERE_MAX];
    char secret[TV__CLI_TOKEN_MAX + 1];
    unsigned n_sent;
    tv__api *api;
    tv__cli_progress *progress; /* local imports: the watch callback's bar */
} tv__cli_client;

/* Chooses the mode for the command of c (docs/cli.md "Finding the
 * daemon"): --store DIR -> local; --url URL -> remote; $TENSORVAULT_URL ->
 * remote, falling back to local on $TENSORVAULT_STORE when no daemon
 * answers; $TENSORVAULT_STORE -> local; else remote at the first of
 * /run/tensorvault/http.sock, ./var/run/http.sock (UNIX sockets that
 * exist) and TV__CLI_DEFAULT_URL. The token: --token-file FILE,
 * $TENSORVAULT_TOKEN, $TENSORVAULT_TOKEN_FILE, /var/lib/tensorvault/
 * admin.token, ./var/admin.token (where.h). writer: the command mutates
 * (local mode opens the store as writer). Returns 0; TV_E_INVALID_ARG for
 * a URL that is neither http(s) nor a socket path; -errno or
 * TV_E_INVALID_ARG naming a given token file that cannot be read. */
int tv__cli_client_open(const tv__cli_ctx *c, bool writer, tv__cli_client *cl, tv_error *err);
void tv__cli_client_close(tv__cli_client *cl);

/* One API request: path is already percent-encoded, query (without '?')
 * may be NULL, body may be NULL (not stolen). *doc gets the answer's JSON
 * document (owned; NULL when the answer is not JSON). Returns 0 for a 2xx
 * answer; else the code of the answer's error object (err has its
 * message), or the transport's error. *status (may be NULL) gets the HTTP
 * status (0 when none came). A refused connection (TV_E_NO_DAEMON) and a
 * 401 (TV_E_UNAUTHORIZED) name the places looked at for the daemon or the
 * token and the variable to set. */
int tv__cli_call(tv__cli_client *cl, const char *method, const char *path, const char *query,
                 json_t *body, json_t **doc, int *status, tv_error *err);

/* tv__cli_call for a GET whose answer is bytes (a sidecar file): *body
 * (malloc'd, free()) and *body_len get a 2xx answer's body as it came.
 * Returns as tv__cli_call. */
int tv__cli_call_bytes(tv__cli_client *cl, const char *path, char **body, size_t *body_len,
                       tv_error *err);

/* The error object's code and message into err; returns the code
 * (TV_E_INTERNAL naming the status when doc has no error object). */
int tv__cli_doc_error(const json_t *doc, int status, tv_error *err);

/* What a printed document is (selects the text rendering). */
typedef enum tv__cli_doc {
    TV__DOC_MODELS,
    TV__DOC_MODEL,
    TV__DOC_GENERATIONS,
    TV__DOC_GENERATION,
    TV__DOC_TENSORS,
    TV__DOC_TENSOR,
    TV__DOC_DEVICES,
    TV__DOC_DEVICE,
    TV__DOC_ALIASES,
    TV__DOC_ALIAS,
    TV__DOC_JOBS,
    TV__DOC_JOB,
    TV__DOC_IMPORT,
    TV__DOC_VERIFY,
    TV__DOC_GC,
    TV__DOC_TOKENS,
    TV__DOC_TOKEN,
    TV__DOC_VERSION,
    TV__DOC_STATUS,
    TV__DOC_DELETED,
    TV__DOC_DEACTIVATED, /* a Model after POST .../deactivate */
    TV__DOC_ACTIVATED,
    TV__DOC_RETIRED,
    TV__DOC_ALIAS_REMOVED,
    TV__DOC_CANCELLED,
    TV__DOC_TOKEN_REVOKED,
    TV__DOC_SESSIONS,    /* GET /v1/sessions */
    TV__DOC_FLEET,       /* GET /v1/fleet */
    TV__DOC_FLEET_ALIAS, /* PUT /v1/fleet/aliases/{model}/{alias} */
} tv__cli_doc;

/* Prints doc: --json as the document itself (indented, ASCII), else its
 * text rendering. Never fails on a missing field (prints "-"). */
void tv__cli_print(FILE *f, bool json, tv__cli_doc kind, const json_t *doc);

/* The text of an activation (activate, rollback): "activated generation 3
 * of m (was 2)"; was 0: "(was none)", < 0: unknown, not said. */
void tv__cli_print_activated(FILE *f, const json_t *doc, int64_t was);

/* 237.4 MiB: n bytes in IEC units ("512 B" below 1 KiB, one decimal
 * above, up to EiB). Returns buf. */
const char *tv__cli_fmt_bytes(uint64_t n, char *buf, size_t len);
/* "2026-12-06 07:31:02": unix seconds in local time ("-" when it cannot
 * be shown). Returns buf. */
const char *tv__cli_fmt_time(int64_t unix_s, char *buf, size_t len);
/* "4.2 s" below a minute, then "3m07s", "2h05m", "1d03h"; "-" for a
 * negative or unknown one. Returns buf. */
const char *tv__cli_fmt_duration(double secs, char *buf, size_t len);

/* "[#######.......]  42.0%  105.0 / 250.0 MiB   45.6 MB/s  ETA 3s  write"
 * into buf; rate in bytes/s (0 unknown), eta in seconds (< 0 unknown),
 * step may be NULL or "". Returns buf. */
const char *tv__cli_progress_format(char *buf, size_t len, uint64_t done, uint64_t total,
                                    double rate, double eta, const char *step);

/* Starts a bar on stderr when it is a terminal and not json. */
void tv__cli_progress_start(tv__cli_progress *p, bool json);
/* Draws done/total (rate < 0: computed here from the bar's own clock). */
void tv__cli_progress_draw(tv__cli_progress *p, uint64_t done, uint64_t total, double rate,
                           double eta, const char *step);
/* Ends the line when one was drawn. */
void tv__cli_progress_end(tv__cli_progress *p);
/* The bar for a Job document (bytes_done, bytes_total, rate, eta, step). */
void tv__cli_progress_job(tv__cli_progress *p, const json_t *job);

/* Monotonic seconds. */
double tv__cli_mono(void);

/* Percent-encodes s into a static-free caller buffer: the path segment of
 * a model, alias or tensor name. Returns 0 or a usage-style error. */
int tv__cli_seg(const char *s, char *out, size_t out_len, tv_error *err);

/* Appends "&key=value" (value percent-encoded; nothing for a NULL value)
 * to the query q of len bytes. Returns 0 or TV_E_INVALID_ARG (too long). */
int tv__cli_query_add(char *q, size_t len, const char *key, const char *value, tv_error *err);

/* One request of the command of c (body stolen): *doc receives the
 * answer's document. Returns 0, or the exit code after the failure was
 * printed (tv__cli_failed). */
int tv__cli_request(const tv__cli_ctx *c, bool writer, const char *method, const char *path,
                    const char *query, json_t *body, json_t **doc);

/* The options of every command that talks to the API. */
#define TV__CLI_CLIENT_OPTS                                                                        \
    {"--store", "DIR", NULL, "run in this process on the store in DIR, not through tensorvaultd"}, \
        {"--url", "URL", NULL,                                                                     \
         "tensorvaultd's HTTP API: http(s)://HOST:PORT, or its UNIX socket (unix:PATH, /PATH)"},   \
        {"--token-file", "FILE", NULL, "the file holding the API token to send"},                  \
    {                                                                                              \
        "--json", NULL, NULL, "print the API's JSON document (docs/openapi.yaml) instead of text"  \
    }

#endif
