/* Power-loss harness for the tests: undo logs of unsynced writes behind
 * tv__sys and a wrapper SQLite VFS, a log of unsynced directory operations,
 * a numbered sync point per fsync, fdatasync and xSync, and a power cut that
 * reverts what was not synced (all of it, or a random part) and _exit()s.
 * See powerloss.h for what is and is not modelled.
 *
 * Invariants: the hooks exist only in the forked child; every hook body runs
 * under one mutex (writes of the importer's writer thread and of SQLite are
 * serialised with the cut, so nothing is written after the revert); the
 * undo records of a file are applied newest first, which restores exactly
 * the bytes and size the file had at its last successful sync; directory
 * operations are undone newest first, so each finds the names it made. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sqlite3.h>

#include "powerloss.h"
#include "tv_test.h"
#include "util/sys.h"

#define PL_MAX_FILES 256
#define PL_EXIT_CUT  99 /* the child's exit status after a cut */

typedef struct pl_undo {
    uint64_t off;
    uint64_t old_size; /* the file's size before the write */
    uint64_t wlen;     /* bytes the write (or truncation) changed from off on */
    size_t len;        /* old bytes saved (the part of the write below old_size) */
    uint8_t *data;
} pl_undo;

typedef struct pl_file {
    dev_t dev;
    ino_t ino;
    int raw_fd; /* our own O_RDWR descriptor (no O_DIRECT): reads old bytes, reverts */
    size_t n, cap;
    pl_undo *u;
} pl_file;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static tv_pl_trace *g_trace;
static int g_cut;
static int g_n_syncs;
static char g_last_point[32];
static pl_file g_files[PL_MAX_FILES];
static size_t g_n_files;
static tv__sys_ops g_real;

/* Directory entries created, renamed, linked, unlinked or made since their
 * directory's last fsync, oldest first. A replaced or unlinked file is kept
 * alive under a hard link in the stash directory until the fsync. */
typedef enum pl_op_kind { OP_CREATE, OP_RENAME, OP_LINK, OP_UNLINK, OP_MKDIR } pl_op_kind;

typedef struct pl_op {
    pl_op_kind kind;
    dev_t dir_dev;
    ino_t dir_ino;
    char path[1024];  /* the entry made, renamed to, or unlinked */
    char from[1024];  /* OP_RENAME: the old name */
    char stash[1024]; /* the file the entry named before ("" if none) */
} pl_op;

#define PL_MAX_OPS 256
static pl_op g_ops[PL_MAX_OPS];
static size_t g_n_ops;
static char g_stash_dir[900];
static unsigned g_stash_seq;
static uint64_t g_rng; /* 0: drop every unsynced write; else keep a random subset */

static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static void die(const char *what)
{
    /* A harness failure, not a finding: make it loud. */
    fprintf(stderr, "powerloss harness: %s: %s\n", what, strerror(errno));
    fflush(stderr);
    _exit(98);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("out of memory");
    return p;
}

/* ---- undo logs ------------------------------------------------------------ */

static pl_file *find_file(dev_t dev, ino_t ino)
{
    for (size_t i = 0; i < g_n_files; i++)
        if (g_files[i].dev == dev && g_files[i].ino == ino)
            return &g_files[i];
    return NULL;
}

/* The entry for (dev, ino), created with a descriptor opened by
 * open_raw(arg) the first time. */
static pl_file *get_file(dev_t dev, ino_t ino, int (*open_raw)(const void *), const void *arg)
{
    pl_file *f = find_file(dev, ino);
    if (f)
        return f;
    if (g_n_files == PL_MAX_FILES) {
        errno = EMFILE;
        die("too many files");
    }
    int fd = open_raw(arg);
    if (fd < 0)
        die("reopen a written file");
    f = &g_files[g_n_files++];
    *f = (pl_file){.dev = dev, .ino = ino, .raw_fd = fd};
    return f;
}

static int open_raw_fd(const void *arg)
{
    char p[64];
    snprintf(p, sizeof p, "/proc/self/fd/%d", *(const int *)arg);
    return open(p, O_RDWR | O_CLOEXEC);
}

static int open_raw_path(const void *arg)
{
    return open((const char *)arg, O_RDWR | O_CLOEXEC);
}

/* Saves what [off, off + len) and the size were before a write (or, with
 * truncate_to >= 0, before a truncation to that size). */
