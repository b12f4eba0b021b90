/* The fast path's memory tier (tier.h): generation memfds laid out like
 * their objects, residency and pins per chunk, members' debts, one LRU of
 * unprotected idle chunks across generations, eviction by punching holes.
 *
 * Invariants: those of tier.h; besides, every change of a chunk goes
 * through settle(), which keeps n_inuse, the view-pinned bytes and the
 * lists in step with the chunk's state, so no caller adjusts them by
 * hand; the atomics other threads read are republished (publish()) after
 * every change of the figures they mirror. */
#include "fastpath/tier.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "util/sys.h"

#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004u
#endif
#ifndef MADV_HUGEPAGE
#define MADV_HUGEPAGE 14
#endif
#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif
#ifndef O_TMPFILE
#define O_TMPFILE (020000000 | O_DIRECTORY)
#endif

#define SMALL_PAGE  4096u
#define LIST_NONE   0u
#define LIST_LRU    1u
#define LIST_OWED   2u
#define K_INUSE     1u /* READING, or copy references and no view */
#define K_VPIN      2u /* RESIDENT with a view */
#define K_IDLE      4u /* RESIDENT, no reference, no read */
#define PUNCH_FLAGS (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)

struct tv__tier {
    uint64_t budget_len, floors_len, resident_len, vpinned_len;
    tv__tier_chunk *lru_head, *lru_tail;
    tv__tier_gen *gens;
    uint32_t n_gens;
    uint32_t pages;
    uint64_t page_len;
    char *dir;       /* cache.dir resolved: the generations' files are unnamed files there */
    uint64_t fs_len; /* the size of cache.dir's tmpfs; 0 = no limit (or memfds) */
    bool punch_warned;
    atomic_uint_fast64_t st_bound, st_resident, st_vpinned, st_gens, st_evictions, st_evicted,
        st_scrubbed, st_punch_failures;
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t bound(const tv__tier *t)
{
    uint64_t b = t->budget_len + t->floors_len;
    /* a page the full tmpfs cannot give would fail the device read into it
     * (EFAULT): the tmpfs's size is a bound too, the groups' staging
     * included (it holds at least budget_len: use_dir) */
    return t->fs_len && t->fs_len < b ? t->fs_len : b;
}

static void publish(tv__tier *t)
{
    uint64_t n = t->n_gens;
    atomic_store_explicit(&t->st_bound, bound(t), memory_order_relaxed);
    atomic_store_explicit(&t->st_resident, t->resident_len, memory_order_relaxed);
    atomic_store_explicit(&t->st_vpinned, t->vpinned_len, memory_order_relaxed);
    atomic_store_explicit(&t->st_gens, n, memory_order_relaxed);
}

static uint32_t chunk_idx(const tv__tier_chunk *c)
{
    return (uint32_t)(c - c->g->c);
}

static uint64_t chunk_len_of(const tv__tier_chunk *c)
{
    return c->state == TV__TIER_ABSENT ? 0 : (uint64_t)(c->hi - c->lo);
}

static unsigned kind(const tv__tier_chunk *c)
{
    if (c->state == TV__TIER_READING)
        return K_INUSE;
    if (c->state != TV__TIER_RESIDENT)
        return 0;
    if (c->vrefs)
        return K_VPIN;
    return c->refs ? K_INUSE : K_IDLE;
}

/* ---- lists ---------------------------------------------------------------- */

static void list_unlink(tv__tier_chunk *c)
{
    tv__tier_gen *g = c->g;
    tv__tier_chunk **head = c->list == LIST_LRU ? &g->t->lru_head : &g->owed_head;
    tv__tier_chunk **tail = c->list == LIST_LRU ? &g->t->lru_tail : &g->owed_tail;
    if (c->list == LIST_NONE)
        return;
    if (c->prev)
        c->prev->next = c->next;
    else
        *head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        *tail = c->prev;
    c->prev = c->next = NULL;
    c->list = LIST_NONE;
}

static void list_push(tv__tier_chunk *c, unsigned list, bool at_head)
{
    tv__tier_gen *g = c->g;
    tv__tier_chunk **head = list == LIST_LRU ? &g->t->lru_head : &g->owed_head;
    tv__tier_chunk **tail = list == LIST_LRU ? &g->t->lru_tail : &g->owed_tail;
    if (at_head) {
        c->prev = NULL;
        c->next = *head;
        if (*head)
            (*head)->prev = c;
        else
            *tail = c;
        *head = c;
    } else {
        c->next = NULL;
        c->prev = *tail;
        if (*tail)
            (*tail)->next = c;
        else
            *head = c;
        *tail = c;
    }
    c->list = (uint8_t)list;
}

static uint64_t owed(const tv__tier_chunk *c)
{
    return c->g->active & ~c->taken;
}

/* Puts idle chunk c where it belongs: the owed list while an active member
 * has not taken it, else the LRU (at its tail: used just now). */
static void place_idle(tv__tier_chunk *c)
{
    list_push(c, owed(c) ? LIST_OWED : LIST_LRU, false);
}

/* After a change of c that was of kind `was`: the counters and the lists. */
static void settle(tv__tier_chunk *c, unsigned was)
{
    tv__tier_gen *g = c->g;
    unsigned now = kind(c);
    if ((was & K_INUSE) && !(now & K_INUSE))
        g->n_inuse--;
    else if (!(was & K_INUSE) && (now & K_INUSE))
        g->n_inuse++;
    if ((was & K_VPIN) != (now & K_VPIN)) {
        uint64_t l = chunk_len_of(c);
        if (now & K_VPIN) {
            g->vpinned_len += l;
            g->t->vpinned_len += l;
        } else {
            g->vpinned_len -= l;
            g->t->vpinned_len -= l;
        }
    }
    if (!(now & K_IDLE))
        list_unlink(c);
    else if (c->list == LIST_NONE)
        place_idle(c);
    publish(g->t);
}

/* Moves the chunks of g's owed list that no active member is owed any more
 * to the LRU's head: nobody waits for them, they go first. */
static void owed_recheck(tv__tier_gen *g)
{
    tv__tier_chunk *c = g->owed_head;
    while (c) {
        tv__tier_chunk *nx = c->next;
        if (!owed(c)) {
            list_unlink(c);
            list_push(c, LIST_LRU, true);
        }
        c = nx;
    }
}

/* ---- holes ----------------------------------------------------------------- */

static void punch(tv__tier_gen *g, uint64_t off, uint64_t len)
{
    if (!len)
        return;
    if (tv__sys.fallocate(g->fd, PUNCH_FLAGS, (off_t)off, (off_t)len) == 0)
        return;
    atomic_fetch_add(&g->t->st_punch_failures, 1);
    if (!g->t->punch_warned)
        tv__log(TV_LOG_WARN,
                "fastpath tier: model '%s' generation %" PRId64 ": punching %" PRIu64
                " bytes at %" PRIu64 " failed: %s (the memory stays allocated)",
                g->name, g->gen, len, off, strerror(errno));
    g->t->punch_warned = true;
}

/* Evicts idle chunk c: its hole punched, nothing of it accounted. */
static void evict(tv__tier_chunk *c)
{
    tv__tier_gen *g = c->g;
    uint64_t l = chunk_len_of(c);
    list_unlink(c);
    punch(g, (uint64_t)chunk_idx(c) * g->chunk_len, g->chunk_len);
    g->resident_len -= l;
    g->t->resident_len -= l;
    c->state = TV__TIER_ABSENT;
    c->lo = c->hi = 0;
    atomic_fetch_add(&g->t->st_evictions, 1);
    atomic_fetch_add(&g->t->st_evicted, l);
    publish(g->t);
}

void tv__tier_trim(tv__tier *t)
{
    while (t->resident_len > bound(t) && t->lru_head)
        evict(t->lru_head);
}

/* ---- pages ------------------------------------------------------------------- */

/* The value of "key: N kB" in /proc/meminfo, in bytes (0 when absent). */
static uint64_t meminfo_len(const char *text, const char *key)
{
    const char *p = strstr(text, key);
    unsigned long long v = 0;
    if (!p || sscanf(p + strlen(key), " %llu", &v) != 1)
        return 0;
    return strstr(p, " kB") && v <= UINT64_MAX / 1024 ? (uint64_t)v * 1024 : (uint64_t)v;
}

/* A small text file (a /proc or /sys knob) into buf, NUL-terminated ("" on failure). */
static void read_knob(const char *path, char *buf, size_t cap)
{
    size_t got = 0;
    int fd = tv__sys_open(path, O_RDONLY | O_CLOEXEC, 0);
    buf[0] = '\0';
    if (fd < 0)
        return;
    if (tv__sys_pread_full(fd, buf, cap - 1, 0, &got) == 0)
        buf[got] = '\0';
    tv__sys.close(fd);
    for (size_t n = strlen(buf); n && (buf[n - 1] == '\n' || buf[n - 1] == ' '); n--)
        buf[n - 1] = '\0'; /* a sysfs value's newline stays out of the log line */
}

static void choose_pages(tv__tier *t)
{
    char mi[8192], thp[256];
    read_knob("/proc/meminfo", mi, sizeof mi);
    uint64_t huge = meminfo_len(mi, "Hugepagesize:");
    uint64_t free_pages = 0;
    const char *p = strstr(mi, "HugePages_Free:");
    unsigned long long v = 0;
    if (p && sscanf(p + strlen("HugePages_Free:"), " %llu", &v) == 1)
        free_pages = v;
    uint64_t free_len = 0;
    t->pages = TV__TIER_PAGES_SMALL;
    t->page_len = SMALL_PAGE;
    if (huge >= SMALL_PAGE && (huge & (huge - 1)) == 0 && t->budget_len &&
        !tv__mul_u64(free_pages, huge, &free_len) && free_len >= t->budget_len) {
        t->pages = TV__TIER_PAGES_HUGETLB;
        t->page_len = huge;
        tv__log(TV_LOG_INFO,
                "fastpath tier: hugetlb pages of %" PRIu64 " bytes (%" PRIu64
                " free, the budget is %" PRIu64 " bytes)",
                huge, free_len, t->budget_len);
        return;
    }
    read_knob("/sys/kernel/mm/transparent_hugepage/shmem_enabled", thp, sizeof thp);
    bool thp_on = strstr(thp, "[always]") || strstr(thp, "[within_size]") ||
                  strstr(thp, "[advise]") || strstr(thp, "[force]");
    if (thp_on && huge >= SMALL_PAGE && (huge & (huge - 1)) == 0) {
        t->pages = TV__TIER_PAGES_THP;
        t->page_len = huge;
        tv__log(TV_LOG_INFO,
                "fastpath tier: transparent huge pages of %" PRIu64
                " bytes (shmem_enabled: %.64s); no hugetlb pages for the budget (%" PRIu64
                " of %" PRIu64 " bytes free)",
                huge, thp, free_len, t->budget_len);
        return;
    }
    tv__log(
        TV_LOG_INFO,
        "fastpath tier: small pages (%u bytes): %" PRIu64
        " bytes of hugetlb pages free for a budget of %" PRIu64
        " bytes (vm.nr_hugepages), shmem THP off (shmem_enabled: %.64s); cache.dir on a tmpfs mounted huge=within_size gives it huge pages",
        SMALL_PAGE, free_len, t->budget_len, thp[0] ? thp : "unknown");
}

/* ---- the tier ------------------------------------------------------------------ */

/* Checks cache.dir: a directory on a tmpfs in which this process can
 * create an unnamed file, at least budget_len bytes large when it has a
 * size limit. Sets t->dir (resolved) and the pages: the kernel's own
 * answer for a file there of one huge page (its st_blksize, as clients
 * read it too: the huge page where the mount's huge= option and
 * shmem_enabled's deny/force give one, else 4096). */
static int use_dir(tv__tier *t, const char *dir, tv_error *err)
{
    char *real = realpath(dir, NULL);
    struct statfs sf;
    struct stat st;
    char mi[8192];
    int rc = 0, fd;
    if (!real)
        return tv__seterr(err, errno == ENOMEM ? -ENOMEM : TV_E_INVALID_ARG,
                          "fastpath tier: cache.dir '%s': %s", dir, strerror(errno));
    if (statfs(real, &sf)) {
        rc = tv__seterr(err, TV_E_INVALID_ARG, "fastpath tier: cache.dir '%s': statfs: %s", dir,
                        strerror(errno));
        goto fail;
    }
    if ((unsigned long)sf.f_type != (unsigned long)TMPFS_MAGIC) {
        rc = tv__seterr(
            err, TV_E_INVALID_ARG,
            "fastpath tier: cache.dir '%s' is not on a tmpfs (file system type 0x%lx): the tier keeps its chunks in memory",
            dir, (unsigned long)sf.f_type);
        goto fail;
    }
    uint64_t fs_len = 0; /* f_blocks 0: a tmpfs without a size limit */
    if (tv__mul_u64((uint64_t)sf.f_blocks, (uint64_t)sf.f_bsize, &fs_len))
        fs_len = 0;
    if (fs_len && fs_len < t->budget_len) {
        rc = tv__seterr(err, TV_E_INVALID_ARG,
                        "fastpath tier: cache.dir '%s': its tmpfs holds %" PRIu64
                        " bytes, less than cache.bytes (%" PRIu64 "): mount it with a larger size=",
                        dir, fs_len, t->budget_len);
        goto fail;
    }
    fd = tv__sys_open(real, O_TMPFILE | O_RDWR | O_EXCL | O_CLOEXEC, 0400);
    if (fd < 0) {
        rc = tv__seterr(err, TV_E_INVALID_ARG,
                        "fastpath tier: cache.dir '%s': creating an unnamed file there: %s", dir,
                        strerror(errno));
        goto fail;
    }
    read_knob("/proc/meminfo", mi, sizeof mi);
    uint64_t huge = meminfo_len(mi, "Hugepagesize:");
    t->pages = TV__TIER_PAGES_SMALL;
    t->page_len = SMALL_PAGE;
    /* sizing allocates nothing; "within_size" wants the file that large */
    if (huge > SMALL_PAGE && huge <= (uint64_t)INT64_MAX &&
        tv__sys.ftruncate(fd, (off_t)huge) == 0 && tv__sys.fstat(fd, &st) == 0 &&
        (uint64_t)st.st_blksize == huge && (huge & (huge - 1)) == 0) {
        t->pages = TV__TIER_PAGES_THP;
        t->page_len = huge;
    }
    tv__sys.close(fd);
    t->dir = real;
    t->fs_len = fs_len;
    tv__log(
        TV_LOG_INFO,
        "fastpath tier: unnamed files on the tmpfs of %s (cache.dir), %s of %" PRIu64 " bytes%s",
        t->dir, t->page_len > SMALL_PAGE ? "transparent huge pages" : "small pages", t->page_len,
        t->page_len > SMALL_PAGE ? "" : ": mount it with huge=within_size for huge pages");
    return 0;
fail:
    free(real);
    return rc;
}

int tv__tier_create(uint64_t budget_len, const char *dir, tv__tier **out, tv_error *err)
{
    tv__tier *t = calloc(1, sizeof(*t));
    int rc;
    *out = NULL;
    if (!t)
        return tv__seterr(err, -ENOMEM, "fastpath tier: out of memory");
    t->budget_len = budget_len;
    if (dir && *dir) {
        if ((rc = use_dir(t, dir, err))) {
            free(t);
            return rc;
        }
    } else {
        choose_pages(t);
    }
    publish(t);
    *out = t;
    return 0;
}

void tv__tier_destroy(tv__tier *t)
{
    if (!t)
        return;
    while (t->gens)
        tv__tier_gen_free(t->gens);
    free(t->dir);
    free(t);
}

uint64_t tv__tier_page_len(const tv__tier *t)
{
    return t->page_len;
}

void tv__tier_use_small_pages(tv__tier *t)
{
    t->pages = TV__TIER_PAGES_SMALL;
    t->page_len = SMALL_PAGE;
}

tv__tier_gen *tv__tier_find(tv__tier *t, const char *name, int64_t gen, const uint8_t key[32])
{
    for (tv__tier_gen *g = t->gens; g; g = g->next)
        if (g->gen == gen && !strcmp(g->name, name) && !memcmp(g->key, key, sizeof g->key))
            return g;
    return NULL;
}

tv__tier_gen *tv__tier_gens(tv__tier *t)
{
    return t->gens;
}

/* g's memfd mapped read-write at an address aligned to align. */
static int map_gen(tv__tier_gen *g, uint64_t align, tv_error *err)
{
    void *res = MAP_FAILED, *p;
    size_t res_len = 0;
    uint8_t *at = NULL;
    if (align > SMALL_PAGE) {
        uint64_t a = 0;
        if (tv__add_u64(g->len, align, &a) || a > SIZE_MAX)
            return tv__seterr(err, TV_E_OVERFLOW, "fastpath tier: '%s': mapping size overflows",
                              g->name);
        res_len = (size_t)a;
        res = tv__sys.mmap(NULL, res_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (res == MAP_FAILED)
            return tv__seterr(err, -errno, "fastpath tier: '%s': reserving %zu bytes: %s", g->name,
                              res_len, strerror(errno));
        if (tv__align_up_u64((uintptr_t)res, align, &a)) {
            tv__sys.munmap(res, res_len);
            return tv__seterr(err, TV_E_OVERFLOW, "fastpath tier: '%s': address overflows",
                              g->name);
        }
        at = (uint8_t *)(uintptr_t)a;
    }
    p = tv__sys.mmap(at, g->len, PROT_READ | PROT_WRITE, MAP_SHARED | (at ? MAP_FIXED : 0), g->fd,
                     0);
    if (p == MAP_FAILED) {
        int e = errno;
        if (res != MAP_FAILED)
            tv__sys.munmap(res, res_len);
        return tv__seterr(err, -e, "fastpath tier: '%s': mapping %zu bytes: %s", g->name, g->len,
                          strerror(e));
    }
    if (at) {
        size_t head = (size_t)(at - (uint8_t *)res), tail = res_len - head - g->len;
        if (head)
            tv__sys.munmap(res, head);
        if (tail)
            tv__sys.munmap(at + g->len, tail);
    }
    g->base = p;
    if (g->t->pages == TV__TIER_PAGES_THP)
        (void)tv__sys.madvise(g->base, g->len, MADV_HUGEPAGE); /* 'advise' wants it */
    return 0;
}

int tv__tier_gen_new(tv__tier *t, const char *name, int64_t gen, const uint8_t key[32],
                     uint32_t n_chunks, uint32_t chunk_len, uint64_t align, tv__tier_gen **out,
                     tv_error *err)
{
    uint64_t len = 0;
    int rc = 0;
    *out = NULL;
    if (!n_chunks || !chunk_len || chunk_len % t->page_len || align < SMALL_PAGE ||
        (align & (align - 1)))
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "fastpath tier: '%s': %u chunks of %u bytes (a multiple of %" PRIu64
                          "), alignment %" PRIu64,
                          name, n_chunks, chunk_len, t->page_len, align);
    if (tv__mul_u64(n_chunks, chunk_len, &len) || len > (uint64_t)INT64_MAX || len > SIZE_MAX)
        return tv__seterr(err, TV_E_OVERFLOW, "fastpath tier: '%s': %u chunks of %u bytes overflow",
                          name, n_chunks, chunk_len);
    tv__tier_gen *g = calloc(1, sizeof(*g));
    if (!g || !(g->c = calloc(n_chunks, sizeof(*g->c)))) {
        free(g);
        return tv__seterr(err, -ENOMEM, "fastpath tier: '%s': out of memory for %u chunks", name,
                          n_chunks);
    }
    g->t = t;
    snprintf(g->name, sizeof g->name, "%s", name);
    g->gen = gen;
    memcpy(g->key, key, sizeof g->key);
    g->n_chunks = n_chunks;
    g->chunk_len = chunk_len;
    g->len = (size_t)len;
    g->used_ms = now_ms();
    for (uint32_t i = 0; i < n_chunks; i++)
        g->c[i].g = g;
    unsigned huge = t->pages == TV__TIER_PAGES_HUGETLB ? MFD_HUGETLB : 0u;
    if (t->dir) { /* never named (O_EXCL: it cannot be linked later either) */
        g->fd = tv__sys_open(t->dir, O_TMPFILE | O_RDWR | O_EXCL | O_CLOEXEC, 0400);
        g->page_len = t->page_len;
    } else {
        g->fd = memfd_create("tensorvault-tier", MFD_CLOEXEC | MFD_ALLOW_SEALING | huge);
        g->page_len = huge ? t->page_len : SMALL_PAGE;
    }
    if (g->fd < 0 && huge) { /* the pool may be gone since: small pages then */
        g->fd = memfd_create("tensorvault-tier", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        g->page_len = SMALL_PAGE;
    }
    if (g->fd < 0) {
        rc = tv__seterr(err, -errno, "fastpath tier: '%s': %s: %s", name,
                        t->dir ? "an unnamed file in cache.dir" : "memfd_create", strerror(errno));
        goto fail;
    }
    /* read-only for its owner, nothing for others: a peer of another uid
     * cannot reopen it writable through /proc (it has no write seal); a
     * file of cache.dir's tmpfs cannot carry seals (only memfds can), and
     * being unnamed and 0400 is what keeps others from shrinking it */
    if (tv__sys.ftruncate(g->fd, (off_t)len) || fchmod(g->fd, 0400) ||
        (!t->dir && fcntl(g->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL))) {
        rc = tv__seterr(err, -errno, "fastpath tier: '%s': sizing or sealing %" PRIu64 " bytes: %s",
                        name, len, strerror(errno));
        goto fail;
    }
    if ((rc = map_gen(g, align, err)))
        goto fail;
    g->next = t->gens;
    if (t->gens)
        t->gens->prev = g;
    t->gens = g;
    t->n_gens++;
    publish(t);
    *out = g;
    return 0;
fail:
    if (g->fd >= 0)
        tv__sys.close(g->fd);
    free(g->c);
    free(g);
    return rc;
}

void tv__tier_gen_free(tv__tier_gen *g)
{
    if (!g)
        return;
    tv__tier *t = g->t;
    if (g->open)
        tv__tier_gen_close(g);
    for (uint32_t i = 0; i < g->n_chunks; i++) {
        tv__tier_chunk *c = &g->c[i];
        list_unlink(c);
        if (kind(c) & K_VPIN)
            t->vpinned_len -= chunk_len_of(c);
        t->resident_len -= chunk_len_of(c);
    }
    if (g->prev)
        g->prev->next = g->next;
    else
        t->gens = g->next;
    if (g->next)
        g->next->prev = g->prev;
    t->n_gens--;
    if (g->base)
        tv__sys.munmap(g->base, g->len);
    if (g->fd >= 0)
        tv__sys.close(g->fd);
    free(g->c);
    free(g);
    publish(t);
}

int tv__tier_gen_ro_fd(tv__tier_gen *g)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", g->fd);
    return tv__sys_open(path, O_RDONLY | O_CLOEXEC, 0);
}

void tv__tier_gen_open(tv__tier_gen *g, uint64_t floor_len)
{
    if (g->open)
        return;
    g->open = true;
    g->floor_len = floor_len;
    g->t->floors_len += floor_len;
    g->used_ms = now_ms();
    publish(g->t);
}

void tv__tier_gen_close(tv__tier_gen *g)
{
    if (!g->open)
        return;
    g->t->floors_len -= g->floor_len;
    g->floor_len = 0;
    g->open = false;
    g->members = g->active = 0;
    g->used_ms = now_ms();
    owed_recheck(g); /* no member: nothing is owed */
    publish(g->t);
    tv__tier_trim(g->t);
}

/* ---- residency and pins -------------------------------------------------------- */

/* The idle chunk to evict to make room for a chunk of g: the LRU's head
 * (least recently used, any generation), unless that is g's own; then g's
 * most recently used idle chunk. A generation read in one pass larger
 * than the tier thus keeps its first chunks for the next load: evicting
 * least recently used first under such a scan evicts every chunk before
 * the next pass comes back to it, and a looping load would never hit. */
static tv__tier_chunk *victim(tv__tier *t, const tv__tier_gen *g)
{
    tv__tier_chunk *v = t->lru_head;
    if (!v || v->g != g)
        return v;
    for (tv__tier_chunk *m = t->lru_tail; m; m = m->prev)
        if (m->g == g)
            return m;
    return v;
}

int tv__tier_reserve(tv__tier_gen *g, uint32_t idx, uint32_t lo, uint32_t hi)
{
    tv__tier *t = g->t;
    if (idx >= g->n_chunks || hi <= lo || hi > g->chunk_len)
        return TV_E_INVALID_ARG;
    tv__tier_chunk *c = &g->c[idx];
    unsigned was = kind(c);
    if (c->state != TV__TIER_ABSENT && !(was & K_IDLE))
        return TV_E_INVALID_ARG;
    uint64_t old = chunk_len_of(c), want = (uint64_t)(hi - lo);
    uint64_t need = want > old ? want - old : 0;
    list_unlink(c); /* never its own victim */
    uint64_t evictable = 0;
    for (const tv__tier_chunk *v = t->lru_head; v && t->resident_len + need > bound(t) + evictable;
         v = v->next)
        evictable += chunk_len_of(v);
    if (t->resident_len + need > bound(t) + evictable) {
        if (was & K_IDLE)
            place_idle(c);
        return TV_E_BUSY;
    }
    while (t->resident_len + need > bound(t) && t->lru_head)
        evict(victim(t, g));
    g->resident_len = g->resident_len - old + want;
    t->resident_len = t->resident_len - old + want;
    c->state = TV__TIER_READING;
    c->lo = lo;
    c->hi = hi;
    settle(c, was & ~K_IDLE); /* off the lists already */
    return 0;
}

void tv__tier_landed(tv__tier_gen *g, uint32_t idx, bool ok)
{
    tv__tier_chunk *c = &g->c[idx];
    unsigned was = kind(c);
    if (c->state != TV__TIER_READING)
        return;
    if (ok) {
        c->state = TV__TIER_RESIDENT;
    } else {
        uint64_t l = chunk_len_of(c);
        punch(g, (uint64_t)idx * g->chunk_len, g->chunk_len);
        g->resident_len -= l;
        g->t->resident_len -= l;
        c->state = TV__TIER_ABSENT;
        c->lo = c->hi = 0;
    }
    settle(c, was);
}

void tv__tier_ref(tv__tier_gen *g, uint32_t idx)
{
    tv__tier_chunk *c = &g->c[idx];
    unsigned was = kind(c);
    c->refs++;
    settle(c, was);
}

void tv__tier_unref(tv__tier_gen *g, uint32_t idx, uint32_t n)
{
    tv__tier_chunk *c = &g->c[idx];
    unsigned was = kind(c);
    c->refs = n > c->refs ? 0 : c->refs - n;
    settle(c, was);
    tv__tier_trim(g->t);
}

int tv__tier_vref(tv__tier_gen *g, uint32_t idx)
{
    tv__tier_chunk *c = &g->c[idx];
    unsigned was = kind(c);
    if (c->state != TV__TIER_RESIDENT)
        return TV_E_INVALID_ARG;
    if (!c->vrefs && g->t->vpinned_len + chunk_len_of(c) > g->t->budget_len)
        return TV_E_BUSY;
    c->vrefs++;
    settle(c, was);
    return 0;
}

void tv__tier_vunref(tv__tier_gen *g, uint32_t idx, uint32_t n)
{
    tv__tier_chunk *c = &g->c[idx];
    unsigned was = kind(c);
    c->vrefs = n > c->vrefs ? 0 : c->vrefs - n;
    settle(c, was);
    tv__tier_trim(g->t);
}

bool tv__tier_inuse(const tv__tier_gen *g, uint32_t idx)
{
    return (kind(&g->c[idx]) & K_INUSE) != 0;
}

/* ---- members ----------------------------------------------------------------------- */

int tv__tier_member_join(tv__tier_gen *g)
{
    int bit = -1;
    for (unsigned i = 0; i < TV__TIER_MAX_MEMBERS && bit < 0; i++)
        if (!(g->members & (1ull << i)))
            bit = (int)i;
    if (bit < 0)
        return -1;
    uint64_t b = 1ull << bit;
    g->members |= b;
    g->active |= b;
    for (uint32_t i = 0; i < g->n_chunks; i++) {
        tv__tier_chunk *c = &g->c[i];
        c->taken &= ~b;
        if (c->list == LIST_LRU) { /* resident and idle: now owed to the newcomer */
            list_unlink(c);
            list_push(c, LIST_OWED, false);
        }
    }
    return bit;
}

void tv__tier_member_take(tv__tier_gen *g, int bit, uint32_t idx)
{
    if (bit < 0)
        return;
    tv__tier_chunk *c = &g->c[idx];
    c->taken |= 1ull << bit;
    if (c->list == LIST_OWED && !owed(c)) {
        list_unlink(c);
        list_push(c, LIST_LRU, false);
    }
}

void tv__tier_member_active(tv__tier_gen *g, int bit, bool active)
{
    if (bit < 0)
        return;
    uint64_t b = 1ull << bit;
    if (active) {
        g->active |= g->members & b;
        return;
    }
    if (!(g->active & b))
        return;
    g->active &= ~b;
    owed_recheck(g);
}

void tv__tier_member_leave(tv__tier_gen *g, int bit)
{
    if (bit < 0)
        return;
    uint64_t b = 1ull << bit;
    g->members &= ~b;
    g->active &= ~b;
    owed_recheck(g);
}

bool tv__tier_member_owed(const tv__tier_gen *g, int bit)
{
    if (bit < 0 || !(g->active & (1ull << bit)))
        return false;
    for (const tv__tier_chunk *c = g->owed_head; c; c = c->next)
        if (owed(c) & (1ull << bit))
            return true;
    return false;
}

/* ---- stray pages ---------------------------------------------------------------------- */

uint64_t tv__tier_gen_allocated(const tv__tier_gen *g)
{
    struct stat st;
    if (tv__sys.fstat(g->fd, &st))
        return 0;
    return (uint64_t)st.st_blocks * 512u;
}

/* Punches the whole pages of [a, b) of g's memfd, clipped to the data
 * extent [da, db); returns the bytes punched. Only whole pages: a page
 * that also holds resident bytes stays (on hugetlb pages a partial punch
 * would only zero it). */
static uint64_t punch_clip(tv__tier_gen *g, uint64_t a, uint64_t b, uint64_t da, uint64_t db)
{
    if (a < da)
        a = da;
    if (b > db)
        b = db;
    a += (g->page_len - a % g->page_len) % g->page_len; /* checked: a < b <= g->len */
    b -= b % g->page_len;
    if (a >= b)
        return 0;
    punch(g, a, b - a);
    return b - a;
}

/* The bytes g's resident and reading chunks take in whole pages (what
 * the memfd holds when no client touched a hole). */
static uint64_t resident_pages_len(const tv__tier_gen *g)
{
    uint64_t sum = 0, p = g->page_len;
    for (uint32_t i = 0; i < g->n_chunks; i++) {
        const tv__tier_chunk *c = &g->c[i];
        if (c->state != TV__TIER_ABSENT)
            sum += (c->hi + (p - c->hi % p) % p) - (c->lo - c->lo % p); /* checked: <= chunk_len */
    }
    return sum;
}

uint64_t tv__tier_scrub(tv__tier_gen *g)
{
    uint64_t done = 0, pos = 0;
    if (tv__tier_gen_allocated(g) <= g->resident_len || /* the common case, cheaply */
        tv__tier_gen_allocated(g) <= resident_pages_len(g))
        return 0;
    while (pos < g->len) {
        off_t d = tv__sys.lseek(g->fd, (off_t)pos, SEEK_DATA);
        if (d < 0)
            break; /* ENXIO: no data past pos */
        off_t h = tv__sys.lseek(g->fd, d, SEEK_HOLE);
        uint64_t da = (uint64_t)d, db = h < 0 ? g->len : (uint64_t)h;
        if (db <= da)
            break;
        for (uint64_t i = da / g->chunk_len; i < g->n_chunks && i * g->chunk_len < db; i++) {
            const tv__tier_chunk *c = &g->c[i];
            uint64_t s = i * g->chunk_len, e = s + g->chunk_len;
            if (c->state == TV__TIER_ABSENT)
                done += punch_clip(g, s, e, da, db);
            else if (c->state == TV__TIER_RESIDENT)
                done += punch_clip(g, s, s + c->lo, da, db) + punch_clip(g, s + c->hi, e, da, db);
        }
        pos = db;
    }
    atomic_fetch_add(&g->t->st_scrubbed, done);
    return done;
}

tv__tier_gen *tv__tier_empty_dormant(tv__tier *t)
{
    tv__tier_gen *best = NULL;
    for (tv__tier_gen *g = t->gens; g; g = g->next)
        if (!g->open && !g->resident_len && (!best || g->used_ms < best->used_ms))
            best = g;
    return best;
}

void tv__tier_get_stats(const tv__tier *t, tv__tier_stats *out)
{
    tv__tier *m = (tv__tier *)t; /* atomics are read only */
    memset(out, 0, sizeof(*out));
    if (!t)
        return;
    out->budget_len = t->budget_len;
    out->bound_len = atomic_load(&m->st_bound);
    out->resident_len = atomic_load(&m->st_resident);
    out->vpinned_len = atomic_load(&m->st_vpinned);
    out->generations = atomic_load(&m->st_gens);
    out->evictions = atomic_load(&m->st_evictions);
    out->evicted_len = atomic_load(&m->st_evicted);
    out->scrubbed_len = atomic_load(&m->st_scrubbed);
    out->punch_failures = atomic_load(&m->st_punch_failures);
    out->pages = t->pages;
    out->page_len = t->page_len;
}
