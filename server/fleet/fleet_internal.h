/* What the files of the fleet thread share (fleet.h): the thread's state,
 * the pulls it follows, and the functions each file gives the others. The
 * files call one another one way (scripts/check, the rooms rule), bottom
 * first:
 *   report.c   what this node tells the catalog (its generations' states,
 *              its aliases) and GET /v1/fleet (the fleet as last read)
 *   pull.c     pulling a generation: its sources, its import job, retries
 *   upload.c   the uploader thread: generations imported here to the
 *              object store
 *   publish.c  publishing this node's ready generations to the catalog
 *   rollout.c  the aliases placed here: pull what is missing, switch
 *   fleet.c    the thread and its loop, start, kick, stop
 * Invariant: the fields marked "under mu" are read and written under mu
 * only (HTTP threads read the document, import threads call a pull's
 * on_bad_file); the others belong to the fleet thread, or are set once
 * before it starts. */
#ifndef TV_FLEET_FLEET_INTERNAL_H
#define TV_FLEET_FLEET_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "fleet/catalog.h"
#include "fleet/fleet.h"
#include "httpc/url.h"
#include "jobs/jobs.h"
#include "registry/registry.h"
#include "store/store.h"

/* A generation this process has published (publish.c: once per process). */
typedef struct done_key {
    char model[TV__REG_NAME_MAX + 1];
    int64_t number;
} done_key;

/* The polls (about one a second) a pull's rate is measured over: bytes
 * arrive a pipeline chunk at a time, so a window of several seconds. */
#define PULL_RATE_SAMPLES 6

/* A generation this node pulls for an alias placed on it. */
typedef struct pull {
    char model[TV__REG_NAME_MAX + 1];
    int64_t number;
    int64_t job;       /* the running import job; 0 = none */
    unsigned attempts; /* jobs that failed */
    bool failed;       /* given up: reported failed until the alias moves again */
    int64_t alias_version;
    char error[TV__REG_ERROR_MAX];
    char **urls; /* this attempt's URL of each pull file (NULL: in memory) */
    size_t n_urls;
    uint64_t total; /* the generation's canonical bytes (the catalog's total_bytes) */
    /* The pull's rate: (time, bytes) of the last polls, oldest first. */
    double rate_t[PULL_RATE_SAMPLES];
    uint64_t rate_done[PULL_RATE_SAMPLES];
    size_t n_rate;
    char **excluded;  /* sources that served bad bytes or failed for good */
    int *excluded_rc; /* why each was excluded (the importer's code) */
    size_t n_excluded;
    struct tv__fleet *f;
} pull;

struct tv__fleet {
    unsigned seed; /* rand_r: which peer a pull tries first (fleet thread) */
    char *conninfo, *node, *url, *reg_path;
    char *token, *object_store, *proxy;
    tv__s3_opts s3;
    char *s3_strings[5];
    tv__jobs *jobs;
    const tv__store *writer; /* the daemon's writer store: a worker handle of it switches aliases */
    tv__store *st;
    unsigned pull_attempts;
    pull **pulls;
    size_t n_pulls;
    json_t *doc;   /* the last fleet document read (under mu) */
    double doc_at; /* tv__fleet_mono_s() when doc was read (under mu) */
    double
        beat_at; /* tv__fleet_mono_s() of this node's last heartbeat the catalog took (under mu) */
    bool connected;                                /* under mu */
    char last_error[sizeof(((tv_error *)0)->msg)]; /* under mu */
    char where[320];
    unsigned retry_s, heartbeat_s;
    unsigned node_down_s;     /* fleet.node_down_s: a node unseen this long is down */
    char node_down_param[16]; /* node_down_s as a query parameter */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool stopping, kicked;
    bool quiet; /* the catalog is away: said once, then debug lines until it is back */
    /* uploads to fleet.object_store, by a thread of their own (under mu) */
    struct upload *uploads; /* upload.c */
    pthread_t up_thread;
    bool up_started;
    /* the thread's own */
    tv__catalog *cat;
    tv__reg *reg;
    done_key *done;
    size_t n_done, cap_done;
};

/* Whether tv__fleet_stop was called (any thread). */
static inline bool tv__fleet_stopping(tv__fleet *f)
{
    pthread_mutex_lock(&f->mu);
    bool s = f->stopping;
    pthread_mutex_unlock(&f->mu);
    return s;
}

/* CLOCK_MONOTONIC, in seconds. */
static inline double tv__fleet_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- report.c ---------------------------------------------------------- */

/* The state of generation number of model on this node (node_generations),
 * with its progress; a ready or failed one wakes every node's thread. */
void tv__fleet_report_gen(tv__fleet *f, const char *model, int64_t number, const char *state,
                          uint64_t done, uint64_t total, double rate, const char *error);
/* alias of model now serves generation number here (node_aliases). */
void tv__fleet_report_alias(tv__fleet *f, const char *model, const char *alias, int64_t number,
                            int64_t version);
/* Whether the catalog answers, and its last error, for GET /v1/fleet. */
void tv__fleet_set_connected(tv__fleet *f, bool up, const char *error);

/* ---- pull.c ------------------------------------------------------------ */

/* The pull of (model, number); a new one when create (NULL: none, or out
 * of memory). */
pull *tv__fleet_pull_find(tv__fleet *f, const char *model, int64_t number, bool create);
/* NULL-safe. */
void tv__fleet_pull_free(pull *p);
/* Starts one import job for p from the catalog's description. Returns 0
 * (p->job set, or p->failed with the reason when no source is left). */
int tv__fleet_pull_start(tv__fleet *f, pull *p, tv_error *err);
/* Follows p's job: progress to the catalog, a retry after a failure, the
 * failure reported after the last attempt. */
void tv__fleet_pull_poll(tv__fleet *f, pull *p);

/* ---- upload.c ---------------------------------------------------------- */

/* Queues m's shards for the uploader (once per generation). Returns 0 or
 * -ENOMEM. */
int tv__fleet_upload_queue(tv__fleet *f, const tv__reg_manifest *m);
/* The uploader thread's body (f). */
void *tv__fleet_uploader_main(void *f);
/* Frees what is still queued (the uploader has stopped). */
void tv__fleet_uploads_free(tv__fleet *f);

/* ---- publish.c --------------------------------------------------------- */

/* Publishes every ready generation not yet published by this process.
 * Returns 0, or the first error that is worth a retry. */
int tv__fleet_publish_pending(tv__fleet *f);

/* ---- rollout.c --------------------------------------------------------- */

/* Reads the fleet document, keeps it for GET /v1/fleet and acts on the
 * aliases. Returns whether a rollout is under way here (poll faster). */
bool tv__fleet_rollout_round(tv__fleet *f);

#endif
