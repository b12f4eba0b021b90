/* Read groups of the fast path: one per open model generation, shared by
 * every handle on it. A group owns the tv_model (the lease), the sealed
 * snapshot memfd, its tier generation (tier.h: the generation's chunks,
 * laid out like its objects, in a memfd version-3 clients map read-only),
 * the aio that reads into it, and, for version 1 and 2 sessions, a legacy
 * staging arena of copies (memfd sealed against any writable mapping: the
 * arena those versions know).
 *
 * Invariants:
 *   - chunk_len is a multiple of 4096, of every usable device's io_align
 *     and of the tier's page, and the tier mapping starts at a multiple of
 *     the largest io_align, so every chunk read (base_off + k x chunk_len +
 *     lo, clipped to the replica's alloc_len) is aligned in offset, length
 *     and address, and lands at the chunk's own place;
 *   - a chunk is read only from ABSENT, or to read more of a resident chunk
 *     no one references (never into bytes a client holds), never twice at
 *     once, and only while the group has fewer than group_slots chunks in
 *     use and the tier room (tier.h); a read that fails moves to the next
 *     usable replica (excluded devices are skipped), and only when every
 *     replica failed are its waiters' requests failed and its hole punched;
 *   - a legacy slot is reused (its key dropped) only from the LRU, i.e.
 *     with no reference and no fill pending; its copy is made once the
 *     chunk is resident, of bytes the chunk holds;
 *   - a uid has handles on at most max_groups_per_uid groups and a model
 *     at most max_groups_per_model groups (generations) open: an OPEN that
 *     would pass either is refused TV_E_BUSY before a group is made or
 *     joined (the global max_groups likewise, for a new group);
 *   - the group is destroyed after its last handle, at the end of that loop
 *     turn once the turn's replies (CLOSED) were sent: the aio first (it
 *     waits for the reads in flight), then the legacy arena, the memfds, the
 *     model (the lease); its tier generation stays, dormant, while it holds
 *     resident chunks (at most FP_MAX_DORMANT dormant generations), so an
 *     OPEN of the same generation (the same snapshot checksum) later finds
 *     them;
 *   - a read ahead only ever starts on an ABSENT chunk, with staging to
 *     spare, evicting no chunk a member is owed;
 *   - the reads use the aio's pread pool, never io_uring fixed buffers: a
 *     registered buffer pins its pages, and a page the tier punched while
 *     pinned would take the next read's bytes away from the memfd. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fastpath/fp_internal.h"
#include "util/sys.h"

#define FP_PAGE            4096u
#define FP_MAX_SLOT_LEN    (256u << 20)
#define FP_MAX_QUEUE_DEPTH 4096u         /* tv__aio's limit; more chunks wait for a free read */
#define FP_AIO_WINDOW      (16ull << 30) /* tv__aio's largest region */
#define FP_MAX_DORMANT     64u           /* generations kept with no group open */

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

/* ---- the legacy arena's slots --------------------------------------------- */

static void lru_unlink(fp_group *g, uint32_t idx)
{
    fp_slot *sl = &g->slots[idx];
    if (!sl->in_lru)
        return;
    if (sl->prev >= 0)
        g->slots[sl->prev].next = sl->next;
    else
        g->lru_head = sl->next;
    if (sl->next >= 0)
        g->slots[sl->next].prev = sl->prev;
    else
        g->lru_tail = sl->prev;
    sl->prev = sl->next = -1;
    sl->in_lru = false;
}

static void lru_push_tail(fp_group *g, uint32_t idx)
{
    fp_slot *sl = &g->slots[idx];
    sl->prev = g->lru_tail;
    sl->next = -1;
    if (g->lru_tail >= 0)
        g->slots[g->lru_tail].next = (int32_t)idx;
    else
        g->lru_head = (int32_t)idx;
    g->lru_tail = (int32_t)idx;
    sl->in_lru = true;
}

static void lru_push_head(fp_group *g, uint32_t idx)
{
    fp_slot *sl = &g->slots[idx];
    sl->next = g->lru_head;
    sl->prev = -1;
    if (g->lru_head >= 0)
        g->slots[g->lru_head].prev = (int32_t)idx;
    else
        g->lru_tail = (int32_t)idx;
    g->lru_head = (int32_t)idx;
    sl->in_lru = true;
}

static uint32_t index_bucket(const fp_group *g, uint32_t chunk)
{
    uint64_t h = (uint64_t)chunk * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32) & g->index_mask;
}

static void index_insert(fp_group *g, uint32_t idx)
{
    fp_slot *sl = &g->slots[idx];
    uint32_t b = index_bucket(g, sl->chunk);
    sl->hnext = g->index[b];
    g->index[b] = (int32_t)idx;
}

/* Unkeys slot idx (its contents no longer count as a copy). */
static void index_remove(fp_group *g, uint32_t idx)
{
    fp_slot *sl = &g->slots[idx];
    if (!sl->keyed)
        return;
    int32_t *p = &g->index[index_bucket(g, sl->chunk)];
    while (*p >= 0 && *p != (int32_t)idx)
        p = &g->slots[*p].hnext;
    if (*p == (int32_t)idx)
        *p = sl->hnext;
    sl->hnext = -1;
    sl->keyed = false;
}

int32_t tv__fp_slot_find(fp_group *g, uint32_t idx, uint32_t lo, uint32_t hi)
{
    if (!g->slots)
        return -1;
    for (int32_t i = g->index[index_bucket(g, idx)]; i >= 0; i = g->slots[i].hnext) {
        const fp_slot *sl = &g->slots[i];
        if (sl->chunk == idx && sl->lo <= lo && hi <= sl->hi)
            return i;
    }
    return -1;
}

