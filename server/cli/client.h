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

#define TV__CLI_TOKEN_FILE "var/admin.token"
#define TV__CLI_TOKEN_MAX  256
#define TV__CLI_PATH_MAX   4096

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
    char url[1024];
    char token[TV__CLI_TOKEN_MAX + 1];
    unsigned n_sent;
    tv__api *api;
    tv__cli_progress *progress; /* local imports: the watch callback's bar */
} tv__cli_client;

/* Chooses the mode for the command of c (see README "Using it"): --store
 * DIR -> local; else --url, $TENSORVAULT_URL or TV__CLI_DEFAULT_URL ->
 * remote, falling back to local on $TENSORVAULT_STORE when no daemon
 * answers (and --url was not given). The token: --token-file FILE,
 * $TENSORVAULT_TOKEN, or ./var/admin.token when it exists. writer: the
 * command mutates (local mode opens the store as writer). Returns 0, or
 * -errno naming the token file that cannot be read. */
int tv__cli_client_open(const tv__cli_ctx *c, bool writer, tv__cli_client *cl, tv_error *err);
void tv__cli_client_close(tv__cli_client *cl);

/* One API request: path is already percent-encoded, query (without '?')
 * may be NULL, body may be NULL (not stolen). *doc gets the answer's JSON
 * document (owned; NULL when the answer is not JSON). Returns 0 for a 2xx
 * answer; else the code of the answer's error object (err has its
 * message), or the transport's error. *status (may be NULL) gets the HTTP
 * status (0 when none came). */
int tv__cli_call(tv__cli_client *cl, const char *method, const char *path, const char *query,
                 json_t *body, json_t **doc, int *status, tv_error *err);

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

#endif
