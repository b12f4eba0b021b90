/* The daemon backend of tv_model (reader/model.h): a model opened in a
 * fast-path session (tv_model_open_daemon; the session is reader/session.c)
 * whose bytes tensorvaultd reads and lends in its shared staging arena; the
 * sealed snapshot memfd it sends answers every metadata call.
 *
 * Invariants:
 *   - the daemon is not trusted: every CHUNK entry is checked (known
 *     outstanding request, its handle, slot < n_slots, slot_off + len <=
 *     slot_len, dest_off + len <= the request's len, no byte delivered
 *     twice) before one byte is copied, so nothing outside [dest, dest +
 *     len) is ever written; DONE 0 completes a request only when every byte
 *     of it arrived; anything else unexpected closes the session
 *     (reader/session.c);
 *   - every slot reference a CHUNK entry lends is released as soon as the
 *     copies of its message are done (CUDA: after a stream sync), and a read
 *     returns only when all of them went back (or the session is closed);
 *   - the snapshot received is validated (seals, size, checksum, model name,
 *     generation) before a tensor record in it is followed;
 *   - every descriptor received is closed once mapped (or refused); a
 *     version-3 handle keeps a duplicate of its tier's, read-only, for
 *     tv_view_map's private mappings, closed with the handle's hold;
 *   - a model keeps its mappings until tv_model_close, also after its
 *     session was closed (then its reads fail with TV_E_DISCONNECTED). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "reader/daemon.h"
#include "snap/snapshot.h"
#include "util/internal.h"
#include "util/sys.h"
#include "xfer/xfer.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif
#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

#define SNAP_SEALS  (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
#define ARENA_SEALS (F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
/* The tier (version 3) punches holes, so it cannot carry a write seal: it
 * must not shrink under the mapping (a SIGBUS) nor grow. */
#define TIER_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
#define NAME_PREC  TV__NAME_PREC
/* copies from this size on fault their pages in with one call (populate) */
#define POPULATE_MIN (64u << 10)

static void populate(const uint8_t *src, size_t len, uint8_t *dst);
/* tv_get_tensor's arena: the payload is copied to its start */
#define ARENA_ALIGN 64u

static const tv__model_ops daemon_ops;

static tv__fpc_model *daemon_of(const tv_model *m)
{
    return (tv__fpc_model *)m;
}

/* ---- open and close ---------------------------------------------------------- */

/* CLOSE handle, then waits for its CLOSED (no read is outstanding: every
 * read call completes before it returns). */
static int close_handle(tv_client *c, uint32_t handle, tv_error *err)
{
    int rc;
    size_t len = tv__fp_encode_close(c->sbuf, sizeof(c->sbuf), c->version, TV__FP_CLOSE, handle);
    if ((rc = tv__fpc_send(c, c->sbuf, len, true, err)))
        return rc;
    tv__fp_msg m;
    if ((rc = tv__fpc_recv(c, &m, NULL, 0, NULL, true, err)))
        return rc;
    if (m.type != TV__FP_CLOSED || m.u.close.handle != handle)
        return tv__fpc_unexpected(c, &m, "instead of CLOSED", err);
    return 0;
}

/* Unmaps what a hold maps and frees it. NULL-safe. */
static void hold_free(tv__fpc_hold *h)
{
    if (!h)
        return;
    if (h->pinned)
        tv__cuda_unpin((void *)h->arena);
    if (h->arena)
        tv__sys.munmap((void *)h->arena, h->arena_len);
    if (h->tier_fd >= 0)
        tv__sys.close(h->tier_fd);
    free(h);
}

/* Gives the handle back (the daemon's CLOSE releases its lease) when the
 * session lives: CLOSE and its CLOSED. */
static void hold_close_handle(tv__fpc_hold *h, const char *name, int64_t gen)
{
    tv_client *c = h->c;
    if (!c)
        return;
    if (c->n_handles)
        c->n_handles--;
    if (c->sock >= 0) {
        tv_error e = {0};
        if (close_handle(c, h->handle, &e))
            tv__log(TV_LOG_WARN, "fast-path model %s@%lld: close: %s", name, (long long)gen, e.msg);
    }
}

/* Gives the handle back and unmaps what the model mapped; with views of it
 * alive, the hold (handle, arena) stays on the session's orphan list until
 * the last view is released. */
static void daemon_close(tv_model *bm)
{
    tv__fpc_model *m = daemon_of(bm);
    tv_client *c = m->c;
    tv__fpc_hold *h = m->hold;
    if (c) {
        for (tv__fpc_model **p = &c->models; *p; p = &(*p)->next)
            if (*p == m) {
                *p = m->next;
                break;
            }
    }
    if (h && h->n_views) {
        h->model_closed = true;
        if (h->c) {
            h->next = h->c->orphans;
            h->c->orphans = h;
        }
    } else if (h) {
        hold_close_handle(h, m->m.name, m->m.snap.generation);
        hold_free(h);
    }
    if (m->snap_map)
        tv__sys.munmap(m->snap_map, m->snap_len);
}

void tv__fpc_detach_models(tv_client *c)
{
    while (c->models) {
        tv__fpc_model *m = c->models;
        c->models = m->next;
        m->next = NULL;
        m->c = NULL;
        if (m->hold)
            m->hold->c = NULL;
    }
    while (c->orphans) {
        tv__fpc_hold *h = c->orphans;
        c->orphans = h->next;
        h->next = NULL;
        h->c = NULL;
    }
    c->n_handles = 0;
}

/* Whether fd is what a tier file of the daemon's cache.dir is, which
 * cannot carry seals: a file on a tmpfs that has no name (no process can
 * open it by one) and no write permission (no other uid can reopen it
 * writable through /proc to shrink it under this mapping). */
static bool unnamed_readonly_tmpfs(int fd, const struct stat *st)
{
    struct statfs sf;
    return st->st_nlink == 0 && (st->st_mode & 0222) == 0 && fstatfs(fd, &sf) == 0 &&
           (unsigned long)sf.f_type == (unsigned long)TMPFS_MAGIC;
}