static void record(pl_file *f, uint64_t off, uint64_t len, int64_t truncate_to)
{
    struct stat sb;
    if (fstat(f->raw_fd, &sb) < 0)
        die("fstat");
    uint64_t size = (uint64_t)sb.st_size;
    if (truncate_to >= 0) {
        off = (uint64_t)truncate_to;
        len = size > off ? size - off : 0;
    }
    pl_undo u = {.off = off, .old_size = size, .wlen = len};
    if (off < size) {
        u.len = (size_t)(len < size - off ? len : size - off);
        u.data = xmalloc(u.len);
        size_t done = 0;
        while (done < u.len) {
            ssize_t n = pread(f->raw_fd, u.data + done, u.len - done, (off_t)(off + done));
            if (n <= 0)
                die("pread old bytes");
            done += (size_t)n;
        }
    }
    if (f->n == f->cap) {
        f->cap = f->cap ? 2 * f->cap : 16;
        pl_undo *nu = realloc(f->u, f->cap * sizeof(*nu));
        if (!nu)
            die("out of memory");
        f->u = nu;
    }
    f->u[f->n++] = u;
}

static void commit(pl_file *f)
{
    for (size_t i = 0; i < f->n; i++)
        free(f->u[i].data);
    f->n = 0;
}

/* The power cut: every file back to its last synced state, then gone. */
static void revert_entries(int *n)
{
    /* Metadata reaches the disk in order (a journal): some prefix survives. */
    size_t keep = g_rng ? (size_t)(rnd() % (g_n_ops + 1)) : 0;
    for (size_t i = g_n_ops; i-- > keep;) {
        pl_op *o = &g_ops[i];
        int rc = 0;
        switch (o->kind) {
        case OP_CREATE:
        case OP_LINK:
            rc = unlink(o->path);
            break;
        case OP_RENAME:
            rc = rename(o->path, o->from);
            if (rc == 0 && o->stash[0])
                rc = rename(o->stash, o->path);
            break;
        case OP_UNLINK:
            rc = o->stash[0] ? rename(o->stash, o->path) : 0;
            break;
        case OP_MKDIR: /* with whatever was made durable inside it */
            rc = tv_test_rmtree(o->path);
            break;
        }
        if (rc < 0)
            die("revert a directory entry");
        (*n)++;
    }
}

static void pwrite_raw(int fd, const uint8_t *p, size_t len, uint64_t off, const char *what)
{
    size_t done = 0;
    while (done < len) {
        ssize_t w = pwrite(fd, p + done, len - done, (off_t)(off + done));
        if (w <= 0)
            die(what);
        done += (size_t)w;
    }
}

#define PL_SECTOR 512u

/* Subset mode, after the revert: each sector an unsynced write touched gets
 * its newest bytes back (saved in cur, a copy of the file before the
 * revert, cur_size bytes) with probability keep/32, and the size is the old
 * or the new one. */
static void keep_some(pl_file *f, const uint8_t *cur, uint64_t cur_size, unsigned keep)
{
    struct stat sb;
    if (fstat(f->raw_fd, &sb) < 0)
        die("fstat");
    uint64_t n_sec = (cur_size + PL_SECTOR - 1) / PL_SECTOR;
    uint8_t *dirty = calloc(n_sec ? n_sec : 1, 1);
    if (!dirty)
        die("out of memory");
    for (size_t j = 0; j < f->n; j++)
        for (uint64_t s = f->u[j].off / PL_SECTOR;
             s < n_sec && s * PL_SECTOR < f->u[j].off + f->u[j].wlen; s++)
            dirty[s] = 1;
    for (uint64_t s = 0; s < n_sec; s++) {
        if (!dirty[s] || rnd() % 32 >= keep)
            continue;
        uint64_t off = s * PL_SECTOR, len = cur_size - off < PL_SECTOR ? cur_size - off : PL_SECTOR;
        pwrite_raw(f->raw_fd, cur + off, (size_t)len, off, "keep: pwrite");
    }
    free(dirty);
    uint64_t size = (rnd() & 1) ? cur_size : (uint64_t)sb.st_size;
    if (ftruncate(f->raw_fd, (off_t)size) < 0)
        die("keep: ftruncate");
}

