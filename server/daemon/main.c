/* tensorvaultd: the registry as a service. Start-up in this order: config,
 * log, store (created with a sparse image on first start), the writer lock,
 * the admin token file (first start only), the job pool, the api, HTTP;
 * then signals until SIGTERM or SIGINT, and shut down in reverse.
 *
 * Invariants: signals are blocked in every thread and taken synchronously
 * here (sigwaitinfo), so no handler runs inside a library; HTTP stops before
 * the pool (no request can reach a freed pool), the pool cancels its jobs
 * (nothing half-imported is published; reservations are released) before
 * the store closes; an existing admin.token file is never overwritten. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/config.h"
#include "daemon/jobs.h"
#include "daemon/openapi.h"
#include "http/api.h"
#include "http/mhd.h"
#include "import/import.h"
#include "store/store.h"
#include "tensorvault/version.h"
#include "util/internal.h"
#include "util/sys.h"

extern char **environ;

#define TOKEN_FILE "admin.token"

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

/* DIR/admin.token: created exclusively (0600), then an admin token is made
 * and written into it; an existing file is left as it is. */
static int ensure_admin_token(tv__store *st, const char *path, tv_error *err)
{
    int fd = tv__sys_open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd == -EEXIST)
        return 0;
    if (fd < 0)
        return tv__seterr(err, fd, "cannot create %s: %s", path, strerror(-fd));
    char secret[TV__TOKEN_SECRET_LEN + 2];
    tv__reg_token tok;
    int rc = tv__reg_token_create(st->reg, "admin", TV__SCOPE_ADMIN, secret, &tok, err);
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
    tv__log(TV_LOG_INFO, "wrote admin token %" PRId64 " to %s", tok.id, path);
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

static int run(const tv__config *c)
{
    int rc, exit_code = 1;
    tv_error err = {0};
    tv__store *st = NULL;
    tv__jobs *jobs = NULL;
    tv__api *api = NULL;
    tv__http *http = NULL;
    char token_path[TV__CFG_STR_MAX + 16];
    char roots_buf[TV__CFG_STR_MAX];
    const char *roots[TV__CFG_MAX_ROOTS];
    size_t n_roots = tv__config_roots(c, roots_buf, roots);
    snprintf(token_path, sizeof(token_path), "%s/%s", c->store_dir, TOKEN_FILE);

    if ((rc = ensure_store(c, &err)) ||
        (rc = tv__store_open(c->store_dir, TV__STORE_WRITE, &st, &err)))
        goto fail;
    if (st->reclaimed.n_jobs)
        tv__log(TV_LOG_WARN, "%zu jobs interrupted by the last stop were marked failed",
                st->reclaimed.n_jobs);
    if ((rc = ensure_admin_token(st, token_path, &err)))
        goto fail;
    if ((rc = tv__jobs_start(st, c->import_workers, c->import_queue, &jobs, &err)))
        goto fail;
    tv__jobs_set_strict_default(jobs, c->import_strict);
    tv__api_opts ao = {
        .store_dir = c->store_dir,
        .writer = true,
        .jobs = jobs,
        .import_roots = roots,
        .n_import_roots = n_roots,
        .anonymous_reads = c->http_anonymous_reads == TV__CFG_ANON_ALWAYS  ? TV__ANON_ALWAYS
                           : c->http_anonymous_reads == TV__CFG_ANON_NEVER ? TV__ANON_NEVER
                                                                           : TV__ANON_LOOPBACK,
        .max_body_bytes = (size_t)c->http_max_body_bytes,
        .openapi_yaml = tv__openapi_yaml,
        .openapi_len = tv__openapi_yaml_len,
    };
    if ((rc = tv__api_open(&ao, st, &api, &err)))
        goto fail;
    maybe_demo(c, st, jobs);
    tv__http_opts ho = {
        .listen = c->http_listen,
        .threads = c->http_threads,
        .connection_timeout_s = c->http_connection_timeout_s,
        .per_ip_connections = c->http_per_ip_connections,
        .memory_limit = (size_t)c->http_memory_limit,
        .max_body_bytes = (size_t)c->http_max_body_bytes,
        .max_header_bytes = (size_t)c->http_max_header_bytes,
        .store_dir = c->store_dir,
    };
    uint16_t port = 0;
    if ((rc = tv__http_start(&ho, api, jobs, &http, &port, &err)))
        goto fail;
    char host[256];
    const char *colon = strrchr(c->http_listen, ':');
    snprintf(host, sizeof(host), "%.*s", (int)(colon - c->http_listen), c->http_listen);
    const char *shown = strncmp(token_path, "./", 2) == 0 ? token_path + 2 : token_path;
    printf("tensorvaultd: listening on http://%s:%u (admin token in %s)\n", host, (unsigned)port,
           shown);
    fflush(stdout);
    tv__log(TV_LOG_INFO, "listening on http://%s:%u, store %s, %u import workers", host,
            (unsigned)port, c->store_dir, c->import_workers);

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
        break;
    }
    exit_code = 0;
    goto out;
fail:
    fprintf(stderr, "tensorvaultd: %s\n", err.msg[0] ? err.msg : tv_strerror(rc));
out:
    tv__http_quiesce(http);
    tv__http_stop(http);
    tv__jobs_stop(jobs);
    tv__api_close(api);
    tv__store_close(st);
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