void tv__fp_slot_take(fp_group *g, uint32_t idx)
{
    lru_unlink(g, idx);
}

void tv__fp_slot_unref(fp_group *g, uint32_t idx, uint32_t n)
{
    fp_slot *sl = &g->slots[idx];
    sl->refs = n > sl->refs ? 0 : sl->refs - n;
    if (sl->refs == 0 && sl->state == FP_SLOT_READY) {
        sl->state = FP_SLOT_FREE;
        lru_push_tail(g, idx);
        g->fp->again = true;
    }
}

/* The copy of slot idx: its chunk's bytes [lo, hi), resident in the tier. */
static void slot_copy(fp_group *g, uint32_t idx)
{
    const fp_slot *sl = &g->slots[idx];
    memcpy(g->arena + (size_t)idx * g->chunk_len + sl->lo,
           g->tg->base + (size_t)sl->chunk * g->chunk_len + sl->lo, sl->hi - sl->lo);
}

int32_t tv__fp_slot_take_free(fp_group *g, uint32_t idx, bool filling)
{
    /* Reuse a free slot before growing into a never-used one (whose shmem
     * pages the first copy allocates). */
    int32_t s = g->lru_head;
    if (s < 0 && g->n_fresh < g->n_slots) {
        s = (int32_t)g->n_fresh++;
        atomic_fetch_add(&g->fp->st_slots_used, 1);
    }
    if (s < 0)
        return -1;
    const tv__tier_chunk *tc = &g->tg->c[idx];
    fp_slot *sl = &g->slots[s];
    lru_unlink(g, (uint32_t)s);
    index_remove(g, (uint32_t)s); /* the copy it held goes */
    sl->keyed = true;
    sl->chunk = idx;
    sl->lo = tc->lo;
    sl->hi = tc->hi;
    sl->refs = 0;
    sl->waits = NULL;
    sl->fnext = -1;
    index_insert(g, (uint32_t)s);
    if (filling) {
        sl->state = FP_SLOT_FILLING;
        sl->fnext = g->chunks[idx].fills;
        g->chunks[idx].fills = s;
    } else {
        slot_copy(g, (uint32_t)s);
        sl->state = FP_SLOT_READY;
    }
    return s;
}

/* ---- chunks and their reads -------------------------------------------------- */

uint32_t tv__fp_chunk_index(const fp_group *g, uint32_t shard, uint64_t k)
{
    return g->shards[shard].first_chunk + (uint32_t)k; /* k < the shard's chunks: checked at READ */
}

/* The bytes chunk idx has in its object: chunk_len, less at the object's end. */
static uint32_t chunk_full_len(const fp_group *g, uint32_t idx)
{
    const fp_shard *sh = &g->shards[g->chunks[idx].shard];
    uint64_t off = (uint64_t)(idx - sh->first_chunk) * g->chunk_len;
    uint64_t left = sh->object_len > off ? sh->object_len - off : 0;
    return left < g->chunk_len ? (uint32_t)left : g->chunk_len;
}

/* The aio of the window holding chunk idx, made on first use. */
static tv__aio *aio_for(fp_group *g, uint32_t idx, tv_error *err)
{
    uint32_t w = idx / g->window_chunks;
    if (g->aio[w])
        return g->aio[w];
    uint32_t first = w * g->window_chunks;
    uint32_t n = g->n_chunks - first < g->window_chunks ? g->n_chunks - first : g->window_chunks;
    tv__aio_opts ao = {.engine = TV_ENGINE_PREAD,
                       .queue_depth = g->queue_depth,
                       .region = g->tg->base + (size_t)first * g->chunk_len,
                       .region_len = (size_t)n * g->chunk_len,
                       .piece_len = g->chunk_len};
    if (tv__aio_create(&ao, &g->aio[w], err))
        return NULL;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &g->ev};
    if (epoll_ctl(g->fp->epoll_fd, EPOLL_CTL_ADD, tv__aio_event_fd(g->aio[w]), &ev)) {
        tv__seterr(err, -errno, "model '%s': epoll_ctl for the read completions: %s", g->name,
                   strerror(errno));
        tv__aio_destroy(g->aio[w]);
        g->aio[w] = NULL;
    }
    return g->aio[w];
}

/* Submits the read of chunk idx's [lo, hi) (the tier's READING range) from
 * the next usable replica at or after its `tried`. Returns 0 (queued) or
 * the error of the last replica tried (TV_E_NO_REPLICA when none is
 * usable), err naming it. */
static int chunk_submit(fp_group *g, uint32_t idx, tv_error *err)
{
    fp_chunk *ch = &g->chunks[idx];
    const tv__tier_chunk *tc = &g->tg->c[idx];
    const fp_shard *sh = &g->shards[ch->shard];
    uint64_t k = idx - sh->first_chunk, chunk_off = k * g->chunk_len; /* < object_len */
    int rc = ch->last_err ? ch->last_err : TV_E_NO_REPLICA;
    tv__aio *aio = aio_for(g, idx, err);
    if (!aio)
        return err && err->code ? err->code : -ENOMEM;
    for (; ch->tried < sh->n_replicas; ch->tried++) {
        const tv__snap_replica_info *rep = &g->replicas[sh->first_replica + ch->tried];
        const tv__model_dev *dev = &g->devs[rep->device];
        uint64_t off = 0;
        if (dev->fd < 0 || dev->reason != 0)
            continue;
        if (chunk_off + tc->hi > rep->alloc_len || tv__add_u64(rep->base_off, chunk_off, &off)) {
            rc = tv__seterr(err, TV_E_SNAPSHOT,
                            "model '%s' generation %" PRId64 ": chunk %" PRIu64
                            " of shard %u outside its object on device %u",
                            g->name, g->gen, k, ch->shard, rep->device);
            continue;
        }
        rc = tv__aio_submit(aio, dev->fd, dev->io_align, rep->device, off + tc->lo,
                            g->tg->base + (size_t)idx * g->chunk_len + tc->lo,
                            (size_t)(tc->hi - tc->lo), idx, err);
        if (rc == 0) {
            ch->reading = ch->tried;
            g->in_flight++;
            g->flush_needed = true;
            return 0;
        }
    }
    if (rc == TV_E_NO_REPLICA)
        tv__seterr(err, rc, "model '%s' generation %" PRId64 ": shard %u has no usable replica",
                   g->name, g->gen, ch->shard);
    return rc;
}