static void cut_now(void)
{
    int n = 0;
    static const unsigned keep_of_32[3] = {16, 28, 31};
    unsigned keep = keep_of_32[g_rng ? rnd() % 3 : 0];
    revert_entries(&n);
    for (size_t i = 0; i < g_n_files; i++) {
        pl_file *f = &g_files[i];
        uint8_t *cur = NULL;
        uint64_t cur_size = 0;
        if (g_rng && f->n) {
            struct stat sb;
            if (fstat(f->raw_fd, &sb) < 0)
                die("fstat");
            cur_size = (uint64_t)sb.st_size;
            cur = xmalloc((size_t)cur_size);
            size_t done = 0;
            while (done < cur_size) {
                ssize_t r = pread(f->raw_fd, cur + done, (size_t)cur_size - done, (off_t)done);
                if (r <= 0)
                    die("keep: pread");
                done += (size_t)r;
            }
        }
        for (size_t j = f->n; j-- > 0;) {
            pl_undo *u = &f->u[j];
            if (ftruncate(f->raw_fd, (off_t)u->old_size) < 0)
                die("revert: ftruncate");
            pwrite_raw(f->raw_fd, u->data, u->len, u->off, "revert: pwrite");
            n++;
        }
        if (cur) {
            keep_some(f, cur, cur_size, keep);
            free(cur);
        }
    }
    g_trace->cut = true;
    g_trace->n_reverted = n;
    _exit(PL_EXIT_CUT);
}

/* ---- sync points ---------------------------------------------------------- */

static void name_of_path(const char *path, char *out, size_t len)
{
    const char *a = path, *b = NULL;
    for (const char *p = path; *p; p++)
        if (*p == '/' && p[1]) {
            b = a;
            a = p + 1;
        }
    const char *src = b ? b : a;
    size_t n = strlen(src);
    if (n >= len)
        n = len - 1;
    memcpy(out, src, n);
    out[n] = '\0';
}

static void name_of_fd(int fd, char *out, size_t len)
{
    char p[64], target[4096];
    snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(p, target, sizeof target - 1);
    if (n < 0)
        n = 0;
    target[n] = '\0';
    name_of_path(target, out, len);
}

/* Called under g_mu before a sync is performed: numbers it, records it and
 * cuts the power when it is the chosen one. */
static void sync_point(const char *op, const char *file)
{
    int k = ++g_n_syncs;
    if (k <= TV_PL_MAX_SYNCS) {
        tv_pl_sync *s = &g_trace->sync[k - 1];
        snprintf(s->op, sizeof s->op, "%s", op);
        snprintf(s->file, sizeof s->file, "%s", file);
        snprintf(s->after, sizeof s->after, "%s", g_last_point);
    }
    g_trace->n_syncs = k;
    if (k == g_cut)
        cut_now();
}

/* ---- tv__sys hooks ---------------------------------------------------------- */

static pl_file *file_of_fd(int fd, bool create)
{
    struct stat sb;
    if (g_real.fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode))
        return NULL;
    return create ? get_file(sb.st_dev, sb.st_ino, open_raw_fd, &fd)
                  : find_file(sb.st_dev, sb.st_ino);
}

static ssize_t hook_pwrite(int fd, const void *buf, size_t len, off_t off)
{
    pthread_mutex_lock(&g_mu);
    pl_file *f = file_of_fd(fd, true);
    if (f && off >= 0)
        record(f, (uint64_t)off, len, -1);
    ssize_t n = g_real.pwrite(fd, buf, len, off);
    int e = errno;
    pthread_mutex_unlock(&g_mu);
    errno = e;
    return n;
}

static int hook_ftruncate(int fd, off_t len)
{
    pthread_mutex_lock(&g_mu);
    pl_file *f = file_of_fd(fd, true);
    if (f && len >= 0)
        record(f, 0, 0, (int64_t)len);
    int rc = g_real.ftruncate(fd, len);
    int e = errno;
    pthread_mutex_unlock(&g_mu);
    errno = e;
    return rc;
}

/* ---- directory entries ------------------------------------------------------ */

/* The directory holding path's entry. */
static void dir_of(const char *path, dev_t *dev, ino_t *ino)
{
    char d[1024];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(d, sizeof d, ".");
    else if (slash == path)
        snprintf(d, sizeof d, "/");
    else
        snprintf(d, sizeof d, "%.*s", (int)(slash - path), path);
    struct stat sb;
    if (stat(d, &sb) < 0)
        die("stat a directory");
    *dev = sb.st_dev;
    *ino = sb.st_ino;
}

