/* The importer; see import.h for the order of steps and the invariants.
 *
 * Steps: tv__import runs one static function per step of import.h
 * (step_resolve ... step_publish) over one import_job, with one cleanup
 * ladder; each step reports progress (step_begin / step_advance / step_end)
 * and polls the cancel callback (job_cancelled) between chunks and steps.
 *
 * Data path: the calling thread posts a shard in chunk_len pieces to a ring
 * of aligned buffers (transparent huge pages where the kernel gives them:
 * each O_DIRECT transfer then pins a few pages, not thousands); two reader
 * threads read the pieces from the source (import/source.h: a local file,
 * with O_DIRECT where it pays, or Range requests to an HTTP origin), so one
 * read is always queued behind the other; a hasher thread runs SHA-256 over
 * each piece in order while two writer threads issue the O_DIRECT pwrites
 * to every replica. Reading, hashing and writing overlap, and memory stays
 * at N_BUFS x chunk_len. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "import/alloc.h"
#include "import/import.h"
#include "import/source.h"
#include "import/tensor_hash.h"
#include "store/snapbuild.h"
#include "util/hex.h"
#include "util/sha256.h"
#include "util/sys.h"

#define N_BUFS     4
#define BUF_ALIGN  65536      /* >= every device's io_align */
#define HUGE_ALIGN (2u << 20) /* the ring's alignment: transparent huge pages fit */
/* A resumable import flushes and records how far it got this often
 * (whichever comes first), so a kill loses at most the chunks in flight
 * and about RESUME_EVERY_S of transfer. */
#define RESUME_EVERY_S   0.25
#define RESUME_EVERY_LEN (64ull << 20)

/* One shard's plan: which objects hold it on which device. */
typedef struct shard_plan {
    tv_shard_info info;
    char sha_hex[65];
    char header_sha_hex[65];
    bool have_sha; /* full hash known before writing (dedup probe) */
    size_t n_obj;
    int64_t dev_id[TV__IMPORT_MAX_DEVICES];
    tv__reg_object obj[TV__IMPORT_MAX_DEVICES];
    bool reused[TV__IMPORT_MAX_DEVICES];   /* bound to an existing committed object */
    bool candidate;                        /* its length matches a committed object (dedup probe) */
    uint64_t done[TV__IMPORT_MAX_DEVICES]; /* bytes of obj[k] written and flushed (resume) */
    bool resumed;                          /* an interrupted import's bytes were taken over */
    bool read_local;                       /* read and hashed from a local file: */
    tv__src_stamp file_st;                 /* its stamps, unchanged over the reads */
} shard_plan;

/* One import, passed from step to step. */
typedef struct import_job {
    tv__store *st;
    const char *model;
    const tv__import_opts *o;
    size_t chunk;
    tv_checkpoint *ck;
    tv__src *src; /* where the checkpoint is read from (a path or a URL) */
    size_t n_shards;
    shard_plan *plans;
    uint8_t *bufs; /* N_BUFS x chunk, HUGE_ALIGN aligned */
    int64_t devs[TV__IMPORT_MAX_DEVICES];
    size_t n_devs;
    char real_src[PATH_MAX]; /* the resolved path, or the URL */
    const char *step;        /* the running step, for progress and messages */
    uint64_t step_done, step_total;
    uint64_t to_write;   /* extents of the new objects (the write step's total) */
    bool crashed_mid;    /* the "write" crash point fired */
    bool published;      /* the generation is committed: keep its objects */
    bool resumable;      /* a remote source with o->resume_save: records progress */
    bool saved;          /* a record naming the reservations was handed to resume_save */
    json_t *resume;      /* o->resume, parsed (entries taken over get "taken") */
    double last_save;    /* now_s() of the last record */
    uint64_t since_save; /* bytes posted since */
    int64_t started_ns;  /* CLOCK_REALTIME before the source was opened */
    tv__sidecars side;   /* the sidecar files, published with the generation */
    tv__import_result r;
    tv__thash *thash; /* per-tensor XXH3-128 (import/tensor_hash.h), fed with the SHA-256 */
} import_job;

static void job_report(import_job *j, size_t shard)
{
    const tv__import_opts *o = j->o;
    if (o->on_step)
        o->on_step(o->step_ctx, j->step, shard, j->step_done, j->step_total);
    if (o->progress && strcmp(j->step, "write") == 0)
        o->progress(o->progress_ctx, j->step_done, j->step_total);
}

static void step_begin(import_job *j, const char *step, uint64_t total)
{
    j->step = step;
    j->step_done = 0;
    j->step_total = total;
    job_report(j, TV__IMPORT_NO_SHARD);
}

static void step_advance(import_job *j, size_t shard, uint64_t n)
{
    uint64_t left = j->step_total - j->step_done;
    j->step_done += n < left ? n : left;
    job_report(j, shard);
}

/* The step's last report (done == total), unless it was made already. */
static void step_end(import_job *j)
{
    if (j->step_done == j->step_total)
        return;
    j->step_done = j->step_total;
    job_report(j, TV__IMPORT_NO_SHARD);
}

static int job_cancelled(const import_job *j, tv_error *err)
{
    const tv__import_opts *o = j->o;
    if (!o->cancelled || !o->cancelled(o->cancel_ctx))
        return 0;
    return tv__seterr(err, -ECANCELED, "import of model '%s' cancelled in step %s", j->model,
                      j->step);
}

/* A shard's file is recorded (shard_files) only when its last change lies
 * this long before the import started: a change within one timestamp tick
 * of the file system (up to 2 s on some) could otherwise leave the stamps
 * as they were. */
#define FILE_SETTLED_NS 2000000000LL

static int64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Notes the stamps of the local file shard s was just read and hashed from
 * (checked unchanged over the reads: tv__src_shard_check). */
static void note_file(import_job *j, size_t s, const tv__src_shard *sf)
{
    if (sf->fd < 0) /* an origin's bytes: no file here */
        return;
    j->plans[s].read_local = true;
    j->plans[s].file_st = sf->st;
}

/* Records the local file shard s was read from (shard_id's shard_files
 * row) when it may identify the shard: see FILE_SETTLED_NS. */