int tv__fpc_check_memfd(int fd, uint64_t len, int want, bool tier, const char *what, tv_error *err)
{
    struct stat st;
    if (tv__sys.fstat(fd, &st) < 0)
        return tv__seterr(err, TV_E_PROTOCOL, "%s descriptor: fstat: %s", what, strerror(errno));
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != len)
        return tv__seterr(err, TV_E_PROTOCOL,
                          "%s descriptor is not a memfd of %llu bytes (%lld bytes)", what,
                          (unsigned long long)len, (long long)st.st_size);
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals >= 0 && (seals & want) == want)
        return 0;
    if (tier && unnamed_readonly_tmpfs(fd, &st))
        return 0;
    return tv__seterr(err, TV_E_PROTOCOL, "%s memfd is not sealed (seals 0x%x, need 0x%x)%s", what,
                      seals < 0 ? 0 : (unsigned)seals, (unsigned)want,
                      tier ? ", nor an unnamed read-only tmpfs file" : "");
}

/* Checks a received memfd (tv__fpc_check_memfd), failing the session. */
static int check_memfd(tv_client *c, int fd, uint64_t len, int want, bool tier, const char *what,
                       const char *spec, tv_error *err)
{
    tv_error e = {0};
    int rc = tv__fpc_check_memfd(fd, len, want, tier, what, &e);
    return rc ? tv__fpc_fail(c, err, rc, "open '%s': %s", spec, e.msg) : 0;
}

/* Validates the snapshot image against the spec and OPENED (generation
 * gen): checksum, model name, generation; then the common part is made. */
static int check_snapshot(tv__fpc_model *m, const char *spec, size_t name_len, int64_t want_gen,
                          int64_t gen, tv_error *err)
{
    tv_error e = {0};
    const char *nm;
    size_t nl;
    tv__snap *snap = &m->m.snap;
    int rc = tv__snap_open(m->snap_map, m->snap_len, TV__SNAP_VERIFY_CHECKSUM, snap, &e);
    if (!rc)
        rc = tv__snap_model(snap, &nm, &nl, &e);
    if (rc)
        return tv__seterr(err, TV_E_SNAPSHOT, "open '%s': the snapshot from tensorvaultd: %s", spec,
                          e.msg);
    if (nl != name_len || memcmp(nm, spec, nl))
        return tv__seterr(err, TV_E_SNAPSHOT,
                          "open '%s': tensorvaultd sent the snapshot of model '%.*s'", spec,
                          NAME_PREC(nl), nm);
    if (snap->generation != gen || (want_gen && snap->generation != want_gen))
        return tv__seterr(
            err, TV_E_SNAPSHOT,
            "open '%s': tensorvaultd sent generation %lld's snapshot for generation %lld", spec,
            (long long)snap->generation, (long long)(want_gen ? want_gen : gen));
    return tv__model_init(&m->m, err);
}

/* The OPENED the daemon answered open_id with: its values sane, the
 * handle not one of the session's. */
static int check_opened(tv_client *c, const char *spec, uint32_t open_id, const tv__fp_opened *o,
                        size_t n_fds, tv_error *err)
{
    uint64_t slots_len = 0;
    bool handle_used = false;
    for (tv__fpc_model *p = c->models; p; p = p->next)
        handle_used |= p->handle == o->handle;
    for (tv__fpc_hold *p = c->orphans; p; p = p->next)
        handle_used |= p->handle == o->handle;
    if (o->open_id != open_id || n_fds != TV__FP_N_FDS_OPENED || o->handle == 0 || handle_used ||
        o->slot_len == 0 || o->slot_len % 4096 || o->n_slots == 0 || o->credit == 0 ||
        tv__mul_u64(o->slot_len, o->n_slots, &slots_len) || slots_len > o->arena_len ||
        o->snap_len < TV__SNAP_HEADER_LEN || o->snap_len > SIZE_MAX || o->arena_len > SIZE_MAX ||
        o->generation <= 0)
        return tv__fpc_fail(
            c, err, TV_E_PROTOCOL,
            "open '%s': bad OPENED from tensorvaultd on %s (open %u, %zu fds, handle %u%s, generation %lld, snapshot %llu bytes, arena %llu bytes, %u slots of %u bytes, credit %u)",
            spec, c->path, o->open_id, n_fds, o->handle, handle_used ? " already open" : "",
            (long long)o->generation, (unsigned long long)o->snap_len,
            (unsigned long long)o->arena_len, o->n_slots, o->slot_len, o->credit);
    return 0;
}

/* Maps the snapshot (fds[0]) and the arena (fds[1]) of OPENED o into m
 * (the arena into its hold). */
static int map_model(tv__fpc_model *m, const char *spec, const tv__fp_opened *o, const int *fds,
                     tv_error *err)
{
    if (!(m->hold = calloc(1, sizeof(*m->hold))))
        return tv__seterr(err, -ENOMEM, "out of memory");
    m->hold->tier_fd = -1;
    m->hold->handle = o->handle;
    m->tier = (o->flags & TV__FP_OPENED_TIER) != 0;
    m->handle = o->handle;
    m->slot_len = o->slot_len;
    m->n_slots = o->n_slots;
    m->credit = o->credit;
    m->snap_len = (size_t)o->snap_len;
    m->arena_len = (size_t)o->arena_len;
    void *p = tv__sys.mmap(NULL, m->snap_len, PROT_READ, MAP_SHARED, fds[0], 0);
    if (p == MAP_FAILED)
        return tv__seterr(err, -errno, "open '%s': mmap of the snapshot: %s", spec,
                          strerror(errno));
    m->snap_map = p;
    p = tv__sys.mmap(NULL, m->arena_len, PROT_READ, MAP_SHARED, fds[1], 0);
    if (p == MAP_FAILED)
        return tv__seterr(err, -errno, "open '%s': mmap of the staging arena: %s", spec,
                          strerror(errno));
    m->arena = p;
    m->hold->arena = p;
    m->hold->arena_len = m->arena_len;
    /* The tier's descriptor stays for tv_view_map (private mappings of a
     * view's pages); without it views still work, only mapped shared. */
    struct stat sb;
    if (m->tier && tv__sys.fstat(fds[1], &sb) == 0 && sb.st_blksize > 0 &&
        ((uint64_t)sb.st_blksize & ((uint64_t)sb.st_blksize - 1)) == 0) {
        m->hold->tier_fd = fcntl(fds[1], F_DUPFD_CLOEXEC, 0);
        m->hold->page_len = (size_t)sb.st_blksize;
    }
    return 0;
}

