/* tensorvaultd: the registry as a service. Start-up in this order: config,
 * log, store (created with a sparse image on first start), the writer lock,
 * the admin token file (first start only), the job pool, the fast path
 * (its UNIX socket), the api, HTTP; then signals until SIGTERM or SIGINT,
 * and shut down in reverse.
 *
 * Invariants: signals are blocked in every thread and taken synchronously
 * here (sigwaitinfo), so no handler runs inside a library; HTTP stops before
 * the fast path and the pool (no request can reach a freed one), the fast
 * path closes its sessions and leases, and the pool cancels its jobs
 * (nothing half-imported is published; reservations are released), before
 * the store closes; the stop is bounded whatever the far end of a transfer
 * does (every import, pull and upload transfer hears it within a second,
 * httpc/httpc.h: tv__http_cancel), so the daemon exits within 5 s of
 * SIGTERM (plus the fleet catalog's own wait, fleet.h); an existing
 * admin token file (store.admin_token) is never overwritten; the fast
 * path's admit callback runs on its loop thread with a registry connection
 * of its own (never the writer's). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/config.h"
#include "jobs/jobs.h"
#include "fleet/fleet.h"
#include "daemon/openapi.h"
#include "fastpath/access.h"
#include "fastpath/fastpath.h"
#include "http/api.h"
#include "http/history.h"
#include "http/metrics.h"
#include "http/mhd.h"
#include "import/import.h"
#include "import/source.h"
#include "store/store.h"
#include "tensorvault/tensorvault.h"
#include "tensorvault/version.h"
#include "util/internal.h"
#include "util/sys.h"

extern char **environ;

static int reopen_log(const tv__config *c)
{
    if (strcmp(c->log_file, "stderr") == 0)
        return 0;
    if (!freopen(c->log_file, "a", stderr))
        return -errno;
    setvbuf(stderr, NULL, _IOLBF, 0);
    return 0;
}

/* First start: the store directory and its sparse image (or the device). */
static int ensure_store(const tv__config *c, tv_error *err)
{
    int rc = tv__store_check_dir(c->store_dir, err);
    if (rc != TV_E_NOT_FOUND)
        return rc;
    tv__store_init_opts o = {0};
    if (c->store_device[0]) {
        o.device = c->store_device;
    } else {
        o.image = c->store_image;
        o.image_size_bytes = c->store_image_size;
    }
    int64_t dev = 0;
    if ((rc = tv__store_init(c->store_dir, &o, &dev, err)))
        return rc;
    tv__log(TV_LOG_INFO, "created store %s on %s (device %" PRId64 ")", c->store_dir,
            c->store_device[0] ? c->store_device : c->store_image, dev);
    return 0;
}

/* Gives the admin token file fd its mode (fchmod: the umask, the unit's
 * 0077, narrows the mode open() asks for); an existing file (!created) of
 * another owner is left as it is. */
static int token_file_mode(int fd, const char *path, unsigned mode, bool created, tv_error *err)
{
    struct stat sb;
    int rc = tv__sys.fstat(fd, &sb) ? -errno : 0;
    if (rc)
        return tv__seterr(err, rc, "cannot stat %s: %s", path, strerror(-rc));
    if ((sb.st_mode & 07777) == mode || (!created && sb.st_uid != geteuid()))
        return 0;
    if (fchmod(fd, (mode_t)mode))
        return tv__seterr(err, -errno, "cannot chmod %04o %s: %s", mode, path, strerror(errno));
    if (!created)
        tv__log(TV_LOG_INFO, "admin token file %s: mode %04o (store.admin_token_mode)", path, mode);
    return 0;
}

/* store.admin_token (default DIR/admin.token): created exclusively, then
 * an admin token is made and written into it; an existing file keeps its
 * bytes. Either way the file ends with store.admin_token_mode (0600, or
 * 0640 for the daemon's group). */