static pl_op *new_op(pl_op_kind kind, const char *path)
{
    if (g_n_ops == PL_MAX_OPS) {
        errno = EMFILE;
        die("too many directory operations");
    }
    pl_op *o = &g_ops[g_n_ops++];
    memset(o, 0, sizeof *o);
    o->kind = kind;
    snprintf(o->path, sizeof o->path, "%s", path);
    dir_of(path, &o->dir_dev, &o->dir_ino);
    return o;
}

/* Hard-links the file named path into the stash (out = "" when path names
 * no regular file). */
static void stash(const char *path, char *out, size_t len)
{
    struct stat sb;
    out[0] = '\0';
    if (!g_stash_dir[0] || lstat(path, &sb) < 0 || !S_ISREG(sb.st_mode))
        return;
    snprintf(out, len, "%s/.pl-stash-%ld-%u", g_stash_dir, (long)getpid(), g_stash_seq++);
    if (link(path, out) < 0)
        die("stash a replaced file");
}

static void drop_stash(pl_op *o)
{
    if (o->stash[0])
        unlink(o->stash);
    o->stash[0] = '\0';
}

static void commit_dir(dev_t dev, ino_t ino)
{
    size_t w = 0;
    for (size_t i = 0; i < g_n_ops; i++) {
        if (g_ops[i].dir_dev == dev && g_ops[i].dir_ino == ino)
            drop_stash(&g_ops[i]);
        else
            g_ops[w++] = g_ops[i];
    }
    g_n_ops = w;
}

static int hook_open(const char *path, int flags, mode_t mode)
{
    pthread_mutex_lock(&g_mu);
    struct stat sb;
    bool existed = !(flags & O_CREAT) || lstat(path, &sb) == 0;
    int fd = g_real.open(path, flags, mode);
    int e = errno;
    if (fd >= 0 && !existed)
        new_op(OP_CREATE, path);
    pthread_mutex_unlock(&g_mu);
    errno = e;
    return fd;
}

static int do_rename(const char *from, const char *to, int (*real)(const char *, const char *))
{
    pthread_mutex_lock(&g_mu);
    char st[1024];
    stash(to, st, sizeof st);
    int rc = real(from, to);
    int e = errno;
    if (rc == 0) {
        pl_op *o = new_op(OP_RENAME, to);
        snprintf(o->from, sizeof o->from, "%s", from);
        snprintf(o->stash, sizeof o->stash, "%s", st);
    } else if (st[0]) {
        unlink(st);
    }
    pthread_mutex_unlock(&g_mu);
    errno = e;
    return rc;
}

static int hook_rename(const char *from, const char *to)
{
    return do_rename(from, to, g_real.rename);
}

static int hook_rename_noreplace(const char *from, const char *to)
{
    return do_rename(from, to, g_real.rename_noreplace);
}

static int hook_link(const char *from, const char *to)
{
    pthread_mutex_lock(&g_mu);
    int rc = g_real.link(from, to);
    int e = errno;
    if (rc == 0)
        new_op(OP_LINK, to);
    pthread_mutex_unlock(&g_mu);
    errno = e;
    return rc;
}

static int hook_unlink(const char *path)
{
    pthread_mutex_lock(&g_mu);
    char st[1024];
    stash(path, st, sizeof st);
    int rc = g_real.unlink(path);
    int e = errno;
    if (rc == 0)
        snprintf(new_op(OP_UNLINK, path)->stash, sizeof st, "%s", st);
    else if (st[0])
        unlink(st);
    pthread_mutex_unlock(&g_mu);
    errno = e;
    return rc;
}

static int hook_mkdir(const char *path, mode_t mode)
{
    pthread_mutex_lock(&g_mu);
    int rc = g_real.mkdir(path, mode);
    int e = errno;
    if (rc == 0)
        new_op(OP_MKDIR, path);
    pthread_mutex_unlock(&g_mu);
    errno = e;
    return rc;
}

static int do_sync(int fd, int (*real)(int), const char *op)
{
    char name[80];
    pthread_mutex_lock(&g_mu);
    name_of_fd(fd, name, sizeof name);
    sync_point(op, name);
    int rc = real(fd);
    int e = errno;
    if (rc == 0) {
        pl_file *f = file_of_fd(fd, false);
        if (f)
            commit(f);
        struct stat sb;
        if (g_real.fstat(fd, &sb) == 0 && S_ISDIR(sb.st_mode))
            commit_dir(sb.st_dev, sb.st_ino);
    }
    pthread_mutex_unlock(&g_mu);
    errno = e;
    return rc;
}