/* Starts the read of chunk idx's [lo, hi) (hi clipped to the chunk): the
 * tier makes room first; when it has none, the debts of the member asking
 * (member, -1: none) stop counting and it tries once more: what is kept for
 * a member never blocks that member itself. Returns FP_GOT_STARTED,
 * FP_GOT_BLOCKED (no room: throttled) or FP_GOT_FAILED (err). */
static int chunk_start(fp_group *g, uint32_t idx, uint32_t lo, uint32_t hi, uint64_t reader,
                       int member, tv_error *err)
{
    fp_chunk *ch = &g->chunks[idx];
    uint32_t full = chunk_full_len(g, idx);
    if (g->whole_only) {
        lo = 0;
        hi = full;
    }
    if (hi > full)
        hi = full;
    if (lo >= hi) {
        tv__seterr(err, TV_E_SNAPSHOT,
                   "model '%s' generation %" PRId64 ": bytes %u.. of chunk %u outside its object",
                   g->name, g->gen, lo, idx);
        return FP_GOT_FAILED;
    }
    if (tv__tier_reserve(g->tg, idx, lo, hi)) {
        /* its debts come back with its next take (tv__tier_member_active) */
        if (member < 0 || !tv__tier_member_owed(g->tg, member) ||
            (tv__tier_member_active(g->tg, member, false), tv__tier_reserve(g->tg, idx, lo, hi))) {
            g->throttled = true;
            return FP_GOT_BLOCKED;
        }
    }
    ch->tried = 0;
    ch->last_err = 0;
    ch->reader = reader;
    ch->ahead = ch->ahead_read = false;
    if (chunk_submit(g, idx, err)) {
        tv__tier_landed(g->tg, idx, false);
        return FP_GOT_FAILED;
    }
    return FP_GOT_STARTED;
}

int tv__fp_chunk_get(fp_group *g, uint32_t idx, uint32_t need_lo, uint32_t need_hi, uint32_t lo,
                     uint32_t hi, uint64_t reader, int member, uint32_t own_refs, tv_error *err)
{
    const tv__tier_chunk *tc = &g->tg->c[idx];
    bool covers = tc->lo <= need_lo && need_hi <= tc->hi;
    if (tc->state == TV__TIER_RESIDENT && covers)
        return FP_GOT_RESIDENT;
    if (tc->state == TV__TIER_READING)
        return covers ? FP_GOT_READING : FP_GOT_BLOCKED; /* other bytes in flight: next turn */
    if (tc->state == TV__TIER_RESIDENT) {
        /* read more of it, whole: only when no client holds its bytes (a
         * failed read must not touch them); another session's references
         * stall us (tv__fp_hold_sweep), our own only ourselves */
        if (tc->refs || tc->vrefs) {
            if (own_refs < tc->refs + tc->vrefs)
                g->starved = true;
            return FP_GOT_BLOCKED;
        }
        lo = 0;
        hi = UINT32_MAX;
    }
    if (g->tg->n_inuse >= g->staging) {
        g->starved = true; /* the holders of this group's chunks stall us (tv__fp_hold_sweep) */
        return FP_GOT_BLOCKED;
    }
    if (g->in_flight >= g->queue_depth)
        return FP_GOT_BLOCKED;
    return chunk_start(g, idx, lo, hi, reader, member, err);
}

void tv__fp_readahead(fp_group *g, uint32_t shard, uint64_t from_k, uint64_t reader)
{
    const fp_shard *sh = &g->shards[shard];
    uint64_t n = g->fp->o.readahead, end_k = sh->file_len / g->chunk_len;
    if (n > g->staging / 4)
        n = g->staging / 4;
    if (sh->file_len % g->chunk_len)
        end_k++;
    for (uint64_t k = from_k; k < end_k && k - from_k < n; k++) {
        uint32_t idx = tv__fp_chunk_index(g, shard, k);
        tv_error err = {0};
        if (g->tg->c[idx].state != TV__TIER_ABSENT)
            continue; /* resident, or read now: never read twice */
        if (g->tg->n_inuse >= g->staging / 2 || g->in_flight >= g->queue_depth)
            break; /* staging for the requests first */
        bool was = g->throttled;
        if (chunk_start(g, idx, 0, UINT32_MAX, reader, -1, &err) != FP_GOT_STARTED) {
            g->throttled = was; /* no room for a read ahead is no one's wait */
            break;
        }
        g->chunks[idx].ahead = g->chunks[idx].ahead_read = true;
    }
}

void tv__fp_chunk_used(fp_group *g, uint32_t idx)
{
    fp_chunk *ch = &g->chunks[idx];
    if (!ch->ahead)
        return;
    ch->ahead = false;
    atomic_fetch_add(&g->fp->st_readahead_hit, g->tg->c[idx].hi - g->tg->c[idx].lo);
}

