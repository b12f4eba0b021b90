/* The alias-move thread (see mover.h). */
#include "fleet/mover.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/internal.h"

#define MOVER_STOP_WAIT_S 5

typedef struct queued {
    tv__mover_req r;
    char **strs; /* the copies: model, alias, placement names */
    const char **placement;
    struct queued *next;
} queued;

struct tv__mover {
    char *conninfo;
    tv__catalog *cat; /* the thread's */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    queued *head, *tail;
    size_t n;
    bool stopping;
};

static void queued_free(queued *q)
{
    if (!q)
        return;
    for (size_t i = 0; q->strs && q->strs[i]; i++)
        free(q->strs[i]);
    free(q->strs);
    free(q->placement);
    free(q);
}

/* A deep copy of r (its strings and placement list). */
static queued *queued_copy(const tv__mover_req *r)
{
    size_t np = 0;
    while (r->move.placement && r->move.placement[np])
        np++;
    queued *q = calloc(1, sizeof *q);
    if (!q || !(q->strs = calloc(np + 3, sizeof *q->strs)) ||
        (np && !(q->placement = calloc(np + 1, sizeof *q->placement))))
        goto fail;
    q->r = *r;
    if (!(q->strs[0] = strdup(r->move.model)) || !(q->strs[1] = strdup(r->move.alias)))
        goto fail;
    q->r.move.model = q->strs[0];
    q->r.move.alias = q->strs[1];
    for (size_t i = 0; i < np; i++) {
        if (!(q->strs[2 + i] = strdup(r->move.placement[i])))
            goto fail;
        q->placement[i] = q->strs[2 + i];
    }
    q->r.move.placement = np ? q->placement : NULL;
    return q;
fail:
    queued_free(q);
    return NULL;
}

static void run_one(tv__mover *m, queued *q)
{
    tv_error err = {0};
    int64_t version = 0;
    int rc = 0;
    if (!q->r.claim(q->r.ctx))
        return;
    if (!m->cat && (rc = tv__catalog_open_ex(m->conninfo, TV__CATALOG_BRIEF, &m->cat, &err))) {
        if (rc == -ECONNREFUSED)
            rc = TV_E_BUSY;
    } else if ((rc = tv__catalog_move_alias(m->cat, &q->r.move, &version, &err))) {
        if (rc == -ECONNREFUSED)
            rc = TV_E_BUSY;
    }
    q->r.done(q->r.ctx, rc, version, &err);
}

static void *mover_main(void *arg)
{
    tv__mover *m = arg;
    pthread_mutex_lock(&m->mu);
    for (;;) {
        while (!m->stopping && !m->head)
            pthread_cond_wait(&m->cond, &m->mu);
        if (m->stopping)
            break;
        queued *q = m->head;
        m->head = q->next;
        if (!m->head)
            m->tail = NULL;
        m->n--;
        pthread_mutex_unlock(&m->mu);
        run_one(m, q);
        queued_free(q);
        pthread_mutex_lock(&m->mu);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

int tv__mover_start(const char *conninfo, tv__mover **out, tv_error *err)
{
    if (!conninfo || !conninfo[0] || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "fleet mover: empty conninfo");
    tv__mover *m = calloc(1, sizeof *m);
    if (!m || !(m->conninfo = strdup(conninfo))) {
        free(m);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cond, NULL);
    int rc = pthread_create(&m->thread, NULL, mover_main, m);
    if (rc) {
        pthread_cond_destroy(&m->cond);
        pthread_mutex_destroy(&m->mu);
        free(m->conninfo);
        free(m);
        return tv__seterr(err, -rc, "fleet: starting the alias-move thread: %s", strerror(rc));
    }
    *out = m;
    return 0;
}

int tv__mover_submit(tv__mover *m, const tv__mover_req *r, tv_error *err)
{
    queued *q = queued_copy(r);
    if (!q)
        return tv__seterr(err, -ENOMEM, "out of memory");
    pthread_mutex_lock(&m->mu);
    int rc = 0;
    if (m->stopping)
        rc = tv__seterr(err, TV_E_STATE, "the daemon is stopping: the alias did not move");
    else if (m->n >= TV__MOVER_QUEUE)
        rc = tv__seterr(
            err, TV_E_BUSY,
            "%d fleet alias moves wait for the catalog already: this one did not move (try again)",
            TV__MOVER_QUEUE);
    if (!rc) {
        if (m->tail)
            m->tail->next = q;
        else
            m->head = q;
        m->tail = q;
        m->n++;
        q = NULL;
        pthread_cond_signal(&m->cond);
    }
    pthread_mutex_unlock(&m->mu);
    queued_free(q);
    return rc;
}

void tv__mover_stop(tv__mover *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    m->stopping = true;
    queued *q = m->head;
    m->head = m->tail = NULL;
    m->n = 0;
    pthread_cond_signal(&m->cond);
    pthread_mutex_unlock(&m->mu);
    while (q) {
        queued *nx = q->next;
        tv_error e = {0};
        tv__seterr(&e, TV_E_BUSY, "the daemon is stopping: the alias did not move");
        if (q->r.claim(q->r.ctx))
            q->r.done(q->r.ctx, TV_E_BUSY, 0, &e);
        queued_free(q);
        q = nx;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += MOVER_STOP_WAIT_S;
    if (pthread_timedjoin_np(m->thread, NULL, &until) == ETIMEDOUT) {
        tv__log(TV_LOG_WARN,
                "fleet: an alias move still waits on the catalog after %d s; stopping without it",
                MOVER_STOP_WAIT_S);
        pthread_detach(m->thread);
        return; /* the thread still uses m: left to the exit */
    }
    tv__catalog_close(m->cat);
    pthread_cond_destroy(&m->cond);
    pthread_mutex_destroy(&m->mu);
    free(m->conninfo);
    free(m);
}