static int ensure_admin_token(tv__store *st, const char *path, unsigned mode, tv_error *err)
{
    int fd = tv__sys_open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd == -EEXIST) {
        fd = tv__sys_open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0);
        if (fd < 0)
            return tv__seterr(err, fd, "cannot open %s: %s", path, strerror(-fd));
        int rc = token_file_mode(fd, path, mode, false, err);
        tv__sys.close(fd);
        return rc;
    }
    if (fd < 0)
        return tv__seterr(err, fd, "cannot create %s: %s", path, strerror(-fd));
    char secret[TV__TOKEN_SECRET_LEN + 2];
    tv__reg_token tok;
    int rc = token_file_mode(fd, path, mode, true, err);
    if (!rc)
        rc = tv__reg_token_create(st->reg, "admin", TV__SCOPE_ADMIN, secret, &tok, err);
    if (!rc) {
        size_t n = strlen(secret);
        secret[n++] = '\n';
        if ((rc = tv__sys_pwrite_full(fd, secret, n, 0)) || (rc = tv__sys_fsync(fd)))
            tv__seterr(err, rc, "cannot write %s: %s", path, strerror(-rc));
        memset(secret, 0, sizeof(secret));
    }
    tv__sys.close(fd);
    if (rc) {
        tv__sys.unlink(path); /* the next start tries again */
        return rc;
    }
    tv__log(TV_LOG_INFO, "wrote admin token %" PRId64 " to %s (mode %04o)", tok.id, path, mode);
    return 0;
}

/* demo.source: imported as model "demo" (activated) when the store has no
 * model yet. Problems are warnings: the daemon serves anyway. */
static void maybe_demo(const tv__config *c, tv__store *st, tv__jobs *jobs)
{
    if (!c->demo_source[0])
        return;
    tv__reg_model *m = NULL;
    size_t n = 0;
    tv_error err = {0};
    if (tv__reg_models_list(st->reg, &m, &n, &err)) {
        tv__log(TV_LOG_WARN, "demo: cannot list models: %s", err.msg);
        return;
    }
    free(m);
    if (n)
        return;
    char real[PATH_MAX];
    if (!realpath(c->demo_source, real)) {
        tv__log(TV_LOG_WARN, "demo: %s: %s (not imported)", c->demo_source, strerror(errno));
        return;
    }
    tv__job_spec spec = {.kind = TV__JOB_IMPORT, .model = "demo", .source = real, .activate = true};
    int64_t id = 0;
    if (tv__jobs_submit(jobs, &spec, &id, &err))
        tv__log(TV_LOG_WARN, "demo: import of %s not queued: %s", real, err.msg);
    else
        tv__log(TV_LOG_INFO, "demo: importing %s as model 'demo' (job %" PRId64 ")", real, id);
}

/* What the fast path's admit callback needs: the access rules and a
 * read-only registry connection, opened on first use (by the loop thread),
 * under mu should more than one thread ever call it. */
typedef struct admit_ctx {
    const tv__fp_access *access;
    char reg_path[TV__CFG_STR_MAX + 16];
    tv__reg *reg;
    pthread_mutex_t mu;
} admit_ctx;

/* A retired generation is refused (its lease would keep gc from freeing
 * it), then the peer must pass the model's access rules. */
static int admit(void *ctx, const char *model, int64_t generation, pid_t pid, uid_t uid,
                 const gid_t *gids, size_t n_gids, tv_error *err)
{
    admit_ctx *a = ctx;
    tv__reg_generation g;
    tv_error e = {0};
    int rc = 0;
    (void)pid;
    if (generation == 0) /* before the open: the access rules only */
        return tv__fp_access_check(a->access, model, uid, gids, n_gids, err);
    pthread_mutex_lock(&a->mu);
    if (!a->reg)
        rc = tv__reg_open_ex(a->reg_path, TV__REG_READONLY, &a->reg, &e);
    if (!rc)
        rc = tv__reg_generation_get(a->reg, model, generation, &g, &e);
    pthread_mutex_unlock(&a->mu);
    if (rc == TV_E_NOT_FOUND)
        return tv__seterr(err, rc, "generation %" PRId64 " of %s is not in the registry",
                          generation, model);
    if (rc)
        return tv__seterr(err, rc, "registry: %s", e.msg);
    if (g.state == TV__GEN_RETIRED)
        return tv__seterr(err, TV_E_NOT_FOUND, "generation %" PRId64 " of %s is retired",
                          generation, model);
    return tv__fp_access_check(a->access, model, uid, gids, n_gids, err);
}

