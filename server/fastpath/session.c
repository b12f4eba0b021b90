/* Fast-path sessions: the per-connection state machine (HELLO, then OPEN /
 * READ / RELEASE / CLOSE), its requests and their chunk cursors, the
 * round-robin scheduler over sessions, and the outbox of encoded messages
 * the socket has not taken yet.
 *
 * Invariants:
 *   - nothing here blocks on a client: messages go out with non-blocking
 *     sends; what the socket refuses waits in the outbox, bounded by
 *     credit + max_requests + a few control messages (entries counted): a
 *     session whose outbox is still past it after a send attempt is closed
 *     as a protocol error;
 *   - CHUNK and DONE entries of a turn are batched (chunks flushed before
 *     dones, and both before any other message), so every CHUNK of a request
 *     precedes its DONE and an ERROR naming a request precedes its DONE;
 *   - a request is issued one chunk per scheduling round while its session
 *     holds fewer than credit references + waits; a chunk in the table is
 *     never read again (a wait, or a reference on the ready slot);
 *   - a session below its credit that finds no free slot marks the group
 *     starved for the turn; the holders of that group's slots that
 *     released nothing for hold_timeout_ms are then failed (TV_E_TIMEOUT):
 *     the scheduler never waits on a client for longer than that;
 *   - every reference a session holds is counted per (handle, slot): a
 *     RELEASE of one not held is fatal, and a handle's close or the
 *     session's end gives every one back. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fastpath/fp_internal.h"
#include "util/sys.h"

#define FP_INPUT_BATCH 64 /* messages read from one socket per turn */

/* Unlinks node n (fields prev, next) from the list head .. tail. */
#define DLIST_UNLINK(head, tail, n)                                                                \
    do {                                                                                           \
        if ((n)->prev)                                                                             \
            (n)->prev->next = (n)->next;                                                           \
        else                                                                                       \
            (head) = (n)->next;                                                                    \
        if ((n)->next)                                                                             \
            (n)->next->prev = (n)->prev;                                                           \
        else                                                                                       \
            (tail) = (n)->prev;                                                                    \
    } while (0)

static uint64_t out_bound(const tv__fp *fp)
{
    return (uint64_t)fp->o.credit + fp->o.max_requests + 2ull * fp->o.max_handles + 64u;
}

/* ---- outbox ---- */

static void close_fds(const int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (fds[i] >= 0)
            tv__sys.close(fds[i]);
}

/* Appends one encoded message (taking the fds). */
static void out_push(fp_session *s, const void *buf, size_t len, const int *fds, size_t n_fds,
                     uint32_t entries)
{
    fp_out *o;
    if (s->doomed || len == 0) {
        close_fds(fds, n_fds);
        if (!s->doomed)
            tv__fp_session_fail(s, TV_E_INTERNAL, "fastpath: a reply did not encode");
        return;
    }
    o = malloc(sizeof(*o) + len);
    if (!o) {
        close_fds(fds, n_fds);
        tv__fp_session_fail(s, -ENOMEM, "fastpath: out of memory for a reply");
        return;
    }
    o->next = NULL;
    o->len = (uint32_t)len;
    o->entries = entries;
    o->n_fds = (uint32_t)n_fds;
    for (size_t i = 0; i < n_fds; i++)
        o->fds[i] = fds[i];
    memcpy(o->buf, buf, len);
    if (s->out_tail)
        s->out_tail->next = o;
    else
        s->out_head = o;
    s->out_tail = o;
    s->out_entries += entries;
    s->dirty = true;
}

void tv__fp_session_flush(fp_session *s)
{
    tv__fp *fp = s->fp;
    if (s->n_pchunk) {
        size_t len =
            tv__fp_encode_chunk(fp->sbuf, sizeof fp->sbuf, s->version, s->pchunk, s->n_pchunk);
        out_push(s, fp->sbuf, len, NULL, 0, s->n_pchunk);
        s->n_pchunk = 0;
    }
    if (s->n_pdone) {
        size_t len =
            tv__fp_encode_done(fp->sbuf, sizeof fp->sbuf, s->version, s->pdone, s->n_pdone);
        out_push(s, fp->sbuf, len, NULL, 0, s->n_pdone);
        s->n_pdone = 0;
    }
}

/* A control message: after every pending entry. */
static void out_control(fp_session *s, size_t len, const int *fds, size_t n_fds)
{
    tv__fp *fp = s->fp;
    uint8_t *msg = malloc(len ? len : 1);
    if (!msg) {
        close_fds(fds, n_fds);
        tv__fp_session_fail(s, -ENOMEM, "fastpath: out of memory for a reply");
        return;
    }
    memcpy(msg, fp->sbuf, len); /* flushing below reuses sbuf */
    tv__fp_session_flush(s);
    out_push(s, msg, len, fds, n_fds, 1);
    free(msg);
}

static void send_error(fp_session *s, int code, uint64_t req_id, uint32_t open_id, const char *msg)
{
    size_t len = tv__fp_encode_error(s->fp->sbuf, sizeof s->fp->sbuf, s->version, code, 0, req_id,
                                     open_id, msg, strlen(msg));
    out_control(s, len, NULL, 0);
}

static void push_done(fp_session *s, uint64_t req_id, int result, uint32_t handle)
{
    if (s->n_pdone == TV__FP_MAX_DONES)
        tv__fp_session_flush(s);
    s->pdone[s->n_pdone++] =
        (tv__fp_done_ent){.req_id = req_id, .result = result, .handle = handle};
    s->requests_done++;
    s->dirty = true;
}

void tv__fp_session_on_output(fp_session *s)
{
    while (s->out_head && !s->doomed) {
        fp_out *o = s->out_head;
        tv_error err = {0};
        int rc = tv__fp_send(s->fd, o->buf, o->len, o->fds, o->n_fds, &err);
        if (rc == -EAGAIN)
            break;
        if (rc) {
            tv__fp_session_drop(s, err.msg[0] ? err.msg : "send failed");
            break;
        }
        s->out_head = o->next;
        if (!s->out_head)
            s->out_tail = NULL;
        s->out_entries -= o->entries;
        close_fds(o->fds, o->n_fds);
        free(o);
    }
    if (!s->doomed && s->out_entries > out_bound(s->fp))
        tv__fp_session_fail(s, TV_E_PROTOCOL,
                            "the client does not read its replies: %" PRIu64
                            " entries wait to be sent (at most %" PRIu64 ")",
                            s->out_entries, out_bound(s->fp));
    if (!s->doomed)
        tv__fp_session_arm(s);
}

/* ---- doom ---- */

void tv__fp_session_fail(fp_session *s, int code, const char *fmt, ...)
{
    va_list ap;
    if (s->doomed)
        return;
    s->doomed = true;
    s->fatal_code = code ? code : TV_E_PROTOCOL;
    va_start(ap, fmt);
    vsnprintf(s->fatal_msg, sizeof s->fatal_msg, fmt, ap);
    va_end(ap);
}

void tv__fp_session_drop(fp_session *s, const char *why)
{
    if (s->doomed)
        return;
    s->doomed = true;
    s->fatal_code = 0;
    snprintf(s->why, sizeof s->why, "%s", why);
}

/* ---- requests ---- */

static uint32_t req_hash(const fp_session *s, uint64_t id)
{
    id ^= id >> 31;
    id *= 0x9E3779B97F4A7C15ull;
    return (uint32_t)(id >> 32) & s->hash_mask;
}

static fp_req *req_find(const fp_session *s, uint64_t id)
{
    for (fp_req *r = s->hash[req_hash(s, id)]; r; r = r->hnext)
        if (r->req_id == id)
            return r;
    return NULL;
}