static int hook_fsync(int fd)
{
    return do_sync(fd, g_real.fsync, "fsync");
}

static int hook_fdatasync(int fd)
{
    return do_sync(fd, g_real.fdatasync, "fdatasync");
}

static void crash_hook(const char *point)
{
    pthread_mutex_lock(&g_mu);
    snprintf(g_last_point, sizeof g_last_point, "%s", point);
    pthread_mutex_unlock(&g_mu);
}

/* ---- the SQLite wrapper VFS ------------------------------------------------- */

typedef struct pl_sqlfile {
    sqlite3_file base;
    sqlite3_file *real;
    bool tracked; /* main database, WAL or rollback journal */
    dev_t dev;
    ino_t ino;
    char path[4096];
    char name[80];
} pl_sqlfile;

static sqlite3_vfs *g_real_vfs;
static sqlite3_vfs g_vfs;
static sqlite3_io_methods g_io;

#define REAL(f) (((pl_sqlfile *)(f))->real)

static int vf_close(sqlite3_file *f)
{
    int rc = REAL(f)->pMethods->xClose(REAL(f));
    return rc;
}
static int vf_read(sqlite3_file *f, void *b, int n, sqlite3_int64 off)
{
    return REAL(f)->pMethods->xRead(REAL(f), b, n, off);
}
static int vf_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 off)
{
    pl_sqlfile *p = (pl_sqlfile *)f;
    pthread_mutex_lock(&g_mu);
    if (p->tracked && off >= 0 && n > 0)
        record(get_file(p->dev, p->ino, open_raw_path, p->path), (uint64_t)off, (uint64_t)n, -1);
    int rc = p->real->pMethods->xWrite(p->real, b, n, off);
    pthread_mutex_unlock(&g_mu);
    return rc;
}
static int vf_truncate(sqlite3_file *f, sqlite3_int64 size)
{
    pl_sqlfile *p = (pl_sqlfile *)f;
    pthread_mutex_lock(&g_mu);
    if (p->tracked && size >= 0)
        record(get_file(p->dev, p->ino, open_raw_path, p->path), 0, 0, (int64_t)size);
    int rc = p->real->pMethods->xTruncate(p->real, size);
    pthread_mutex_unlock(&g_mu);
    return rc;
}
static int vf_sync(sqlite3_file *f, int flags)
{
    pl_sqlfile *p = (pl_sqlfile *)f;
    pthread_mutex_lock(&g_mu);
    sync_point("xSync", p->name);
    int rc = p->real->pMethods->xSync(p->real, flags);
    if (rc == SQLITE_OK && p->tracked) {
        pl_file *pf = find_file(p->dev, p->ino);
        if (pf)
            commit(pf);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}
static int vf_file_size(sqlite3_file *f, sqlite3_int64 *size)
{
    return REAL(f)->pMethods->xFileSize(REAL(f), size);
}
static int vf_lock(sqlite3_file *f, int l)
{
    return REAL(f)->pMethods->xLock(REAL(f), l);
}
static int vf_unlock(sqlite3_file *f, int l)
{
    return REAL(f)->pMethods->xUnlock(REAL(f), l);
}
static int vf_check_reserved(sqlite3_file *f, int *out)
{
    return REAL(f)->pMethods->xCheckReservedLock(REAL(f), out);
}
static int vf_file_control(sqlite3_file *f, int op, void *arg)
{
    return REAL(f)->pMethods->xFileControl(REAL(f), op, arg);
}
static int vf_sector_size(sqlite3_file *f)
{
    return REAL(f)->pMethods->xSectorSize(REAL(f));
}
static int vf_device_characteristics(sqlite3_file *f)
{
    return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f));
}
static int vf_shm_map(sqlite3_file *f, int pg, int pgsz, int extend, void volatile **pp)
{
    return REAL(f)->pMethods->xShmMap(REAL(f), pg, pgsz, extend, pp);
}
static int vf_shm_lock(sqlite3_file *f, int off, int n, int flags)
{
    return REAL(f)->pMethods->xShmLock(REAL(f), off, n, flags);
}
static void vf_shm_barrier(sqlite3_file *f)
{
    REAL(f)->pMethods->xShmBarrier(REAL(f));
}
static int vf_shm_unmap(sqlite3_file *f, int del)
{
    return REAL(f)->pMethods->xShmUnmap(REAL(f), del);
}
static int vf_fetch(sqlite3_file *f, sqlite3_int64 off, int amt, void **pp)
{
    return REAL(f)->pMethods->xFetch(REAL(f), off, amt, pp);
}
static int vf_unfetch(sqlite3_file *f, sqlite3_int64 off, void *p)
{
    return REAL(f)->pMethods->xUnfetch(REAL(f), off, p);
}

