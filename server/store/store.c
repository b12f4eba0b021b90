/* Store directories: init, open with the writer lock, validated device
 * access and a device's status. See store.h for the invariants. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "store/snapbuild.h"
#include "store/store.h"
#include "util/hex.h"
#include "util/sys.h"

#define REGISTRY_FILE "registry.db"
#define LOCK_FILE     "lock"

static int path_join(char *out, size_t len, const char *dir, const char *name, tv_error *err)
{
    if ((size_t)snprintf(out, len, "%s/%s", dir, name) >= len)
        return tv__seterr(err, -ENAMETOOLONG, "%s/%s: path too long", dir, name);
    return 0;
}

/* Says plainly when an errno means the store's filesystem is full. */
static const char *full_hint(int neg_errno)
{
    if (neg_errno == -ENOSPC)
        return " (no space left on the store's filesystem)";
    if (neg_errno == -EDQUOT)
        return " (disk quota exceeded on the store's filesystem)";
    return "";
}

static bool is_errno(int rc)
{
    return rc < 0 && rc > -1000; /* TV_E_* codes start at -1000 */
}

/* Opens DIR/lock without following a symlink or blocking on a FIFO, creates
 * it (0600) when absent (*created), and takes the writer flock. A lock that
 * is not a regular file is an error naming it; it is never truncated. */
static int take_lock(const char *dir, int *fd_out, bool *created, tv_error *err)
{
    char p[4096];
    int rc = path_join(p, sizeof(p), dir, LOCK_FILE, err);
    if (rc)
        return rc;
    const int base = O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
    int fd = tv__sys_open(p, base, 0);
    if (fd == -ENOENT) {
        fd = tv__sys_open(p, base | O_CREAT | O_EXCL, 0600);
        if (fd >= 0)
            *created = true;
        else if (fd == -EEXIST) /* another writer made it just now */
            fd = tv__sys_open(p, base, 0);
    }
    if (fd == -ELOOP)
        return tv__seterr(err, fd, "lock %s is a symlink (never followed); remove it", p);
    if (fd < 0)
        return tv__seterr(err, fd, "lock %s: %s%s", p, strerror(-fd), full_hint(fd));
    struct stat sb;
    if (tv__sys.fstat(fd, &sb) != 0) {
        rc = tv__seterr(err, -errno, "lock %s: fstat: %s", p, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        const char *kind = S_ISFIFO(sb.st_mode)   ? "a FIFO"
                           : S_ISDIR(sb.st_mode)  ? "a directory"
                           : S_ISSOCK(sb.st_mode) ? "a socket"
                           : S_ISCHR(sb.st_mode)  ? "a character device"
                           : S_ISBLK(sb.st_mode)  ? "a block device"
                                                  : "not a file";
        rc = tv__seterr(err, TV_E_INVALID_ARG, "lock %s is not a regular file (%s); remove it", p,
                        kind);
        goto fail;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        rc = tv__seterr(err, -errno, "lock %s: fcntl: %s", p, strerror(errno));
        goto fail;
    }
    if (tv__sys.flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        char holder[32] = "";
        size_t n = 0;
        if (tv__sys_pread_full(fd, holder, sizeof(holder) - 1, 0, &n))
            n = 0;
        holder[n] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        if (e == EWOULDBLOCK)
            rc = tv__seterr(err, TV_E_LOCKED, "store %s is locked by another writer (pid %s)", dir,
                            holder[0] ? holder : "unknown");
        else
            rc = tv__seterr(err, -e, "flock %s: %s", p, strerror(e));
        goto fail;
    }
    /* A failed store init unlinks the lock it created: holding the flock
     * counts only while the path still names this inode. */
    struct stat now;
    if (lstat(p, &now) != 0 || now.st_ino != sb.st_ino || now.st_dev != sb.st_dev) {
        rc =
            tv__seterr(err, TV_E_LOCKED, "store %s: lock %s was replaced while locking it", dir, p);
        goto fail;
    }
    char pid[32];
    int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
    if (tv__sys.ftruncate(fd, 0) != 0) {
        rc = tv__seterr(err, -errno, "lock %s: ftruncate: %s", p, strerror(errno));
        goto fail;
    }
    if ((rc = tv__sys_pwrite_full(fd, pid, (size_t)n, 0))) {
        tv__seterr(err, rc, "lock %s: writing the pid: %s%s", p, strerror(-rc), full_hint(rc));
        goto fail;
    }
    *fd_out = fd;
    return 0;
fail:
    tv__sys.close(fd); /* releases the flock if it was taken */
    return rc;
}

void tv__store_close(tv__store *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->n_devs; i++)
        tv__dev_close(st->devs[i].dev);
    free(st->devs);
    tv__reg_close(st->reg);
    if (st->lock_fd >= 0)
        tv__sys.close(st->lock_fd); /* releases the flock */
    free(st->dir);
    free(st);
}