/* The list wait w is on: its legacy slot's, or (version 3) its chunk's. */
static fp_wait **wait_head(const fp_wait *w)
{
    fp_group *g = w->req->h->g;
    return w->req->h->legacy ? &g->slots[w->slot].waits : &g->chunks[w->slot].waits;
}

/* Unlinks wait w from its slot's or chunk's list. */
static void unlink_wait(fp_wait *w)
{
    if (w->sprev)
        w->sprev->snext = w->snext;
    else
        *wait_head(w) = w->snext;
    if (w->snext)
        w->snext->sprev = w->sprev;
}

/* Unlinks r (its waits too) from everything and frees it. */
static void req_remove(fp_req *r)
{
    fp_handle *h = r->h;
    fp_session *s = h->s;
    fp_wait *w = r->waits;
    while (w) {
        fp_wait *nx = w->rnext;
        unlink_wait(w);
        s->waits--;
        free(w);
        w = nx;
    }
    if (s->issue == r)
        s->issue = r->next;
    DLIST_UNLINK(s->rq_head, s->rq_tail, r);
    fp_req **pp = &s->hash[req_hash(s, r->req_id)];
    while (*pp && *pp != r)
        pp = &(*pp)->hnext;
    if (*pp)
        *pp = r->hnext;
    s->n_reqs--;
    h->n_reqs--;
    s->fp->again = true;
    free(r);
}

static void req_maybe_done(fp_req *r)
{
    if (r->next_k != r->end_k || r->n_waits)
        return;
    push_done(r->h->s, r->req_id, 0, r->h->id);
    req_remove(r);
}

void tv__fp_req_fail(fp_req *r, int code, const char *msg)
{
    fp_handle *h = r->h;
    fp_session *s = h->s;
    tv__snap_tensor_info ti;
    char text[TV__FP_MAX_TEXT + 1];
    if (r->header)
        snprintf(text, sizeof text, "model '%s' generation %" PRId64 ": shard %u header: %s",
                 h->g->name, h->g->gen, r->shard, msg);
    else if (tv__snap_tensor(h->g->snap, r->tensor, &ti, NULL) == 0)
        snprintf(text, sizeof text, "tensor '%.*s' (index %u): %s", (int)ti.name_len, ti.name,
                 r->tensor, msg);
    else
        snprintf(text, sizeof text, "tensor %u: %s", r->tensor, msg);
    send_error(s, code, r->req_id, 0, text);
    push_done(s, r->req_id, code, h->id);
    req_remove(r);
}

/* The CHUNK entry of request r for chunk k (of its shard), now in slot idx
 * (a legacy slot, or the chunk's index in the tier). Returns its bytes. */
static uint64_t emit_chunk(fp_req *r, uint64_t k, uint32_t idx, bool shared)
{
    fp_handle *h = r->h;
    fp_session *s = h->s;
    tv__fp *fp = s->fp;
    uint64_t L = h->g->chunk_len, kL = k * L; /* k < end_k: inside E, checked at READ */
    uint64_t b = r->P > kL ? r->P : kL;
    uint64_t e = r->E < kL + L ? r->E : kL + L;
    uint64_t len = e - b;
    if (s->n_pchunk == TV__FP_MAX_CHUNKS)
        tv__fp_session_flush(s);
    s->pchunk[s->n_pchunk++] = (tv__fp_chunk_ent){.req_id = r->req_id,
                                                  .handle = h->id,
                                                  .slot = idx,
                                                  .slot_off = (uint32_t)(b - kL),
                                                  .len = (uint32_t)len,
                                                  .dest_off = b - r->P};
    s->dirty = true;
    h->bytes_delivered += len;
    s->bytes_delivered += len;
    atomic_fetch_add(&fp->st_delivered, len);
    if (shared)
        atomic_fetch_add(&fp->st_shared, len);
    return len;
}

/* Counts a chunk of a request served from memory (hit) or after a read. */
static void count_tier(tv__fp *fp, bool hit, uint64_t len)
{
    atomic_fetch_add(hit ? &fp->st_tier_hits : &fp->st_tier_misses, 1);
    atomic_fetch_add(hit ? &fp->st_tier_hit_bytes : &fp->st_tier_miss_bytes, len);
}

/* Member h took chunk idx: its debt is paid, and it is active again (after
 * a stall, or after its debts stopped counting when it found no room). */
static void took(fp_handle *h, uint32_t idx)
{
    h->last_take_ms = tv__fp_now_ms();
    h->stalled = false;
    tv__tier_member_active(h->g->tg, h->member, true);
    tv__tier_member_take(h->g->tg, h->member, idx);
}

/* A legacy slot reference of h on slot idx (credit use unchanged when it
 * was a wait). */
static void hold_slot(fp_handle *h, uint32_t idx)
{
    fp_slot *sl = &h->g->slots[idx];
    sl->refs++;
    h->refs[idx]++;
    if (h->held++ == 0)
        h->held_since_ms = tv__fp_now_ms();
    h->s->held++;
    took(h, sl->chunk);
}

/* uid's view pins on generation tg (NULL when none, unless create: then a
 * new empty record, or NULL when out of memory). */
static fp_uid_views *uid_views(tv__fp *fp, uid_t uid, const tv__tier_gen *tg, bool create)
{
    for (fp_uid_views *v = fp->uid_views; v; v = v->next)
        if (v->uid == uid && v->tg == tg)
            return v;
    if (!create)
        return NULL;
    fp_uid_views *v = calloc(1, sizeof(*v));
    if (!v)
        return NULL;
    v->uid = uid;
    v->tg = tg;
    v->next = fp->uid_views;
    fp->uid_views = v;
    return v;
}

/* Frees v once it holds no chunk. */
static void uid_views_forget(tv__fp *fp, fp_uid_views *v)
{
    if (v->holders.n)
        return;
    for (fp_uid_views **pp = &fp->uid_views; *pp; pp = &(*pp)->next)
        if (*pp == v) {
            *pp = v->next;
            break;
        }
    tv__fp_refmap_free(&v->holders);
    free(v);
}

/* Bytes of the tier uid pins with views, each chunk once. */
static uint64_t uid_view_len(const tv__fp *fp, uid_t uid)
{
    uint64_t n = 0;
    for (const fp_uid_views *v = fp->uid_views; v; v = v->next)
        n += v->uid == uid ? v->len : 0;
    return n;
}

/* Handle h took its first view of chunk idx: the uid's pins count it
 * unless another of its handles holds it. Kept only under a per-uid bound
 * (cache.view_bytes_per_uid; the tier's own bound counts each chunk once
 * anyway). Returns 0 or -ENOMEM. */
static int uid_view_hold(fp_handle *h, uint32_t idx)
{
    tv__fp *fp = h->s->fp;
    if (!fp->o.view_len_per_uid)
        return 0;
    const tv__tier_chunk *tc = &h->g->tg->c[idx];
    fp_uid_views *v = uid_views(fp, h->s->uid, h->g->tg, true);
    if (!v)
        return -ENOMEM;
    if (tv__fp_refmap_add(&v->holders, idx, 1)) {
        uid_views_forget(fp, v);
        return -ENOMEM;
    }
    if (tv__fp_refmap_get(&v->holders, idx) == 1)
        v->len += tc->hi - tc->lo;
    return 0;
}

/* Handle h gave back its last view of chunk idx. */
static void uid_view_drop(fp_handle *h, uint32_t idx)
{
    tv__fp *fp = h->s->fp;
    if (!fp->o.view_len_per_uid)
        return;
    const tv__tier_chunk *tc = &h->g->tg->c[idx];
    fp_uid_views *v = uid_views(fp, h->s->uid, h->g->tg, false);
    if (!v || !tv__fp_refmap_dec(&v->holders, idx))
        return;
    if (!tv__fp_refmap_get(&v->holders, idx))
        v->len -= tc->hi - tc->lo;
    uid_views_forget(fp, v);
}