/* At connect: a peer the access rules let open no model at all gets no
 * session (it could only hold one that every other user then lacks). */
static int admit_peer(void *ctx, pid_t pid, uid_t uid, const gid_t *gids, size_t n_gids,
                      tv_error *err)
{
    const admit_ctx *a = ctx;
    (void)pid;
    return tv__fp_access_any(a->access, uid, gids, n_gids, err);
}

/* The access rules of the configuration ([access] default and models). */
static int make_access(const tv__config *c, tv__fp_access **out, tv_error *err)
{
    const char *models[TV__CFG_MAX_ACCESS], *rules[TV__CFG_MAX_ACCESS];
    for (size_t i = 0; i < c->n_access; i++) {
        models[i] = c->access[i].model;
        rules[i] = c->access[i].rules;
    }
    return tv__fp_access_create(c->access_default, models, rules, c->n_access, out, err);
}

/* An [access] model key that names no model of the registry is a typo or
 * the wrong case (model names are case-sensitive) until such a model is
 * imported: that model's rule protects nothing while the model it meant
 * follows the default list. Said once, at start. */
static void warn_unknown_access(const tv__config *c, tv__store *st)
{
    tv__reg_model *m = NULL;
    size_t n = 0;
    tv_error err = {0};
    if (!c->n_access)
        return;
    if (tv__reg_models_list(st->reg, &m, &n, &err)) {
        tv__log(TV_LOG_WARN, "access rules: cannot list the registry's models to check them: %s",
                err.msg);
        return;
    }
    for (size_t i = 0; i < c->n_access; i++) {
        size_t j = 0;
        while (j < n && strcmp(m[j].name, c->access[i].model) != 0)
            j++;
        if (j == n)
            tv__log(
                TV_LOG_WARN,
                "access rule for model '%s': no such model in the registry (model names are case-sensitive)",
                c->access[i].model);
    }
    free(m);
}

/* Starts the fast path when enabled. A build without it (TV_E_NOT_SUPPORTED)
 * or a default socket path too long for a socket address is a warning: the
 * daemon serves HTTP anyway. Any other failure stops the start. */