/* Every replica failed: fail every waiting request (direct and through
 * legacy slots filling), free those slots; the tier punched the chunk. */
static void chunk_failed(fp_group *g, uint32_t idx, int code, const char *msg)
{
    fp_chunk *ch = &g->chunks[idx];
    fp_wait *w;
    tv__tier_landed(g->tg, idx, false);
    ch->ahead = ch->ahead_read = false; /* a read ahead that failed: no error to anyone */
    while ((w = ch->waits) != NULL)
        tv__fp_req_fail(w->req, code, msg); /* unlinks every wait of its request */
    int32_t s = ch->fills;
    ch->fills = -1;
    while (s >= 0) {
        fp_slot *sl = &g->slots[s];
        int32_t nx = sl->fnext;
        sl->fnext = -1;
        while ((w = sl->waits) != NULL)
            tv__fp_req_fail(w->req, code, msg);
        index_remove(g, (uint32_t)s);
        sl->state = FP_SLOT_FREE;
        lru_push_head(g, (uint32_t)s);
        s = nx;
    }
    g->fp->again = true;
}

static void chunk_ready(fp_group *g, uint32_t idx)
{
    fp_chunk *ch = &g->chunks[idx];
    const tv__tier_chunk *tc = &g->tg->c[idx];
    uint64_t len = tc->hi - tc->lo;
    fp_wait *w;
    tv__tier_landed(g->tg, idx, true);
    if (ch->ahead_read) { /* before device_read: a reader of both never sees more ahead */
        ch->ahead_read = false;
        atomic_fetch_add(&g->fp->st_readahead, len);
    }
    atomic_fetch_add(&g->fp->st_device_read, len);
    while ((w = ch->waits) != NULL)
        tv__fp_wait_deliver(g, idx, w);
    int32_t s = ch->fills;
    ch->fills = -1;
    while (s >= 0) {
        fp_slot *sl = &g->slots[s];
        int32_t nx = sl->fnext;
        sl->fnext = -1;
        slot_copy(g, (uint32_t)s);
        sl->state = FP_SLOT_READY;
        while ((w = sl->waits) != NULL)
            tv__fp_wait_deliver(g, (uint32_t)s, w);
        if (sl->refs == 0) {
            sl->state = FP_SLOT_FREE;
            lru_push_tail(g, (uint32_t)s);
        }
        s = nx;
    }
    g->fp->again = true;
}

/* A completion of chunk idx's read. */
static void chunk_done(fp_group *g, uint32_t idx, int result)
{
    fp_chunk *ch = &g->chunks[idx];
    const tv__tier_chunk *tc = &g->tg->c[idx];
    g->in_flight--;
    if (result == 0) {
        chunk_ready(g, idx);
        return;
    }
    const fp_shard *sh = &g->shards[ch->shard];
    const tv__snap_replica_info *rep = &g->replicas[sh->first_replica + ch->reading];
    uint64_t off = rep->base_off + (uint64_t)(idx - sh->first_chunk) * g->chunk_len +
                   tc->lo; /* checked at submit */
    char msg[TV__FP_MAX_TEXT + 1];
    tv_error err = {0};
    snprintf(msg, sizeof msg,
             "model '%s' generation %" PRId64 ": read of device %u at offset %" PRIu64
             " (%u bytes, shard %u) failed: %s",
             g->name, g->gen, rep->device, off, tc->hi - tc->lo, ch->shard, tv_strerror(result));
    tv__log(TV_LOG_WARN, "fastpath: %s", msg);
    ch->last_err = result;
    ch->tried = ch->reading + 1;
    if (chunk_submit(g, idx, &err) == 0)
        return;
    chunk_failed(g, idx, result, msg);
}

void tv__fp_group_on_event(fp_group *g)
{
    tv__aio_done done[64];
    for (uint32_t a = 0; a < g->n_aio; a++) {
        size_t n;
        while (g->aio[a] && (n = tv__aio_reap(g->aio[a], done, TV_ARRAY_LEN(done))) > 0) {
            for (size_t i = 0; i < n; i++) {
                uint32_t idx = (uint32_t)done[i].tag;
                if (idx >= g->n_chunks || g->tg->c[idx].state != TV__TIER_READING)
                    continue;
                chunk_done(g, idx, done[i].result);
            }
        }
    }
}

void tv__fp_groups_flush(tv__fp *fp)
{
    for (fp_group *g = fp->g_head; g; g = g->next) {
        if (!g->flush_needed)
            continue;
        g->flush_needed = false;
        for (uint32_t a = 0; a < g->n_aio; a++) {
            tv_error err = {0};
            if (g->aio[a] && tv__aio_flush(g->aio[a], &err))
                tv__log(TV_LOG_WARN,
                        "fastpath: model '%s' generation %" PRId64 ": submitting reads: %s",
                        g->name, g->gen, err.msg);
        }
    }
}

/* ---- life ---------------------------------------------------------------------- */

static void free_waits(fp_wait *w)
{
    while (w) {
        fp_wait *nx = w->snext;
        free(w);
        w = nx;
    }
}

/* Frees the dormant tier generations with nothing resident, and the least
 * recently used ones past FP_MAX_DORMANT. */
static void dormant_trim(tv__fp *fp)
{
    tv__tier_gen *e;
    while ((e = tv__tier_empty_dormant(fp->tier)) != NULL)
        tv__tier_gen_free(e);
    for (;;) {
        uint32_t n = 0;
        tv__tier_gen *old = NULL;
        for (tv__tier_gen *x = tv__tier_gens(fp->tier); x; x = x->next)
            if (!x->open) {
                n++;
                if (!old || x->used_ms < old->used_ms)
                    old = x;
            }
        if (n <= FP_MAX_DORMANT || !old)
            break;
        tv__tier_gen_free(old);
    }
}

