/* Read groups of the fast path: one per open model generation, shared by
 * every handle on it. A group owns the tv_model (the lease), the sealed
 * snapshot memfd, the staging arena (memfd mapped here read-write, sealed
 * against any further writable mapping), the aio that reads into it, and
 * the chunk table: which slot holds or is reading chunk k of shard s.
 *
 * Invariants:
 *   - slot_len is a multiple of 4096 and of every usable device's io_align,
 *     and the arena starts at a multiple of the largest io_align, so every
 *     chunk read (base_off + k x slot_len, clipped to the replica's
 *     alloc_len) is aligned in offset, length and address;
 *   - a slot is reused (its key dropped) only from the LRU, i.e. with no
 *     reference and no read in flight; a read that fails moves to the next
 *     usable replica (excluded devices are skipped), and only when every
 *     replica failed are its waiters' requests failed;
 *   - a uid has handles on at most max_groups_per_uid groups and a model
 *     at most max_groups_per_model groups (generations) open: an OPEN that
 *     would pass either is refused TV_E_BUSY before a group is made or
 *     joined (the global max_groups likewise, for a new group);
 *   - the group is destroyed after its last handle, at the end of that loop
 *     turn once the turn's replies (CLOSED) were sent: the aio first (it
 *     waits for the reads in flight), then the mapping, the memfds, the
 *     model (the lease);
 *   - a read ahead only ever takes a free slot (LRU or never used: no
 *     reference, no wait) for a chunk no slot holds or is reading;
 *   - a never-used slot is taken only when the LRU is empty or its head
 *     holds a chunk read ahead and not yet used: the arena's pages (shmem,
 *     allocated on first use) grow with the working set, not the slot count. */
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
#define FP_MAX_QUEUE_DEPTH 4096u /* tv__aio's limit; more slots wait for a free read */

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

static uint32_t index_bucket(const fp_group *g, uint32_t shard, uint64_t k)
{
    uint64_t h = (k ^ ((uint64_t)shard << 40)) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32) & g->index_mask;
}

static void index_insert(fp_group *g, uint32_t idx)
{
    fp_slot *sl = &g->slots[idx];
    uint32_t b = index_bucket(g, sl->shard, sl->k);
    sl->hnext = g->index[b];
    g->index[b] = (int32_t)idx;
}

/* Unkeys slot idx (its contents no longer count as a chunk). */
static void index_remove(fp_group *g, uint32_t idx)
{
    fp_slot *sl = &g->slots[idx];
    if (!sl->keyed)
        return;
    int32_t *p = &g->index[index_bucket(g, sl->shard, sl->k)];
    while (*p >= 0 && *p != (int32_t)idx)
        p = &g->slots[*p].hnext;
    if (*p == (int32_t)idx)
        *p = sl->hnext;
    sl->hnext = -1;
    sl->keyed = false;
}