static int start_fastpath(const tv__config *c, admit_ctx *actx, tv__fp **out, tv_error *err)
{
    *out = NULL;
    if (!c->fastpath_enabled) {
        tv__log(TV_LOG_INFO, "fast path disabled (fastpath.enabled = false)");
        return 0;
    }
    if (!c->fastpath_socket[0] || strlen(c->fastpath_socket) > TV__CFG_SOCKET_MAX) {
        tv__log(
            TV_LOG_WARN,
            "fast path not started: the socket path under store.dir %s is longer than %d bytes (set fastpath.socket)",
            c->store_dir, TV__CFG_SOCKET_MAX);
        return 0;
    }
    tv__fp_opts fo = {
        .socket_path = c->fastpath_socket,
        .socket_mode = c->fastpath_mode,
        .store_dir = c->store_dir,
        .engine = TV_ENGINE_AUTO,
        .slot_len = (uint32_t)c->fastpath_slot_len,
        .group_slots = c->fastpath_group_slots,
        .credit = c->fastpath_credit,
        .max_sessions = c->fastpath_max_sessions,
        .max_sessions_per_uid = c->fastpath_max_sessions_per_uid,
        .max_groups = c->fastpath_max_groups,
        .max_groups_per_uid = c->fastpath_max_groups_per_uid,
        .max_groups_per_model = c->fastpath_max_groups_per_model,
        .max_requests = c->fastpath_max_requests,
        .hold_timeout_ms = c->fastpath_hold_timeout_ms,
        .readahead = c->fastpath_readahead,
        .cache_len = c->cache_bytes ? (int64_t)c->cache_bytes : -1, /* 0: no tier */
        .cache_dir = c->cache_dir,
        .share_wait_ms = c->fastpath_share_wait_ms,
        .view_len_per_uid = c->cache_view_bytes_per_uid,
        .admit = admit,
        .peer = admit_peer,
        .admit_ctx = actx,
    };
    tv_error e = {0};
    int rc = tv__fp_start(&fo, out, &e);
    if (rc == TV_E_NOT_SUPPORTED) {
        tv__log(TV_LOG_WARN, "fast path not started: %s", e.msg);
        *out = NULL;
        return 0;
    }
    if (rc)
        return tv__seterr(err, rc, "fast path on %s: %s", c->fastpath_socket, e.msg);
    if (c->fastpath_max_sessions_per_uid >= c->fastpath_max_sessions) /* given, not the default */
        tv__log(
            TV_LOG_WARN,
            "fastpath.max_sessions_per_uid %u is not under fastpath.max_sessions %u: one uid may take every fast-path session",
            c->fastpath_max_sessions_per_uid, c->fastpath_max_sessions);
    if (c->fastpath_max_groups_per_uid >= c->fastpath_max_groups) /* given, not the default */
        tv__log(
            TV_LOG_WARN,
            "fastpath.max_groups_per_uid %u is not under fastpath.max_groups %u: one uid may take every read group",
            c->fastpath_max_groups_per_uid, c->fastpath_max_groups);
    tv__log(
        TV_LOG_INFO,
        "fast path on %s (mode %04o, %u sessions, credit %u, %u x %llu-byte slots per model, memory tier of %llu bytes (cache.bytes))",
        c->fastpath_socket, c->fastpath_mode, c->fastpath_max_sessions, c->fastpath_credit,
        c->fastpath_group_slots, (unsigned long long)c->fastpath_slot_len,
        (unsigned long long)c->cache_bytes);
    return 0;
}

/* The HOST[:PORT] of an http(s):// URL into out ("" when there is none):
 * peers reach this node by fleet.url, so its name is one of the daemon's. */
static void url_authority(const char *url, char *out, size_t len)
{
    const char *p = strstr(url, "://");
    out[0] = '\0';
    if (!p)
        return;
    p += 3;
    size_t n = strcspn(p, "/?#");
    const char *at = memchr(p, '@', n);
    if (at) {
        n -= (size_t)(at + 1 - p);
        p = at + 1;
    }
    if (n < len)
        snprintf(out, len, "%.*s", (int)n, p);
}

/* The soft limit of open descriptors up to want (at most the hard limit):
 * every HTTP connection and fast-path session holds one. */
static void raise_nofile(rlim_t want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur >= want)
        return;
    rlim_t to = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
    rl.rlim_cur = to;
    if (setrlimit(RLIMIT_NOFILE, &rl))
        tv__log(TV_LOG_WARN, "cannot raise the open-file limit to %llu: %s", (unsigned long long)to,
                strerror(errno));
}

static void kick_fleet(void *f)
{
    tv__fleet_kick(f);
}

/* What the daemon runs, in start order; stopped in reverse by tvd_stop
 * (every field may still be NULL or unset there). */
typedef struct tvd {
    const tv__config *c;
    tv__store *st;
    tv__jobs *jobs;
    tv__fp_access *access;
    tv__fp *fp;
    tv__history_sampler *history; /* the dashboard chart's samples */
    tv__api *api;
    tv__http *http;
    tv__fleet *fleet;
    admit_ctx actx;
    tv__src_http_opts http_src; /* the imports' (and the fleet's) http(s) and S3 settings */
    tv__src_hub_opts hub_src;   /* hf:// imports: import.hf_* */
    char token_path[TV__CFG_STR_MAX + 16];
    char fleet_host[256]; /* HOST[:PORT] of fleet.url, one of the daemon's names */
    char host[256];       /* of http.listen */
    uint16_t port;
} tvd;