static void group_free(fp_group *g)
{
    if (!g)
        return;
    atomic_fetch_sub(&g->fp->st_slots_used, g->n_fresh);
    if (g->fp->evs) {
        for (int i = g->fp->ev_next; i < g->fp->n_evs; i++)
            if (g->fp->evs[i].data.ptr == &g->ev)
                g->fp->evs[i].data.ptr = NULL;
    }
    for (uint32_t a = 0; g->aio && a < g->n_aio; a++) {
        if (!g->aio[a])
            continue;
        epoll_ctl(g->fp->epoll_fd, EPOLL_CTL_DEL, tv__aio_event_fd(g->aio[a]), NULL);
        tv__aio_destroy(g->aio[a]); /* waits for the reads in flight */
    }
    free(g->aio);
    if (g->chunks) {
        for (uint32_t i = 0; i < g->n_chunks; i++) {
            free_waits(g->chunks[i].waits);
            if (g->tg && g->tg->c[i].state == TV__TIER_READING) /* never reaped: not resident */
                tv__tier_landed(g->tg, i, false);
        }
    }
    for (uint32_t i = 0; g->slots && i < g->n_slots; i++)
        free_waits(g->slots[i].waits);
    if (g->arena)
        tv__sys.munmap(g->arena, g->arena_len);
    if (g->arena_fd >= 0)
        tv__sys.close(g->arena_fd);
    if (g->snap_fd >= 0)
        tv__sys.close(g->snap_fd);
    if (g->tier_ro_fd >= 0)
        tv__sys.close(g->tier_ro_fd);
    if (g->tg) {
        tv__tier_gen_close(g->tg); /* dormant from now on, or freed below when empty */
        if (g->fp->o.cache_len < 0)
            tv__tier_gen_free(g->tg);
        dormant_trim(g->fp);
    }
    tv_model_close(g->m);
    free(g->chunks);
    free(g->slots);
    free(g->index);
    free(g->shards);
    free(g->replicas);
    free(g->devs);
    free(g);
}

void tv__fp_group_unref(fp_group *g)
{
    tv__fp *fp = g->fp;
    if (--g->n_handles > 0)
        return;
    if (g->prev)
        g->prev->next = g->next;
    else
        fp->g_head = g->next;
    if (g->next)
        g->next->prev = g->prev;
    fp->n_groups--;
    atomic_fetch_sub(&fp->st_groups, 1);
    g->dying = true;
    g->prev = NULL;
    g->next = fp->dying;
    fp->dying = g;
}

/* Puts g at the head of the open groups (counted in n_groups and stats). */
static void group_link(fp_group *g)
{
    tv__fp *fp = g->fp;
    g->prev = NULL;
    g->next = fp->g_head;
    if (fp->g_head)
        fp->g_head->prev = g;
    fp->g_head = g;
    fp->n_groups++;
    atomic_fetch_add(&fp->st_groups, 1);
}

/* Takes a dying group back (an OPEN of its generation in the same turn). */
static void group_revive(fp_group *g)
{
    tv__fp *fp = g->fp;
    fp_group **pp = &fp->dying;
    while (*pp && *pp != g)
        pp = &(*pp)->next;
    if (*pp)
        *pp = g->next;
    g->dying = false;
    group_link(g);
}

void tv__fp_groups_reap(tv__fp *fp)
{
    while (fp->dying) {
        fp_group *g = fp->dying;
        fp->dying = g->next;
        tv__log(TV_LOG_INFO,
                "fastpath: model '%s' generation %" PRId64
                " released (last handle closed); %" PRIu64 " bytes stay in the memory tier",
                g->name, g->gen, g->tg ? g->tg->resident_len : 0);
        group_free(g);
    }
    if (fp->tier)
        dormant_trim(fp);
}