/* Why a view of chunk idx is refused for h (a budget), or NULL. */
static const char *view_refusal(fp_handle *h, uint32_t idx, char *buf, size_t cap)
{
    tv__fp *fp = h->s->fp;
    fp_group *g = h->g;
    const tv__tier_chunk *tc = &g->tg->c[idx];
    uint64_t len = tc->hi - tc->lo;
    if (fp->o.cache_len < 0) {
        snprintf(buf, cap,
                 "model '%s' generation %" PRId64
                 ": no view: the daemon keeps no memory tier (cache.bytes = 0)",
                 g->name, g->gen);
        return buf;
    }
    if (fp->o.view_len_per_uid == 0 || tv__fp_refmap_get(&h->vrefs, idx))
        return NULL;
    /* a chunk another handle of the uid views pins nothing more */
    const fp_uid_views *v = uid_views(fp, h->s->uid, g->tg, false);
    if (v && tv__fp_refmap_get(&v->holders, idx))
        return NULL;
    uint64_t mine = uid_view_len(fp, h->s->uid);
    if (mine + len <= fp->o.view_len_per_uid)
        return NULL;
    snprintf(buf, cap,
             "model '%s' generation %" PRId64 ": no view: uid %u pins %" PRIu64
             " bytes with views (cache.view_bytes_per_uid = %" PRIu64 ")",
             g->name, g->gen, (unsigned)h->s->uid, mine, fp->o.view_len_per_uid);
    return buf;
}

/* Request r of a version-3 handle takes resident chunk idx: a view
 * reference (a view request) or a copy reference, and its CHUNK entry.
 * Returns the entry's bytes, or 0 when r failed (its view refused: r is
 * freed then) or the session did (out of memory). */
static uint64_t take_chunk(fp_req *r, uint32_t idx, uint64_t k, bool shared)
{
    fp_handle *h = r->h;
    fp_session *s = h->s;
    fp_group *g = h->g;
    char msg[TV__FP_MAX_TEXT + 1];
    if (r->view) {
        const char *why = view_refusal(h, idx, msg, sizeof msg);
        if (!why && tv__tier_vref(g->tg, idx)) {
            tv__tier_stats ts;
            tv__tier_get_stats(s->fp->tier, &ts);
            snprintf(msg, sizeof msg,
                     "model '%s' generation %" PRId64 ": no view: views pin %" PRIu64
                     " bytes of the memory tier's %" PRIu64 " (cache.bytes)",
                     g->name, g->gen, ts.vpinned_len, ts.budget_len);
            why = msg;
        }
        if (why) {
            atomic_fetch_add(&s->fp->st_view_refused, 1);
            tv__fp_req_fail(r, TV_E_BUSY, why);
            return 0;
        }
        bool first = !tv__fp_refmap_get(&h->vrefs, idx);
        if (tv__fp_refmap_add(&h->vrefs, idx, 1) || (first && uid_view_hold(h, idx))) {
            if (tv__fp_refmap_get(&h->vrefs, idx))
                (void)tv__fp_refmap_dec(&h->vrefs, idx);
            tv__tier_vunref(g->tg, idx, 1);
            tv__fp_session_fail(s, -ENOMEM, "fastpath: out of memory for a view reference");
            return 0;
        }
        if (first)
            h->view_len += g->tg->c[idx].hi - g->tg->c[idx].lo;
    } else {
        if (tv__fp_refmap_add(&h->crefs, idx, 1)) {
            tv__fp_session_fail(s, -ENOMEM, "fastpath: out of memory for a reference");
            return 0;
        }
        tv__tier_ref(g->tg, idx);
        if (h->held++ == 0)
            h->held_since_ms = tv__fp_now_ms();
        s->held++;
    }
    took(h, idx);
    return emit_chunk(r, k, idx, shared);
}

void tv__fp_wait_deliver(fp_group *g, uint32_t idx, fp_wait *w)
{
    fp_req *r = w->req;
    fp_handle *h = r->h;
    fp_session *s = h->s;
    uint64_t k = w->k, len;
    bool shared = w->shared;
    (void)g;
    unlink_wait(w);
    if (w->rprev)
        w->rprev->rnext = w->rnext;
    else
        r->waits = w->rnext;
    if (w->rnext)
        w->rnext->rprev = w->rprev;
    r->n_waits--;
    s->waits--; /* the wait becomes a reference: credit use unchanged (views: freed) */
    free(w);
    if (h->legacy) {
        hold_slot(h, idx);
        len = emit_chunk(r, k, idx, shared);
    } else if (!(len = take_chunk(r, idx, k, shared))) {
        return; /* r failed (a view refused), or the session */
    }
    count_tier(s->fp, false, len);
    req_maybe_done(r);
}

static bool add_wait(fp_req *r, uint32_t idx, uint64_t k, bool shared)
{
    fp_session *s = r->h->s;
    fp_wait *w = calloc(1, sizeof(*w));
    if (!w) {
        tv__fp_session_fail(s, -ENOMEM, "fastpath: out of memory for a chunk wait");
        return false;
    }
    w->req = r;
    w->slot = idx;
    w->k = k;
    w->shared = shared;
    fp_wait **head = wait_head(w);
    w->snext = *head;
    if (*head)
        (*head)->sprev = w;
    *head = w;
    w->rnext = r->waits;
    if (r->waits)
        r->waits->rprev = w;
    r->waits = w;
    r->n_waits++;
    s->waits++;
    return true;
}

/* r's last chunk was issued: the session's next request is next. A request
 * that is not a small random read and has nothing queued after it (a
 * client loading tensor after tensor) reads ahead the chunks past its end
 * (after the chunk just issued got its wait or reference: the readahead
 * takes free slots only). */
static void issued_last(fp_session *s, fp_req *r, bool *ahead)
{
    s->issue = r->next;
    *ahead = !r->small && !r->next && s->fp->o.readahead > 0;
}

/* A legacy (version 1 or 2) request's chunk k = chunk idx: a copy in a
 * legacy slot (found, made now from the resident chunk, or filling once its
 * read lands). Returns false when it has to wait (no free slot: starved;
 * the chunk blocked). */
static bool issue_legacy(fp_session *s, fp_req *r, uint32_t idx, uint64_t k, uint32_t need_lo,
                         uint32_t need_hi, uint32_t lo, uint32_t hi)
{
    fp_handle *h = r->h;
    fp_group *g = h->g;
    fp_chunk *ch = &g->chunks[idx];
    uint32_t shard = r->shard;
    uint64_t end_k = r->end_k;
    bool ahead = false;
    tv_error err = {0};
    int32_t sl = tv__fp_slot_find(g, idx, need_lo, need_hi);
    int got = FP_GOT_RESIDENT;
    if (sl < 0) {
        if (g->lru_head < 0 && g->n_fresh >= g->n_slots) {
            g->starved = true; /* no free slot: their holders stall us */
            return false;
        }
        got = tv__fp_chunk_get(g, idx, need_lo, need_hi, lo, hi, s->id, h->member, 0, &err);
        if (got == FP_GOT_BLOCKED)
            return false;
        if (got == FP_GOT_FAILED) {
            tv__fp_req_fail(r, err.code, err.msg);
            return true;
        }
        sl = tv__fp_slot_take_free(g, idx, got != FP_GOT_RESIDENT); /* one is free: above */
    }
    fp_slot *slot = &g->slots[sl];
    bool own_ahead = ch->ahead && ch->reader == s->id; /* read ahead for this session */
    tv__fp_chunk_used(g, idx);
    r->next_k++;
    if (r->next_k == r->end_k)
        issued_last(s, r, &ahead);
    if (slot->state == FP_SLOT_FILLING) {
        if (add_wait(r, (uint32_t)sl, k, got == FP_GOT_STARTED ? false : ch->reader != s->id) &&
            ahead)
            tv__fp_readahead(g, shard, end_k, s->id);
        return true;
    }
    bool cached = slot->in_lru || got == FP_GOT_RESIDENT;
    if (slot->in_lru)
        tv__fp_slot_take(g, (uint32_t)sl);
    slot->state = FP_SLOT_READY;
    hold_slot(h, (uint32_t)sl);
    count_tier(s->fp, true,
               emit_chunk(r, k, (uint32_t)sl, (cached && !own_ahead) || ch->reader != s->id));
    if (ahead)
        tv__fp_readahead(g, shard, end_k, s->id);
    req_maybe_done(r);
    return true;
}