/* What an existing directory without registry.db is: a store that lost its
 * registry (it has a lock or snapshots/) or no store at all. Called by
 * tv__store_check_dir once dir is known to be a directory. */
static int no_registry(const char *dir, const char *reg_path, tv_error *err)
{
    char p[4096];
    struct stat sb;
    bool store_like = false;
    if (!path_join(p, sizeof(p), dir, LOCK_FILE, NULL) && lstat(p, &sb) == 0)
        store_like = true;
    if (!path_join(p, sizeof(p), dir, "snapshots", NULL) && lstat(p, &sb) == 0)
        store_like = true;
    if (store_like)
        return tv__seterr(err, TV_E_REGISTRY,
                          "store %s: registry %s is missing; restore it (never re-created)", dir,
                          reg_path);
    return tv__seterr(err, TV_E_NOT_FOUND,
                      "%s is not a tensorvault store (no %s; run 'tensorvault store init')", dir,
                      REGISTRY_FILE);
}

int tv__store_check_dir(const char *dir, tv_error *err)
{
    char p[4096];
    struct stat sb;
    int rc;
    if (!dir)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL store directory");
    if (stat(dir, &sb) < 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return tv__seterr(
                err, TV_E_NOT_FOUND,
                "%s is not a tensorvault store (no such directory; run 'tensorvault store init')",
                dir);
        return tv__seterr(err, -errno, "%s: %s", dir, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode))
        return tv__seterr(err, TV_E_NOT_FOUND, "%s is not a tensorvault store (not a directory)",
                          dir);
    if ((rc = path_join(p, sizeof(p), dir, REGISTRY_FILE, err)))
        return rc;
    if (lstat(p, &sb) < 0)
        return no_registry(dir, p, err);
    if (!S_ISREG(sb.st_mode))
        return tv__seterr(err, TV_E_REGISTRY, "store %s: registry %s is not a regular file", dir,
                          p);
    return 0;
}

/* Opens the store in dir. Readers open the registry read-only (never
 * creating, migrating or writing it: a read-only mount works); writers take
 * the lock first. create (store init of a new store only) lets the registry
 * be created; *created_lock reports a lock file made here. */
static int open_common(const char *dir, unsigned flags, bool create, bool *created_lock,
                       tv__store **out, tv_error *err)
{
    int rc;
    char p[4096];
    bool lock_made = false;
    *out = NULL;
    tv__store *st = calloc(1, sizeof(*st));
    if (!st)
        return tv__seterr(err, -ENOMEM, "out of memory");
    st->lock_fd = -1;
    if (!(st->dir = strdup(dir))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = path_join(p, sizeof(p), dir, REGISTRY_FILE, err)) ||
        (!create && (rc = tv__store_check_dir(dir, err))))
        goto fail;
    if ((flags & TV__STORE_WRITE) && (rc = take_lock(dir, &st->lock_fd, &lock_made, err)))
        goto fail;
    unsigned rflags = create ? TV__REG_CREATE : (flags & TV__STORE_WRITE) ? 0 : TV__REG_READONLY;
    if ((rc = tv__reg_open_ex(p, rflags, &st->reg, err)))
        goto fail;
    if ((flags & TV__STORE_WRITE) && (rc = tv__reg_reclaim_writing(st->reg, &st->reclaimed, err)))
        goto fail;
    if (st->reclaimed.n_objects || st->reclaimed.n_generations)
        tv__log(TV_LOG_WARN,
                "store %s: reclaimed %zu reservations, %zu importing generations failed", dir,
                st->reclaimed.n_objects, st->reclaimed.n_generations);
    if (flags & TV__STORE_WRITE) {
        tv_error se = {0};
        if (tv__store_sync_snapshots(st, &se))
            tv__log(TV_LOG_WARN, "store %s: snapshot repair: %s", dir, se.msg);
    }
    if (created_lock)
        *created_lock = lock_made;
    *out = st;
    return 0;
fail:
    tv__store_close(st);
    if (lock_made && create && !path_join(p, sizeof(p), dir, LOCK_FILE, NULL))
        tv__sys.unlink(p);
    return rc;
}