/* The sealed snapshot memfd: exactly the image's bytes. */
static int make_snap_memfd(fp_group *g, tv_error *err)
{
    const void *img = NULL;
    size_t len = 0;
    int rc = tv__model_snap_image(g->m, &img, &len);
    if (rc)
        return tv__seterr(err, rc, "model '%s' generation %" PRId64 ": no snapshot image", g->name,
                          g->gen);
    g->snap_fd = memfd_create("tensorvault-snapshot", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (g->snap_fd < 0)
        return tv__seterr(err, -errno, "model '%s': memfd_create for the snapshot: %s", g->name,
                          strerror(errno));
    rc = tv__sys_pwrite_full(g->snap_fd, img, len, 0);
    if (rc)
        return tv__seterr(err, rc, "model '%s': writing the snapshot memfd: %s", g->name,
                          strerror(-rc));
    if (fcntl(g->snap_fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL))
        return tv__seterr(err, -errno, "model '%s': sealing the snapshot memfd: %s", g->name,
                          strerror(errno));
    g->snap_len = len;
    return 0;
}

/* The legacy arena: n_slots slots of chunk_len bytes in a memfd mapped
 * read-write here, then sealed so that no one (the clients) can map it
 * writable; the copies land at page-aligned offsets (memcpy, no device
 * read), so any page-aligned address will do. */
int tv__fp_group_legacy(fp_group *g, tv_error *err)
{
    uint64_t arena_len = 0;
    uint32_t n_index = 16;
    if (g->arena)
        return 0;
    g->n_slots = g->staging;
    if (tv__mul_u64(g->chunk_len, g->n_slots, &arena_len) || arena_len > (16ull << 30))
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "model '%s': legacy arena of %u slots x %u bytes is over 16 GiB", g->name,
                          g->n_slots, g->chunk_len);
    while (n_index < 2 * g->n_slots)
        n_index *= 2;
    g->slots = calloc(g->n_slots, sizeof(*g->slots));
    g->index = malloc((size_t)n_index * sizeof(*g->index));
    if (!g->slots || !g->index)
        return tv__seterr(err, -ENOMEM, "model '%s': out of memory for %u slots", g->name,
                          g->n_slots);
    g->index_mask = n_index - 1;
    for (uint32_t i = 0; i < n_index; i++)
        g->index[i] = -1;
    for (uint32_t i = 0; i < g->n_slots; i++)
        g->slots[i].prev = g->slots[i].next = g->slots[i].hnext = g->slots[i].fnext = -1;
    g->arena_len = (size_t)arena_len;
    g->arena_fd = memfd_create("tensorvault-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (g->arena_fd < 0)
        return tv__seterr(err, -errno, "model '%s': memfd_create for the arena: %s", g->name,
                          strerror(errno));
    if (tv__sys.ftruncate(g->arena_fd, (off_t)g->arena_len))
        return tv__seterr(err, -errno, "model '%s': sizing the arena memfd to %zu bytes: %s",
                          g->name, g->arena_len, strerror(errno));
    void *p = tv__sys.mmap(NULL, g->arena_len, PROT_READ | PROT_WRITE, MAP_SHARED, g->arena_fd, 0);
    if (p == MAP_FAILED)
        return tv__seterr(err, -errno, "model '%s': mapping the %zu-byte arena: %s", g->name,
                          g->arena_len, strerror(errno));
    g->arena = p;
    if (fcntl(g->arena_fd, F_ADD_SEALS,
              F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL))
        return tv__seterr(err, -errno, "model '%s': sealing the arena memfd: %s", g->name,
                          strerror(errno));
    return 0;
}

/* The devices, replicas and shards of g's model, the io alignment in *align. */
static int group_tables(fp_group *g, uint64_t *align, tv_error *err)
{
    const tv__snap *snap = g->snap;
    int rc;
    g->n_devs = snap->n_devices;
    g->n_shards = snap->n_shards;
    g->n_replicas = snap->n_replicas;
    g->devs = calloc(g->n_devs ? g->n_devs : 1, sizeof(*g->devs));
    g->shards = calloc(g->n_shards ? g->n_shards : 1, sizeof(*g->shards));
    g->replicas = calloc(g->n_replicas ? g->n_replicas : 1, sizeof(*g->replicas));
    if (!g->devs || !g->shards || !g->replicas)
        return tv__seterr(err, -ENOMEM, "model '%s': out of memory for the group tables", g->name);
    for (uint32_t i = 0; i < g->n_devs; i++) {
        if ((rc = tv__model_dev_info(g->m, i, &g->devs[i])))
            return tv__seterr(err, rc,
                              "model '%s' generation %" PRId64 ": device %u: no device info",
                              g->name, g->gen, i);
        if (g->devs[i].fd >= 0 && g->devs[i].reason == 0 &&
            tv__lcm_u64(*align, g->devs[i].io_align, align))
            return tv__seterr(err, TV_E_OVERFLOW, "model '%s': io alignment of device %u overflows",
                              g->name, i);
    }
    for (uint32_t i = 0; i < g->n_replicas; i++) {
        if ((rc = tv__snap_replica(snap, i, &g->replicas[i], err)))
            return rc;
        if (g->replicas[i].device >= g->n_devs)
            return tv__seterr(err, TV_E_SNAPSHOT, "model '%s': replica %u names device %u of %u",
                              g->name, i, g->replicas[i].device, g->n_devs);
    }
    for (uint32_t i = 0; i < g->n_shards; i++) {
        tv__snap_shard_info si;
        if ((rc = tv__snap_shard(snap, i, &si, err)))
            return rc;
        if (si.n_replicas == 0 || si.first_replica >= g->n_replicas)
            return tv__seterr(err, TV_E_SNAPSHOT, "model '%s': shard %u has no replica", g->name,
                              i);
        /* replicas share object_align: their objects have one length */
        g->shards[i] = (fp_shard){.data_off = si.data_off,
                                  .file_len = si.file_len,
                                  .object_len = g->replicas[si.first_replica].alloc_len,
                                  .first_replica = si.first_replica,
                                  .n_replicas = si.n_replicas};
    }
    return 0;
}

/* Chunk geometry: chunk_len (slot_len raised to the io alignment and the
 * tier's page), every shard's first chunk, the chunk table. */
static int group_chunks(fp_group *g, uint64_t align, tv_error *err)
{
    tv__fp *fp = g->fp;
    uint64_t len = fp->o.slot_len, n = 0;
    if (tv__lcm_u64(len, align, &len) || tv__lcm_u64(len, tv__tier_page_len(fp->tier), &len) ||
        len > FP_MAX_SLOT_LEN)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "model '%s': slot_len %u raised to the devices' io alignment %" PRIu64
                          " and the tier's page %" PRIu64 " is over %u bytes",
                          g->name, fp->o.slot_len, align, tv__tier_page_len(fp->tier),
                          FP_MAX_SLOT_LEN);
    g->chunk_len = (uint32_t)len;
    for (uint32_t i = 0; i < g->n_shards; i++) {
        uint64_t k = 0;
        if (tv__align_up_u64(g->shards[i].file_len, len, &k) || n > UINT32_MAX)
            return tv__seterr(err, TV_E_OVERFLOW, "model '%s': too many chunks", g->name);
        g->shards[i].first_chunk = (uint32_t)n;
        n += k / len;
    }
    if (n == 0 || n >= UINT32_MAX)
        return tv__seterr(err, TV_E_INVALID_ARG, "model '%s': %" PRIu64 " chunks", g->name, n);
    g->n_chunks = (uint32_t)n;
    g->chunks = calloc(n, sizeof(*g->chunks));
    if (!g->chunks)
        return tv__seterr(err, -ENOMEM, "model '%s': out of memory for %" PRIu64 " chunks", g->name,
                          n);
    for (uint32_t s = 0, i = 0; i < g->n_chunks; i++) {
        while (s + 1 < g->n_shards && i >= g->shards[s + 1].first_chunk)
            s++;
        g->chunks[i].shard = s;
        g->chunks[i].fills = -1;
    }
    g->staging = fp->o.group_slots;
    g->io_align = (uint32_t)align; /* <= chunk_len <= FP_MAX_SLOT_LEN */
    g->whole_only = tv__tier_page_len(fp->tier) > FP_PAGE;
    g->queue_depth = g->staging < FP_MAX_QUEUE_DEPTH ? g->staging : FP_MAX_QUEUE_DEPTH;
    g->window_chunks = (uint32_t)(FP_AIO_WINDOW / len);                 /* len <= 256 MiB: >= 64 */
    g->n_aio = (g->n_chunks + g->window_chunks - 1) / g->window_chunks; /* checked: n < 2^32 */
    g->aio = calloc(g->n_aio, sizeof(*g->aio));
    if (!g->aio)
        return tv__seterr(err, -ENOMEM, "model '%s': out of memory", g->name);
    return 0;
}