/* A version-3 request's chunk k = chunk idx of the tier: a reference on
 * the chunk itself (a view, or a copy). Returns false when it has to wait
 * (no staging: starved; no room in the tier: throttled; the read queue). */
static bool issue_direct(fp_session *s, fp_req *r, uint32_t idx, uint64_t k, uint32_t need_lo,
                         uint32_t need_hi, uint32_t lo, uint32_t hi)
{
    fp_handle *h = r->h;
    fp_group *g = h->g;
    fp_chunk *ch = &g->chunks[idx];
    const tv__tier_chunk *tc = &g->tg->c[idx];
    uint32_t shard = r->shard;
    uint64_t end_k = r->end_k;
    bool ahead = false, idle = tc->state == TV__TIER_RESIDENT && !tc->refs && !tc->vrefs;
    tv_error err = {0};
    /* a copy reference puts an idle chunk in use: staging first */
    if (!r->view && idle && tc->lo <= need_lo && need_hi <= tc->hi &&
        g->tg->n_inuse >= g->staging) {
        g->starved = true;
        return false;
    }
    int got = tv__fp_chunk_get(
        g, idx, need_lo, need_hi, lo, hi, s->id, h->member,
        tv__fp_refmap_get(&h->crefs, idx) + tv__fp_refmap_get(&h->vrefs, idx), &err);
    if (got == FP_GOT_BLOCKED)
        return false;
    if (got == FP_GOT_FAILED) {
        tv__fp_req_fail(r, err.code, err.msg);
        return true;
    }
    bool own_ahead = ch->ahead && ch->reader == s->id;
    tv__fp_chunk_used(g, idx);
    r->next_k++;
    if (r->next_k == r->end_k)
        issued_last(s, r, &ahead);
    if (got != FP_GOT_RESIDENT) {
        if (add_wait(r, idx, k, got == FP_GOT_READING && ch->reader != s->id) && ahead)
            tv__fp_readahead(g, shard, end_k, s->id);
        return true;
    }
    uint64_t len = take_chunk(r, idx, k, (idle && !own_ahead) || ch->reader != s->id);
    if (!len)
        return true; /* r failed (a view refused), or the session */
    count_tier(s->fp, true, len);
    if (ahead)
        tv__fp_readahead(g, shard, end_k, s->id);
    req_maybe_done(r);
    return true;
}

/* Issues the next chunk of the session's first unissued request. Returns
 * false when it has to wait. */
static bool issue_one(fp_session *s)
{
    fp_req *r = s->issue;
    fp_group *g = r->h->g;
    uint64_t k = r->next_k;
    /* the chunk-relative bytes this request needs of chunk k (k * L fits: checked at READ) */
    uint64_t kL = k * g->chunk_len;
    uint32_t need_lo = (uint32_t)(r->P > kL ? r->P - kL : 0);
    uint32_t need_hi = (uint32_t)(r->E - kL < g->chunk_len ? r->E - kL : g->chunk_len);
    /* a new read: the whole chunk, or a small random read's envelope only */
    uint32_t lo = 0, hi = UINT32_MAX;
    if (r->small) {
        uint64_t up = need_hi;
        lo = need_lo & ~(g->io_align - 1);
        (void)tv__align_up_u64(up, g->io_align, &up); /* <= chunk_len, a multiple of io_align */
        hi = (uint32_t)up;
    }
    uint32_t idx = tv__fp_chunk_index(g, r->shard, k);
    return r->h->legacy ? issue_legacy(s, r, idx, k, need_lo, need_hi, lo, hi)
                        : issue_direct(s, r, idx, k, need_lo, need_hi, lo, hi);
}

/* Moves s to the tail of the session list: the sessions served go last, so
 * a slot that comes free goes to the session that waited longest. */
static void session_to_tail(tv__fp *fp, fp_session *s)
{
    if (fp->s_tail == s)
        return;
    if (s->prev)
        s->prev->next = s->next;
    else
        fp->s_head = s->next;
    s->next->prev = s->prev;
    s->prev = fp->s_tail;
    s->next = NULL;
    fp->s_tail->next = s;
    fp->s_tail = s;
}

bool tv__fp_schedule(tv__fp *fp)
{
    bool any = false, progress;
    fp->again = false;
    for (fp_group *g = fp->g_head; g; g = g->next)
        g->starved = g->throttled = false;
    do {
        fp_session *s = fp->s_head, *last = fp->s_tail;
        progress = false;
        while (s) {
            fp_session *nx = s == last ? NULL : s->next; /* the ones served go after last */
            if (!s->doomed && s->issue && s->held + s->waits < fp->o.credit && issue_one(s)) {
                progress = true;
                session_to_tail(fp, s);
            }
            s = nx;
        }
        any |= progress;
    } while (progress);
    return any;
}

int tv__fp_hold_sweep(tv__fp *fp)
{
    int64_t now = tv__fp_now_ms(), next = -1, limit = fp->o.hold_timeout_ms;
    bool starved = false;
    for (const fp_group *g = fp->g_head; g && !starved; g = g->next)
        starved = g->starved;
    if (!starved)
        return -1;
    for (fp_session *s = fp->s_head; s; s = s->next) {
        for (uint32_t i = 0; i < fp->o.max_handles && !s->doomed; i++) {
            const fp_handle *h = s->handles[i];
            if (!h || !h->held || !h->g->starved)
                continue;
            int64_t left = h->held_since_ms + limit - now;
            if (left > 0) {
                if (next < 0 || left < next)
                    next = left;
                continue;
            }
            tv__fp_session_fail(
                s, TV_E_TIMEOUT,
                "model '%s' generation %" PRId64 ": %u slots held for %" PRId64
                " ms without a release while another session waits for a slot (fastpath.hold_timeout_ms = %u): the session is closed and its slots return",
                h->g->name, h->g->gen, h->held, now - h->held_since_ms, fp->o.hold_timeout_ms);
        }
    }
    return next < 0 ? -1 : (int)(next > 60000 ? 60000 : next);
}