static int v_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *file, int flags, int *out_flags)
{
    (void)vfs;
    pl_sqlfile *p = (pl_sqlfile *)file;
    memset(p, 0, sizeof *p);
    p->real = (sqlite3_file *)(p + 1);
    int rc = g_real_vfs->xOpen(g_real_vfs, name, p->real, flags, out_flags);
    if (rc != SQLITE_OK) {
        p->base.pMethods = NULL;
        return rc;
    }
    if (name) {
        snprintf(p->path, sizeof p->path, "%s", name);
        name_of_path(name, p->name, sizeof p->name);
    }
    struct stat sb;
    if (name && (flags & (SQLITE_OPEN_MAIN_DB | SQLITE_OPEN_WAL | SQLITE_OPEN_MAIN_JOURNAL)) &&
        stat(name, &sb) == 0) {
        p->tracked = true;
        p->dev = sb.st_dev;
        p->ino = sb.st_ino;
    }
    p->base.pMethods = &g_io;
    return SQLITE_OK;
}

static int v_delete(sqlite3_vfs *vfs, const char *name, int dir_sync)
{
    (void)vfs;
    return g_real_vfs->xDelete(g_real_vfs, name, dir_sync);
}
static int v_access(sqlite3_vfs *vfs, const char *name, int flags, int *out)
{
    (void)vfs;
    return g_real_vfs->xAccess(g_real_vfs, name, flags, out);
}
static int v_full_pathname(sqlite3_vfs *vfs, const char *name, int n, char *out)
{
    (void)vfs;
    return g_real_vfs->xFullPathname(g_real_vfs, name, n, out);
}
static void *v_dlopen(sqlite3_vfs *vfs, const char *name)
{
    (void)vfs;
    return g_real_vfs->xDlOpen(g_real_vfs, name);
}
static void v_dlerror(sqlite3_vfs *vfs, int n, char *out)
{
    (void)vfs;
    g_real_vfs->xDlError(g_real_vfs, n, out);
}
static void (*v_dlsym(sqlite3_vfs *vfs, void *h, const char *sym))(void)
{
    (void)vfs;
    return g_real_vfs->xDlSym(g_real_vfs, h, sym);
}
static void v_dlclose(sqlite3_vfs *vfs, void *h)
{
    (void)vfs;
    g_real_vfs->xDlClose(g_real_vfs, h);
}
static int v_randomness(sqlite3_vfs *vfs, int n, char *out)
{
    (void)vfs;
    return g_real_vfs->xRandomness(g_real_vfs, n, out);
}
static int v_sleep(sqlite3_vfs *vfs, int us)
{
    (void)vfs;
    return g_real_vfs->xSleep(g_real_vfs, us);
}
static int v_current_time(sqlite3_vfs *vfs, double *out)
{
    (void)vfs;
    return g_real_vfs->xCurrentTime(g_real_vfs, out);
}
static int v_last_error(sqlite3_vfs *vfs, int n, char *out)
{
    (void)vfs;
    return g_real_vfs->xGetLastError(g_real_vfs, n, out);
}
static int v_current_time64(sqlite3_vfs *vfs, sqlite3_int64 *out)
{
    (void)vfs;
    return g_real_vfs->xCurrentTimeInt64(g_real_vfs, out);
}

