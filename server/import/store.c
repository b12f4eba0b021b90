/* Store directories: init, open with the writer lock, validated device
 * access. See store.h for the invariants. */
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

#include "import/snapbuild.h"
#include "import/store.h"
#include "util/sys.h"

#define REGISTRY_FILE "registry.db"
#define LOCK_FILE "lock"

static int path_join(char *out, size_t len, const char *dir, const char *name, tv_error *err)
{
    if ((size_t)snprintf(out, len, "%s/%s", dir, name) >= len)
        return tv__seterr(err, -ENAMETOOLONG, "%s/%s: path too long", dir, name);
    return 0;
}

static int take_lock(const char *dir, int *fd_out, tv_error *err)
{
    char p[4096];
    int rc = path_join(p, sizeof(p), dir, LOCK_FILE, err);
    if (rc)
        return rc;
    int fd = tv__sys.open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return tv__seterr(err, -errno, "%s: %s", p, strerror(errno));
    if (tv__sys.flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        char holder[32] = "";
        ssize_t n = tv__sys.pread(fd, holder, sizeof(holder) - 1, 0);
        holder[n > 0 ? n : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        tv__sys.close(fd);
        if (e == EWOULDBLOCK)
            return tv__seterr(err, TV_E_LOCKED,
                              "store %s is locked by another writer (pid %s)", dir,
                              holder[0] ? holder : "unknown");
        return tv__seterr(err, -e, "flock %s: %s", p, strerror(e));
    }
    char pid[32];
    int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
    if (tv__sys.ftruncate(fd, 0) == 0 && tv__sys.pwrite(fd, pid, (size_t)n, 0) != n) {
        /* The pid is only informational. */
    }
    *fd_out = fd;
    return 0;
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

static int open_common(const char *dir, unsigned flags, bool must_exist, tv__store **out,
                       tv_error *err)
{
    int rc;
    char p[4096];
    *out = NULL;
    tv__store *st = calloc(1, sizeof(*st));
    if (!st)
        return tv__seterr(err, -ENOMEM, "out of memory");
    st->lock_fd = -1;
    if (!(st->dir = strdup(dir))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = path_join(p, sizeof(p), dir, REGISTRY_FILE, err)))
        goto fail;
    struct stat sb;
    if (must_exist && stat(p, &sb) < 0) {
        rc = tv__seterr(err, TV_E_NOT_FOUND, "%s is not a tensorvault store (no %s; run "
                        "'tensorvault store init')", dir, REGISTRY_FILE);
        goto fail;
    }
    if ((flags & TV__STORE_WRITE) && (rc = take_lock(dir, &st->lock_fd, err)))
        goto fail;
    if ((rc = tv__reg_open(p, &st->reg, err)))
        goto fail;
    if ((flags & TV__STORE_WRITE) && (rc = tv__reg_reclaim_writing(st->reg, &st->reclaimed, err)))
        goto fail;
    if (st->reclaimed.n_objects || st->reclaimed.n_generations)
        tv__log(TV_LOG_WARN, "store %s: reclaimed %zu interrupted reservations, %zu importing "
                "generations marked failed", dir, st->reclaimed.n_objects,
                st->reclaimed.n_generations);
    if (flags & TV__STORE_WRITE) {
        tv_error se = {0};
        if (tv__store_sync_snapshots(st, &se))
            tv__log(TV_LOG_WARN, "store %s: snapshot repair: %s", dir, se.msg);
    }
    *out = st;
    return 0;
fail:
    tv__store_close(st);
    return rc;
}

int tv__store_open(const char *dir, unsigned flags, tv__store **out, tv_error *err)
{
    if (!dir || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    return open_common(dir, flags, true, out, err);
}

/* Identity JSON stored in the registry row <-> label fields. */
static void hexs(const uint8_t *b, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++)
        out[2 * i] = d[b[i] >> 4], out[2 * i + 1] = d[b[i] & 15];
    out[2 * n] = '\0';
}

static int identity_json(const tv__dev *d, char *out, size_t len)
{
    char nguid[33], eui[17];
    hexs(d->ident.nguid, 16, nguid);
    hexs(d->ident.eui64, 8, eui);
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:s}", "serial", d->ident.serial, "model",
                          d->ident.model, "nsid", (json_int_t)d->ident.nsid, "nguid", nguid,
                          "eui64", eui);
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