int tv__fp_share_sweep(tv__fp *fp)
{
    int64_t now = tv__fp_now_ms(), next = -1, limit = fp->o.share_wait_ms;
    bool throttled = false;
    for (const fp_group *g = fp->g_head; g && !throttled; g = g->next)
        throttled = g->throttled;
    if (!throttled)
        return -1;
    for (fp_session *s = fp->s_head; s; s = s->next) {
        for (uint32_t i = 0; i < fp->o.max_handles && !s->doomed; i++) {
            fp_handle *h = s->handles[i];
            if (!h || !h->g->throttled || h->stalled || h->member < 0 ||
                !tv__tier_member_owed(h->g->tg, h->member))
                continue;
            int64_t left = h->last_take_ms + limit - now;
            if (left > 0) {
                if (next < 0 || left < next)
                    next = left;
                continue;
            }
            h->stalled = true;
            tv__tier_member_active(h->g->tg, h->member, false);
            atomic_fetch_add(&fp->st_stalls, 1);
            fp->again = true;
            tv__log(
                TV_LOG_INFO,
                "fastpath: session %" PRIu64
                " (pid %d uid %u): handle %u of model '%s' generation %" PRId64
                " took no chunk for %" PRId64
                " ms while the memory kept for it is needed (fastpath.share_wait_ms = %u): the others stop keeping chunks for it",
                s->id, (int)s->pid, (unsigned)s->uid, h->id, h->g->name, h->g->gen,
                now - h->last_take_ms, fp->o.share_wait_ms);
        }
    }
    return next < 0 ? -1 : (int)(next > 60000 ? 60000 : next);
}

/* ---- handles ---- */

static fp_handle *handle_find(const fp_session *s, uint32_t id)
{
    for (uint32_t i = 0; i < s->fp->o.max_handles; i++)
        if (s->handles[i] && s->handles[i]->id == id)
            return s->handles[i];
    return NULL;
}

/* Closes handle h: its requests end (DONE CANCELLED when notify), its
 * references return, then CLOSED (notify). */
static void handle_close(fp_session *s, fp_handle *h, bool notify)
{
    fp_group *g = h->g;
    uint32_t id = h->id;
    fp_req *r = s->rq_head;
    while (r) {
        fp_req *nx = r->next;
        if (r->h == h) {
            if (notify)
                push_done(s, r->req_id, TV_E_CANCELLED, h->id);
            req_remove(r);
        }
        r = nx;
    }
    /* entries not encoded yet name references dropped now: never sent */
    uint32_t kept = 0;
    for (uint32_t i = 0; i < s->n_pchunk; i++)
        if (s->pchunk[i].handle != id)
            s->pchunk[kept++] = s->pchunk[i];
    s->n_pchunk = kept;
    for (uint32_t i = 0; i < s->n_pdone; i++) /* their requests end cancelled too */
        if (s->pdone[i].handle == id && s->pdone[i].result == 0)
            s->pdone[i].result = TV_E_CANCELLED;
    for (uint32_t i = 0; h->refs && i < g->n_slots; i++) {
        if (!h->refs[i])
            continue;
        s->held -= h->refs[i];
        tv__fp_slot_unref(g, i, h->refs[i]);
    }
    for (uint32_t i = 0; i < h->crefs.cap; i++) {
        if (h->crefs.key[i] == UINT32_MAX)
            continue;
        s->held -= h->crefs.val[i];
        tv__tier_unref(g->tg, h->crefs.key[i], h->crefs.val[i]);
    }
    for (uint32_t i = 0; i < h->vrefs.cap; i++)
        if (h->vrefs.key[i] != UINT32_MAX) {
            uid_view_drop(h, h->vrefs.key[i]);
            tv__tier_vunref(g->tg, h->vrefs.key[i], h->vrefs.val[i]);
        }
    tv__fp_refmap_free(&h->crefs);
    tv__fp_refmap_free(&h->vrefs);
    tv__tier_member_leave(g->tg, h->member);
    for (uint32_t i = 0; i < s->fp->o.max_handles; i++)
        if (s->handles[i] == h)
            s->handles[i] = NULL;
    s->n_handles--;
    tv__log(TV_LOG_INFO,
            "fastpath: session %" PRIu64
            " (pid %d uid %u): handle %u closed: model '%s' generation %" PRId64 ", %" PRIu64
            " bytes delivered",
            s->id, (int)s->pid, (unsigned)s->uid, id, g->name, g->gen, h->bytes_delivered);
    free(h->refs);
    free(h);
    s->fp->again = true;
    if (notify) {
        size_t len =
            tv__fp_encode_close(s->fp->sbuf, sizeof s->fp->sbuf, s->version, TV__FP_CLOSED, id);
        out_control(s, len, NULL, 0);
    }
    /* CLOSED is queued first: a last handle's group is torn down at the end
     * of the turn, after the replies went out (tv__fp_groups_reap) */
    tv__fp_group_unref(g);
}

/* ---- messages ---- */

static void on_hello(fp_session *s, const tv__fp_msg *m)
{
    tv__fp *fp = s->fp;
    if (m->type != TV__FP_HELLO) {
        tv__fp_session_fail(s, TV_E_PROTOCOL, "the first message must be HELLO, not %s",
                            tv__fp_type_name(m->type));
        return;
    }
    /* the highest version both speak */
    uint16_t v = m->u.hello.max_version < TV__FP_VERSION_MAX ? m->u.hello.max_version
                                                             : (uint16_t)TV__FP_VERSION_MAX;
    if (v < m->u.hello.min_version || v < TV__FP_VERSION_MIN) {
        tv__fp_session_fail(
            s, TV_E_VERSION, "the client speaks versions %u..%u, this daemon versions %u..%u",
            m->u.hello.min_version, m->u.hello.max_version, TV__FP_VERSION_MIN, TV__FP_VERSION_MAX);
        return;
    }
    s->hello = true;
    s->version = v;
    tv__fp_hello_ok ok = {.version = v,
                          .max_msg_len = TV__FP_MAX_MSG,
                          .max_requests = fp->o.max_requests,
                          .max_handles = fp->o.max_handles,
                          .session_id = s->id};
    size_t len = tv__fp_encode_hello_ok(fp->sbuf, sizeof fp->sbuf, &ok);
    out_control(s, len, NULL, 0);
}