/* Sends OPEN spec and receives its answer: OPENED (0, *o, the
 * descriptors), the daemon's refusal of the open (its code; the session
 * stays) or a session failure. */
static int send_open(tv_client *c, const char *spec, size_t spec_len, uint32_t open_id,
                     tv__fp_opened *o, int *fds, size_t *n_fds, tv_error *err)
{
    int rc;
    size_t len = tv__fp_encode_open(c->sbuf, sizeof(c->sbuf), c->version, open_id, spec, spec_len);
    if (!len)
        return tv__seterr(err, TV_E_INVALID_ARG, "bad model spec '%.300s'", spec);
    if ((rc = tv__fpc_send(c, c->sbuf, len, true, err)))
        return rc;
    tv__fp_msg msg;
    if ((rc = tv__fpc_recv(c, &msg, fds, TV__FP_N_FDS_OPENED, n_fds, true, err)))
        return rc;
    if (msg.type == TV__FP_ERROR && !(msg.u.error.flags & TV__FP_ERROR_FATAL)) {
        tv__fpc_close_fds(fds, *n_fds);
        if (msg.u.error.open_id != open_id || msg.u.error.req_id || msg.u.error.code >= 0)
            return tv__fpc_fail(c, err, TV_E_PROTOCOL,
                                "tensorvaultd on %s: ERROR for open %u code %d answering open %u",
                                c->path, msg.u.error.open_id, msg.u.error.code, open_id);
        return tv__seterr(err, msg.u.error.code, "open '%.300s' through %s: %.*s", spec, c->path,
                          TV__FPC_TEXT_PREC(&msg), msg.text ? msg.text : "");
    }
    if (msg.type != TV__FP_OPENED) {
        tv__fpc_close_fds(fds, *n_fds);
        return tv__fpc_unexpected(c, &msg, "instead of OPENED", err);
    }
    *o = msg.u.opened;
    return 0;
}

TV_API int tv_model_open_daemon(tv_client *c, const char *spec, const tv_open_opts *opts,
                                tv_model **out, tv_error *err)
{
    int rc, fds[TV__FP_N_FDS_OPENED] = {-1, -1};
    size_t n_fds = 0;
    tv__fpc_model *m = NULL;
    tv__fp_opened o = {0};
    if (!c || !spec || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *out = NULL;
    if (opts && (rc = tv__model_check_opts(opts, err)))
        return rc;
    if (c->sock < 0)
        return tv__fpc_dead(c, err);
    size_t sl = strlen(spec);
    const char *at = strrchr(spec, '@');
    size_t nl = at ? (size_t)(at - spec) : sl;
    int64_t want_gen = 0;
    if (nl == 0 || sl > TV__FP_MAX_SPEC || (at && !at[1]))
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "bad model spec '%.300s' (NAME, NAME@GEN or NAME@ALIAS, at most %u bytes)", spec,
            TV__FP_MAX_SPEC);
    if (at && at[1] >= '0' && at[1] <= '9' && !tv__parse_pos_i64(at + 1, &want_gen))
        return tv__seterr(err, TV_E_INVALID_ARG, "bad generation in '%s'", spec);
    uint32_t open_id = ++c->next_open_id ? c->next_open_id : ++c->next_open_id;
    if ((rc = send_open(c, spec, sl, open_id, &o, fds, &n_fds, err)))
        return rc;
    if ((rc = check_opened(c, spec, open_id, &o, n_fds, err)))
        goto fail;
    bool tier = (o.flags & TV__FP_OPENED_TIER) != 0;
    if ((rc = check_memfd(c, fds[0], o.snap_len, SNAP_SEALS, false, "snapshot", spec, err)) ||
        (rc = check_memfd(c, fds[1], o.arena_len, tier ? TIER_SEALS : ARENA_SEALS, tier, "arena",
                          spec, err)))
        goto fail;
    if (!(m = calloc(1, sizeof(*m)))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto fail_close_handle;
    }
    m->m.ops = &daemon_ops;
    m->m.arena_align = ARENA_ALIGN;
    if ((rc = map_model(m, spec, &o, fds, err)))
        goto fail_close_handle;
    tv__fpc_close_fds(fds, n_fds);
    if ((rc = check_snapshot(m, spec, nl, want_gen, o.generation, err)))
        goto fail_close_handle;
    /* The tier is not pinned: pinning it whole would make the kernel fill
     * its holes (the daemon's memory), and a page the daemon evicts later
     * would leave the pin on a page the memfd no longer has. Its chunks
     * are copied to the GPU pageable (or pin a view's range yourself,
     * docs/fastpath.md 8.12). */
    if (c->cuda_register && !m->tier && tv__cuda_available()) {
        tv_error pe = {0};
        if (tv__cuda_pin_readonly((void *)m->arena, m->arena_len, &pe) == 0)
            m->hold->pinned = true;
        else
            tv__log(TV_LOG_INFO, "fast-path %s: arena not pinned (%s): pageable GPU copies", spec,
                    pe.msg);
    }
    m->c = c;
    m->hold->c = c;
    m->next = c->models;
    c->models = m;
    c->n_handles++;
    *out = &m->m;
    return 0;
fail_close_handle:
    /* The daemon opened the handle: give it back, the session stays. */
    if (c->sock >= 0) {
        tv_error ce = {0};
        close_handle(c, o.handle, &ce);
    }
fail:
    tv__fpc_close_fds(fds, n_fds);
    tv_model_close(m ? &m->m : NULL);
    return rc;
}