int32_t tv__fp_slot_find(fp_group *g, uint32_t shard, uint64_t k, uint32_t lo, uint32_t hi)
{
    for (int32_t i = g->index[index_bucket(g, shard, k)]; i >= 0; i = g->slots[i].hnext) {
        const fp_slot *sl = &g->slots[i];
        if (sl->shard == shard && sl->k == k && sl->lo <= lo && hi <= sl->hi)
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

/* Submits the read of slot idx from the next usable replica at or after
 * sl->tried. Returns 0 (queued) or the error of the last replica tried
 * (TV_E_NO_REPLICA when none is usable), err naming it. */
static int slot_submit(fp_group *g, uint32_t idx, tv_error *err)
{
    fp_slot *sl = &g->slots[idx];
    const fp_shard *sh = &g->shards[sl->shard];
    uint64_t chunk_off = 0;
    int rc = sl->last_err ? sl->last_err : TV_E_NO_REPLICA;
    if (tv__mul_u64(sl->k, g->slot_len, &chunk_off))
        return tv__seterr(err, TV_E_OVERFLOW,
                          "model '%s' generation %" PRId64 ": chunk %" PRIu64
                          " of shard %u: offset overflows",
                          g->name, g->gen, sl->k, sl->shard);
    for (; sl->tried < sh->n_replicas; sl->tried++) {
        const tv__snap_replica_info *rep = &g->replicas[sh->first_replica + sl->tried];
        const tv__model_dev *dev = &g->devs[rep->device];
        uint64_t off = 0, len = 0;
        if (dev->fd < 0 || dev->reason != 0)
            continue;
        if (chunk_off >= rep->alloc_len || tv__add_u64(rep->base_off, chunk_off, &off)) {
            rc = tv__seterr(err, TV_E_SNAPSHOT,
                            "model '%s' generation %" PRId64 ": chunk %" PRIu64
                            " of shard %u outside its object on device %u",
                            g->name, g->gen, sl->k, sl->shard, rep->device);
            continue;
        }
        len = rep->alloc_len - chunk_off;
        if (len > g->slot_len)
            len = g->slot_len;
        /* [lo, hi) of the chunk, at the same offsets in the slot; replicas
         * have the same object_align, so the clip is the same on each. */
        if (len > sl->hi)
            len = sl->hi;
        if (sl->lo >= len) {
            rc = tv__seterr(err, TV_E_SNAPSHOT,
                            "model '%s' generation %" PRId64 ": bytes %u.. of chunk %" PRIu64
                            " of shard %u outside its object on device %u",
                            g->name, g->gen, sl->lo, sl->k, sl->shard, rep->device);
            continue;
        }
        rc = tv__aio_submit(g->aio, dev->fd, dev->io_align, rep->device, off + sl->lo,
                            g->arena + (size_t)idx * g->slot_len + sl->lo, (size_t)(len - sl->lo),
                            idx, err);
        if (rc == 0) {
            sl->reading = sl->tried;
            sl->hi = (uint32_t)len;
            sl->len = (uint32_t)(len - sl->lo);
            g->flush_needed = true;
            return 0;
        }
    }
    if (rc == TV_E_NO_REPLICA)
        tv__seterr(err, rc, "model '%s' generation %" PRId64 ": shard %u has no usable replica",
                   g->name, g->gen, sl->shard);
    return rc;
}

int32_t tv__fp_slot_start(fp_group *g, uint32_t shard, uint64_t k, uint32_t lo, uint32_t hi,
                          uint64_t reader, tv_error *err)
{
    if (tv__aio_in_flight(g->aio) >= g->queue_depth)
        return -1;
    /* Reuse a free slot before growing the working set into a never-used
     * one (whose shmem pages the first read allocates: ~0.7 ms per MiB on
     * the benchmark VM, 85 ms for 128 slots of 1 MiB), unless reusing would
     * drop a chunk read ahead and not yet used. */
    int32_t idx = g->lru_head;
    if ((idx < 0 || g->slots[idx].ahead) && g->n_fresh < g->n_slots) {
        idx = (int32_t)g->n_fresh++;
        atomic_fetch_add(&g->fp->st_slots_used, 1);
    }
    if (idx < 0)
        return -1;
    fp_slot *sl = &g->slots[idx];
    lru_unlink(g, (uint32_t)idx);
    index_remove(g, (uint32_t)idx); /* evicts the chunk it cached */
    sl->keyed = true;
    sl->shard = shard;
    sl->k = k;
    sl->lo = lo;
    sl->hi = hi > g->slot_len ? g->slot_len : hi;
    index_insert(g, (uint32_t)idx);
    sl->state = FP_SLOT_READING;
    sl->tried = 0;
    sl->last_err = 0;
    sl->reader = reader;
    sl->refs = 0;
    sl->waits = NULL;
    sl->ahead = sl->ahead_read = false;
    if (slot_submit(g, (uint32_t)idx, err)) {
        index_remove(g, (uint32_t)idx);
        sl->state = FP_SLOT_FREE;
        lru_push_head(g, (uint32_t)idx);
        return -2;
    }
    return idx;
}

/* Whether read-ahead must stay off for g: a group with several handles
 * (tensor-parallel ranks loading together) lags member to member, and the
 * free slots the laggards still have to find cached must not be recycled
 * for one member's read-ahead (the device should read about one copy of
 * the model however many members load it). Checking only members with requests outstanding is
 * not enough: a laggard's READs may still sit in its socket. */
static bool others_reading(const fp_group *g, uint64_t reader)
{
    (void)reader;
    return g->n_handles > 1;
}

void tv__fp_readahead(fp_group *g, uint32_t shard, uint64_t from_k, uint64_t reader)
{
    const fp_shard *sh = &g->shards[shard];
    uint64_t n = g->fp->o.readahead, end_k = sh->file_len / g->slot_len;
    if (others_reading(g, reader))
        return;
    if (n > g->n_slots / 4)
        n = g->n_slots / 4;
    if (sh->file_len % g->slot_len)
        end_k++;
    for (uint64_t k = from_k; k < end_k && k - from_k < n; k++) {
        uint64_t kL = k * g->slot_len; /* < file_len */
        uint32_t hi = sh->file_len - kL < g->slot_len ? (uint32_t)(sh->file_len - kL) : g->slot_len;
        tv_error err = {0};
        if (tv__fp_slot_find(g, shard, k, 0, hi) >= 0)
            continue; /* cached, or read (ahead or for a request) now: never read twice */
        if (g->n_fresh == g->n_slots && g->lru_head >= 0 && g->slots[g->lru_head].ahead)
            break; /* reading further would only drop a chunk read ahead and not yet used */
        /* free (LRU) slots only, and room in the aio */
        int32_t idx = tv__fp_slot_start(g, shard, k, 0, UINT32_MAX, reader, &err);
        if (idx < 0)
            break; /* no free slot, the aio is full, or no replica: nothing to anyone */
        g->slots[idx].ahead = g->slots[idx].ahead_read = true;
    }
}

void tv__fp_slot_used(fp_group *g, uint32_t idx)
{
    fp_slot *sl = &g->slots[idx];
    if (!sl->ahead)
        return;
    sl->ahead = false;
    atomic_fetch_add(&g->fp->st_readahead_hit, sl->len);
}

/* Every replica failed: fail every waiting request, free the slot. */
static void slot_failed(fp_group *g, uint32_t idx, int code, const char *msg)
{
    fp_slot *sl = &g->slots[idx];
    fp_wait *w;
    index_remove(g, idx);
    sl->state = FP_SLOT_FREE;
    sl->ahead = sl->ahead_read = false; /* a read ahead that failed: no error to anyone */
    while ((w = sl->waits) != NULL) {
        fp_req *r = w->req;
        tv__fp_req_fail(r, code, msg); /* unlinks every wait of r, this one too */
    }
    if (sl->refs == 0)
        lru_push_head(g, idx);
    g->fp->again = true;
}

static void slot_ready(fp_group *g, uint32_t idx)
{
    fp_slot *sl = &g->slots[idx];
    fp_wait *w;
    sl->state = FP_SLOT_READY;
    if (sl->ahead_read) { /* before device_read: a reader of both never sees more ahead */
        sl->ahead_read = false;
        atomic_fetch_add(&g->fp->st_readahead, sl->len);
    }
    atomic_fetch_add(&g->fp->st_device_read, sl->len);
    while ((w = sl->waits) != NULL)
        tv__fp_wait_deliver(g, idx, w);
    if (sl->refs == 0) {
        sl->state = FP_SLOT_FREE;
        lru_push_tail(g, idx);
        g->fp->again = true;
    }
}

void tv__fp_group_on_event(fp_group *g)
{
    tv__aio_done done[64];
    size_t n;
    while ((n = tv__aio_reap(g->aio, done, TV_ARRAY_LEN(done))) > 0) {
        for (size_t i = 0; i < n; i++) {
            uint32_t idx = (uint32_t)done[i].tag;
            fp_slot *sl;
            if (idx >= g->n_slots)
                continue;
            sl = &g->slots[idx];
            if (sl->state != FP_SLOT_READING)
                continue;
            if (done[i].result == 0) {
                slot_ready(g, idx);
                continue;
            }
            const tv__snap_replica_info *rep =
                &g->replicas[g->shards[sl->shard].first_replica + sl->reading];
            uint64_t off = rep->base_off + sl->k * g->slot_len + sl->lo; /* checked at submit */
            char msg[TV__FP_MAX_TEXT + 1];
            tv_error err = {0};
            snprintf(msg, sizeof msg,
                     "model '%s' generation %" PRId64 ": read of device %u at offset %" PRIu64
                     " (%u bytes, shard %u) failed: %s",
                     g->name, g->gen, rep->device, off, sl->len, sl->shard,
                     tv_strerror(done[i].result));
            tv__log(TV_LOG_WARN, "fastpath: %s", msg);
            sl->last_err = done[i].result;
            sl->tried = sl->reading + 1;
            if (slot_submit(g, idx, &err) == 0)
                continue;
            slot_failed(g, idx, done[i].result, msg);
        }
    }
}

void tv__fp_groups_flush(tv__fp *fp)
{
    for (fp_group *g = fp->g_head; g; g = g->next) {
        tv_error err = {0};
        if (!g->flush_needed)
            continue;
        g->flush_needed = false;
        if (tv__aio_flush(g->aio, &err))
            tv__log(TV_LOG_WARN,
                    "fastpath: model '%s' generation %" PRId64 ": submitting reads: %s", g->name,
                    g->gen, err.msg);
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
    if (g->aio) {
        epoll_ctl(g->fp->epoll_fd, EPOLL_CTL_DEL, tv__aio_event_fd(g->aio), NULL);
        tv__aio_destroy(g->aio); /* waits for the reads in flight */
    }
    if (g->slots) {
        for (uint32_t i = 0; i < g->n_slots; i++) {
            fp_wait *w = g->slots[i].waits;
            while (w) {
                fp_wait *nx = w->snext;
                free(w);
                w = nx;
            }
        }
    }
    if (g->arena)
        tv__sys.munmap(g->arena, g->arena_len);
    if (g->arena_fd >= 0)
        tv__sys.close(g->arena_fd);
    if (g->snap_fd >= 0)
        tv__sys.close(g->snap_fd);
    tv_model_close(g->m);
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
                "fastpath: model '%s' generation %" PRId64 " released (last handle closed)",
                g->name, g->gen);
        group_free(g);
    }
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

/* The arena memfd, mapped read-write here at an address aligned to align,
 * then sealed so that no one (the clients) can map it writable. */
static int make_arena(fp_group *g, uint64_t align, tv_error *err)
{
    void *res = MAP_FAILED, *p = MAP_FAILED;
    size_t res_len = 0;
    uint8_t *at = NULL;
    int rc = 0;
    g->arena_fd = memfd_create("tensorvault-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (g->arena_fd < 0)
        return tv__seterr(err, -errno, "model '%s': memfd_create for the arena: %s", g->name,
                          strerror(errno));
    if (tv__sys.ftruncate(g->arena_fd, (off_t)g->arena_len))
        return tv__seterr(err, -errno, "model '%s': sizing the arena memfd to %zu bytes: %s",
                          g->name, g->arena_len, strerror(errno));
    if (align > FP_PAGE) {
        /* reserve align extra bytes, map the memfd at the aligned address
         * inside, give back the rest */
        uint64_t a = 0;
        res_len = g->arena_len + (size_t)align;
        res = tv__sys.mmap(NULL, res_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (res == MAP_FAILED)
            return tv__seterr(err, -errno, "model '%s': reserving %zu bytes for the arena: %s",
                              g->name, res_len, strerror(errno));
        if (tv__align_up_u64((uintptr_t)res, align, &a)) {
            rc = tv__seterr(err, TV_E_OVERFLOW, "model '%s': arena address overflows", g->name);
            goto fail_res;
        }
        at = (uint8_t *)(uintptr_t)a;
    }
    p = tv__sys.mmap(at, g->arena_len, PROT_READ | PROT_WRITE, MAP_SHARED | (at ? MAP_FIXED : 0),
                     g->arena_fd, 0);
    if (p == MAP_FAILED) {
        rc = tv__seterr(err, -errno, "model '%s': mapping the %zu-byte arena: %s", g->name,
                        g->arena_len, strerror(errno));
        goto fail_res;
    }
    if (at) {
        size_t head = (size_t)(at - (uint8_t *)res);
        size_t tail = res_len - head - g->arena_len;
        if (head)
            tv__sys.munmap(res, head);
        if (tail)
            tv__sys.munmap(at + g->arena_len, tail);
    }
    g->arena = p;
    if (fcntl(g->arena_fd, F_ADD_SEALS,
              F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL))
        return tv__seterr(err, -errno, "model '%s': sealing the arena memfd: %s", g->name,
                          strerror(errno));
    return 0;
fail_res:
    if (res != MAP_FAILED)
        tv__sys.munmap(res, res_len);
    return rc;
}

static int group_create(tv__fp *fp, tv_model *m, fp_group **out, tv_error *err)
{
    fp_group *g = calloc(1, sizeof(*g));
    const tv__snap *snap = tv__model_snap(m);
    uint64_t align = FP_PAGE, slot_len = 0, arena_len = 0;
    int rc = 0;
    if (!g) {
        tv_model_close(m);
        return tv__seterr(err, -ENOMEM, "fastpath: out of memory for a read group");
    }
    g->fp = fp;
    g->m = m;
    g->snap = snap;
    g->snap_fd = g->arena_fd = -1;
    g->lru_head = g->lru_tail = -1;
    g->ev.kind = FP_EV_GROUP;
    g->ev.ptr = g;
    snprintf(g->name, sizeof g->name, "%s", tv_model_name(m));
    g->gen = tv_model_generation(m);
    if (!snap) {
        rc = tv__seterr(err, TV_E_INTERNAL, "model '%s': open model has no snapshot", g->name);
        goto fail;
    }
    g->n_devs = snap->n_devices;
    g->n_shards = snap->n_shards;
    g->n_replicas = snap->n_replicas;
    g->devs = calloc(g->n_devs ? g->n_devs : 1, sizeof(*g->devs));
    g->shards = calloc(g->n_shards ? g->n_shards : 1, sizeof(*g->shards));
    g->replicas = calloc(g->n_replicas ? g->n_replicas : 1, sizeof(*g->replicas));
    if (!g->devs || !g->shards || !g->replicas) {
        rc = tv__seterr(err, -ENOMEM, "model '%s': out of memory for the group tables", g->name);
        goto fail;
    }
    for (uint32_t i = 0; i < g->n_devs; i++) {
        rc = tv__model_dev_info(m, i, &g->devs[i]);
        if (rc) {
            tv__seterr(err, rc, "model '%s' generation %" PRId64 ": device %u: no device info",
                       g->name, g->gen, i);
            goto fail;
        }
        if (g->devs[i].fd >= 0 && g->devs[i].reason == 0 &&
            tv__lcm_u64(align, g->devs[i].io_align, &align)) {
            rc = tv__seterr(err, TV_E_OVERFLOW, "model '%s': io alignment of device %u overflows",
                            g->name, i);
            goto fail;
        }
    }
    for (uint32_t i = 0; i < g->n_replicas; i++) {
        rc = tv__snap_replica(snap, i, &g->replicas[i], err);
        if (rc)
            goto fail;
        if (g->replicas[i].device >= g->n_devs) {
            rc = tv__seterr(err, TV_E_SNAPSHOT, "model '%s': replica %u names device %u of %u",
                            g->name, i, g->replicas[i].device, g->n_devs);
            goto fail;
        }
    }
    for (uint32_t i = 0; i < g->n_shards; i++) {
        tv__snap_shard_info si;
        rc = tv__snap_shard(snap, i, &si, err);
        if (rc)
            goto fail;
        g->shards[i] = (fp_shard){.data_off = si.data_off,
                                  .file_len = si.file_len,
                                  .first_replica = si.first_replica,
                                  .n_replicas = si.n_replicas};
    }
    slot_len = fp->o.slot_len;
    if (tv__lcm_u64(slot_len, align, &slot_len) || slot_len > FP_MAX_SLOT_LEN) {
        rc = tv__seterr(err, TV_E_INVALID_ARG,
                        "model '%s': slot_len %u raised to the devices' io alignment %" PRIu64
                        " is over %u bytes",
                        g->name, fp->o.slot_len, align, FP_MAX_SLOT_LEN);
        goto fail;
    }
    if (tv__mul_u64(slot_len, fp->o.group_slots, &arena_len) || arena_len > (16ull << 30)) {
        rc = tv__seterr(err, TV_E_INVALID_ARG,
                        "model '%s': arena of %u slots x %" PRIu64 " bytes is over 16 GiB", g->name,
                        fp->o.group_slots, slot_len);
        goto fail;
    }
    g->slot_len = (uint32_t)slot_len;
    g->n_slots = fp->o.group_slots;
    g->arena_len = (size_t)arena_len;
    g->slots = calloc(g->n_slots, sizeof(*g->slots));
    if (!g->slots) {
        rc =
            tv__seterr(err, -ENOMEM, "model '%s': out of memory for %u slots", g->name, g->n_slots);
        goto fail;
    }
    g->io_align = (uint32_t)align; /* <= slot_len <= FP_MAX_SLOT_LEN */
    uint32_t n_index = 16;
    while (n_index < 2 * g->n_slots)
        n_index *= 2;
    g->index = malloc((size_t)n_index * sizeof(*g->index));
    if (!g->index) {
        rc = tv__seterr(err, -ENOMEM, "model '%s': out of memory for the chunk index", g->name);
        goto fail;
    }
    g->index_mask = n_index - 1;
    for (uint32_t i = 0; i < n_index; i++)
        g->index[i] = -1;
    for (uint32_t i = 0; i < g->n_slots; i++)
        g->slots[i].prev = g->slots[i].next = g->slots[i].hnext = -1;
    g->n_fresh = 0; /* the LRU starts empty: slots come into use in index order */
    rc = make_snap_memfd(g, err);
    if (rc)
        goto fail;
    rc = make_arena(g, align, err);
    if (rc)
        goto fail;
    g->queue_depth = g->n_slots < FP_MAX_QUEUE_DEPTH ? g->n_slots : FP_MAX_QUEUE_DEPTH;
    tv__aio_opts ao = {.engine = fp->o.engine,
                       .queue_depth = g->queue_depth,
                       .region = g->arena,
                       .region_len = g->arena_len,
                       .piece_len = g->slot_len};
    rc = tv__aio_create(&ao, &g->aio, err);
    if (rc)
        goto fail;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &g->ev};
    if (epoll_ctl(fp->epoll_fd, EPOLL_CTL_ADD, tv__aio_event_fd(g->aio), &ev)) {
        rc = tv__seterr(err, -errno, "model '%s': epoll_ctl for the read completions: %s", g->name,
                        strerror(errno));
        tv__aio_destroy(g->aio);
        g->aio = NULL;
        goto fail;
    }
    group_link(g);
    tv__log(TV_LOG_INFO, "fastpath: model '%s' generation %" PRId64 " opened: %u slots of %u bytes",
            g->name, g->gen, g->n_slots, g->slot_len);
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