int tv__store_open(const char *dir, unsigned flags, tv__store **out, tv_error *err)
{
    if (!dir || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    return open_common(dir, flags, false, NULL, out, err);
}

/* The NVMe identity (what the label records) plus the claim keys that
 * recognise the device under any other path ("claim": tv__dev_claim_keys). */
static int identity_json(const tv__dev *d, const tv__dev_claim *c, char *out, size_t len)
{
    char nguid[33], eui[17];
    tv__hex_encode(d->ident.nguid, 16, false, nguid);
    tv__hex_encode(d->ident.eui64, 8, false, eui);
    json_t *keys = json_array();
    for (size_t i = 0; keys && i < c->n_keys; i++)
        json_array_append_new(keys, json_string(c->keys[i]));
    json_t *o =
        json_pack("{s:s,s:s,s:I,s:s,s:s,s:o}", "serial", d->ident.serial, "model", d->ident.model,
                  "nsid", (json_int_t)d->ident.nsid, "nguid", nguid, "eui64", eui, "claim", keys);
    if (!o)
        return -ENOMEM;
    char *s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(o);
    if (!s)
        return -ENOMEM;
    int rc = strlen(s) < len ? 0 : -ENAMETOOLONG;
    if (!rc)
        strcpy(out, s);
    free(s);
    return rc;
}

/* The claim keys a registry row recorded at registration (none for rows of
 * older builds). */
static void row_claim(const tv__reg_device *row, tv__dev_claim *c)
{
    memset(c, 0, sizeof(*c));
    json_t *o = json_loads(row->identity, 0, NULL);
    json_t *keys = json_object_get(o, "claim");
    for (size_t i = 0; i < json_array_size(keys) && c->n_keys < TV__DEV_CLAIM_MAX_KEYS; i++) {
        const char *k = json_string_value(json_array_get(keys, i));
        if (k && strlen(k) < TV__DEV_CLAIM_KEY_LEN)
            strcpy(c->keys[c->n_keys++], k);
    }
    json_decref(o);
}

/* The label the registry row says should be on the device. */
static int expected_label(const tv__reg_device *row, tv__label *l, tv_error *err)
{
    tv__snap_device_in r;
    tv__dev_record rec;
    int rc = tv__store_device_record(row, &r, err);
    if (rc)
        return rc;
    tv__snap_device_in_record(&r, &rec);
    tv__label_expected(&rec, l);
    return 0;
}

int tv__store_device(tv__store *st, int64_t id, bool write, tv__dev **out, tv_error *err)
{
    int rc;
    tv__reg_device row;
    tv__label on_disk, want;
    if (write && st->lock_fd < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "store opened read-only");
    for (size_t i = 0; i < st->n_devs; i++) {
        if (st->devs[i].id == id && (!write || st->devs[i].writable)) {
            *out = st->devs[i].dev;
            return 0;
        }
    }
    if ((rc = tv__reg_device_get(st->reg, id, &row, err)))
        return rc;
    tv__dev *d = NULL;
    /* An image is registered by its real path: a symlink found there later
     * was planted, not made by us, and is not followed. */
    unsigned oflags = (write ? TV__DEV_O_RDWR : TV__DEV_O_RDONLY) |
                      (!strcmp(row.kind, "file") ? TV__DEV_O_NOFOLLOW : 0);
    if ((rc = tv__dev_open(row.path, oflags, &d, err)))
        return rc;
    if ((rc = tv__label_read(d, row.region_off, &on_disk, err)) ||
        (rc = expected_label(&row, &want, err)) ||
        (rc = tv__label_check(&on_disk, &want, d, err))) {
        tv__dev_close(d);
        if (is_errno(rc) && rc != -ENOMEM) /* EIO and friends stay I/O errors */
            return tv__seterr_wrap(err, rc, "device %lld (%s): reading the label", (long long)id,
                                   row.path);
        if (rc != TV_E_DEVICE_MISMATCH && rc != -ENOMEM && rc != TV_E_REGISTRY)
            return tv__seterr_wrap(err, TV_E_DEVICE_MISMATCH, "device %lld (%s): label unreadable",
                                   (long long)id, row.path);
        return rc;
    }
    tv__store_dev *nd = realloc(st->devs, sizeof(*nd) * (st->n_devs + 1));
    if (!nd) {
        tv__dev_close(d);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    st->devs = nd;
    st->devs[st->n_devs++] = (tv__store_dev){.id = id, .dev = d, .writable = write};
    *out = d;
    return 0;
}

const char *tv__store_device_status(tv__store *st, int64_t id, tv_error *err)
{
    tv__dev *d;
    int rc = tv__store_device(st, id, false, &d, err);
    if (rc == 0)
        return "ok";
    if (rc == -ENOENT)
        return "missing";
    if (rc == TV_E_DEVICE_MISMATCH)
        return "mismatch";
    return "error";
}

int tv__store_find_device(tv__store *st, const char *spec, int64_t *id, tv_error *err)
{
    tv__reg_device *devs = NULL;
    size_t n = 0;
    int rc = tv__reg_device_list(st->reg, &devs, &n, err);
    if (rc)
        return rc;
    char real[4096];
    const char *rp = realpath(spec, real) ? real : spec;
    char *end;
    long long num = strtoll(spec, &end, 10);
    rc = tv__seterr(err, TV_E_NOT_FOUND, "no device '%s' in store %s", spec, st->dir);
    for (size_t i = 0; i < n; i++) {
        char rr[4096];
        const char *rowp = realpath(devs[i].path, rr) ? rr : devs[i].path;
        if ((*end == '\0' && num == devs[i].id) || !strcmp(spec, devs[i].uuid) ||
            !strcmp(rp, rowp)) {
            *id = devs[i].id;
            rc = 0;
            break;
        }
    }
    free(devs);
    return rc;
}

/* -EEXIST when d is already a device of this store: the same storage by
 * identity (claim keys recorded at registration or computed now from the
 * registered path) or by real path, or a label of this store's uuid. */
static int check_not_registered(tv__store *st, const tv__dev *d, const char *real,
                                const tv__dev_claim *mine, const tv__dev_scan *scan, bool fresh,
                                tv_error *err)
{
    tv__reg_device *devs = NULL;
    size_t n = 0;
    int rc = tv__reg_device_list(st->reg, &devs, &n, err);
    if (rc)
        return rc;
    char scan_uuid[37] = "";
    if (scan && scan->label_valid)
        tv__uuid_format(scan->label_uuid, scan_uuid);
    for (size_t i = 0; i < n && !rc; i++) {
        /* A file this call just created (O_EXCL) is a new inode: a key
         * recorded for a registered image deleted since may have been
         * reused by it, so only the path is compared. */
        tv__dev_claim theirs;
        row_claim(&devs[i], &theirs);
        bool same = !fresh && tv__dev_claim_same(mine, &theirs);
        const char *why = "the same device";
        if (!same && !fresh) {
            tv__dev *o = NULL;
            tv_error ignore;
            if (tv__dev_open(devs[i].path, TV__DEV_O_RDONLY | TV__DEV_O_NODIRECT, &o, &ignore) ==
                    0 &&
                tv__dev_claim_keys(o, &theirs, &ignore) == 0)
                same = tv__dev_claim_same(mine, &theirs);
            tv__dev_close(o);
        }
        if (!same && !strcmp(real, devs[i].path))
            same = true;
        if (!same && scan_uuid[0] && !strcmp(scan_uuid, devs[i].uuid)) {
            same = true;
            why = "its label";
        }
        if (same)
            rc = tv__seterr(err, -EEXIST, "%s is already device %lld of store %s (%s, %s)", d->path,
                            (long long)devs[i].id, st->dir, why, devs[i].path);
    }
    free(devs);
    return rc;
}

/* TV_E_DEVICE_IN_USE unless the scan found nothing or force is set. */
static int check_unclaimed(const tv__dev *d, const tv__dev_scan *s, uint64_t roff, uint64_t rlen,
                           bool force, tv_error *err)
{
    if (!s->label && !s->nonzero)
        return 0;
    char what[160];
    if (s->label && s->label_valid) {
        char u[37];
        tv__uuid_format(s->label_uuid, u);
        snprintf(what, sizeof(what), "the label of tensorvault store %s at offset %llu", u,
                 (unsigned long long)s->label_off);
    } else if (s->label) {
        snprintf(what, sizeof(what), "a damaged tensorvault label at offset %llu",
                 (unsigned long long)s->label_off);
    } else {
        snprintf(what, sizeof(what), "non-zero data at offset %llu",
                 (unsigned long long)s->nonzero_off);
    }
    if (force) {
        tv__log(TV_LOG_WARN, "%s holds %s: overwriting it (--force)", d->path, what);
        return 0;
    }
    return tv__seterr(err, TV_E_DEVICE_IN_USE,
                      "%s holds %s in region [%llu, %llu): not overwritten without --force",
                      d->path, what, (unsigned long long)roff, (unsigned long long)(roff + rlen));
}

/* What tv__store_init created, removed again when it fails (never what
 * was there before). */
typedef struct init_made {
    bool dir, reg, lock, image;
} init_made;

/* The store directory: created 0700 when missing (m->dir), else checked.
 * *new_store: it has no registry yet. A directory with snapshots/ or a lock
 * but no registry is a store that lost its registry: never start a new one
 * over it. A failure here has created nothing (the lost-registry check
 * runs only on a directory that was there): nothing is left to undo. */
static int init_dir(const char *dir, const char *reg_path, init_made *m, bool *new_store,
                    tv_error *err)
{
    struct stat sb;
    if (stat(dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode))
            return tv__seterr(err, -ENOTDIR, "store %s is not a directory", dir);
        if (sb.st_mode & 077)
            tv__log(TV_LOG_WARN,
                    "store directory %s has mode 0%o: others can reach it, chmod 700 it", dir,
                    (unsigned)(sb.st_mode & 0777));
    } else if (errno != ENOENT) {
        return tv__seterr(err, -errno, "store %s: %s", dir, strerror(errno));
    } else {
        if (tv__sys.mkdir(dir, 0700) != 0) {
            int rc = -errno;
            return tv__seterr(err, rc, "mkdir %s: %s%s", dir, strerror(-rc), full_hint(rc));
        }
        m->dir = true;
    }
    *new_store = lstat(reg_path, &sb) != 0;
    if (*new_store && !m->dir) {
        char p[4096];
        if ((!path_join(p, sizeof(p), dir, "snapshots", NULL) && lstat(p, &sb) == 0) ||
            (!path_join(p, sizeof(p), dir, LOCK_FILE, NULL) && lstat(p, &sb) == 0))
            return no_registry(dir, reg_path, err);
    }
    return 0;
}

/* Opens the device or image of o (the image created first when missing:
 * m->image) for writing, and its real path into real. An existing image is
 * used as it is, under the same claim rules as a device, when it has the
 * size asked. */
static int init_open_device(const tv__store_init_opts *o, init_made *m, tv__dev **d,
                            char real[4096], tv_error *err)
{
    const char *path = o->device;
    unsigned dflags = TV__DEV_O_RDWR;
    int rc;
    if (o->image) {
        path = o->image;
        dflags |= TV__DEV_O_NOFOLLOW;
        rc = tv__dev_create_image(o->image, o->image_size_bytes, err);
        if (rc == 0)
            m->image = true;
        else if (rc != -EEXIST)
            return rc;
    }
    if ((rc = tv__dev_open(path, dflags, d, err)))
        return rc;
    if (o->image && !m->image && (*d)->size_bytes != o->image_size_bytes)
        return tv__seterr(err, -EEXIST, "image %s exists with %llu bytes, not the %llu asked", path,
                          (unsigned long long)(*d)->size_bytes,
                          (unsigned long long)o->image_size_bytes);
    if (!realpath(path, real))
        return tv__seterr(err, -errno, "%s: %s", path, strerror(errno));
    return 0;
}

/* The region of d the store gets ([*roff, *roff + *rlen): o's, or from 1 MiB
 * to the end), and the claim: d's identity keys into *claim; d must be
 * neither a device of this store (refused even with force: its objects are
 * in the registry) nor, without o->force, hold a label or data in the
 * region (a fresh image is all holes: nothing to look at). */
static int init_claim(tv__store *st, const tv__store_init_opts *o, tv__dev *d, const char *real,
                      bool fresh, uint64_t *roff, uint64_t *rlen, tv__dev_claim *claim,
                      tv_error *err)
{
    int rc;
    *roff = o->region_off ? o->region_off : (1u << 20);
    /* An explicit offset is used as given or refused, never rounded. */
    if (o->region_off && o->region_off % d->io_align)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "region offset %llu is not a multiple of the io alignment %llu of %s",
                          (unsigned long long)o->region_off, (unsigned long long)d->io_align, real);
    if (tv__align_up_u64(*roff, d->io_align, roff))
        return tv__seterr(err, TV_E_OVERFLOW, "region offset overflows");
    *rlen = o->region_len;
    if (!*rlen)
        *rlen = d->size_bytes > *roff ? d->size_bytes - *roff : 0;
    if ((rc = tv__region_validate(d, *roff, *rlen, err)))
        return rc;
    tv__dev_scan scan;
    memset(&scan, 0, sizeof(scan));
    if ((rc = tv__dev_claim_keys(d, claim, err)) ||
        (!fresh && (rc = tv__dev_claim_scan(d, *roff, *rlen, &scan, err))))
        return rc;
    if ((rc = check_not_registered(st, d, real, claim, &scan, fresh, err)) ||
        (rc = check_unclaimed(d, &scan, *roff, *rlen, o->force, err)))
        return rc;
    return 0;
}