static void install_vfs(void)
{
    g_real_vfs = sqlite3_vfs_find(NULL);
    if (!g_real_vfs || g_real_vfs->iVersion < 2) {
        errno = ENOSYS;
        die("no default SQLite VFS of version 2 or later");
    }
    g_vfs = (sqlite3_vfs){
        .iVersion = 2,
        .szOsFile = (int)sizeof(pl_sqlfile) + g_real_vfs->szOsFile,
        .mxPathname = g_real_vfs->mxPathname,
        .zName = "tv-powerloss",
        .xOpen = v_open,
        .xDelete = v_delete,
        .xAccess = v_access,
        .xFullPathname = v_full_pathname,
        .xDlOpen = v_dlopen,
        .xDlError = v_dlerror,
        .xDlSym = v_dlsym,
        .xDlClose = v_dlclose,
        .xRandomness = v_randomness,
        .xSleep = v_sleep,
        .xCurrentTime = v_current_time,
        .xGetLastError = v_last_error,
        .xCurrentTimeInt64 = v_current_time64,
    };
    g_io = (sqlite3_io_methods){
        .iVersion = 3,
        .xClose = vf_close,
        .xRead = vf_read,
        .xWrite = vf_write,
        .xTruncate = vf_truncate,
        .xSync = vf_sync,
        .xFileSize = vf_file_size,
        .xLock = vf_lock,
        .xUnlock = vf_unlock,
        .xCheckReservedLock = vf_check_reserved,
        .xFileControl = vf_file_control,
        .xSectorSize = vf_sector_size,
        .xDeviceCharacteristics = vf_device_characteristics,
        .xShmMap = vf_shm_map,
        .xShmLock = vf_shm_lock,
        .xShmBarrier = vf_shm_barrier,
        .xShmUnmap = vf_shm_unmap,
        .xFetch = vf_fetch,
        .xUnfetch = vf_unfetch,
    };
    if (sqlite3_vfs_register(&g_vfs, 1) != SQLITE_OK) {
        errno = EIO;
        die("sqlite3_vfs_register");
    }
}

/* ---- the child ---------------------------------------------------------------- */

static void arm(int cut, tv_pl_trace *trace)
{
    g_trace = trace;
    g_cut = cut;
    g_n_syncs = 0;
    g_last_point[0] = '\0';
    g_n_files = 0;
    g_real = tv__sys;
    tv__sys.pwrite = hook_pwrite;
    tv__sys.ftruncate = hook_ftruncate;
    tv__sys.fsync = hook_fsync;
    tv__sys.fdatasync = hook_fdatasync;
    if (g_stash_dir[0]) {
        g_n_ops = 0;
        tv__sys.open = hook_open;
        tv__sys.rename = hook_rename;
        tv__sys.rename_noreplace = hook_rename_noreplace;
        tv__sys.link = hook_link;
        tv__sys.unlink = hook_unlink;
        tv__sys.mkdir = hook_mkdir;
    }
    tv__sys_crash_hook = crash_hook;
    install_vfs();
}

void tv_pl_keep_random(uint64_t seed)
{
    g_rng = seed;
}

void tv_pl_model_dirs(const char *stash_dir)
{
    snprintf(g_stash_dir, sizeof g_stash_dir, "%s", stash_dir ? stash_dir : "");
}

tv_pl_trace *tv_pl_trace_new(void)
{
    void *p =
        mmap(NULL, sizeof(tv_pl_trace), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void tv_pl_trace_free(tv_pl_trace *t)
{
    if (t)
        munmap(t, sizeof(*t));
}

int tv_pl_run(int (*fn)(void *ctx), void *ctx, int cut, tv_pl_trace *trace)
{
    memset(trace, 0, sizeof(*trace));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return -1;
    }
    if (pid == 0) {
        if (!getenv("TV_PL_VERBOSE")) {
            int nul = open("/dev/null", O_WRONLY | O_CLOEXEC);
            if (nul >= 0) {
                dup2(nul, 1);
                dup2(nul, 2);
                close(nul);
            }
        }
        arm(cut, trace);
        int rc = fn(ctx);
        pthread_mutex_lock(&g_mu);
        if (cut == TV_PL_AT_END)
            cut_now();
        for (size_t i = 0; i < g_n_ops; i++)
            drop_stash(&g_ops[i]);
        _exit(rc & 0xff);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) {
            perror("waitpid");
            return -1;
        }
    if (WIFEXITED(status) && WEXITSTATUS(status) == PL_EXIT_CUT && trace->cut)
        return TV_PL_CUT;
    if (WIFEXITED(status) && WEXITSTATUS(status) != 98)
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        fprintf(stderr, "powerloss: child killed by signal %d\n", WTERMSIG(status));
    else
        fprintf(stderr, "powerloss: harness failure in the child (status %d)\n", status);
    return -1;
}