static int record_file(import_job *j, size_t s, int64_t shard_id, tv_error *err)
{
    const shard_plan *p = &j->plans[s];
    if (!p->read_local || p->file_st.ctime_ns > j->started_ns - FILE_SETTLED_NS)
        return 0;
    tv__reg_file_stamp f = {.dev = p->file_st.dev_id,
                            .ino = p->file_st.inode,
                            .size = p->file_st.size,
                            .mtime_ns = p->file_st.mtime_ns,
                            .ctime_ns = p->file_st.ctime_ns};
    return tv__reg_shard_file_add(j->st->reg, shard_id, &f, err);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The shard's and its header's hash contexts: both or neither. */
static int hashes_init(tv__sha256 *h, tv__sha256 *hh, tv_error *err)
{
    if (tv__sha256_init(h))
        return tv__seterr(err, -ENOMEM, "out of memory");
    if (tv__sha256_init(hh)) {
        tv__sha256_free(h);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    return 0;
}

static void hashes_final(tv__sha256 *h, tv__sha256 *hh, char sha_hex[65], char hdr_hex[65])
{
    uint8_t dig[32];
    tv__sha256_final(h, dig);
    tv__hex_encode(dig, 32, false, sha_hex);
    tv__sha256_final(hh, dig);
    tv__hex_encode(dig, 32, false, hdr_hex);
}

/* Hashes the whole source file (dedup probe) and its header, and copies the
 * 8 + N header bytes into hdr (si->data_off bytes): the header compared with
 * the validated one must come from the same reads as the hash. */
static int hash_source(import_job *j, size_t s, tv__src_shard *sf, const tv_shard_info *si,
                       uint8_t *buf, size_t chunk, uint8_t *hdr, char sha_hex[65], char hdr_hex[65],
                       tv_error *err)
{
    tv__sha256 h, hh;
    int rc;
    if ((rc = hashes_init(&h, &hh, err)))
        return rc;
    uint64_t hdr_end = si->data_off;
    for (uint64_t off = 0; off < si->file_len; off += chunk) {
        size_t n = (size_t)(si->file_len - off < chunk ? si->file_len - off : chunk);
        if ((rc = job_cancelled(j, err)) ||
            (rc = tv__src_shard_read(sf, buf, n, chunk, off, err))) {
            tv__sha256_free(&h);
            tv__sha256_free(&hh);
            return rc;
        }
        tv__sha256_update(&h, buf, n);
        /* ---- per-tensor hashes: from the same reads as the shard's ---- */
        tv__thash_feed(j->thash, s, off, buf, n);
        /* ---- */
        if (off < hdr_end) {
            size_t hn = (size_t)(hdr_end - off < n ? hdr_end - off : n);
            tv__sha256_update(&hh, buf, hn);
            memcpy(hdr + off, buf, hn);
        }
        step_advance(j, s, n);
    }
    hashes_final(&h, &hh, sha_hex, hdr_hex);
    return tv__src_shard_check(sf, err);
}

/* ---- the data pipeline -----------------------------------------------------
 *
 * Four stages over one ring of N_BUFS buffers, tracked by sequence numbers:
 * the calling thread posts buffer `posted` (what to read, hash and write);
 * N_READERS reader threads take posted buffers in turn (`claimed`) and read
 * them from the source at once, so the next chunk's read is queued while
 * the last one completes; `filled` is the prefix whose reads completed; the
 * hasher thread hashes the filled buffers in order (`hashed`) while
 * N_WRITERS writer threads take them in turn (`wclaimed`) and write them to
 * every target, `written` being the prefix whose writes completed (hasher
 * and writers only read the buffer, so they run side by side). A buffer is
 * free again once hasher and writers passed it. A failed read or write sets
 * rc (no writer writes from then on) and still counts as done, so every
 * posted buffer always reaches `hashed` and `written`. */

#define N_READERS 2
#define N_WRITERS 2

typedef struct target {
    tv__dev *dev;
    uint64_t off; /* absolute device offset of this buffer */
    size_t len;   /* bytes of the buffer this target takes (its extent may end sooner) */
} target;

typedef struct wbuf {
    uint8_t *p;
    size_t len;         /* bytes to write (payload + zero padding) */
    size_t payload;     /* canonical shard bytes at the start of p */
    tv__src_shard *src; /* read payload bytes from here at src_off (NULL: none) */
    const tv_shard_info *si;
    uint64_t src_off;
    bool read_done, write_done;
    tv__sha256 *h;  /* the shard's hash, fed by the hasher thread */
    tv__sha256 *hh; /* the header's hash (NULL: no header bytes in this buffer) */
    uint8_t *hdr;   /* where the hasher copies the hdr_n header bytes */
    size_t hdr_n;
    size_t shard; /* which shard's object bytes [end - len, end) this is (resume marks) */
    uint64_t end;
    tv__thash *th; /* the tensor hashes the hasher feeds too (NULL: none) */
    size_t n_targets;
    target t[TV__IMPORT_MAX_DEVICES];
} wbuf;

typedef struct pipeline {
    pthread_t hasher, readers[N_READERS], writers[N_WRITERS];
    bool hasher_started;
    size_t n_readers, n_writers;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    wbuf bufs[N_BUFS];
    size_t chunk;
    uint64_t posted, claimed, filled, hashed, wclaimed, written;
    /* The last buffer of the `written` prefix: every byte of every shard
     * before mark_shard, and of mark_shard below mark_end, is written. */
    bool marked;
    size_t mark_shard;
    uint64_t mark_end;
    bool stop;
    int rc;
    tv_error err;
    uint64_t bytes_written;
} pipeline;

/* Under mu: records the first failure. */
static void pipeline_fail(pipeline *w, int rc, const tv_error *e)
{
    if (rc && !w->rc) {
        w->rc = rc;
        w->err = *e;
    }
}

static void *reader_main(void *arg)
{
    pipeline *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->claimed == w->posted && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->claimed == w->posted)
            break;
        wbuf *b = &w->bufs[w->claimed++ % N_BUFS];
        int failed = w->rc;
        pthread_mutex_unlock(&w->mu);
        int rc = 0;
        tv_error e = {0};
        if (!failed && b->src && b->payload)
            rc = tv__src_shard_read(b->src, b->p, b->payload, w->chunk, b->src_off, &e);
        if (!failed && !rc)
            memset(b->p + b->payload, 0, b->len - b->payload);
        pthread_mutex_lock(&w->mu);
        pipeline_fail(w, rc, &e);
        b->read_done = true;
        while (w->filled < w->posted && w->bufs[w->filled % N_BUFS].read_done) {
            w->bufs[w->filled % N_BUFS].read_done = false;
            w->filled++;
        }
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void *writer_main(void *arg)
{
    pipeline *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->wclaimed == w->filled && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->wclaimed == w->filled)
            break;
        wbuf *b = &w->bufs[w->wclaimed++ % N_BUFS];
        int failed = w->rc;
        pthread_mutex_unlock(&w->mu);
        int rc = 0;
        tv_error e = {0};
        for (size_t i = 0; !failed && !rc && i < b->n_targets; i++)
            rc = tv__dev_pwrite_full(b->t[i].dev, b->p, b->t[i].len, b->t[i].off, &e);
        pthread_mutex_lock(&w->mu);
        pipeline_fail(w, rc, &e);
        for (size_t i = 0; !rc && !failed && i < b->n_targets; i++)
            w->bytes_written += b->t[i].len;
        b->write_done = true;
        while (w->written < w->wclaimed && w->bufs[w->written % N_BUFS].write_done) {
            wbuf *d = &w->bufs[w->written % N_BUFS];
            d->write_done = false;
            w->marked = true;
            w->mark_shard = d->shard;
            w->mark_end = d->end;
            w->written++;
        }
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void *hasher_main(void *arg)
{
    pipeline *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->hashed == w->filled && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->hashed == w->filled)
            break;
        wbuf *b = &w->bufs[w->hashed % N_BUFS];
        pthread_mutex_unlock(&w->mu);
        if (b->h)
            tv__sha256_update(b->h, b->p, b->payload);
        /* ---- per-tensor hashes: the payload at its file offset ---- */
        if (b->th && b->payload)
            tv__thash_feed(b->th, b->shard, b->src_off, b->p, b->payload);
        /* ---- */
        if (b->hh) {
            tv__sha256_update(b->hh, b->p, b->hdr_n);
            memcpy(b->hdr, b->p, b->hdr_n);
        }
        pthread_mutex_lock(&w->mu);
        w->hashed++;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static int pipeline_start(pipeline *w, uint8_t *bufs, size_t chunk, tv_error *err)
{
    memset(w, 0, sizeof(*w));
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->chunk = chunk;
    for (size_t b = 0; b < N_BUFS; b++)
        w->bufs[b].p = bufs + b * chunk;
    for (; w->n_writers < N_WRITERS; w->n_writers++)
        if (pthread_create(&w->writers[w->n_writers], NULL, writer_main, w))
            return tv__seterr(err, -EAGAIN, "cannot start a writer thread");
    if (pthread_create(&w->hasher, NULL, hasher_main, w))
        return tv__seterr(err, -EAGAIN, "cannot start the hasher thread");
    w->hasher_started = true;
    for (; w->n_readers < N_READERS; w->n_readers++)
        if (pthread_create(&w->readers[w->n_readers], NULL, reader_main, w))
            return tv__seterr(err, -EAGAIN, "cannot start a reader thread");
    return 0;
}

/* Lets every thread finish what was posted, then joins them. */
static void pipeline_stop(pipeline *w)
{
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    for (size_t i = 0; i < w->n_readers; i++)
        pthread_join(w->readers[i], NULL);
    for (size_t i = 0; i < w->n_writers; i++)
        pthread_join(w->writers[i], NULL);
    if (w->hasher_started)
        pthread_join(w->hasher, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

/* Waits for a free buffer; returns it, or NULL when a stage failed. */
static wbuf *pipeline_acquire(pipeline *w)
{
    pthread_mutex_lock(&w->mu);
    for (;;) {
        uint64_t done = w->hashed < w->written ? w->hashed : w->written;
        if (w->rc || w->posted - done < N_BUFS)
            break;
        pthread_cond_wait(&w->cv, &w->mu);
    }
    wbuf *b = w->rc ? NULL : &w->bufs[w->posted % N_BUFS];
    pthread_mutex_unlock(&w->mu);
    return b;
}

static void pipeline_submit(pipeline *w)
{
    pthread_mutex_lock(&w->mu);
    w->posted++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Waits until every posted buffer is read and hashed (a shard's digest is
 * final, and no reader uses its source any more) and, with written, also
 * written; returns the first failure's rc so far (a read's or a write's). */
static int pipeline_wait(pipeline *w, bool written, tv_error *err)
{
    pthread_mutex_lock(&w->mu);
    while (w->hashed < w->posted || (written && w->written < w->posted))
        pthread_cond_wait(&w->cv, &w->mu);
    int rc = w->rc;
    if (rc && err)
        *err = w->err;
    pthread_mutex_unlock(&w->mu);
    return rc;
}

static uint64_t pipeline_bytes_written(pipeline *w)
{
    pthread_mutex_lock(&w->mu);
    uint64_t n = w->bytes_written;
    pthread_mutex_unlock(&w->mu);
    return n;
}

/* ---- names ---------------------------------------------------------------- */

static const char NAME_RULE[] =
    "a name is 1-128 bytes of [A-Za-z0-9._-] in components separated by '/'";

static bool name_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

int tv__name_valid(const char *name, const char *what, tv_error *err)
{
    if (!what)
        what = "name";
    if (!name || !*name)
        return tv__seterr(err, TV_E_NAME, "%s is empty; %s", what, NAME_RULE);
    size_t len = strnlen(name, TV__NAME_MAX + 1);
    if (len > TV__NAME_MAX)
        return tv__seterr(err, TV_E_NAME, "%s '%.32s...' is longer than %d bytes; %s", what, name,
                          TV__NAME_MAX, NAME_RULE);
    const char *bad = NULL;
    size_t at = 0;
    for (size_t i = 0; i < len && !bad; i++) {
        unsigned char c = (unsigned char)name[i];
        bool start = i == 0 || name[i - 1] == '/';
        at = i;
        if (c == '/' && (start || i + 1 == len))
            bad = "an empty component (a leading, trailing or doubled '/')";
        else if (c == '/')
            continue;
        else if (c == '@')
            bad = "'@' (it separates a name from a generation or alias)";
        else if (!name_char(c))
            bad = c <= 0x20 || c >= 0x7f ? "a space, control character or non-ASCII byte"
                                         : "a character outside [A-Za-z0-9._-] and '/'";
        else if (start && (c == '-' || c == '.'))
            bad = "a component starting with '-' or '.'";
        else if (c == '.' && name[i + 1] == '.')
            bad = "'..'";
    }
    if (!bad)
        return 0;
    /* Quote the name with unprintable bytes escaped: it may be hostile. */
    char q[4 * TV__NAME_MAX + 1];
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        o += (size_t)snprintf(q + o, sizeof(q) - o,
                              c < 0x20 || c >= 0x7f || c == '\\' ? "\\x%02x" : "%c", c);
    }
    return tv__seterr(err, TV_E_NAME, "%s '%s' is refused at byte %zu: %s; %s", what, q, at, bad,
                      NAME_RULE);
}

/* Reads back one object and checks its hash and its zero padding; with a
 * job (the import's verify step), reports each chunk and polls cancel. */
static int verify_extent(import_job *j, size_t s, tv__dev *d, uint64_t base, uint64_t canonical,
                         uint64_t alloc, const char *want_hex, uint8_t *buf, size_t chunk,
                         const char *what, tv_error *err)
{
    tv__sha256 h;
    uint8_t dig[32];
    char hex[65];
    int rc;
    if (tv__sha256_init(&h))
        return tv__seterr(err, -ENOMEM, "out of memory");
    for (uint64_t off = 0; off < alloc; off += chunk) {
        size_t n = (size_t)(alloc - off < chunk ? alloc - off : chunk);
        if ((j && (rc = job_cancelled(j, err))) ||
            (rc = tv__dev_pread_full(d, buf, n, base + off, err))) {
            tv__sha256_free(&h);
            return rc;
        }
        size_t payload = off >= canonical ? 0 : (size_t)(canonical - off < n ? canonical - off : n);
        tv__sha256_update(&h, buf, payload);
        for (size_t i = payload; i < n; i++) {
            if (buf[i]) {
                tv__sha256_free(&h);
                return tv__seterr(err, TV_E_HASH_MISMATCH,
                                  "%s: padding byte at object offset %llu is not zero", what,
                                  (unsigned long long)(off + i));
            }
        }
        if (j)
            step_advance(j, s, n);
    }
    tv__sha256_final(&h, dig);
    tv__hex_encode(dig, 32, false, hex);
    if (strcmp(hex, want_hex) != 0)
        return tv__seterr(err, TV_E_HASH_MISMATCH, "%s: read back sha256 %s, expected %s", what,
                          hex, want_hex);
    return 0;
}

int tv__verify_object(tv__store *st, const tv__reg_object *obj, tv_error *err)
{
    tv__dev *d;
    int rc = tv__store_device(st, obj->device_id, false, &d, err);
    if (rc)
        return rc;
    size_t chunk = TV__IMPORT_DEFAULT_CHUNK;
    uint8_t *buf = NULL;
    if (posix_memalign((void **)&buf, BUF_ALIGN, chunk))
        return tv__seterr(err, -ENOMEM, "out of memory");
    char what[96];
    snprintf(what, sizeof(what), "object %lld on device %lld", (long long)obj->id,
             (long long)obj->device_id);
    rc = verify_extent(NULL, 0, d, obj->base_off, obj->canonical_len, obj->alloc_len, obj->sha256,
                       buf, chunk, what, err);
    free(buf);
    return rc;
}

/* Compares shard s of the validated checkpoint with the header bytes that
 * were actually written (8 + N bytes). Returns 0 or TV_E_SOURCE_CHANGED. */
static int same_header(const tv_checkpoint *ck, size_t s, const uint8_t *hdr, const shard_plan *p,
                       tv_error *err)
{
    tv_checkpoint *w = NULL;
    tv_error e2;
    int rc = 0;
    if (tv_checkpoint_parse_shard(hdr, (size_t)p->info.data_off, p->info.file_len, p->info.name,
                                  NULL, &w, &e2) != 0)
        return tv__seterr(err, TV_E_SOURCE_CHANGED,
                          "shard '%s' changed during import: written header is invalid (%s)",
                          p->info.name, e2.msg);
    size_t first = 0;
    for (size_t i = 0; i < tv_checkpoint_n_tensors(ck); i++) {
        tv_tensor_info t;
        tv_checkpoint_tensor(ck, i, &t);
        if (t.shard < s)
            first = i + 1;
    }
    if (tv_checkpoint_n_tensors(w) != p->info.n_tensors)
        rc = -1;
    for (size_t i = 0; !rc && i < p->info.n_tensors; i++) {
        tv_tensor_info a, b;
        tv_checkpoint_tensor(ck, first + i, &a);
        tv_checkpoint_tensor(w, i, &b);
        if (a.name_len != b.name_len || memcmp(a.name, b.name, a.name_len) || a.dtype != b.dtype ||
            a.rank != b.rank || a.begin_off != b.begin_off || a.end_off != b.end_off ||
            (a.rank && memcmp(a.shape, b.shape, sizeof(uint64_t) * a.rank)))
            rc = -1;
    }
    tv_checkpoint_close(w);
    if (rc)
        return tv__seterr(
            err, TV_E_SOURCE_CHANGED,
            "shard '%s' changed during import: its header differs from the validated one",
            p->info.name);
    return 0;
}

static void release_reservations(tv__store *st, shard_plan *plans, size_t n)
{
    for (size_t s = 0; s < n; s++) {
        for (size_t k = 0; k < plans[s].n_obj; k++) {
            if (!plans[s].reused[k] && plans[s].obj[k].id > 0) {
                tv_error e;
                if (tv__reg_object_delete(st->reg, plans[s].obj[k].id, &e))
                    tv__log(TV_LOG_WARN, "releasing reservation %lld: %s",
                            (long long)plans[s].obj[k].id, e.msg);
                plans[s].obj[k].id = 0;
            }
        }
    }
}

/* ---- resume (import.h: tv__import_opts.resume) ----------------------------
 *
 * A record names, per new object, the shard it holds and how far it is
 * written and flushed ("done"). Records are only made after a drain of the
 * pipeline and a flush of every target, so what a record says is on the
 * device; it is taken over only by an import of the same shards (name,
 * length, and the catalog's SHA-256 for a pull), which re-hashes the bytes
 * below "done" from the device and fetches the rest. */

static uint64_t new_bytes_on(const import_job *j, int64_t dev);

/* The SHA-256 a pull expects for shard s, or NULL. */
static const char *pull_sha(const import_job *j, size_t s)
{
    const tv__src_pull *pl = j->o->pull;
    size_t f = pl ? tv__src_pull_find(pl, j->plans[s].info.name) : SIZE_MAX;
    return f != SIZE_MAX ? pl->files[f].sha256 : NULL;
}

/* A failure a retry of the same import may cure: keep what was written. */
static bool transient(int rc)
{
    return rc == -EIO || rc == -EPROTO || rc == -ETIMEDOUT || rc == -ECONNRESET ||
           rc == -ECONNREFUSED || rc == -EHOSTUNREACH || rc == -ENETUNREACH || rc == -EAGAIN ||
           rc == -EPIPE;
}

/* What must match for a URL import's bytes to be taken over: the origin's
 * validator of the shard (a pull has the catalog's SHA-256 instead). */
static const char *shard_validator(const import_job *j, size_t s)
{
    return j->o->pull ? NULL : tv__src_validator(j->src, &j->plans[s].info);
}

/* Hands this import's record (keep) or NULL (nothing to keep) to resume_save. */
static void resume_save(import_job *j, bool keep)
{
    if (!j->resumable)
        return;
    char *text = NULL;
    if (keep) {
        json_t *objs = json_array();
        for (size_t s = 0; objs && s < j->n_shards; s++) {
            const shard_plan *p = &j->plans[s];
            const char *sha = pull_sha(j, s);
            for (size_t k = 0; k < p->n_obj; k++)
                if (!p->reused[k] && p->obj[k].id > 0)
                    json_array_append_new(
                        objs, json_pack("{s:s,s:I,s:s?,s:s?,s:I,s:I,s:I}", "shard", p->info.name,
                                        "bytes", (json_int_t)p->info.file_len, "sha256", sha,
                                        "validator", shard_validator(j, s), "device",
                                        (json_int_t)p->dev_id[k], "object",
                                        (json_int_t)p->obj[k].id, "done", (json_int_t)p->done[k]));
        }
        json_t *doc = objs ? json_pack("{s:s,s:I,s:o}", "source", j->real_src, "generation",
                                       (json_int_t)j->o->generation, "objects", objs)
                           : NULL;
        text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
        json_decref(doc);
        if (!text) {
            tv__log(TV_LOG_WARN, "import of model '%s': out of memory for its resume record",
                    j->model);
            return;
        }
    }
    j->o->resume_save(j->o->resume_ctx, text);
    j->saved = keep;
    j->last_save = now_s();
    j->since_save = 0;
    free(text);
}

/* Takes over a reservation of the record for shard s on device dev: the
 * object must still be 'writing' there with the shard's length. */
static bool resume_take(import_job *j, size_t s, int64_t dev, tv__reg_object *obj, uint64_t *done)
{
    json_t *objs = j->resume ? json_object_get(j->resume, "objects") : NULL;
    const shard_plan *p = &j->plans[s];
    const char *want = pull_sha(j, s);
    if (!objs || json_integer_value(json_object_get(j->resume, "generation")) != j->o->generation)
        return false;
    for (size_t i = 0; i < json_array_size(objs); i++) {
        json_t *e = json_array_get(objs, i);
        const char *name = json_string_value(json_object_get(e, "shard"));
        const char *sha = json_string_value(json_object_get(e, "sha256"));
        const char *val = json_string_value(json_object_get(e, "validator"));
        const char *want_val = shard_validator(j, s);
        json_int_t d = json_integer_value(json_object_get(e, "done"));
        tv__reg_object o;
        if (json_is_true(json_object_get(e, "taken")) || !name || strcmp(name, p->info.name) ||
            json_integer_value(json_object_get(e, "bytes")) != (json_int_t)p->info.file_len ||
            json_integer_value(json_object_get(e, "device")) != dev || (!want) != (!sha) ||
            (want && strcmp(want, sha)) || (!want && !want_val) || !want_val != !val ||
            (want_val && strcmp(want_val, val)) ||
            tv__reg_object_get(j->st->reg, json_integer_value(json_object_get(e, "object")), &o,
                               NULL) ||
            o.state != TV__OBJ_WRITING || o.device_id != dev ||
            o.canonical_len != p->info.file_len || d < 0 || (uint64_t)d > o.alloc_len ||
            d % BUF_ALIGN)
            continue;
        json_object_set_new(e, "taken", json_true());
        *obj = o;
        *done = (uint64_t)d;
        return true;
    }
    return false;
}

/* Deletes the record's reservations nobody took over. */
static void resume_drop_rest(import_job *j)
{
    json_t *objs = j->resume ? json_object_get(j->resume, "objects") : NULL;
    for (size_t i = 0; i < json_array_size(objs); i++) {
        json_t *e = json_array_get(objs, i);
        tv__reg_object o;
        int64_t id = json_integer_value(json_object_get(e, "object"));
        if (json_is_true(json_object_get(e, "taken")) ||
            tv__reg_object_get(j->st->reg, id, &o, NULL) || o.state != TV__OBJ_WRITING)
            continue;
        tv_error e2;
        if (tv__reg_object_delete(j->st->reg, id, &e2))
            tv__log(TV_LOG_WARN, "releasing reservation %lld: %s", (long long)id, e2.msg);
        json_object_set_new(e, "taken", json_true());
    }
}

/* Records how far each new object is written: takes the pipeline's mark
 * (the written prefix; none once a stage failed), flushes every target
 * device (the writes before the mark completed before the flush began),
 * then hands the record on. The pipeline keeps running meanwhile. */
static int resume_checkpoint(import_job *j, pipeline *w, tv_error *err)
{
    int rc;
    pthread_mutex_lock(&w->mu);
    bool marked = w->marked && !w->rc;
    size_t ms = w->mark_shard;
    uint64_t me = w->mark_end;
    pthread_mutex_unlock(&w->mu);
    if (!marked)
        return 0;
    double t0 = now_s();
    for (size_t i = 0; i < j->n_devs; i++) {
        tv__dev *d;
        if (new_bytes_on(j, j->devs[i]) &&
            ((rc = tv__store_device(j->st, j->devs[i], true, &d, err)) ||
             (rc = tv__dev_flush(d, err))))
            return rc;
    }
    for (size_t s = 0; s <= ms && s < j->n_shards; s++) {
        shard_plan *p = &j->plans[s];
        for (size_t k = 0; k < p->n_obj; k++) {
            uint64_t upto = s < ms || me > p->obj[k].alloc_len ? p->obj[k].alloc_len : me;
            if (!p->reused[k] && upto > p->done[k])
                p->done[k] = upto;
        }
    }
    resume_save(j, true);
    tv__log(TV_LOG_DEBUG, "import of model '%s': resume mark (shard %zu, %llu bytes) took %.1f ms",
            j->model, ms, (unsigned long long)me, (now_s() - t0) * 1e3);
    return 0;
}

/* Re-hashes what an interrupted import wrote of shard s, [0, upto) of its
 * first new object on dev, into h, hh and hdr_copy (the pipeline is idle). */
static int resume_rehash(import_job *j, size_t s, tv__dev *dev, uint64_t base, uint64_t upto,
                         tv__sha256 *h, tv__sha256 *hh, uint8_t *hdr_copy, tv_error *err)
{
    const shard_plan *p = &j->plans[s];
    uint64_t canon = p->info.file_len, hdr_end = p->info.data_off;
    int rc;
    for (uint64_t off = 0; off < upto; off += j->chunk) {
        size_t n = (size_t)(upto - off < j->chunk ? upto - off : j->chunk);
        if ((rc = job_cancelled(j, err)) ||
            (rc = tv__dev_pread_full(dev, j->bufs, n, base + off, err)))
            return rc;
        size_t payload = off >= canon ? 0 : (size_t)(canon - off < n ? canon - off : n);
        tv__sha256_update(h, j->bufs, payload);
        if (off < hdr_end) {
            size_t hn = (size_t)(hdr_end - off < payload ? hdr_end - off : payload);
            tv__sha256_update(hh, j->bufs, hn);
            memcpy(hdr_copy + off, j->bufs, hn);
        }
    }
    return 0;
}

/* ---- the steps -------------------------------------------------------------
 *
 * Each step function runs one step of import.h over the job, reports its
 * progress and polls cancel; on failure it leaves what it reserved in the
 * plans (tv__import's ladder releases it) and holds nothing else. */

/* 1. Validate everything first: the checkpoint (every shard header and the
 * index) and every target device (label, size, identity). */
static int step_resolve(import_job *j, const char *src, tv_error *err)
{
    const tv__import_opts *o = j->o;
    tv__reg_device *all = NULL;
    size_t n_all = 0;
    int rc;

    /* Every transfer of a remote source hears the cancel too (within a
     * second, stalled or not). */
    tv__src_http_opts ho = {.retries = TV__SRC_HTTP_DEFAULT_RETRIES};
    if (o->http)
        ho = *o->http;
    ho.cancel = (tv__http_cancel){.cancelled = o->cancelled, .ctx = o->cancel_ctx};
    if ((rc = o->pull ? tv__src_open_pull(o->pull, &ho, &j->src, &j->ck, j->real_src,
                                          sizeof(j->real_src), err)
              : o->local
                  ? tv__src_open_local(o->local, &j->src, &j->ck, j->real_src, sizeof(j->real_src),
                                       err)
                  : tv__src_open(src, &ho, &j->src, &j->ck, j->real_src, sizeof(j->real_src), err)))
        return rc;
    j->n_shards = tv_checkpoint_n_shards(j->ck);
    if (!(j->plans = calloc(j->n_shards ? j->n_shards : 1, sizeof(*j->plans))))
        return tv__seterr(err, -ENOMEM, "out of memory");
    for (size_t s = 0; s < j->n_shards; s++) {
        tv_checkpoint_shard(j->ck, s, &j->plans[s].info);
        j->r.bytes_total += j->plans[s].info.file_len;
    }
    if ((rc = tv__thash_new(j->ck, &j->thash, err)))
        return rc;
    step_begin(j, "resolve", j->r.bytes_total);
    if ((rc = job_cancelled(j, err)))
        goto out;
    if (o->n_devices > TV__IMPORT_MAX_DEVICES) {
        rc = tv__seterr(err, TV_E_INVALID_ARG, "at most %d replicas", TV__IMPORT_MAX_DEVICES);
        goto out;
    }
    for (size_t i = 0; i < o->n_devices; i++) {
        for (size_t k = 0; k < j->n_devs; k++)
            if (j->devs[k] == o->devices[i]) {
                rc = tv__seterr(err, TV_E_INVALID_ARG, "device %lld named twice",
                                (long long)o->devices[i]);
                goto out;
            }
        j->devs[j->n_devs++] = o->devices[i];
    }
    if (!o->n_devices) {
        if ((rc = tv__reg_device_list(j->st->reg, &all, &n_all, err)))
            goto out;
        if (n_all == 0) {
            rc = tv__seterr(err, TV_E_NOT_FOUND, "store %s has no device", j->st->dir);
            goto out;
        }
        j->devs[j->n_devs++] = all[0].id;
    }
    for (size_t i = 0; i < j->n_devs; i++) {
        tv__dev *d;
        if ((rc = tv__store_device(j->st, j->devs[i], true, &d, err)))
            goto out;
    }
    uint64_t bufs_len;
    if (tv__mul_u64(j->chunk, N_BUFS, &bufs_len) || bufs_len > SIZE_MAX ||
        posix_memalign((void **)&j->bufs, HUGE_ALIGN, (size_t)bufs_len)) {
        j->bufs = NULL;
        rc =
            tv__seterr(err, -ENOMEM, "out of memory for %d buffers of %zu bytes", N_BUFS, j->chunk);
        goto out;
    }
    /* Huge pages where the kernel gives them: an O_DIRECT transfer pins 4
     * pages per 8 MiB instead of 2048. Advice only. */
    (void)madvise(j->bufs, (size_t)bufs_len, MADV_HUGEPAGE);
    step_end(j);
out:
    free(all);
    return rc;
}

/* Hashes shard s for the dedup probe (whole file and header, from the same
 * reads) and checks that the header it read is the validated one. */
static int probe_shard(import_job *j, size_t s, tv_error *err)
{
    shard_plan *p = &j->plans[s];
    tv__src_shard sf;
    int rc;
    uint8_t *hdr = malloc((size_t)p->info.data_off);
    if (!hdr)
        return tv__seterr(err, -ENOMEM, "out of memory for the %llu-byte header",
                          (unsigned long long)p->info.data_off);
    if ((rc = tv__src_shard_open(j->src, s, &p->info, &sf, err)))
        goto out;
    rc = hash_source(j, s, &sf, &p->info, j->bufs, j->chunk, hdr, p->sha_hex, p->header_sha_hex,
                     err);
    if (!rc)
        note_file(j, s, &sf);
    tv__src_shard_close(&sf);
    /* A reused object is bound without reading the source again, so the
     * header it holds must be the validated one, or the published tensors
     * would not describe its bytes. */
    if (!rc)
        rc = same_header(j->ck, s, hdr, p, err);
    if (!rc)
        p->have_sha = true;
out:
    free(hdr);
    return rc;
}

/* A pull knows shard s's SHA-256 from the catalog: a committed object with
 * that hash on a target device holds exactly its bytes, and is bound
 * instead of fetched once its header, read from the device, is the
 * validated one (the tensors published come from that header). Returns
 * true when the shard's hashes are known (p->have_sha). */
static bool pull_local(import_job *j, size_t s)
{
    shard_plan *p = &j->plans[s];
    const char *want = pull_sha(j, s);
    uint64_t hdr_end = p->info.data_off;
    tv__reg_object obj;
    tv__dev *d = NULL;
    size_t i = 0;
    for (; want && i < j->n_devs; i++)
        if (tv__reg_object_find_committed(j->st->reg, j->devs[i], want, &obj, NULL) == 0 &&
            obj.canonical_len == p->info.file_len)
            break;
    if (!want || i == j->n_devs || tv__store_device(j->st, j->devs[i], true, &d, NULL))
        return false;
    uint8_t *hdr = malloc((size_t)hdr_end);
    tv__sha256 hh;
    tv_error e = {0};
    int rc = hdr ? tv__sha256_init(&hh) : -ENOMEM;
    if (rc) {
        free(hdr);
        return false;
    }
    for (uint64_t off = 0; !rc && off < hdr_end; off += j->chunk) {
        uint64_t left = hdr_end - off, n = left < j->chunk ? left : j->chunk;
        uint64_t n_io = n;
        if (tv__align_up_u64(n, BUF_ALIGN, &n_io) || n_io > j->chunk || off + n_io > obj.alloc_len)
            rc = TV_E_OVERFLOW;
        else if (!(rc = tv__dev_pread_full(d, j->bufs, (size_t)n_io, obj.base_off + off, &e)))
            memcpy(hdr + off, j->bufs, (size_t)n);
    }
    if (!rc)
        tv__sha256_update(&hh, hdr, (size_t)hdr_end);
    uint8_t dig[32];
    tv__sha256_final(&hh, dig);
    if (!rc && (rc = same_header(j->ck, s, hdr, p, &e)) == 0) {
        snprintf(p->sha_hex, sizeof p->sha_hex, "%s", want);
        tv__hex_encode(dig, 32, false, p->header_sha_hex);
        p->have_sha = true;
        tv__log(
            TV_LOG_INFO,
            "import of model '%s': shard '%s' (sha256 %.12s...) is stored here already: bound, not fetched",
            j->model, p->info.name, want);
    } else if (rc) {
        tv__log(TV_LOG_WARN, "import of model '%s': shard '%s': the local copy is not used: %s",
                j->model, p->info.name, e.msg[0] ? e.msg : tv_strerror(rc));
    }
    free(hdr);
    return p->have_sha;
}

/* Dedup probe: a shard whose length matches a committed object on a target
 * device is hashed first; an identical object on a device is reused. A
 * pull's shards are bound by the catalog's hash (pull_local), not probed. */
static int step_dedup(import_job *j, tv_error *err)
{
    tv__reg *reg = j->st->reg;
    uint64_t total = 0;
    int rc = 0;
    for (size_t i = 0; i < j->n_devs && !rc; i++) {
        tv__reg_object *objs = NULL;
        size_t n_objs = 0;
        if ((rc = tv__reg_objects_list_committed(reg, j->devs[i], &objs, &n_objs, err)))
            return rc;
        for (size_t s = 0; s < j->n_shards; s++)
            for (size_t k = 0; k < n_objs; k++)
                j->plans[s].candidate |= objs[k].canonical_len == j->plans[s].info.file_len;
        free(objs);
    }
    for (size_t s = 0; s < j->n_shards; s++) {
        if (j->o->pull)
            j->plans[s].candidate = false; /* a probe would fetch the shard twice */
        total += j->plans[s].candidate ? j->plans[s].info.file_len : 0;
    }
    step_begin(j, "dedup", total);
    if ((rc = job_cancelled(j, err)))
        return rc;
    for (size_t s = 0; s < j->n_shards; s++)
        if (j->plans[s].candidate && (rc = probe_shard(j, s, err)))
            return rc;
    for (size_t s = 0; j->o->pull && s < j->n_shards; s++)
        (void)pull_local(j, s);
    for (size_t i = 0; i < j->n_devs; i++) {
        for (size_t s = 0; s < j->n_shards; s++) {
            shard_plan *p = &j->plans[s];
            tv__reg_object found;
            tv_error e2;
            if (!p->have_sha ||
                tv__reg_object_find_committed(reg, j->devs[i], p->sha_hex, &found, &e2) != 0)
                continue;
            p->dev_id[p->n_obj] = j->devs[i];
            p->obj[p->n_obj] = found;
            p->reused[p->n_obj++] = true;
            j->r.bytes_deduped += p->info.file_len;
        }
    }
    step_end(j);
    return 0;
}

/* Whether shard plan p still needs a copy on device dev. */
static bool needs_copy(const shard_plan *p, int64_t dev)
{
    for (size_t k = 0; k < p->n_obj; k++)
        if (p->dev_id[k] == dev)
            return false;
    return true;
}

/* 2. Reserve extents ('writing' objects) for everything that must be
 * written; j->to_write receives their total length. */
static int step_reserve(import_job *j, tv_error *err)
{
    uint64_t total = 0;
    int rc;
    for (size_t s = 0; s < j->n_shards; s++)
        for (size_t i = 0; i < j->n_devs; i++)
            total += needs_copy(&j->plans[s], j->devs[i]) ? j->plans[s].info.file_len : 0;
    step_begin(j, "reserve", total);
    for (size_t s = 0; s < j->n_shards; s++) {
        shard_plan *p = &j->plans[s];
        for (size_t i = 0; i < j->n_devs; i++) {
            if (!needs_copy(p, j->devs[i]))
                continue;
            size_t k = p->n_obj;
            if ((rc = job_cancelled(j, err)))
                return rc;
            if (resume_take(j, s, j->devs[i], &p->obj[k], &p->done[k]))
                p->resumed = true;
            else if ((rc = tv__alloc_reserve(j->st->reg, j->devs[i], p->info.file_len, &p->obj[k],
                                             err)))
                return rc;
            p->dev_id[k] = j->devs[i];
            p->n_obj++;
            j->to_write += p->obj[k].alloc_len;
            step_advance(j, s, p->info.file_len);
        }
    }
    /* Every reservation is named by a record before a byte is written. */
    resume_drop_rest(j);
    resume_save(j, true);
    step_end(j);
    return job_cancelled(j, err);
}

/* 3, one shard: its canonical bytes + zero padding go to every new object,
 * hashed on the way; then the source is checked unchanged and the header
 * as written compared with the validated one. */
static int write_shard(import_job *j, pipeline *w, size_t s, tv_error *err)
{
    shard_plan *p = &j->plans[s];
    size_t n_new = 0, chunk = j->chunk;
    target tg[TV__IMPORT_MAX_DEVICES];
    uint64_t tg_alloc[TV__IMPORT_MAX_DEVICES];
    uint64_t start = UINT64_MAX; /* written and flushed by an interrupted import, on every target */
    uint64_t alloc = 0;          /* the largest extent; replicas may differ in object_align */
    uint64_t canon = p->info.file_len, hdr_end = p->info.data_off;
    tv__src_shard sf = {.fd = -1};
    uint8_t *hdr_copy = NULL;
    tv__sha256 h, hh;
    int rc;

    for (size_t k = 0; k < p->n_obj; k++) {
        if (p->reused[k])
            continue;
        tv__store_device(j->st, p->dev_id[k], true, &tg[n_new].dev, NULL);
        tg[n_new].off = p->obj[k].base_off;
        tg_alloc[n_new++] = p->obj[k].alloc_len;
        if (p->done[k] < start)
            start = p->done[k];
        if (p->obj[k].alloc_len > alloc)
            alloc = p->obj[k].alloc_len;
    }
    if (n_new == 0)
        return 0;
    if ((rc = tv__src_shard_open(j->src, s, &p->info, &sf, err)))
        return rc;
    if (!(hdr_copy = malloc((size_t)hdr_end))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory for the %llu-byte header",
                        (unsigned long long)hdr_end);
        goto out_source;
    }
    if ((rc = hashes_init(&h, &hh, err)))
        goto out_hdr;
    /* The pipeline's buffers are free for the re-hash once it drained. */
    if (start && !(rc = pipeline_wait(w, true, err)) &&
        !(rc = resume_rehash(j, s, tg[0].dev, tg[0].off, start, &h, &hh, hdr_copy, err))) {
        j->r.bytes_resumed += start < canon ? start : canon;
        uint64_t sub = 0;
        for (size_t k = 0; k < n_new; k++)
            sub += start < tg_alloc[k] ? start : tg_alloc[k];
        step_advance(j, s, sub);
        tv__log(TV_LOG_INFO,
                "import of model '%s': shard '%s': %llu of %llu bytes resumed from the device",
                j->model, p->info.name, (unsigned long long)(start < canon ? start : canon),
                (unsigned long long)canon);
    }
    for (uint64_t off = start; !rc && off < alloc; off += chunk) {
        if ((rc = job_cancelled(j, err)))
            break;
        wbuf *b = pipeline_acquire(w);
        if (!b) {
            rc = pipeline_wait(w, true, err);
            break;
        }
        size_t n = (size_t)(alloc - off < chunk ? alloc - off : chunk);
        size_t payload = off >= canon ? 0 : (size_t)(canon - off < n ? canon - off : n);
        /* Buffered: ask for the chunk after this one now, so the disk reads
         * it while this one is read, hashed and written. */
        if (off + n < canon)
            tv__src_shard_willneed(&sf, off + n, chunk);
        b->src = payload ? &sf : NULL;
        b->si = &p->info;
        b->src_off = off;
        b->payload = payload;
        b->h = &h;
        b->hh = off < hdr_end ? &hh : NULL;
        b->hdr = hdr_copy + off;
        b->hdr_n = off < hdr_end ? (size_t)(hdr_end - off < payload ? hdr_end - off : payload) : 0;
        b->len = n;
        b->shard = s;
        b->end = off + n;
        b->th = j->thash;
        b->n_targets = 0;
        uint64_t sub = 0;
        for (size_t k = 0; k < n_new; k++) {
            if (off >= tg_alloc[k])
                continue;
            size_t tl = (size_t)(tg_alloc[k] - off < n ? tg_alloc[k] - off : n);
            b->t[b->n_targets++] = (target){.dev = tg[k].dev, .off = tg[k].off + off, .len = tl};
            sub += tl;
        }
        pipeline_submit(w);
        step_advance(j, s, sub);
        j->since_save += n;
        if (j->resumable &&
            (now_s() - j->last_save >= RESUME_EVERY_S || j->since_save >= RESUME_EVERY_LEN) &&
            (rc = resume_checkpoint(j, w, err)))
            break;
        if (!j->crashed_mid && j->step_done * 2 >= j->to_write) {
            j->crashed_mid = true;
            tv__crash_point("write");
        }
    }
    /* Readers still use sf, the hasher h, hh and hdr_copy, until they
     * caught up with this shard. */
    int prc = pipeline_wait(w, false, rc ? NULL : err);
    if (!rc)
        rc = prc;
    char sha_hex[65], hdr_hex[65];
    hashes_final(&h, &hh, sha_hex, hdr_hex);
    if (rc || (rc = tv__src_shard_check(&sf, err)))
        goto out_hdr;
    note_file(j, s, &sf);
    tv__src_shard_close(&sf);
    /* What is published must describe the bytes written: re-parse the
     * header exactly as written and compare it with the validated one. */
    if ((rc = same_header(j->ck, s, hdr_copy, p, err)))
        goto out_hdr;
    if (p->have_sha && strcmp(p->sha_hex, sha_hex) != 0) {
        rc = tv__seterr(err, TV_E_SOURCE_CHANGED, "shard '%s' changed content during import",
                        p->info.name);
        goto out_hdr;
    }
    /* A pull knows every shard's hash from the catalog: bytes that differ
     * (a peer serving bad data) fail here, before anything is published. */
    size_t pf = j->o->pull ? tv__src_pull_find(j->o->pull, p->info.name) : SIZE_MAX;
    const char *want = pf != SIZE_MAX ? j->o->pull->files[pf].sha256 : NULL;
    if (want && strcmp(want, sha_hex) != 0) {
        rc = tv__seterr(err, TV_E_HASH_MISMATCH, "shard '%s' from %s has sha256 %s; %s says %s",
                        p->info.name,
                        j->o->pull->files[pf].url ? j->o->pull->files[pf].url : "memory", sha_hex,
                        j->o->pull->hub ? "the Hub's listing" : "the catalog", want);
        if (!p->resumed)
            tv__src_pull_bad(j->o->pull, pf, rc); /* else the earlier source may be at fault */
        goto out_hdr;
    }
    memcpy(p->sha_hex, sha_hex, sizeof(sha_hex));
    memcpy(p->header_sha_hex, hdr_hex, sizeof(hdr_hex));
    p->have_sha = true;
out_hdr:
    free(hdr_copy);
out_source:
    tv__src_shard_close(&sf);
    return rc;
}

/* 3. Write every new object, shard by shard, through the pipeline. */
static int step_write(import_job *j, tv_error *err)
{
    pipeline w;
    int rc;
    step_begin(j, "write", j->to_write);
    if ((rc = job_cancelled(j, err)))
        return rc;
    if ((rc = pipeline_start(&w, j->bufs, j->chunk, err)))
        goto out;
    for (size_t s = 0; s < j->n_shards && !rc; s++)
        rc = write_shard(j, &w, s, err);
    if (!rc)
        rc = pipeline_wait(&w, true, err);
out:
    j->r.bytes_written = pipeline_bytes_written(&w); /* drained, when it counts */
    pipeline_stop(&w); /* joins the threads started, whatever happened */
    if (!rc)
        step_end(j);
    return rc;
}

/* Bytes of new objects on device dev. */
static uint64_t new_bytes_on(const import_job *j, int64_t dev)
{
    uint64_t n = 0;
    for (size_t s = 0; s < j->n_shards; s++)
        for (size_t k = 0; k < j->plans[s].n_obj; k++)
            if (!j->plans[s].reused[k] && j->plans[s].dev_id[k] == dev)
                n += j->plans[s].obj[k].alloc_len;
    return n;
}

/* 4. Flush every device written. */
static int step_flush(import_job *j, tv_error *err)
{
    int rc;
    step_begin(j, "flush", j->to_write);
    if ((rc = job_cancelled(j, err)))
        return rc;
    for (size_t i = 0; i < j->n_devs; i++) {
        tv__dev *d;
        if ((rc = job_cancelled(j, err)) ||
            (rc = tv__store_device(j->st, j->devs[i], true, &d, err)) ||
            (rc = tv__dev_flush(d, err)))
            return rc;
        step_advance(j, TV__IMPORT_NO_SHARD, new_bytes_on(j, j->devs[i]));
    }
    step_end(j);
    return 0;
}

/* 5. Verify bounds; strict mode reads every new object back. */
static int step_verify(import_job *j, tv_error *err)
{
    int rc;
    step_begin(j, "verify", j->to_write);
    if ((rc = job_cancelled(j, err)))
        return rc;
    for (size_t s = 0; s < j->n_shards; s++) {
        shard_plan *p = &j->plans[s];
        for (size_t k = 0; k < p->n_obj; k++) {
            if (p->reused[k])
                continue;
            tv__reg_device row;
            if ((rc = job_cancelled(j, err)) ||
                (rc = tv__reg_device_get(j->st->reg, p->dev_id[k], &row, err)))
                return rc;
            uint64_t end;
            if (tv__add_u64(p->obj[k].base_off, p->obj[k].alloc_len, &end) ||
                p->obj[k].base_off < row.data_off || end > row.region_off + row.region_len ||
                p->obj[k].canonical_len != p->info.file_len)
                return tv__seterr(err, TV_E_INTERNAL, "object %lld lies outside its region",
                                  (long long)p->obj[k].id);
            if (!j->o->strict) {
                step_advance(j, s, p->obj[k].alloc_len);
                continue;
            }
            tv__dev *d;
            char what[160];
            snprintf(what, sizeof(what), "shard '%s' on device %lld", p->info.name,
                     (long long)p->dev_id[k]);
            if ((rc = tv__store_device(j->st, p->dev_id[k], true, &d, err)) ||
                (rc = verify_extent(j, s, d, p->obj[k].base_off, p->obj[k].canonical_len,
                                    p->obj[k].alloc_len, p->sha_hex, j->bufs, j->chunk, what, err)))
                return rc;
        }
    }
    step_end(j);
    return 0;
}

/* ---- sidecar files ---- */

/* The source's sidecar files, read once the checkpoint is validated and
 * before anything is written: over the total cap fails here. */
static int collect_sidecars(import_job *j, tv_error *err)
{
    const tv__sidecar_caps caps = {.max_len = j->o->sidecar_max_len,
                                   .total_len = j->o->sidecar_total_len};
    int rc = tv__src_sidecars(j->src, &caps, &j->side, err);
    if (rc)
        return rc;
    for (size_t i = 0; i < j->side.n_skipped; i++) {
        tv__log(TV_LOG_WARN, "import of model '%s': sidecar file %s", j->model, j->side.skipped[i]);
        if (j->o->on_skipped)
            j->o->on_skipped(j->o->skipped_ctx, j->side.skipped[i]);
    }
    return job_cancelled(j, err);
}

/* Inside publish's transaction: the files with the generation. */
static int publish_sidecars(import_job *j, int64_t gen_id, tv_error *err)
{
    if (!j->side.n)
        return 0;
    tv__reg_file_in *in = calloc(j->side.n, sizeof(*in));
    if (!in)
        return tv__seterr(err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < j->side.n; i++)
        in[i] = (tv__reg_file_in){.path = j->side.files[i].path,
                                  .data = j->side.files[i].data,
                                  .len = j->side.files[i].len,
                                  .sha256 = j->side.files[i].sha256};
    int rc = tv__reg_generation_files_add(j->st->reg, gen_id, in, j->side.n, err);
    free(in);
    return rc;
}

/* 6. Publish last, in one transaction: the objects, the generation, its
 * shards, bindings and tensors. */
static int publish(import_job *j, tv_error *err)
{
    tv__store *st = j->st;
    tv_checkpoint *ck = j->ck;
    shard_plan *plans = j->plans;
    int rc;
    tv_tensor_info *infos = NULL;
    size_t n_t = tv_checkpoint_n_tensors(ck);
    if (!(infos = malloc(sizeof(*infos) * (n_t ? n_t : 1))))
        return tv__seterr(err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n_t; i++)
        tv_checkpoint_tensor(ck, i, &infos[i]);
    if ((rc = tv__reg_begin(st->reg, err)))
        goto out;
    for (size_t s = 0; s < j->n_shards; s++)
        for (size_t k = 0; k < plans[s].n_obj; k++)
            if (!plans[s].reused[k] &&
                (rc = tv__reg_object_commit(st->reg, plans[s].obj[k].id, plans[s].sha_hex, err)))
                goto fail_tx;
    tv__reg_generation gen;
    /* total_bytes is the canonical bytes (every shard file, headers included:
     * what the devices hold and the API's ImportResult.total_bytes), not the
     * tensor data alone. */
    if ((rc = tv__reg_generation_create_as(st->reg, j->model, j->real_src, j->r.bytes_total,
                                           j->o->generation, &gen, err)))
        goto fail_tx;
    for (size_t s = 0; s < j->n_shards; s++) {
        tv__reg_shard_in in = {
            .idx = (uint32_t)s,
            .name = plans[s].info.name,
            .file_len = plans[s].info.file_len,
            .header_len = plans[s].info.header_len,
            .sha256_hex = plans[s].sha_hex,
            .header_sha256_hex = plans[s].header_sha_hex,
        };
        int64_t shard_id;
        if ((rc = tv__reg_shard_add(st->reg, gen.id, &in, &shard_id, err)) ||
            (rc = record_file(j, s, shard_id, err)))
            goto fail_tx;
        for (size_t k = 0; k < plans[s].n_obj; k++)
            if ((rc = tv__reg_shard_bind(st->reg, shard_id, plans[s].obj[k].id, err)))
                goto fail_tx;
    }
    if ((rc = tv__reg_tensors_insert_hashed(st->reg, gen.id, infos, n_t, tv__thash_hexes(j->thash),
                                            err)) ||
        (rc = publish_sidecars(j, gen.id, err)) ||
        (rc = tv__reg_generation_set_state(st->reg, gen.id, TV__GEN_READY, err)))
        goto fail_tx;
    tv__crash_point("publish");
    if ((rc = tv__reg_commit(st->reg, err)))
        goto out;
    j->r.generation = gen.number;
    goto out;
fail_tx:
    tv__reg_rollback(st->reg);
out:
    free(infos);
    return rc;
}

/* 6. Publish (the last point where cancel is heard), write the snapshot,
 * then activate when asked. Once published the objects are kept, whatever
 * follows. */
static int step_publish(import_job *j, tv_error *err)
{
    int rc;
    step_begin(j, "publish", j->r.bytes_total);
    if ((rc = job_cancelled(j, err)) || (rc = publish(j, err)))
        return rc;
    j->published = true; /* from here on the objects are committed: keep them */
    tv__crash_point("import.commit");
    /* The generation is published (ready, not active). Its snapshot: a
     * failure is repaired by the next writer open, so it only warns.
     * --activate then goes through the activation protocol (registry and
     * pointer together, an error changes neither): on failure the import
     * reports it and the generation stays ready and inactive. */
    tv_error se = {0};
    if (tv__store_write_snapshot(j->st, j->model, j->r.generation, &se))
        tv__log(TV_LOG_WARN, "import: model '%s' generation %lld: snapshot: %s", j->model,
                (long long)j->r.generation, se.msg);
    if (j->o->activate && (rc = tv__store_activate(j->st, j->model, j->r.generation, err))) {
        if (err) {
            char msg[sizeof err->msg + 600];
            snprintf(msg, sizeof msg,
                     "model '%.256s' generation %lld was imported (ready) but not activated: %s",
                     j->model, (long long)j->r.generation, err->msg);
            memcpy(err->msg, msg, sizeof err->msg - 1);
            err->msg[sizeof err->msg - 1] = '\0';
        }
        return rc;
    }
    step_end(j);
    return 0;
}

int tv__import(tv__store *st, const char *model, const char *src, const tv__import_opts *o,
               tv__import_result *res, tv_error *err)
{
    static const tv__import_opts dflt = {0};
    import_job *j = NULL;
    double t0 = now_s();
    int rc;

    if (!st || !model || !src || st->lock_fd < 0)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "import needs a writer store, a model and a source");
    if ((rc = tv__name_valid(model, "model name", err)))
        return rc;
    if (!(j = calloc(1, sizeof(*j))))
        return tv__seterr(err, -ENOMEM, "out of memory");
    j->st = st;
    j->model = model;
    j->o = o ? o : &dflt;
    j->step = "resolve";
    bool remote = j->o->pull || tv__src_is_url(src);
    uint64_t chunk = j->o->chunk_len ? j->o->chunk_len
                     : remote        ? TV__IMPORT_REMOTE_CHUNK
                                     : TV__IMPORT_DEFAULT_CHUNK;
    if (tv__align_up_u64(chunk, BUF_ALIGN, &chunk) || chunk > SIZE_MAX / N_BUFS) {
        rc = tv__seterr(
            err, TV_E_INVALID_ARG,
            "import chunk_len %zu: rounded up to a multiple of %d, %d of them overflow the address space",
            j->o->chunk_len, BUF_ALIGN, N_BUFS);
        goto out;
    }
    j->chunk = (size_t)chunk;
    j->resumable = j->o->resume_save && remote;
    j->started_ns = wall_ns();
    j->last_save = now_s();
    if (j->resumable && j->o->resume) {
        json_error_t je;
        j->resume = json_loads(j->o->resume, JSON_REJECT_DUPLICATES, &je);
        if (!json_is_object(j->resume)) {
            tv__log(TV_LOG_WARN,
                    "import of model '%s': ignoring a resume record that is not a JSON object",
                    j->model);
            json_decref(j->resume);
            j->resume = NULL;
        }
    }

    if ((rc = step_resolve(j, src, err)) || (rc = collect_sidecars(j, err)) ||
        (rc = step_dedup(j, err))) {
        /* The record taken over stays for the next try only when one may help. */
        if (!transient(rc)) {
            resume_drop_rest(j);
            resume_save(j, false);
        }
        goto out;
    }
    if ((rc = step_reserve(j, err)))
        goto fail_release;
    tv__crash_point("reserve");
    if ((rc = step_write(j, err)) || (rc = step_flush(j, err)))
        goto fail_release;
    tv__crash_point("flush");
    if ((rc = step_verify(j, err)) || (rc = step_publish(j, err)))
        goto fail_release;
    resume_save(j, false); /* published: nothing to resume */
    j->r.n_shards = j->n_shards;
    j->r.n_tensors = tv_checkpoint_n_tensors(j->ck);
    j->r.seconds = now_s() - t0;
    j->r.n_files = j->side.n;
    j->r.n_skipped = j->side.n_skipped;
    if (res)
        *res = j->r;
    goto out;

fail_release:
    if (!j->published && j->resumable && j->saved && transient(rc)) {
        tv__log(
            TV_LOG_INFO,
            "import of model '%s' stopped (%s): its reservations are kept, the same import again resumes where the last flush left it",
            j->model, tv_err_name(rc));
    } else {
        if (!j->published)
            release_reservations(st, j->plans, j->plans ? j->n_shards : 0);
        resume_drop_rest(j);
        resume_save(j, false);
    }
out:
    json_decref(j->resume);
    free(j->bufs);
    free(j->plans);
    tv__thash_free(j->thash);
    tv_checkpoint_close(j->ck);
    tv__src_free(j->src);
    tv__sidecars_clear(&j->side);
    free(j);
    return rc;
}