static void on_open(fp_session *s, const tv__fp_msg *m)
{
    tv__fp *fp = s->fp;
    uint32_t open_id = m->u.open.open_id;
    char spec[TV__FP_MAX_SPEC_COPY];
    tv_error err = {0};
    fp_group *g = NULL;
    fp_handle *h = NULL;
    bool refused = false;
    int fds[TV__FP_N_FDS_OPENED] = {-1, -1};
    uint32_t at = 0;
    int rc;
    size_t n = m->text_len < sizeof spec - 1 ? m->text_len : sizeof spec - 1;
    memcpy(spec, m->text, n);
    spec[n] = '\0';
    /* A peer that does not read its replies must not make the daemon hold
     * descriptors without bound: OPENED replies waiting in the outbox hold
     * two each, so at most max_handles of them may wait. */
    uint32_t waiting = 0;
    for (const fp_out *o = s->out_head; o; o = o->next)
        waiting += o->n_fds;
    if (waiting >= TV__FP_N_FDS_OPENED * fp->o.max_handles) {
        tv__fp_session_fail(s, TV_E_PROTOCOL,
                            "the client does not read its replies: %u descriptors wait to be sent",
                            waiting);
        return;
    }
    if (s->n_handles >= fp->o.max_handles) {
        tv__seterr(&err, TV_E_BUSY,
                   "session %" PRIu64 " has %u handles open (max_handles): '%s' not opened", s->id,
                   s->n_handles, spec);
        send_error(s, TV_E_BUSY, 0, open_id, err.msg);
        return;
    }
    rc = tv__fp_group_open(fp, s, spec, &g, &refused, &err);
    if (rc) {
        if (refused)
            atomic_fetch_add(&fp->st_refused, 1);
        tv__log(TV_LOG_WARN, "fastpath: session %" PRIu64 " (pid %d uid %u): OPEN '%s' %s: %s",
                s->id, (int)s->pid, (unsigned)s->uid, spec, refused ? "refused" : "failed",
                err.msg);
        send_error(s, rc, 0, open_id, err.msg[0] ? err.msg : tv_strerror(rc));
        return;
    }
    bool legacy = s->version < TV__FP_V3;
    if (legacy && (rc = tv__fp_group_legacy(g, &err))) {
        send_error(s, rc, 0, open_id, err.msg);
        tv__fp_group_unref(g);
        return;
    }
    h = calloc(1, sizeof(*h));
    if (h && legacy)
        h->refs = calloc(g->n_slots, sizeof(*h->refs));
    fds[0] = fcntl(g->snap_fd, F_DUPFD_CLOEXEC, 3);
    fds[1] = fcntl(legacy ? g->arena_fd : g->tier_ro_fd, F_DUPFD_CLOEXEC, 3);
    if (!h || (legacy && !h->refs) || fds[0] < 0 || fds[1] < 0) {
        if (h)
            free(h->refs);
        free(h);
        close_fds(fds, 2);
        send_error(s, -ENOMEM, 0, open_id, "fastpath: out of memory or descriptors for a handle");
        tv__fp_group_unref(g);
        return;
    }
    h->legacy = legacy;
    h->member = tv__tier_member_join(g->tg); /* what is resident now is owed to it */
    h->last_take_ms = tv__fp_now_ms();
    while (s->handles[at])
        at++;
    h->id = ++s->next_handle;
    h->s = s;
    h->g = g;
    snprintf(h->spec, sizeof h->spec, "%s", spec);
    s->handles[at] = h;
    s->n_handles++;
    tv__fp_opened o = {.open_id = open_id,
                       .handle = h->id,
                       .generation = g->gen,
                       .snap_len = g->snap_len,
                       .arena_len = legacy ? g->arena_len : g->tg->len,
                       .slot_len = g->chunk_len,
                       .n_slots = legacy ? g->n_slots : g->n_chunks,
                       .credit = fp->o.credit,
                       .flags = legacy ? 0u : TV__FP_OPENED_TIER};
    size_t len = tv__fp_encode_opened(fp->sbuf, sizeof fp->sbuf, s->version, &o);
    out_control(s, len, fds, 2);
    tv__log(TV_LOG_INFO,
            "fastpath: session %" PRIu64
            " (pid %d uid %u): opened '%s' as handle %u: model '%s' generation %" PRId64,
            s->id, (int)s->pid, (unsigned)s->uid, spec, h->id, g->name, g->gen);
}

static void on_close(fp_session *s, const tv__fp_msg *m)
{
    fp_handle *h = handle_find(s, m->u.close.handle);
    if (!h) {
        tv__fp_session_fail(s, TV_E_PROTOCOL, "CLOSE names handle %u, which is not open",
                            m->u.close.handle);
        return;
    }
    handle_close(s, h, true);
}

/* A request refused on its own (not fatal): ERROR then DONE. */
static void req_refuse(fp_session *s, fp_handle *h, uint64_t req_id, int code, const char *msg)
{
    send_error(s, code, req_id, 0, msg);
    push_done(s, req_id, code, h->id);
}

/* Queues request req_id of handle h for the object bytes [P, E) of shard
 * (E > P; len = E - P). Returns 0, or -ENOMEM with the session failed. */
static int queue_req(fp_session *s, fp_handle *h, uint64_t req_id, uint32_t tensor, uint32_t shard,
                     bool header, bool view, uint64_t P, uint64_t E, uint64_t len)
{
    fp_group *g = h->g;
    fp_req *r = calloc(1, sizeof(*r));
    if (!r) {
        tv__fp_session_fail(s, -ENOMEM, "fastpath: out of memory for a request");
        return -ENOMEM;
    }
    r->req_id = req_id;
    r->h = h;
    r->tensor = tensor;
    r->shard = shard;
    r->header = header;
    r->P = P;
    r->E = E;
    r->next_k = P / g->chunk_len;
    r->end_k = (E - 1) / g->chunk_len + 1;
    /* A small read far from the handle's previous one (a random access) reads
     * its envelope only; one that follows it (a model load, tensor after
     * tensor) reads whole chunks, which its neighbours then share. */
    r->small = len <= FP_SMALL_READ && len <= g->chunk_len / 16 && !view &&
               !(h->seq_valid && h->last_shard == shard && P + g->chunk_len >= h->last_end &&
                 P <= h->last_end + g->chunk_len);
    r->view = view;
    if (view)
        atomic_fetch_add(&s->fp->st_views, 1);
    h->seq_valid = true;
    h->last_shard = shard;
    h->last_end = E;
    r->prev = s->rq_tail;
    if (s->rq_tail)
        s->rq_tail->next = r;
    else
        s->rq_head = r;
    s->rq_tail = r;
    uint32_t b = req_hash(s, r->req_id);
    r->hnext = s->hash[b];
    s->hash[b] = r;
    if (!s->issue)
        s->issue = r;
    s->n_reqs++;
    h->n_reqs++;
    return 0;
}

/* A READ entry with TV__FP_READ_SHARD_HEADER (the decoder let it through
 * only in a version-2 session): e->tensor is a shard index, [off, off +
 * len) object-relative inside the shard's first 8 + header_len bytes; out
 * of range: the request's ERROR + DONE (not fatal). Returns 0, or -ENOMEM
 * with the session failed. */
static int header_request(fp_session *s, fp_handle *h, const tv__fp_read_ent *e)
{
    fp_group *g = h->g;
    char msg[TV__FP_MAX_TEXT + 1];
    uint64_t end = 0;
    if (e->tensor >= g->n_shards) {
        snprintf(msg, sizeof msg,
                 "model '%s' generation %" PRId64 ": shard index %u out of range (%u shards)",
                 g->name, g->gen, e->tensor, g->n_shards);
        req_refuse(s, h, e->req_id, TV_E_INVALID_ARG, msg);
        return 0;
    }
    const fp_shard *sh = &g->shards[e->tensor];
    if (tv__add_u64(e->off, e->len, &end) || end > sh->data_off) {
        snprintf(msg, sizeof msg,
                 "model '%s' generation %" PRId64 ": shard %u: header range of %" PRIu64
                 " bytes at %" PRIu64 " is past its %" PRIu64 " header bytes",
                 g->name, g->gen, e->tensor, e->len, e->off, sh->data_off);
        req_refuse(s, h, e->req_id, TV_E_INVALID_ARG, msg);
        return 0;
    }
    if (e->len == 0) {
        push_done(s, e->req_id, 0, h->id);
        return 0;
    }
    return queue_req(s, h, e->req_id, 0, e->tensor, true, (e->flags & TV__FP_READ_VIEW) != 0,
                     e->off, end, e->len);
}