/* The store (created on first start), its writer lock, the admin token. */
static int start_store(tvd *d, tv_error *err)
{
    const tv__config *c = d->c;
    int rc;
    if ((rc = ensure_store(c, err)) ||
        (rc = tv__store_open(c->store_dir, TV__STORE_WRITE, &d->st, err)))
        return rc;
    if (d->st->reclaimed.n_jobs)
        tv__log(TV_LOG_WARN, "%zu jobs interrupted by the last stop were marked failed",
                d->st->reclaimed.n_jobs);
    return ensure_admin_token(d->st, d->token_path, c->store_admin_token_mode, err);
}

/* The job pool, with the imports' settings. */
static int start_jobs(tvd *d, tv_error *err)
{
    const tv__config *c = d->c;
    int rc = tv__jobs_start(d->st, c->import_workers, c->import_queue, &d->jobs, err);
    if (rc)
        return rc;
    tv__jobs_set_strict_default(d->jobs, c->import_strict);
    d->http_src = (tv__src_http_opts){.s3 = {.endpoint = c->s3_endpoint,
                                             .region = c->s3_region,
                                             .access_key_id = c->s3_access_key_id,
                                             .secret_access_key = c->s3_secret_access_key,
                                             .session_token = c->s3_session_token},
                                      .proxy = c->fleet_proxy,
                                      .retries = c->import_http_retries,
                                      .timeout_s = c->import_http_timeout,
                                      .range = c->import_http_range};
    d->hub_src = (tv__src_hub_opts){.endpoint = c->import_hf_endpoint,
                                    .token = c->hf_token[0] ? c->hf_token : NULL,
                                    .redirects = {.max = TV__HTTP_DEFAULT_REDIRECTS,
                                                  .allow_http = c->import_hf_redirect_http,
                                                  .allow_private = c->import_hf_redirect_private},
                                    .sidecar_max_len = c->import_sidecar_max_bytes,
                                    .sidecar_total_len = c->import_sidecar_total_bytes};
    d->http_src.hub = &d->hub_src;
    tv__jobs_set_http(d->jobs, &d->http_src);
    tv__jobs_set_sidecar_caps(d->jobs, c->import_sidecar_max_bytes, c->import_sidecar_total_bytes);
    return 0;
}

/* The access rules, the fast path that applies them, and the throughput
 * history (it reads the fast path's counters and the jobs'). */
static int start_access(tvd *d, tv_error *err)
{
    int rc;
    if ((rc = make_access(d->c, &d->access, err)))
        return rc;
    d->actx.access = d->access;
    warn_unknown_access(d->c, d->st);
    if ((rc = start_fastpath(d->c, &d->actx, &d->fp, err)))
        return rc;
    tv__metrics_set_fastpath(d->fp);
    if ((rc = tv__history_start(d->jobs, TV__HISTORY_INTERVAL_MS, &d->history)))
        return tv__seterr(err, rc, "cannot start the throughput history: %s", strerror(-rc));
    return 0;
}

/* The api over the writer store; the demo import when asked for. */
static int start_api(tvd *d, tv_error *err)
{
    const tv__config *c = d->c;
    char roots_buf[TV__CFG_STR_MAX];
    const char *roots[TV__CFG_MAX_ROOTS];
    size_t n_roots = tv__config_roots(c, roots_buf, roots);
    tv__api_opts ao = {
        .store_dir = c->store_dir,
        .writer = true,
        .jobs = d->jobs,
        .import_roots = roots,
        .n_import_roots = n_roots,
        .import_origins = c->import_origins,
        .anonymous_reads = c->http_anonymous_reads == TV__CFG_ANON_ALWAYS  ? TV__ANON_ALWAYS
                           : c->http_anonymous_reads == TV__CFG_ANON_NEVER ? TV__ANON_NEVER
                                                                           : TV__ANON_LOOPBACK,
        .max_body_bytes = (size_t)c->http_max_body_bytes,
        .openapi_yaml = tv__openapi_yaml,
        .openapi_len = tv__openapi_yaml_len,
        .fp = d->fp,
        .fleet_token = c->fleet_token,
        .fleet_conninfo = c->fleet_postgres,
        .access = d->access,
    };
    int rc = tv__api_open(&ao, d->st, &d->api, err);
    if (rc)
        return rc;
    maybe_demo(c, d->st, d->jobs);
    return 0;
}