/* ---- reads ---------------------------------------------------------------- */

enum { REQ_PENDING = 0, REQ_SENT, REQ_DONE };

/* One read of [off, off + len) of a tensor into dest (host memory, or a
 * device pointer for a sink): a checked request (tv__mreq) and what the
 * session knows of it. */
typedef struct creq {
    uint64_t off, len;
    uint8_t *dest;
    uint32_t tensor;    /* a shard index with TV__FP_READ_SHARD_HEADER */
    uint32_t flags;     /* READ entry flags: TV__FP_READ_SHARD_HEADER, TV__FP_READ_VIEW */
    const tv__tdesc *t; /* the tensor's record (NULL for a shard header) */
    uint8_t state;
    int result;
    tv__fpc_spans sp;
    /* a view: the slots its CHUNK entries referenced (to give back), and
     * where its bytes start in the arena (every entry must agree) */
    uint32_t *vslots;
    uint32_t n_vslots, cap_vslots;
    uint64_t vbase;
    bool vbase_set;
} creq;

/* The state of one run of requests. */
typedef struct run {
    tv__fpc_model *m;
    tv_client *c;
    creq *r;
    size_t n, next, n_done, outstanding;
    uint64_t base; /* req_id of r[0] */
    const tv__io_sink *sink;
    uint32_t n_rel;
    size_t fail_at; /* lowest failed request with a message, or SIZE_MAX */
    tv_error fail_err;
    int xfer_rc;
    uint32_t *rel; /* the session's scratch */
} run;