static void on_read(fp_session *s, const tv__fp_msg *m)
{
    tv__fp *fp = s->fp;
    fp_handle *h = handle_find(s, m->u.list.handle);
    tv_error err = {0};
    if (!h) {
        tv__fp_session_fail(s, TV_E_PROTOCOL, "READ names handle %u, which is not open",
                            m->u.list.handle);
        return;
    }
    fp_group *g = h->g;
    for (uint32_t i = 0; i < m->u.list.n && !s->doomed; i++) {
        tv__fp_read_ent e;
        tv__snap_tensor_info ti;
        char msg[TV__FP_MAX_TEXT + 1];
        uint64_t end = 0, P = 0, E = 0;
        int rc = tv__fp_read_entry(m, i, &e, &err);
        if (rc) {
            tv__fp_session_fail(s, TV_E_PROTOCOL, "%s", err.msg);
            return;
        }
        if (req_find(s, e.req_id)) {
            tv__fp_session_fail(s, TV_E_PROTOCOL,
                                "READ: request %" PRIu64 " is already outstanding", e.req_id);
            return;
        }
        if (s->n_reqs >= fp->o.max_requests) {
            tv__fp_session_fail(s, TV_E_PROTOCOL,
                                "READ: more than %u requests outstanding (max_requests)",
                                fp->o.max_requests);
            return;
        }
        if (e.flags & TV__FP_READ_SHARD_HEADER) {
            if (header_request(s, h, &e) == 0)
                continue; /* queued, refused or answered */
            return;       /* the session failed */
        }
        if (e.tensor >= g->snap->n_tensors) {
            snprintf(msg, sizeof msg,
                     "model '%s' generation %" PRId64 ": tensor index %u out of range (%u tensors)",
                     g->name, g->gen, e.tensor, g->snap->n_tensors);
            req_refuse(s, h, e.req_id, TV_E_INVALID_ARG, msg);
            continue;
        }
        rc = tv__snap_tensor(g->snap, e.tensor, &ti, &err);
        if (rc) {
            req_refuse(s, h, e.req_id, rc, err.msg);
            continue;
        }
        if (tv__add_u64(e.off, e.len, &end) || end > ti.nbytes) {
            snprintf(msg, sizeof msg,
                     "model '%s' generation %" PRId64 ": tensor '%.*s': range of %" PRIu64
                     " bytes at %" PRIu64 " is past its %" PRIu64 " bytes",
                     g->name, g->gen, (int)ti.name_len, ti.name, e.len, e.off, ti.nbytes);
            req_refuse(s, h, e.req_id, TV_E_INVALID_ARG, msg);
            continue;
        }
        if (e.len == 0) {
            push_done(s, e.req_id, 0, h->id);
            continue;
        }
        const fp_shard *sh = &g->shards[ti.shard];
        if (tv__add_u64(sh->data_off, ti.begin_off, &P) || tv__add_u64(P, e.off, &P) ||
            tv__add_u64(P, e.len, &E) || E > sh->file_len) {
            snprintf(msg, sizeof msg,
                     "model '%s' generation %" PRId64 ": tensor '%.*s' lies outside its shard",
                     g->name, g->gen, (int)ti.name_len, ti.name);
            req_refuse(s, h, e.req_id, TV_E_SNAPSHOT, msg);
            continue;
        }
        if (queue_req(s, h, e.req_id, e.tensor, ti.shard, false, (e.flags & TV__FP_READ_VIEW) != 0,
                      P, E, e.len))
            return;
    }
}

/* Gives back one reference of h on slot (RELEASE: a copy reference of a
 * legacy slot or of a chunk; RELEASE_VIEW: a view reference of a chunk).
 * Returns false when h holds none there (the caller fails the session). */
static bool release_one(fp_handle *h, uint32_t slot, bool view, int64_t now)
{
    fp_group *g = h->g;
    fp_session *s = h->s;
    if (view) {
        if (h->legacy || slot >= g->n_chunks || !tv__fp_refmap_dec(&h->vrefs, slot))
            return false;
        if (!tv__fp_refmap_get(&h->vrefs, slot)) {
            h->view_len -= g->tg->c[slot].hi - g->tg->c[slot].lo;
            uid_view_drop(h, slot);
        }
        tv__tier_vunref(g->tg, slot, 1);
    } else if (h->legacy) {
        if (slot >= g->n_slots || h->refs[slot] == 0)
            return false;
        h->refs[slot]--;
        tv__fp_slot_unref(g, slot, 1);
    } else {
        if (slot >= g->n_chunks || !tv__fp_refmap_dec(&h->crefs, slot))
            return false;
        tv__tier_unref(g->tg, slot, 1);
    }
    if (!view) {
        h->held--;
        h->held_since_ms = now; /* a release: the handle moves */
        s->held--;
    }
    s->fp->again = true;
    return true;
}

static void on_release(fp_session *s, const tv__fp_msg *m)
{
    fp_handle *h = handle_find(s, m->u.list.handle);
    bool view = m->type == TV__FP_RELEASE_VIEW;
    int64_t now = tv__fp_now_ms();
    tv_error err = {0};
    if (!h) {
        tv__fp_session_fail(s, TV_E_PROTOCOL, "%s names handle %u, which is not open",
                            tv__fp_type_name(m->type), m->u.list.handle);
        return;
    }
    for (uint32_t i = 0; i < m->u.list.n; i++) {
        uint32_t slot = 0;
        if (tv__fp_release_entry(m, i, &slot, &err)) {
            tv__fp_session_fail(s, TV_E_PROTOCOL, "%s", err.msg);
            return;
        }
        if (!release_one(h, slot, view, now)) {
            tv__fp_session_fail(s, TV_E_PROTOCOL, "%s %u of handle %u released but not held",
                                view ? "view of slot" : "slot", slot, h->id);
            return;
        }
    }
}

static void on_message(fp_session *s, const uint8_t *buf, size_t len)
{
    tv__fp_msg m;
    tv_error err = {0};
    int rc = tv__fp_decode(buf, len, s->hello ? s->version : 0, &m, &err);
    if (rc) {
        tv__fp_session_fail(s, rc == TV_E_VERSION ? TV_E_VERSION : TV_E_PROTOCOL, "%s",
                            err.msg[0] ? err.msg : tv_strerror(rc));
        return;
    }
    if (!s->hello) {
        on_hello(s, &m);
        return;
    }
    switch (m.type) {
    case TV__FP_OPEN:
        on_open(s, &m);
        break;
    case TV__FP_CLOSE:
        on_close(s, &m);
        break;
    case TV__FP_READ:
        on_read(s, &m);
        break;
    case TV__FP_RELEASE:
    case TV__FP_RELEASE_VIEW:
        on_release(s, &m);
        break;
    case TV__FP_HELLO:
        tv__fp_session_fail(s, TV_E_PROTOCOL, "a second HELLO");
        break;
    default:
        tv__fp_session_fail(s, TV_E_PROTOCOL, "%s is a message the daemon sends, not the client",
                            tv__fp_type_name(m.type));
        break;
    }
}

void tv__fp_session_on_input(fp_session *s)
{
    tv__fp *fp = s->fp;
    for (int i = 0; i < FP_INPUT_BATCH && !s->doomed; i++) {
        int fds[4] = {-1, -1, -1, -1};
        size_t n_fds = 0;
        tv_error err = {0};
        ssize_t n =
            tv__fp_recv(s->fd, fp->rbuf, sizeof fp->rbuf, fds, TV_ARRAY_LEN(fds), &n_fds, &err);
        if (n == -EAGAIN)
            break;
        if (n == 0) {
            tv__fp_session_drop(s, "the client closed the connection");
            break;
        }
        if (n < 0) {
            if (n == TV_E_PROTOCOL)
                tv__fp_session_fail(s, TV_E_PROTOCOL, "%s", err.msg);
            else
                tv__fp_session_drop(s, err.msg[0] ? err.msg : tv_strerror((int)n));
            break;
        }
        if (n_fds) {
            close_fds(fds, n_fds);
            tv__fp_session_fail(s, TV_E_PROTOCOL, "file descriptors are not accepted");
            break;
        }
        on_message(s, fp->rbuf, (size_t)n);
        tv__fp_session_flush(s);
        tv__fp_session_on_output(s);
    }
}

/* ---- reference maps ---- */

static uint32_t refmap_slot(const fp_refmap *m, uint32_t key)
{
    uint32_t i = (uint32_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 32) & (m->cap - 1);
    while (m->key[i] != UINT32_MAX && m->key[i] != key)
        i = (i + 1) & (m->cap - 1);
    return i;
}