/* HTTP on http.listen and the UNIX socket; says where once it listens. */
static int start_http(tvd *d, tv_error *err)
{
    const tv__config *c = d->c;
    url_authority(c->fleet_url, d->fleet_host, sizeof d->fleet_host);
    if (!c->http_socket[0])
        tv__log(
            c->http_socket_set ? TV_LOG_INFO : TV_LOG_WARN,
            c->http_socket_set
                ? "http: no UNIX socket (http.socket is empty)"
                : "http: no UNIX socket: the path under store.dir %s is too long (set http.socket)",
            c->store_dir);
    tv__http_opts ho = {
        .listen = c->http_listen,
        .threads = c->http_threads,
        .connection_timeout_s = c->http_connection_timeout_s,
        .header_timeout_s = c->http_header_timeout_s,
        .per_ip_connections = c->http_per_ip_connections,
        .per_uid_connections = c->http_per_uid_connections,
        .max_connections = c->http_max_connections,
        .memory_limit = (size_t)c->http_memory_limit,
        .max_body_bytes = (size_t)c->http_max_body_bytes,
        .max_header_bytes = (size_t)c->http_max_header_bytes,
        .store_dir = c->store_dir,
        .socket_path = c->http_socket,
        .socket_mode = c->http_socket_mode,
        .identify_loopback = c->http_anonymous_reads != TV__CFG_ANON_NEVER,
        .allowed_hosts = c->http_allowed_hosts,
        .extra_hosts = d->fleet_host,
    };
    raise_nofile(c->http_max_connections + c->fastpath_max_sessions + 256u);
    int rc = tv__http_start(&ho, d->api, d->jobs, &d->http, &d->port, err);
    if (rc)
        return rc;
    const char *colon = strrchr(c->http_listen, ':');
    snprintf(d->host, sizeof(d->host), "%.*s", (int)(colon - c->http_listen), c->http_listen);
    const char *shown = strncmp(d->token_path, "./", 2) == 0 ? d->token_path + 2 : d->token_path;
    printf("tensorvaultd: listening on http://%s:%u (admin token in %s)\n", d->host,
           (unsigned)d->port, shown);
    fflush(stdout);
    tv__log(TV_LOG_INFO, "listening on http://%s:%u, store %s, %u import workers", d->host,
            (unsigned)d->port, c->store_dir, c->import_workers);
    return 0;
}

/* Fleet mode (fleet.postgres set): a thread of its own connects in the
 * background; the node serves standalone until (and whenever) the catalog
 * is away. */
static int start_fleet(tvd *d, tv_error *err)
{
    const tv__config *c = d->c;
    if (!c->fleet_postgres[0])
        return 0;
    char url[TV__CFG_STR_MAX + 32];
    if (c->fleet_url[0])
        snprintf(url, sizeof(url), "%s", c->fleet_url);
    else
        snprintf(url, sizeof(url), "http://%s:%u", d->host, (unsigned)d->port);
    size_t ul = strlen(url);
    while (ul > 0 && url[ul - 1] == '/')
        url[--ul] = '\0';
    tv__fleet_opts fo = {.conninfo = c->fleet_postgres,
                         .node = c->fleet_node,
                         .url = url,
                         .reg_path = d->actx.reg_path,
                         .jobs = d->jobs,
                         .store = d->st,
                         .token = c->fleet_token,
                         .object_store = c->fleet_object_store,
                         .proxy = c->fleet_proxy,
                         .s3 = &d->http_src.s3,
                         .pull_attempts = c->fleet_pull_attempts,
                         .node_down_s = c->fleet_node_down_s};
    int rc = tv__fleet_start(&fo, &d->fleet, err);
    if (rc)
        return rc;
    tv__jobs_set_on_import(d->jobs, kick_fleet, d->fleet);
    tv__api_set_fleet(d->api, d->fleet);
    return 0;
}