/* Records request i's failure (code, message) when it is the lowest so far. */
static void req_failed(run *s, size_t i, int code, const char *fmt, ...) TV_PRINTF(4, 5);
static void req_failed(run *s, size_t i, int code, const char *fmt, ...)
{
    if (!s->r[i].result)
        s->r[i].result = code;
    if (i >= s->fail_at)
        return;
    char msg[sizeof(s->fail_err.msg)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    tv__seterr(&s->fail_err, code, "%s", msg);
    s->fail_at = i;
}

/* What request q reads, for messages: *kind "tensor" and its name, or
 * "shard header" and the shard's file name. */
static const char *tname(const run *s, const creq *q, const char **kind, int *len)
{
    if (q->flags & TV__FP_READ_SHARD_HEADER) {
        tv_shard_desc sd;
        tv__shard_public(&s->m->m.snap, q->tensor, &sd);
        *kind = "shard header";
        *len = NAME_PREC(sd.name_len);
        return sd.name;
    }
    *kind = "tensor";
    *len = NAME_PREC(q->t->name_len);
    return q->t->name;
}

/* The request an entry names, if it is outstanding. */
static int find_req(run *s, uint64_t req_id, uint32_t handle, const char *what, creq **out,
                    tv_error *err)
{
    uint64_t i = req_id - s->base;
    if (req_id < s->base || i >= s->n || s->r[i].state != REQ_SENT)
        return tv__fpc_fail(s->c, err, TV_E_PROTOCOL,
                            "tensorvaultd on %s sent %s for request %llu, which is not outstanding",
                            s->c->path, what, (unsigned long long)req_id);
    if (handle != s->m->handle)
        return tv__fpc_fail(s->c, err, TV_E_PROTOCOL,
                            "tensorvaultd on %s sent %s of handle %u for request %llu of handle %u",
                            s->c->path, what, handle, (unsigned long long)req_id, s->m->handle);
    *out = &s->r[i];
    return 0;
}

/* Sends the pending RELEASE; wait: block while the socket is full, else
 * -EAGAIN leaves it pending. */
static int flush_release(run *s, bool wait, tv_error *err)
{
    tv_client *c = s->c;
    if (!s->n_rel)
        return 0;
    size_t len =
        tv__fp_encode_release(c->sbuf, sizeof(c->sbuf), c->version, s->m->handle, s->rel, s->n_rel);
    if (!len)
        return tv__fpc_fail(c, err, TV_E_INTERNAL, "RELEASE of %u slots does not encode", s->n_rel);
    int rc = tv__fpc_send(c, c->sbuf, len, wait, err);
    if (rc == 0)
        s->n_rel = 0;
    return rc;
}

/* Sends the next READ (as many requests as the session's window and one
 * message allow). Returns 0, -EAGAIN (socket full: nothing sent) or an error. */
static int send_reads(run *s, tv_error *err)
{
    tv_client *c = s->c;
    size_t n = 0, j = s->next;
    size_t room = c->max_requests > s->outstanding ? c->max_requests - s->outstanding : 0;
    if (room > TV__FP_MAX_READS)
        room = TV__FP_MAX_READS;
    tv__fp_read_ent *e = c->ents;
    for (; j < s->n && n < room; j++) {
        creq *q = &s->r[j];
        if (q->state != REQ_PENDING)
            continue;
        e[n++] = (tv__fp_read_ent){.req_id = s->base + j,
                                   .tensor = q->tensor,
                                   .flags = q->flags,
                                   .off = q->off,
                                   .len = q->len};
    }
    int rc = 0;
    if (n) {
        size_t len =
            tv__fp_encode_read(c->sbuf, sizeof(c->sbuf), c->version, s->m->handle, e, (uint32_t)n);
        if (!len)
            rc = tv__fpc_fail(c, err, TV_E_INTERNAL, "READ of %zu requests does not encode", n);
        else
            rc = tv__fpc_send(c, c->sbuf, len, false, err);
        if (rc == 0) {
            for (size_t k = 0; k < n; k++)
                s->r[e[k].req_id - s->base].state = REQ_SENT;
            s->outstanding += n;
            s->next = j;
        }
    } else {
        s->next = j;
    }
    return rc;
}

/* A CHUNK entry of view request q: its bytes stay in the arena, where
 * every entry of the view must say they start (a contiguous range: the
 * tier's layout); the slot is kept to give back when the view is released. */
static int view_entry(run *s, creq *q, const tv__fp_chunk_ent *e, const char *kind, int nl,
                      const char *nm, tv_error *err)
{
    tv_client *c = s->c;
    uint64_t at = (uint64_t)e->slot * s->m->slot_len + e->slot_off; /* < arena_len: checked */
    if (at < e->dest_off || (q->vbase_set && at - e->dest_off != q->vbase))
        return tv__fpc_fail(
            c, err, TV_E_PROTOCOL,
            "tensorvaultd on %s: CHUNK of a view of %s '%.*s': bytes [%llu, +%u) are not where the view's other bytes are",
            c->path, kind, nl, nm, (unsigned long long)e->dest_off, e->len);
    q->vbase = at - e->dest_off;
    q->vbase_set = true;
    if (q->n_vslots == q->cap_vslots) {
        uint32_t cap = q->cap_vslots ? q->cap_vslots * 2 : 8;
        uint32_t *v = cap > q->cap_vslots ? realloc(q->vslots, (size_t)cap * sizeof(*v)) : NULL;
        if (!v)
            return tv__fpc_fail(c, err, -ENOMEM, "out of memory");
        q->vslots = v;
        q->cap_vslots = cap;
    }
    q->vslots[q->n_vslots++] = e->slot;
    return 0;
}

static int on_chunk(run *s, const tv__fp_msg *msg, tv_error *err)
{
    tv_client *c = s->c;
    tv__fpc_model *m = s->m;
    int rc;
    if (s->n_rel + msg->u.list.n > TV__FP_MAX_RELEASE && (rc = flush_release(s, true, err)))
        return rc;
    for (uint32_t i = 0; i < msg->u.list.n; i++) {
        tv__fp_chunk_ent e;
        tv_error de = {0};
        creq *q = NULL;
        if ((rc = tv__fp_chunk_entry(msg, i, &e, &de)))
            return tv__fpc_fail(c, err, TV_E_PROTOCOL, "tensorvaultd on %s: CHUNK entry %u: %s",
                                c->path, i, de.msg);
        if ((rc = find_req(s, e.req_id, e.handle, "CHUNK", &q, err)))
            return rc;
        int nl;
        const char *kind;
        const char *nm = tname(s, q, &kind, &nl);
        if (e.slot >= m->n_slots || (uint64_t)e.slot_off + e.len > m->slot_len)
            return tv__fpc_fail(
                c, err, TV_E_PROTOCOL,
                "tensorvaultd on %s: CHUNK for %s '%.*s': slot %u [%u, +%u) outside %u slots of %u bytes",
                c->path, kind, nl, nm, e.slot, e.slot_off, e.len, m->n_slots, m->slot_len);
        rc = tv__fpc_spans_add(&q->sp, e.dest_off, e.len, q->len);
        if (rc == TV_E_OVERFLOW)
            return tv__fpc_fail(
                c, err, TV_E_PROTOCOL,
                "tensorvaultd on %s: CHUNK for %s '%.*s': bytes [%llu, +%u) past the request's %llu",
                c->path, kind, nl, nm, (unsigned long long)e.dest_off, e.len,
                (unsigned long long)q->len);
        if (rc == TV_E_PROTOCOL)
            return tv__fpc_fail(
                c, err, TV_E_PROTOCOL,
                "tensorvaultd on %s: CHUNK for %s '%.*s': bytes [%llu, +%u) delivered twice",
                c->path, kind, nl, nm, (unsigned long long)e.dest_off, e.len);
        if (rc)
            return tv__fpc_fail(c, err, rc, "out of memory");
        if (q->flags & TV__FP_READ_VIEW) {
            if ((rc = view_entry(s, q, &e, kind, nl, nm, err)))
                return rc;
            continue;
        }
        const uint8_t *src = m->arena + (size_t)e.slot * m->slot_len + e.slot_off;
        if (!s->sink) {
            populate(src, e.len, q->dest + e.dest_off);
            memcpy(q->dest + e.dest_off, src, e.len);
        } else if ((rc =
                        s->sink->copy(s->sink->ctx, q->dest, e.dest_off, src, e.len, UINT32_MAX))) {
            req_failed(s, (size_t)(q - s->r), rc, "%s '%.*s': copy to the GPU failed: %s", kind, nl,
                       nm, tv_strerror(rc));
        }
        s->rel[s->n_rel++] = e.slot;
    }
    /* The copies out of these slots are done before they go back. */
    if (s->sink && s->sink->finish && (rc = s->sink->finish(s->sink->ctx)) && !s->xfer_rc)
        s->xfer_rc = rc;
    rc = flush_release(s, false, err);
    return rc == -EAGAIN ? 0 : rc;
}

/* Faults in, in one call each, the arena pages of a chunk about to be
 * copied and the destination pages it lands in: page by page, the copy's
 * faults (a tier mapped with small pages, a fresh destination) cost more
 * than the copy itself. The arena's pages are whole pages of bytes the
 * daemon said are resident (its reads are page-aligned), so populating
 * them allocates nothing there. Advice only: a kernel without
 * MADV_POPULATE_* (before 5.14) faults as before. */
static void populate(const uint8_t *src, size_t len, uint8_t *dst)
{
#if defined(MADV_POPULATE_READ) && defined(MADV_POPULATE_WRITE)
    if (len < POPULATE_MIN)
        return;
    /* [src, src + len) lies in the arena's mapping and [dst, dst + len) in
     * the caller's buffer: neither end, nor its page, wraps */
    const uintptr_t page = 4095;
    uintptr_t a = (uintptr_t)src & ~page;
    uintptr_t b = ((uintptr_t)src + len + page) & ~page; /* checked: inside a mapping */
    (void)tv__sys.madvise((void *)a, b - a, MADV_POPULATE_READ);
    /* only whole pages of the destination: a page it shares with other
     * memory is left to the copy */
    uintptr_t c = ((uintptr_t)dst + page) & ~page; /* checked: inside a mapping */
    uintptr_t d = ((uintptr_t)dst + len) & ~page;  /* checked: inside a mapping */
    if (d > c)
        (void)tv__sys.madvise((void *)c, d - c, MADV_POPULATE_WRITE);
#else
    (void)src, (void)len, (void)dst;
#endif
}

static int on_done(run *s, const tv__fp_msg *msg, tv_error *err)
{
    tv_client *c = s->c;
    for (uint32_t i = 0; i < msg->u.list.n; i++) {
        tv__fp_done_ent e;
        tv_error de = {0};
        creq *q = NULL;
        int rc;
        if ((rc = tv__fp_done_entry(msg, i, &e, &de)))
            return tv__fpc_fail(c, err, TV_E_PROTOCOL, "tensorvaultd on %s: DONE entry %u: %s",
                                c->path, i, de.msg);
        if ((rc = find_req(s, e.req_id, e.handle, "DONE", &q, err)))
            return rc;
        int nl;
        const char *kind;
        const char *nm = tname(s, q, &kind, &nl);
        size_t idx = (size_t)(q - s->r);
        if (e.result > 0)
            return tv__fpc_fail(c, err, TV_E_PROTOCOL,
                                "tensorvaultd on %s: DONE for %s '%.*s' with result %d", c->path,
                                kind, nl, nm, e.result);
        if (e.result == 0 && q->sp.delivered != q->len)
            return tv__fpc_fail(
                c, err, TV_E_PROTOCOL,
                "tensorvaultd on %s: DONE for %s '%.*s' after %llu of its %llu bytes", c->path,
                kind, nl, nm, (unsigned long long)q->sp.delivered, (unsigned long long)q->len);
        if (e.result) {
            q->result = e.result;
            if (idx == s->fail_at)
                s->fail_err.code = e.result; /* its ERROR came first, with the text */
            else
                req_failed(s, idx, e.result, "%s '%.*s': %s", kind, nl, nm, tv_strerror(e.result));
        }
        q->state = REQ_DONE;
        s->outstanding--;
        s->n_done++;
    }
    return 0;
}

static int on_error(run *s, const tv__fp_msg *msg, tv_error *err)
{
    tv_client *c = s->c;
    const tv__fp_error *e = &msg->u.error;
    creq *q = NULL;
    int rc;
    if (e->flags & TV__FP_ERROR_FATAL)
        return tv__fpc_fatal(c, msg, err);
    if (e->open_id || e->code >= 0)
        return tv__fpc_fail(c, err, TV_E_PROTOCOL,
                            "tensorvaultd on %s: ERROR code %d for open %u during a read", c->path,
                            e->code, e->open_id);
    if ((rc = find_req(s, e->req_id, s->m->handle, "ERROR", &q, err)))
        return rc;
    int nl;
    const char *kind;
    const char *nm = tname(s, q, &kind, &nl);
    size_t idx = (size_t)(q - s->r);
    /* The text names the tensor (the daemon's rule); else it is prefixed. */
    if (msg->text_len >= (size_t)nl && memmem(msg->text, msg->text_len, nm, (size_t)nl))
        req_failed(s, idx, e->code, "%.*s", TV__FPC_TEXT_PREC(msg), msg->text);
    else
        req_failed(s, idx, e->code, "%s '%.*s': %.*s", kind, nl, nm, TV__FPC_TEXT_PREC(msg),
                   msg->text ? msg->text : "");
    return 0;
}

/* Runs n checked requests of m through the daemon (sink NULL: host
 * memcpy). Returns 0 when every one succeeded; else the lowest failed
 * request's code with err naming it, or the session's error (then every
 * request that had not completed carries it). */
static int run_reqs(tv__fpc_model *m, creq *r, size_t n, const tv__io_sink *sink, tv_error *err)
{
    tv_client *c = m->c;
    int rc = 0;
    run st, *s = &st;
    if (!c || c->sock < 0) {
        rc = c ? tv__fpc_dead(c, err)
               : tv__seterr(err, TV_E_DISCONNECTED, "the fast-path session of %s is closed",
                            m->m.name);
        goto fail_all;
    }
    st = (run){.m = m, .c = c, .r = r, .n = n, .base = c->next_req_id, .sink = sink};
    s->fail_at = SIZE_MAX;
    s->rel = c->rel;
    c->next_req_id += n;
    for (size_t i = 0; i < n; i++)
        if (r[i].len == 0) { /* nothing to ask for */
            r[i].state = REQ_DONE;
            s->n_done++;
        }
    for (;;) {
        bool want_out = false;
        if (s->n_rel && (rc = flush_release(s, false, err))) {
            if (rc != -EAGAIN)
                goto fail_all;
            want_out = true;
        }
        while (!want_out && s->next < n && s->outstanding < c->max_requests) {
            if ((rc = send_reads(s, err)) == -EAGAIN)
                want_out = true;
            else if (rc)
                goto fail_all;
        }
        if (s->n_done == n && !s->n_rel)
            break;
        tv__fp_msg msg;
        rc = tv__fpc_recv(c, &msg, NULL, 0, NULL, false, err);
        if (rc == 1) {
            if ((rc = tv__fpc_wait(c, want_out ? POLLIN | POLLOUT : POLLIN, err)))
                goto fail_all;
            continue;
        }
        if (rc)
            goto fail_all;
        if (msg.type == TV__FP_CHUNK)
            rc = on_chunk(s, &msg, err);
        else if (msg.type == TV__FP_DONE)
            rc = on_done(s, &msg, err);
        else if (msg.type == TV__FP_ERROR)
            rc = on_error(s, &msg, err);
        else
            rc = tv__fpc_unexpected(c, &msg, "during a read", err);
        if (rc)
            goto fail_all;
    }
    if (s->xfer_rc) {
        rc = tv__seterr(err, s->xfer_rc, "copy from the fast-path arena to the GPU failed: %s",
                        tv_strerror(s->xfer_rc));
        for (size_t i = 0; i < n; i++)
            if (!r[i].result && r[i].len)
                r[i].result = s->xfer_rc;
    } else if (s->fail_at != SIZE_MAX) {
        rc = s->fail_err.code;
        if (err)
            *err = s->fail_err;
    }
    return rc;
fail_all:
    /* The session failed: what had not completed never will. */
    for (size_t i = 0; i < n; i++)
        if (r[i].state != REQ_DONE && !r[i].result)
            r[i].result = rc;
    return rc;
}

/* n checked requests through the daemon: as run_reqs, their results in
 * r[j].result (a tv_get_tensor arena gets the payload at its start). */
static int daemon_read(tv_model *bm, tv__mreq *r, size_t n, const tv__io_sink *sink, tv_error *err)
{
    tv__fpc_model *m = daemon_of(bm);
    creq one, *q = n == 1 ? &one : calloc(n, sizeof(*q));
    if (!q)
        return tv__seterr(err, -ENOMEM, "out of memory");
    for (size_t j = 0; j < n; j++) {
        bool header = r[j].flags & TV__MREQ_SHARD_HEADER;
        q[j] = (creq){.off = r[j].off,
                      .len = r[j].len,
                      .dest = r[j].dest,
                      .tensor = r[j].index,
                      .flags = header ? TV__FP_READ_SHARD_HEADER : 0,
                      .t = r[j].t};
        tv__fpc_spans_init(&q[j].sp);
        r[j].skip = 0;
    }
    int rc = run_reqs(m, q, n, sink, err);
    for (size_t j = 0; j < n; j++) {
        r[j].result = q[j].result;
        tv__fpc_spans_free(&q[j].sp);
    }
    if (q != &one)
        free(q);
    return rc;
}

/* One request; a shard header needs protocol version 2 (nothing is sent
 * to a version-1 daemon). */
static int daemon_read_one(tv_model *bm, tv__mreq *r, tv_error *err)
{
    const tv__fpc_model *m = daemon_of(bm);
    const tv_client *c = m->c;
    if ((r->flags & TV__MREQ_SHARD_HEADER) && c && c->sock >= 0 && c->version < TV__FP_V2)
        return r->result = tv__seterr(
                   err, TV_E_NOT_SUPPORTED,
                   "%s@%lld: tensorvaultd on %s speaks fast-path protocol version %u; shard headers need version 2",
                   m->m.name, (long long)m->m.snap.generation, c->path, c->version);
    return daemon_read(bm, r, 1, NULL, err);
}

/* One fence: a message's copies are synchronized before its slots go back
 * (the arena itself is the staging, pinned at open when asked). */
static int daemon_cuda_sink(tv_model *bm, void *stream, tv__cuda_sink **out, tv_error *err)
{
    (void)bm;
    return tv__cuda_sink_create(stream, 1, out, err);
}

/* ---- views ------------------------------------------------------------------ */

struct tv_view {
    tv__fpc_hold *hold;
    const uint8_t *data;
    uint64_t nbytes;
    uint32_t *slots; /* the view references to give back (RELEASE_VIEW), one per CHUNK entry */
    uint32_t n_slots;
    void *priv;       /* tv_view_map's private mapping of the view's pages, or NULL */
    size_t priv_len;  /* its length */
    size_t priv_skip; /* the view's first byte in it */
};

/* Gives back n view references of hold h (RELEASE_VIEW) when its session
 * lives; a failed send closes the session (its references go with it). */
static void release_views(tv__fpc_hold *h, const uint32_t *slots, uint32_t n)
{
    tv_client *c = h->c;
    while (c && c->sock >= 0 && n) {
        tv_error e = {0};
        uint32_t k = n > TV__FP_MAX_RELEASE ? TV__FP_MAX_RELEASE : n;
        size_t len =
            tv__fp_encode_release_view(c->sbuf, sizeof(c->sbuf), c->version, h->handle, slots, k);
        if (!len || tv__fpc_send(c, c->sbuf, len, true, &e))
            break;
        slots += k;
        n -= k;
    }
}

TV_API const void *tv_view_data(const tv_view *v)
{
    return v ? v->data : NULL;
}

TV_API uint64_t tv_view_nbytes(const tv_view *v)
{
    return v ? v->nbytes : 0;
}

TV_API int tv_view_map(tv_view *v, void **data, tv_error *err)
{
    if (!v || !data)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *data = NULL;
    const tv__fpc_hold *h = v->hold;
    if (!v->priv && v->nbytes) {
        if (h->tier_fd < 0)
            return tv__seterr(err, TV_E_NOT_SUPPORTED,
                              "view of %" PRIu64 " bytes: no descriptor of the tier to map it from",
                              v->nbytes);
        uint64_t off = (uint64_t)(v->data - h->arena), lo = off - off % h->page_len, hi = 0;
        if (tv__add_u64(off, v->nbytes, &hi) || tv__align_up_u64(hi, h->page_len, &hi) ||
            hi > h->arena_len)
            return tv__seterr(err, TV_E_OVERFLOW,
                              "view at %" PRIu64 " of %" PRIu64
                              " bytes: outside the tier's %zu bytes",
                              off, v->nbytes, h->arena_len);
        void *p = tv__sys.mmap(NULL, (size_t)(hi - lo), PROT_READ | PROT_WRITE, MAP_PRIVATE,
                               h->tier_fd, (off_t)lo);
        if (p == MAP_FAILED)
            return tv__seterr(err, -errno, "view of %" PRIu64 " bytes: private mapping: %s",
                              v->nbytes, strerror(errno));
        v->priv = p;
        v->priv_len = (size_t)(hi - lo);
        v->priv_skip = (size_t)(off - lo);
#ifdef MADV_POPULATE_READ
        /* the pages are the view's, resident and pinned: mapping them in one
         * call beats a fault per page; read-only, so nothing is copied */
        if (v->priv_len >= POPULATE_MIN)
            (void)tv__sys.madvise(p, v->priv_len, MADV_POPULATE_READ);
#endif
    }
    *data = v->priv ? (uint8_t *)v->priv + v->priv_skip : (void *)v->data;
    return 0;
}

TV_API void tv_view_release(tv_view *v)
{
    if (!v)
        return;
    tv__fpc_hold *h = v->hold;
    if (v->priv)
        tv__sys.munmap(v->priv, v->priv_len);
    release_views(h, v->slots, v->n_slots);
    free(v->slots);
    free(v);
    if (--h->n_views || !h->model_closed)
        return;
    /* the model is gone and this was its last view: its handle goes too */
    if (h->c)
        for (tv__fpc_hold **p = &h->c->orphans; *p; p = &(*p)->next)
            if (*p == h) {
                *p = h->next;
                break;
            }
    hold_close_handle(h, "(closed)", 0);
    hold_free(h);
}

/* Whether m can lend views: a daemon model whose arena is the tier.
 * Returns 0 or TV_E_NOT_SUPPORTED naming why. */
static int views_possible(const tv_model *bm, tv_error *err)
{
    if (!bm)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    if (bm->ops != &daemon_ops)
        return tv__seterr(
            err, TV_E_NOT_SUPPORTED,
            "%s@%lld: views are lent by tensorvaultd's memory tier: open the model with tv_model_open_daemon",
            bm->name, (long long)bm->snap.generation);
    const tv__fpc_model *m = daemon_of(bm);
    if (!m->tier)
        return tv__seterr(
            err, TV_E_NOT_SUPPORTED,
            "%s@%lld: tensorvaultd on %s speaks fast-path protocol version %u; views need version 3",
            bm->name, (long long)bm->snap.generation, m->c ? m->c->path : "(closed)",
            m->c ? m->c->version : 0);
    return 0;
}

/* The views of q[0, n) (checked requests with TV__FP_READ_VIEW) through
 * the daemon: out[j] gets request j's view, or NULL with q[j].result set;
 * a failed view's references are given back at once. Returns as run_reqs. */
static int run_views(tv__fpc_model *m, creq *q, size_t n, tv_view **out, tv_error *err)
{
    int rc = run_reqs(m, q, n, NULL, err);
    for (size_t j = 0; j < n; j++) {
        out[j] = NULL;
        if (!q[j].result && q[j].vbase + q[j].len > m->arena_len)
            q[j].result = TV_E_PROTOCOL; /* cannot be: every entry was inside */
        if (!q[j].result && !(out[j] = calloc(1, sizeof(**out))))
            q[j].result = -ENOMEM;
        if (q[j].result) {
            release_views(m->hold, q[j].vslots, q[j].n_vslots);
            free(q[j].vslots);
            if (!rc) {
                rc = q[j].result;
                tv__seterr(err, rc, "view %zu: %s", j, tv_strerror(rc));
            }
            continue;
        }
        *out[j] = (tv_view){.hold = m->hold,
                            .data = m->arena + q[j].vbase,
                            .nbytes = q[j].len,
                            .slots = q[j].vslots,
                            .n_slots = q[j].n_vslots};
        m->hold->n_views++;
    }
    return rc;
}

/* One checked view request of tensor i (record t). */
static creq view_req(uint32_t i, const tv__tdesc *t)
{
    creq q = {.len = t->nbytes, .tensor = i, .flags = TV__FP_READ_VIEW, .t = t};
    tv__fpc_spans_init(&q.sp);
    return q;
}

TV_API int tv_tensor_view(tv_model *bm, const char *name, tv_view **out, tv_error *err)
{
    uint32_t i = 0;
    const tv__tdesc *t = NULL;
    int rc;
    if (!out)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *out = NULL;
    if ((rc = views_possible(bm, err)))
        return rc;
    if (!name)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    if ((rc = tv__tdesc_lookup(&bm->snap, bm->name, bm->snap.generation, name, &i, err)) ||
        (rc = tv__model_tensor(bm, i, &t, err)))
        return rc;
    creq q = view_req(i, t);
    rc = run_views(daemon_of(bm), &q, 1, out, err);
    tv__fpc_spans_free(&q.sp);
    return rc;
}

TV_API int tv_tensor_view_batch(tv_model *bm, tv_view_req *reqs, size_t n, tv_error *err)
{
    tv__batch_err first = {0};
    tv_error e = {0};
    int rc;
    if (!reqs && n)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    for (size_t j = 0; j < n; j++)
        reqs[j].view = NULL;
    if ((rc = views_possible(bm, err))) {
        for (size_t j = 0; j < n; j++)
            reqs[j].result = rc;
        return rc;
    }
    creq *q = calloc(n ? n : 1, sizeof(*q));
    tv_view **v = calloc(n ? n : 1, sizeof(*v));
    size_t *map = calloc(n ? n : 1, sizeof(*map)), k = 0;
    if (!q || !v || !map) {
        free(q);
        free(v);
        free(map);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    for (size_t j = 0; j < n; j++) {
        size_t i = 0;
        const tv__tdesc *t = NULL;
        tv_read_req rq = {.name = reqs[j].name, .index = reqs[j].index};
        rc = tv__tdesc_batch_index(&bm->snap, bm->name, bm->snap.generation, &rq, j, &i, &e);
        if (!rc)
            rc = tv__model_tensor(bm, i, &t, &e);
        if ((reqs[j].result = tv__batch_note(&first, rc, &e)) == 0) {
            q[k] = view_req((uint32_t)i, t);
            map[k++] = j;
        }
    }
    if (k)
        tv__batch_note(&first, run_views(daemon_of(bm), q, k, v, &e), &e);
    for (size_t x = 0; x < k; x++) {
        reqs[map[x]].result = q[x].result;
        reqs[map[x]].view = v[x];
        tv__fpc_spans_free(&q[x].sp);
    }
    free(q);
    free(v);
    free(map);
    return tv__batch_answer(&first, err);
}

static const tv__model_ops daemon_ops = {
    .read_one = daemon_read_one,
    .read = daemon_read,
    .cuda_sink = daemon_cuda_sink,
    .close = daemon_close,
};