/* Labels d (a new store UUID) and registers it: the label first, the
 * registry row last, so a crash in between leaves a labelled but
 * unregistered device, which a retry refuses without --force (it cannot
 * tell it from another store's). *row: the row as registered. */
static int init_register(tv__store *st, tv__dev *d, const char *real, const tv__dev_claim *claim,
                         uint64_t roff, uint64_t rlen, tv__reg_device *row, tv_error *err)
{
    uint8_t uuid[16];
    tv__label l;
    int rc;
    if ((rc = tv__uuid_random(uuid, err)) || (rc = tv__label_init(&l, d, uuid, roff, rlen, err)))
        return rc;
    memset(row, 0, sizeof(*row));
    tv__uuid_format(uuid, row->uuid);
    snprintf(row->kind, sizeof(row->kind), "%s", tv__dev_kind_name(d->kind));
    if (strlen(real) >= sizeof(row->path))
        return tv__seterr(err, -ENAMETOOLONG, "%s: path too long", real);
    strcpy(row->path, real);
    if ((rc = identity_json(d, claim, row->identity, sizeof(row->identity))))
        return tv__seterr(err, rc, "device identity does not fit");
    row->lba_size = d->lba_size;
    row->io_align = d->io_align;
    row->object_align = d->object_align;
    row->size_bytes = d->size_bytes;
    row->region_off = l.region_off;
    row->region_len = l.region_len;
    row->data_off = tv__region_data_off(&l);
    int64_t id = 0;
    if ((rc = tv__label_write(d, &l, err)) || (rc = tv__reg_device_add(st->reg, row, &id, err)))
        return rc;
    row->id = id;
    return 0;
}