/* Until SIGTERM or SIGINT (blocked in every thread, taken here); SIGHUP
 * reopens the log. */
static void wait_for_stop(const tv__config *c)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    for (;;) {
        siginfo_t si;
        int sig = sigwaitinfo(&set, &si);
        if (sig < 0)
            continue; /* EINTR */
        if (sig == SIGHUP) {
            int lr = reopen_log(c);
            if (lr)
                fprintf(stderr, "tensorvault[error] cannot reopen log %s: %s\n", c->log_file,
                        strerror(-lr));
            else
                tv__log(TV_LOG_INFO, "log reopened (SIGHUP)");
            continue;
        }
        tv__log(TV_LOG_INFO, "%s: stopping (no new connections, cancelling running jobs)",
                sig == SIGTERM ? "SIGTERM" : "SIGINT");
        return;
    }
}

/* Everything started, stopped in reverse order: HTTP first (no request can
 * reach a freed part), the store last. */
static void tvd_stop(tvd *d)
{
    tv__http_quiesce(d->http);
    tv__http_stop(d->http);
    tv__history_stop(d->history);
    tv__metrics_set_fastpath(NULL);
    tv__fp_stop(d->fp); /* sessions closed, leases released: before the store closes */
    tv__jobs_set_on_import(d->jobs, NULL, NULL);
    /* Jobs first: a pull's job calls back into the fleet's state. */
    tv__jobs_stop(d->jobs);
    tv__fleet_stop(d->fleet);
    tv__api_close(d->api);
    tv__reg_close(d->actx.reg);
    tv__fp_access_free(d->access);
    pthread_mutex_destroy(&d->actx.mu);
    tv__store_close(d->st);
}

static int run(const tv__config *c)
{
    int rc, exit_code = 1;
    tv_error err = {0};
    tvd d = {.c = c};
    pthread_mutex_init(&d.actx.mu, NULL);
    snprintf(d.actx.reg_path, sizeof(d.actx.reg_path), "%s/registry.db", c->store_dir);
    snprintf(d.token_path, sizeof(d.token_path), "%s", c->store_admin_token);
    if ((rc = start_store(&d, &err)) || (rc = start_jobs(&d, &err)) ||
        (rc = start_access(&d, &err)) || (rc = start_api(&d, &err)) ||
        (rc = start_http(&d, &err)) || (rc = start_fleet(&d, &err))) {
        fprintf(stderr, "tensorvaultd: %s\n", err.msg[0] ? err.msg : tv_strerror(rc));
        goto out;
    }
    wait_for_stop(c);
    exit_code = 0;
out:
    tvd_stop(&d);
    if (exit_code == 0)
        tv__log(TV_LOG_INFO, "stopped");
    return exit_code;
}

int main(int argc, char **argv)
{
    tv__config *c = malloc(sizeof(*c));
    if (!c) {
        fprintf(stderr, "tensorvaultd: out of memory\n");
        return 1;
    }
    /* Every thread started from here on inherits the blocked set. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    tv_error err = {0};
    tv__config_action act;
    int code = 1;
    if (tv__config_load(c, argc, argv, environ, &act, &err)) {
        fprintf(stderr, "tensorvaultd: %s\n", err.msg);
        code = 2;
        goto out;
    }
    if (act == TV__CFG_HELP) {
        fputs(tv__config_usage(), stdout);
        code = 0;
        goto out;
    }
    if (act == TV__CFG_VERSION) {
        printf("tensorvaultd %s\n", TV_VERSION_STRING);
        code = 0;
        goto out;
    }
    tv__log_set_level(c->log_level);
    int lr = reopen_log(c);
    if (lr) {
        fprintf(stderr, "tensorvaultd: cannot open log file %s: %s\n", c->log_file, strerror(-lr));
        goto out;
    }
    code = run(c);
out:
    free(c);
    return code;
}
