/* Answers that come later, from another thread (see tv__api_later in
 * api.h): the handler hands the work to a worker (the fleet's alias-move
 * thread) and returns at once; the transport parks the request
 * (libmicrohttpd suspends the connection, so no HTTP thread waits) until
 * the worker finishes, or until the deadline answers 503 in its place.
 *
 * Invariants: one answer per later (the first of finish and expire wins,
 * under mu); wake is called exactly once, outside mu, after the answer is
 * in; the later lives until both the worker and the transport dropped
 * their reference. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http/api_internal.h"

enum { L_QUEUED, L_RUNNING, L_DONE };

struct tv__api_later {
    pthread_mutex_t mu;
    pthread_cond_t cond; /* an in-process caller waits on it */
    int refs;
    int state;
    int64_t deadline_ms;
    char if_queued[256], if_running[256]; /* the 503's message by state at the deadline */
    tv__api_resp resp;                    /* the answer once L_DONE */
    void (*wake)(void *ctx);
    void *wake_ctx;
    bool woken;
};

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void unref(tv__api_later *l)
{
    pthread_mutex_lock(&l->mu);
    bool last = --l->refs == 0;
    pthread_mutex_unlock(&l->mu);
    if (!last)
        return;
    /* An answer is a status, headers and a JSON document (answer()), never
     * a body, a stream or a later of its own: its document is all there is
     * to free. */
    json_decref(l->resp.json);
    pthread_cond_destroy(&l->cond);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

tv__api_later *tv__api_later_new(tv__api_ctx *c, int64_t timeout_ms, const char *if_queued,
                                 const char *if_running)
{
    tv__api_later *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    pthread_mutex_init(&l->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cond, &ca);
    pthread_condattr_destroy(&ca);
    l->refs = 2; /* the worker's and the transport's */
    l->state = L_QUEUED;
    l->deadline_ms = mono_ms() + timeout_ms;
    snprintf(l->if_queued, sizeof l->if_queued, "%s", if_queued);
    snprintf(l->if_running, sizeof l->if_running, "%s", if_running);
    c->resp->later = l;
    return l;
}

void tv__api_later_discard(tv__api_ctx *c)
{
    tv__api_later *l = c->resp->later;
    c->resp->later = NULL;
    if (l) {
        unref(l);
        unref(l);
    }
}

bool tv__api_later_claim(tv__api_later *l)
{
    pthread_mutex_lock(&l->mu);
    bool ok = l->state == L_QUEUED;
    if (ok)
        l->state = L_RUNNING;
    pthread_mutex_unlock(&l->mu);
    if (!ok)
        unref(l); /* given up on: the worker's part ends here */
    return ok;
}

/* Sets the answer (under mu, state not L_DONE); returns whether the caller
 * must call wake. */
static bool answer(tv__api_later *l, int status, json_t *doc, int code, const char *msg)
{
    tv__api_resp *r = &l->resp;
    r->status = code ? tv__api_http_status(code) : status;
    r->json = code ? tv__api_error_json(code, msg) : doc;
    r->content_type = "application/json";
    if (code && r->status == 503)
        snprintf(r->headers, sizeof r->headers, "Retry-After: 1\r\n");
    l->state = L_DONE;
    pthread_cond_broadcast(&l->cond);
    bool w = l->wake && !l->woken;
    l->woken = l->woken || w;
    return w;
}

void tv__api_later_finish(tv__api_later *l, int status, json_t *doc, int code, const char *msg)
{
    pthread_mutex_lock(&l->mu);
    bool w = false;
    if (l->state != L_DONE)
        w = answer(l, status, doc, code, msg);
    else
        json_decref(doc); /* the deadline answered already */
    pthread_mutex_unlock(&l->mu);
    if (w)
        l->wake(l->wake_ctx);
    unref(l);
}

void tv__api_later_watch(tv__api_later *l, void (*wake)(void *ctx), void *ctx)
{
    pthread_mutex_lock(&l->mu);
    l->wake = wake;
    l->wake_ctx = ctx;
    bool now = l->state == L_DONE && !l->woken;
    l->woken = l->woken || now;
    pthread_mutex_unlock(&l->mu);
    if (now)
        wake(ctx);
}

int64_t tv__api_later_deadline(const tv__api_later *l)
{
    return l->deadline_ms;
}

void tv__api_later_expire(tv__api_later *l, int64_t now_ms, bool force)
{
    pthread_mutex_lock(&l->mu);
    bool w = false;
    if (l->state != L_DONE && (force || now_ms >= l->deadline_ms))
        w = answer(l, 0, NULL, TV_E_BUSY, l->state == L_QUEUED ? l->if_queued : l->if_running);
    pthread_mutex_unlock(&l->mu);
    if (w)
        l->wake(l->wake_ctx);
}

void tv__api_later_take(tv__api_resp *resp)
{
    tv__api_later *l = resp->later;
    if (!l)
        return;
    const char *route = resp->route;
    pthread_mutex_lock(&l->mu);
    *resp = l->resp; /* L_DONE: the worker no longer touches it */
    memset(&l->resp, 0, sizeof l->resp);
    pthread_mutex_unlock(&l->mu);
    resp->route = route;
    resp->later = NULL;
    unref(l);
}

void tv__api_later_abandon(tv__api_later *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    l->wake = NULL;
    pthread_mutex_unlock(&l->mu);
    unref(l);
}

void tv__api_later_wait(tv__api_resp *resp)
{
    tv__api_later *l = resp->later;
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    while (l->state != L_DONE) {
        struct timespec until = {.tv_sec = l->deadline_ms / 1000,
                                 .tv_nsec = (l->deadline_ms % 1000) * 1000000};
        if (pthread_cond_timedwait(&l->cond, &l->mu, &until) == ETIMEDOUT && l->state != L_DONE)
            answer(l, 0, NULL, TV_E_BUSY, l->state == L_QUEUED ? l->if_queued : l->if_running);
    }
    pthread_mutex_unlock(&l->mu);
    tv__api_later_take(resp);
}