/* Removes what a failed tv__store_init created, never what was there
 * before. */
static void init_undo(const char *dir, const char *reg_path, const tv__store_init_opts *o,
                      const init_made *m)
{
    if (m->image)
        tv__sys.unlink(o->image);
    if (m->reg) {
        static const char *const sfx[] = {"", "-wal", "-shm", "-journal"};
        for (size_t i = 0; i < TV_ARRAY_LEN(sfx); i++) {
            char p[4200];
            if ((size_t)snprintf(p, sizeof(p), "%s%s", reg_path, sfx[i]) < sizeof(p))
                tv__sys.unlink(p);
        }
    }
    if (m->lock) {
        char p[4096];
        if (!path_join(p, sizeof(p), dir, LOCK_FILE, NULL))
            tv__sys.unlink(p);
    }
    if (m->dir)
        rmdir(dir);
}

int tv__store_init(const char *dir, const tv__store_init_opts *o, int64_t *device_id, tv_error *err)
{
    int rc;
    tv__store *st = NULL;
    tv__dev *d = NULL;
    init_made m = {0};
    bool new_store = false;
    char real[4096], reg_path[4096];
    uint64_t roff = 0, rlen = 0;
    tv__dev_claim claim;
    tv__reg_device row;
    if (!dir || !o || (!o->image == !o->device))
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "store init needs exactly one of --image or --device");
    if ((rc = path_join(reg_path, sizeof(reg_path), dir, REGISTRY_FILE, err)) ||
        (rc = init_dir(dir, reg_path, &m, &new_store, err)))
        return rc;
    m.reg = new_store;
    if ((rc = open_common(dir, TV__STORE_WRITE, new_store, &m.lock, &st, err))) {
        if (rc == TV_E_LOCKED) /* another init holds it: its files are not ours */
            m.reg = false;
        goto fail;
    }
    if ((rc = init_open_device(o, &m, &d, real, err)) ||
        (rc = init_claim(st, o, d, real, m.image, &roff, &rlen, &claim, err)) ||
        (rc = init_register(st, d, real, &claim, roff, rlen, &row, err)))
        goto fail;
    if (device_id)
        *device_id = row.id;
    if (o->row_out)
        *o->row_out = row;
    tv__dev_close(d);
    tv__store_close(st);
    return 0;
fail:
    tv__dev_close(d);
    tv__store_close(st);
    init_undo(dir, reg_path, o, &m);
    return rc;
}