/* The label the registry row says should be on the device. */
static int expected_label(const tv__reg_device *row, tv__label *l, tv_error *err)
{
    tv__snap_device_in r;
    int rc = tv__store_device_record(row, &r, err);
    if (rc)
        return rc;
    memset(l, 0, sizeof(*l));
    memcpy(l->magic, TV_LABEL_MAGIC, 8);
    l->version = TV_LABEL_VERSION;
    l->label_len = TV_LABEL_LEN;
    memcpy(l->store_uuid, r.uuid, 16);
    l->lba_size = r.lba_size;
    l->io_align = r.io_align;
    l->region_off = r.region_off;
    l->region_len = r.region_len;
    l->object_align = r.object_align;
    l->device_size = r.size_bytes;
    l->dev_kind = r.kind;
    memcpy(l->serial, r.serial, sizeof(l->serial));
    memcpy(l->model, r.model, sizeof(l->model));
    l->nsid = r.nsid;
    memcpy(l->nguid, r.nguid, 16);
    memcpy(l->eui64, r.eui64, 8);
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
    if ((rc = tv__dev_open(row.path, write ? TV_DEV_O_RDWR : TV_DEV_O_RDONLY, &d, err)))
        return rc;
    if ((rc = tv__label_read(d, row.region_off, &on_disk, err)) ||
        (rc = expected_label(&row, &want, err)) ||
        (rc = tv__label_check(&on_disk, &want, d, err))) {
        tv__dev_close(d);
        if (rc != TV_E_DEVICE_MISMATCH && rc != -ENOMEM)
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

int tv__store_init(const char *dir, const tv__store_init_opts *o, int64_t *device_id,
                   tv_error *err)
{
    int rc;
    tv__store *st = NULL;
    tv__dev *d = NULL;
    bool created_image = false;
    char real[4096];
    if (!dir || !o || (!o->image == !o->device))
        return tv__seterr(err, TV_E_INVALID_ARG, "store init needs exactly one of --image or "
                          "--device");
    if (tv__sys.mkdir(dir, 0700) < 0 && errno != EEXIST)
        return tv__seterr(err, -errno, "mkdir %s: %s", dir, strerror(errno));
    if ((rc = open_common(dir, TV__STORE_WRITE, false, &st, err)))
        return rc;
    const char *path = o->device;
    if (o->image) {
        if ((rc = tv__dev_create_image(o->image, o->image_size, err)))
            goto fail;
        created_image = true;
        path = o->image;
    }
    if (!realpath(path, real)) {
        rc = tv__seterr(err, -errno, "%s: %s", path, strerror(errno));
        goto fail;
    }
    int64_t existing;
    tv_error e2;
    if (tv__store_find_device(st, real, &existing, &e2) == 0) {
        rc = tv__seterr(err, -EEXIST, "%s is already device %lld of store %s", real,
                        (long long)existing, dir);
        goto fail;
    }
    if ((rc = tv__dev_open(real, TV_DEV_O_RDWR, &d, err)))
        goto fail;
    uint64_t roff = o->region_off ? o->region_off : (1u << 20);
    /* An explicit offset is used as given or refused, never rounded. */
    if (o->region_off && o->region_off % d->io_align) {
        rc = tv__seterr(err, TV_E_INVALID_ARG,
                        "region offset %llu is not a multiple of the io alignment %llu of %s",
                        (unsigned long long)o->region_off, (unsigned long long)d->io_align, real);
        goto fail;
    }
    if (tv__align_up_u64(roff, d->io_align, &roff)) {
        rc = tv__seterr(err, TV_E_OVERFLOW, "region offset overflows");
        goto fail;
    }
    uint64_t rlen = o->region_len;
    if (!rlen)
        rlen = d->size_bytes > roff ? d->size_bytes - roff : 0;
    uint8_t uuid[16];
    tv__label l;
    if ((rc = tv__uuid_random(uuid, err)) || (rc = tv__label_init(&l, d, uuid, roff, rlen, err)))
        goto fail;
    tv__reg_device row;
    memset(&row, 0, sizeof(row));
    tv__uuid_format(uuid, row.uuid);
    snprintf(row.kind, sizeof(row.kind), "%s", tv__dev_kind_name(d->kind));
    if (strlen(real) >= sizeof(row.path)) {
        rc = tv__seterr(err, -ENAMETOOLONG, "%s: path too long", real);
        goto fail;
    }
    strcpy(row.path, real);
    if ((rc = identity_json(d, row.identity, sizeof(row.identity)))) {
        tv__seterr(err, rc, "device identity does not fit");
        goto fail;
    }
    row.lba_size = d->lba_size;
    row.io_align = d->io_align;
    row.object_align = d->object_align;
    row.size_bytes = d->size_bytes;
    row.region_off = l.region_off;
    row.region_len = l.region_len;
    row.data_off = tv__region_data_off(&l);
    /* Label first, registry row last: a crash in between leaves a labelled
     * but unregistered device, which a retry simply relabels. */
    if ((rc = tv__label_write(d, &l, err)))
        goto fail;
    if ((rc = tv__reg_device_add(st->reg, &row, device_id, err)))
        goto fail;
    tv__dev_close(d);
    tv__store_close(st);
    return 0;
fail:
    tv__dev_close(d);
    if (created_image)
        tv__sys.unlink(o->image);
    tv__store_close(st);
    return rc;
}