static int refmap_grow(fp_refmap *m)
{
    uint32_t cap = m->cap ? m->cap * 2 : 16;
    fp_refmap n = {.key = malloc((size_t)cap * sizeof(uint32_t)),
                   .val = malloc((size_t)cap * sizeof(uint32_t)),
                   .cap = cap};
    if (!n.key || !n.val || cap < m->cap) {
        free(n.key);
        free(n.val);
        return -ENOMEM;
    }
    memset(n.key, 0xff, (size_t)cap * sizeof(uint32_t));
    for (uint32_t i = 0; i < m->cap; i++) {
        if (m->key[i] == UINT32_MAX)
            continue;
        uint32_t j = refmap_slot(&n, m->key[i]);
        n.key[j] = m->key[i];
        n.val[j] = m->val[i];
        n.n++;
    }
    tv__fp_refmap_free(m);
    *m = n;
    return 0;
}

int tv__fp_refmap_add(fp_refmap *m, uint32_t key, uint32_t n)
{
    if ((m->n + 1) * 4 > m->cap * 3 && refmap_grow(m)) /* at most 3/4 full */
        return -ENOMEM;
    uint32_t i = refmap_slot(m, key);
    if (m->key[i] == UINT32_MAX) {
        m->key[i] = key;
        m->val[i] = 0;
        m->n++;
    }
    m->val[i] += n;
    return 0;
}

uint32_t tv__fp_refmap_get(const fp_refmap *m, uint32_t key)
{
    if (!m->cap)
        return 0;
    uint32_t i = refmap_slot(m, key);
    return m->key[i] == key ? m->val[i] : 0;
}

bool tv__fp_refmap_dec(fp_refmap *m, uint32_t key)
{
    if (!m->cap)
        return false;
    uint32_t i = refmap_slot(m, key);
    if (m->key[i] != key)
        return false;
    if (--m->val[i])
        return true;
    /* remove, then re-place the run after it (linear probing, no tombstones) */
    m->key[i] = UINT32_MAX;
    m->n--;
    for (uint32_t j = (i + 1) & (m->cap - 1); m->key[j] != UINT32_MAX; j = (j + 1) & (m->cap - 1)) {
        uint32_t k = m->key[j], v = m->val[j];
        m->key[j] = UINT32_MAX;
        uint32_t t = refmap_slot(m, k);
        m->key[t] = k;
        m->val[t] = v;
    }
    return true;
}

void tv__fp_refmap_free(fp_refmap *m)
{
    free(m->key);
    free(m->val);
    memset(m, 0, sizeof(*m));
}

/* ---- life ---- */

/* Frees s and its arrays (the session is unlinked, its handles closed). */
static void session_free(fp_session *s)
{
    free(s->hash);
    free(s->handles);
    free(s->pchunk);
    free(s->pdone);
    free(s->gids);
    free(s);
}

int tv__fp_peer_read(int fd, fp_peer *p)
{
    struct ucred cred = {0};
    socklen_t cl = sizeof cred;
    memset(p, 0, sizeof(*p));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0) {
        p->pid = cred.pid;
        p->uid = cred.uid;
        p->gid = cred.gid;
    } else {
        p->uid = (uid_t)-1;
        p->gid = (gid_t)-1;
    }
    /* primary gid first, then the supplementary groups */
    socklen_t gl = 64 * sizeof(gid_t);
    gid_t *sup = malloc(gl);
    if (sup && getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, sup, &gl) != 0) {
        if (errno == ERANGE && gl > 0) {
            gid_t *more = realloc(sup, gl);
            if (more && getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, more, &gl) == 0)
                sup = more;
            else {
                free(more ? more : sup);
                sup = NULL;
                gl = 0;
            }
        } else {
            gl = 0;
        }
    }
    size_t n_sup = sup ? gl / sizeof(gid_t) : 0;
    p->gids = malloc((n_sup + 1) * sizeof(gid_t));
    if (p->gids) {
        p->gids[0] = p->gid;
        for (size_t i = 0; i < n_sup; i++)
            p->gids[1 + i] = sup[i];
        p->n_gids = n_sup + 1;
    }
    free(sup);
    return p->gids ? 0 : -ENOMEM;
}

void tv__fp_peer_free(fp_peer *p)
{
    if (!p)
        return;
    free(p->gids);
    p->gids = NULL;
    p->n_gids = 0;
}

int tv__fp_session_new(tv__fp *fp, int fd, fp_peer *p, fp_session **out)
{
    fp_session *s = calloc(1, sizeof(*s));
    uint32_t buckets = 64;
    if (!s)
        return -ENOMEM;
    while (buckets < fp->o.max_requests && buckets < (1u << 20))
        buckets <<= 1;
    s->fp = fp;
    s->fd = fd;
    s->version = TV__FP_V1;
    s->ev.kind = FP_EV_SESSION;
    s->ev.ptr = s;
    s->hash_mask = buckets - 1;
    s->hash = calloc(buckets, sizeof(*s->hash));
    s->handles = calloc(fp->o.max_handles, sizeof(*s->handles));
    s->pchunk = malloc(TV__FP_MAX_CHUNKS * sizeof(*s->pchunk));
    s->pdone = malloc(TV__FP_MAX_DONES * sizeof(*s->pdone));
    if (!s->hash || !s->handles || !s->pchunk || !s->pdone) {
        session_free(s);
        return -ENOMEM;
    }
    s->pid = p->pid;
    s->uid = p->uid;
    s->gid = p->gid;
    s->gids = p->gids; /* taken */
    s->n_gids = p->n_gids;
    p->gids = NULL;
    p->n_gids = 0;
    s->id = ++fp->next_session_id;
    s->connected_unix = (int64_t)time(NULL);
    s->connected_ms = tv__fp_now_ms();
    *out = s;
    return 0;
}

void tv__fp_session_destroy(fp_session *s)
{
    tv__fp *fp = s->fp;
    uint64_t bytes = s->bytes_delivered;
    for (uint32_t i = 0; i < fp->o.max_handles; i++)
        if (s->handles[i])
            handle_close(s, s->handles[i], false);
    while (s->out_head) {
        fp_out *o = s->out_head;
        s->out_head = o->next;
        close_fds(o->fds, o->n_fds);
        free(o);
    }
    if (s->fatal_code) {
        tv_error err = {0};
        size_t len =
            tv__fp_encode_error(fp->sbuf, sizeof fp->sbuf, s->version, s->fatal_code,
                                TV__FP_ERROR_FATAL, 0, 0, s->fatal_msg, strlen(s->fatal_msg));
        if (len)
            (void)tv__fp_send(s->fd, fp->sbuf, len, NULL, 0, &err);
        if (s->fatal_code == TV_E_PROTOCOL || s->fatal_code == TV_E_VERSION)
            atomic_fetch_add(&fp->st_protocol, 1);
        tv__log(TV_LOG_WARN, "fastpath: session %" PRIu64 " (pid %d uid %u) closed: %s (%s)", s->id,
                (int)s->pid, (unsigned)s->uid, s->fatal_msg, tv_err_name(s->fatal_code));
    }
    tv__log(TV_LOG_INFO,
            "fastpath: session %" PRIu64 " (pid %d uid %u) ended: %s; %" PRIu64
            " bytes delivered, %" PRIu64 " requests",
            s->id, (int)s->pid, (unsigned)s->uid,
            s->fatal_code ? "closed by the daemon" : (s->why[0] ? s->why : "stopped"), bytes,
            s->requests_done);
    epoll_ctl(fp->epoll_fd, EPOLL_CTL_DEL, s->fd, NULL);
    tv__fp_hangup(fp, s->fd); /* the fatal ERROR stays readable after what the client sent */
    DLIST_UNLINK(fp->s_head, fp->s_tail, s);
    fp->n_sessions--;
    atomic_fetch_sub(&fp->st_sessions, 1);
    session_free(s);
}