/* The tier generation of g: the one kept for its snapshot (the same
 * checksum: the same objects, byte for byte) when it has this geometry,
 * else a new one. */
static int group_tier(fp_group *g, uint64_t align, tv_error *err)
{
    tv__fp *fp = g->fp;
    const void *img = NULL;
    size_t img_len = 0;
    uint8_t key[32];
    int rc = tv__model_snap_image(g->m, &img, &img_len);
    if (rc || img_len < TV__SNAP_CHECKSUM_OFF + sizeof key)
        return tv__seterr(err, rc ? rc : TV_E_SNAPSHOT, "model '%s': no snapshot image", g->name);
    memcpy(key, (const uint8_t *)img + TV__SNAP_CHECKSUM_OFF, sizeof key);
    tv__tier_gen *tg = tv__tier_find(fp->tier, g->name, g->gen, key);
    if (tg && (tg->open || tg->chunk_len != g->chunk_len || tg->n_chunks != g->n_chunks)) {
        if (tg->open)
            return tv__seterr(err, TV_E_INTERNAL,
                              "model '%s' generation %" PRId64 ": its tier generation is open",
                              g->name, g->gen);
        tv__tier_gen_free(tg);
        tg = NULL;
    }
    uint64_t page = tv__tier_page_len(fp->tier);
    if (!tg && (rc = tv__tier_gen_new(fp->tier, g->name, g->gen, key, g->n_chunks, g->chunk_len,
                                      align > page ? align : page, &tg, err)))
        return rc;
    g->tg = tg;
    tv__tier_gen_open(tg, (uint64_t)g->staging * g->chunk_len);
    g->tier_ro_fd = tv__tier_gen_ro_fd(tg);
    if (g->tier_ro_fd < 0)
        return tv__seterr(err, g->tier_ro_fd,
                          "model '%s': opening the tier memfd read-only (/proc/self/fd): %s",
                          g->name, strerror(-g->tier_ro_fd));
    return 0;
}

static int group_create(tv__fp *fp, tv_model *m, fp_group **out, tv_error *err)
{
    fp_group *g = calloc(1, sizeof(*g));
    uint64_t align = FP_PAGE;
    int rc = 0;
    if (!g) {
        tv_model_close(m);
        return tv__seterr(err, -ENOMEM, "fastpath: out of memory for a read group");
    }
    g->fp = fp;
    g->m = m;
    g->snap = tv__model_snap(m);
    g->snap_fd = g->arena_fd = g->tier_ro_fd = -1;
    g->lru_head = g->lru_tail = -1;
    g->ev.kind = FP_EV_GROUP;
    g->ev.ptr = g;
    snprintf(g->name, sizeof g->name, "%s", tv_model_name(m));
    g->gen = tv_model_generation(m);
    if (!g->snap) {
        rc = tv__seterr(err, TV_E_INTERNAL, "model '%s': open model has no snapshot", g->name);
        goto fail;
    }
    if ((rc = group_tables(g, &align, err)) || (rc = group_chunks(g, align, err)) ||
        (rc = make_snap_memfd(g, err)) || (rc = group_tier(g, align, err)))
        goto fail;
    group_link(g);
    tv__log(TV_LOG_INFO,
            "fastpath: model '%s' generation %" PRId64 " opened: %u chunks of %u bytes (%" PRIu64
            " resident in the memory tier), staging %u chunks",
            g->name, g->gen, g->n_chunks, g->chunk_len, g->tg->resident_len, g->staging);
    *out = g;
    return 0;
fail:
    group_free(g);
    return rc;
}

static int default_admit(tv__fp *fp, const char *model, const fp_session *s, tv_error *err)
{
    if (s->uid == fp->uid)
        return 0;
    for (size_t i = 0; i < s->n_gids; i++)
        if (s->gids[i] == fp->gid)
            return 0;
    return tv__seterr(
        err, TV_E_PEER_DENIED, "uid %u (gid %u) may not open model '%s' (allowed: uid:%u gid:%u)",
        (unsigned)s->uid, (unsigned)s->gid, model, (unsigned)fp->uid, (unsigned)fp->gid);
}

/* The groups the sessions of uid have handles on (counted once each), and
 * whether g is one of them. */
static uint32_t uid_groups(tv__fp *fp, uid_t uid, const fp_group *g, bool *in_g)
{
    uint32_t n = 0;
    *in_g = false;
    fp->mark++;
    for (const fp_session *s = fp->s_head; s; s = s->next) {
        if (s->uid != uid)
            continue;
        for (uint32_t i = 0; i < fp->o.max_handles; i++) {
            fp_group *hg = s->handles[i] ? s->handles[i]->g : NULL;
            if (!hg || hg->mark == fp->mark)
                continue;
            hg->mark = fp->mark;
            n++;
            *in_g |= hg == g;
        }
    }
    return n;
}

/* The shares of the groups (an OPEN of generation gen of name by session
 * s, joining group g or, NULL, making one): 0, or TV_E_BUSY naming the
 * limit's key when the uid would pass max_groups_per_uid, the model
 * max_groups_per_model, or the daemon max_groups. */
static int group_limits(tv__fp *fp, const fp_session *s, const char *name, int64_t gen,
                        const fp_group *g, tv_error *err)
{
    bool in_g = false;
    uint32_t mine = uid_groups(fp, s->uid, g, &in_g);
    if (!in_g && mine >= fp->o.max_groups_per_uid)
        return tv__seterr(
            err, TV_E_BUSY,
            "fastpath: uid %u has handles on %u model generations (fastpath.max_groups_per_uid = %u): '%s' generation %" PRId64
            " cannot be opened now",
            (unsigned)s->uid, mine, fp->o.max_groups_per_uid, name, gen);
    if (g)
        return 0; /* joins an open group: no new one */
    uint32_t of_model = 0;
    for (const fp_group *x = fp->g_head; x; x = x->next)
        of_model += strcmp(x->name, name) == 0;
    if (of_model >= fp->o.max_groups_per_model)
        return tv__seterr(
            err, TV_E_BUSY,
            "fastpath: model '%s' has %u generations open (fastpath.max_groups_per_model = %u): generation %" PRId64
            " cannot be opened now",
            name, of_model, fp->o.max_groups_per_model, gen);
    if (fp->n_groups >= fp->o.max_groups)
        return tv__seterr(
            err, TV_E_BUSY,
            "fastpath: %u model generations are open (fastpath.max_groups = %u): '%s' generation %" PRId64
            " cannot be opened now",
            fp->n_groups, fp->o.max_groups, name, gen);
    return 0;
}

int tv__fp_group_open(tv__fp *fp, fp_session *s, const char *spec, fp_group **out, bool *refused,
                      tv_error *err)
{
    tv_open_opts oo = {.engine = fp->o.engine, .no_direct = fp->o.no_direct};
    tv_model *m = NULL;
    const char *name;
    int64_t gen;
    int rc;
    *refused = false;
    /* Access first, by the spec's model name (NAME before the last '@', as
     * tv_model_open splits it), generation 0: a peer that may not open the
     * model learns nothing of it (not whether it exists, not an open error)
     * and costs no open. The resolved generation is admitted again below. */
    {
        char want[TV__FP_MAX_SPEC_COPY];
        const char *at = strrchr(spec, '@');
        size_t nl = at ? (size_t)(at - spec) : strlen(spec);
        if (nl >= sizeof want)
            nl = sizeof want - 1;
        memcpy(want, spec, nl);
        want[nl] = '\0';
        if (fp->o.admit)
            rc = fp->o.admit(fp->o.admit_ctx, want, 0, s->pid, s->uid, s->gids, s->n_gids, err);
        else
            rc = default_admit(fp, want, s, err);
        if (rc) {
            if (err && !err->msg[0])
                tv__seterr(err, rc, "uid %u may not open model '%s'", (unsigned)s->uid, want);
            *refused = true;
            return rc;
        }
    }
    rc = tv_model_open(fp->store_dir, spec, &oo, &m, err);
    if (rc)
        return rc;
    name = tv_model_name(m);
    gen = tv_model_generation(m);
    if (fp->o.admit)
        rc = fp->o.admit(fp->o.admit_ctx, name, gen, s->pid, s->uid, s->gids, s->n_gids, err);
    else
        rc = default_admit(fp, name, s, err);
    if (rc) {
        if (err && !err->msg[0])
            tv__seterr(err, rc, "uid %u may not open model '%s'", (unsigned)s->uid, name);
        *refused = true;
        tv_model_close(m);
        return rc;
    }
    fp_group *join = NULL;
    for (fp_group *g = fp->g_head; g && !join; g = g->next)
        if (g->gen == gen && strcmp(g->name, name) == 0)
            join = g;
    rc = group_limits(fp, s, name, gen, join, err);
    if (rc) {
        tv_model_close(m);
        return rc;
    }
    if (join) {
        tv_model_close(m); /* the group's model holds the lease */
        join->n_handles++;
        *out = join;
        return 0;
    }
    for (fp_group *g = fp->dying; g; g = g->next) {
        if (g->gen == gen && strcmp(g->name, name) == 0) {
            tv_model_close(m); /* its model still holds the lease */
            group_revive(g);
            g->n_handles = 1;
            *out = g;
            return 0;
        }
    }
    rc = group_create(fp, m, out, err); /* takes m */
    if (rc == 0)
        (*out)->n_handles = 1;
    return rc;
}
