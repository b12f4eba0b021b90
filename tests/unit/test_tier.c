/* Unit tests of the memory tier's bookkeeping (server/fastpath/tier.c):
 * which idle chunk makes room. Another generation's least recently used
 * chunk goes first; a generation read in one pass larger than the budget
 * gives up its own most recently used chunk, so it keeps its first chunks
 * and the next pass reads them from memory (least recently used first
 * would have evicted each of them before that pass came back). Chunks kept
 * keep their bytes. */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cmocka.h>

#include "fastpath/tier.h"
#include "reader/daemon.h"
#include "tv_test.h"

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

#define CHUNK (4u * 4096u)

static tv__tier_gen *new_gen(tv__tier *t, const char *name, uint32_t n_chunks)
{
    uint8_t key[32] = {0};
    tv__tier_gen *g = NULL;
    tv_error err = {0};
    memcpy(key, name, strlen(name) < sizeof key ? strlen(name) : sizeof key);
    assert_int_equal(tv__tier_gen_new(t, name, 1, key, n_chunks, CHUNK, 4096, &g, &err), 0);
    tv__tier_gen_open(g, CHUNK); /* a floor of one chunk */
    return g;
}

/* A device read of chunk i (its bytes: i + 1), then a copy taken and
 * released: the chunk is idle and resident. Returns whether it was a hit
 * (resident already; its bytes are checked). */
static bool load(tv__tier_gen *g, uint32_t i)
{
    bool hit = g->c[i].state == TV__TIER_RESIDENT;
    uint8_t *p = g->base + (size_t)i * CHUNK;
    if (hit) {
        for (size_t k = 0; k < CHUNK; k += 511)
            assert_int_equal(p[k], (uint8_t)(i + 1));
    } else {
        assert_int_equal(tv__tier_reserve(g, i, 0, CHUNK), 0);
        memset(p, (int)(i + 1), CHUNK);
        tv__tier_landed(g, i, true);
    }
    tv__tier_ref(g, i);
    tv__tier_unref(g, i, 1);
    return hit;
}

static tv__tier *small_tier(uint32_t budget_chunks)
{
    tv__tier *t = NULL;
    tv_error err = {0};
    assert_int_equal(tv__tier_create((uint64_t)budget_chunks * CHUNK, NULL, &t, &err), 0);
    tv__tier_use_small_pages(t);
    return t;
}

static void test_a_pass_larger_than_the_budget_keeps_its_head(void **state)
{
    (void)state;
    tv__tier *t = small_tier(4); /* bound: 4 + the floor's 1 = 5 chunks */
    tv__tier_gen *g = new_gen(t, "big", 10);
    for (uint32_t i = 0; i < 10; i++)
        assert_false(load(g, i));
    tv__tier_stats st;
    tv__tier_get_stats(t, &st);
    assert_int_equal(st.resident_len, 5 * CHUNK);
    for (uint32_t i = 0; i < 4; i++)
        assert_int_equal(g->c[i].state, TV__TIER_RESIDENT);
    unsigned hits2 = 0, hits3 = 0;
    for (uint32_t i = 0; i < 10; i++)
        hits2 += load(g, i);
    for (uint32_t i = 0; i < 10; i++)
        hits3 += load(g, i);
    /* least recently used first: 0 hits in every pass */
    assert_true(hits2 >= 4);
    assert_true(hits3 >= 4);
    tv__tier_get_stats(t, &st);
    assert_true(st.resident_len <= 5 * CHUNK);
    tv__tier_destroy(t);
}

static void test_another_generation_goes_first(void **state)
{
    (void)state;
    tv__tier *t = small_tier(4);
    tv__tier_gen *a = new_gen(t, "a", 4);
    for (uint32_t i = 0; i < 4; i++)
        load(a, i);
    tv__tier_gen_close(a); /* dormant: its floor goes, its chunks stay */
    tv__tier_gen *b = new_gen(t, "b", 4);
    load(b, 0); /* 4 + 1 = the bound: nothing goes */
    for (uint32_t i = 0; i < 4; i++)
        assert_int_equal(a->c[i].state, TV__TIER_RESIDENT);
    load(b, 1); /* a's least recently used chunk goes, not b's */
    assert_int_equal(a->c[0].state, TV__TIER_ABSENT);
    assert_int_equal(a->c[1].state, TV__TIER_RESIDENT);
    assert_int_equal(b->c[0].state, TV__TIER_RESIDENT);
    load(b, 2);
    load(b, 3);
    assert_int_equal(a->c[1].state, TV__TIER_ABSENT);
    assert_int_equal(a->c[2].state, TV__TIER_ABSENT);
    assert_int_equal(a->c[3].state, TV__TIER_RESIDENT);
    for (uint32_t i = 0; i < 4; i++)
        assert_true(load(b, i));
    tv__tier_destroy(t);
}

static void test_a_chunk_in_use_is_never_the_victim(void **state)
{
    (void)state;
    tv__tier *t = small_tier(1); /* bound: 1 + 1 = 2 chunks */
    tv__tier_gen *g = new_gen(t, "g", 4);
    load(g, 0);
    tv__tier_ref(g, 0); /* a copy in progress */
    load(g, 1);
    assert_int_equal(tv__tier_reserve(g, 2, 0, CHUNK), 0); /* 1 goes, not 0 */
    assert_int_equal(g->c[0].state, TV__TIER_RESIDENT);
    assert_int_equal(g->c[1].state, TV__TIER_ABSENT);
    assert_int_equal(tv__tier_reserve(g, 3, 0, CHUNK), TV_E_BUSY); /* 0 in use, 2 reading */
    tv__tier_unref(g, 0, 1);
    assert_int_equal(tv__tier_reserve(g, 3, 0, CHUNK), 0);
    assert_int_equal(g->c[0].state, TV__TIER_ABSENT);
    assert_int_equal(g->c[2].state, TV__TIER_READING);
    tv__tier_landed(g, 3, false);
    assert_int_equal(g->c[3].state, TV__TIER_ABSENT);
    tv__tier_landed(g, 2, true);
    tv__tier_destroy(t);
}

/* The entries of dir other than . and .. */
static unsigned n_entries(const char *dir)
{
    unsigned n = 0;
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

/* cache.dir: the generations live in unnamed files on that tmpfs (nothing
 * appears in the directory), 0400, read-only descriptors for clients that
 * pass the client's check, holes punched on eviction as with memfds. */
static void test_cache_dir_holds_unnamed_files(void **state)
{
    (void)state;
    struct statfs sf;
    if (statfs("/dev/shm", &sf) || (unsigned long)sf.f_type != (unsigned long)TMPFS_MAGIC)
        skip(); /* no tmpfs at /dev/shm on this machine */
    char dir[] = "/dev/shm/tv-test-tier-XXXXXX";
    assert_non_null(mkdtemp(dir));
    tv__tier *t = NULL;
    tv_error err = {0};
    assert_int_equal(tv__tier_create(CHUNK, dir, &t, &err), 0);
    tv__tier_use_small_pages(t); /* CHUNK is small pages' multiple, not a huge page's */
    tv__tier_gen *g = new_gen(t, "d", 4);
    assert_int_equal(n_entries(dir), 0);
    struct stat st;
    assert_int_equal(fstat(g->fd, &st), 0);
    assert_int_equal(st.st_nlink, 0);
    assert_int_equal(st.st_mode & 0777, 0400);
    assert_int_equal(st.st_size, 4 * CHUNK);
    for (uint32_t i = 0; i < 3; i++)
        assert_false(load(g, i)); /* the bound is 1 + 1 chunks: one of them went */
    uint32_t gone = 3;
    for (uint32_t i = 0; i < 3; i++)
        if (g->c[i].state == TV__TIER_ABSENT)
            gone = i;
    assert_true(gone < 3);
    int ro = tv__tier_gen_ro_fd(g);
    assert_true(ro >= 0);
    tv_error e = {0};
    assert_int_equal(tv__fpc_check_memfd(ro, 4 * CHUNK, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL,
                                         true, "tier", &e),
                     0);
    uint8_t *p = mmap(NULL, 4 * CHUNK, PROT_READ, MAP_SHARED, ro, 0);
    assert_true(p != MAP_FAILED);
    for (uint32_t i = 0; i < 3; i++) /* the evicted chunk's hole reads as zeros */
        for (size_t k = 0; k < CHUNK; k += 1021)
            assert_int_equal(p[(size_t)i * CHUNK + k], i == gone ? 0 : (uint8_t)(i + 1));
    assert_true(mmap(NULL, 4 * CHUNK, PROT_READ | PROT_WRITE, MAP_SHARED, ro, 0) == MAP_FAILED);
    munmap(p, 4 * CHUNK);
    close(ro);
    tv__tier_destroy(t);
    assert_int_equal(rmdir(dir), 0);
}

static void test_cache_dir_must_be_a_tmpfs(void **state)
{
    (void)state;
    tv__tier *t = (tv__tier *)1;
    tv_error err = {0};
    assert_int_equal(tv__tier_create(CHUNK, "/proc", &t, &err), TV_E_INVALID_ARG);
    assert_null(t);
    assert_non_null(strstr(err.msg, "cache.dir '/proc' is not on a tmpfs"));
    err = (tv_error){0};
    assert_int_equal(tv__tier_create(CHUNK, "/nonexistent/tv-tier", &t, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "cache.dir '/nonexistent/tv-tier'"));
    assert_non_null(strstr(err.msg, "No such file"));
}

/* The client's check of the tier's descriptor: sealed memfds, or unnamed
 * files without write permission on a tmpfs; nothing else. */
static void test_client_checks_the_tier_descriptor(void **state)
{
    (void)state;
    const int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
    tv_error e = {0};
    int fd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 8192), 0);
    /* unsealed and writable by its owner: refused, tier or not */
    assert_int_equal(tv__fpc_check_memfd(fd, 8192, seals, true, "tier", &e), TV_E_PROTOCOL);
    assert_non_null(strstr(e.msg, "tier memfd is not sealed"));
    assert_int_equal(tv__fpc_check_memfd(fd, 4096, seals, true, "tier", &e), TV_E_PROTOCOL);
    assert_non_null(strstr(e.msg, "not a memfd of 4096 bytes (8192 bytes)"));
    assert_int_equal(fcntl(fd, F_ADD_SEALS, seals), 0);
    assert_int_equal(tv__fpc_check_memfd(fd, 8192, seals, true, "tier", &e), 0);
    assert_int_equal(tv__fpc_check_memfd(fd, 8192, seals | F_SEAL_WRITE, false, "arena", &e),
                     TV_E_PROTOCOL);
    close(fd);
    struct statfs sf;
    if (statfs("/dev/shm", &sf) || (unsigned long)sf.f_type != (unsigned long)TMPFS_MAGIC)
        skip(); /* the tmpfs cases need a tmpfs */
    char dir[] = "/dev/shm/tv-test-tierfd-XXXXXX", named[64];
    assert_non_null(mkdtemp(dir));
    fd = open(dir, O_TMPFILE | O_RDWR | O_EXCL | O_CLOEXEC, 0400);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 8192), 0);
    assert_int_equal(tv__fpc_check_memfd(fd, 8192, seals, true, "tier", &e), 0);
    /* never for the snapshot or the staging arena, which must be sealed */
    assert_int_equal(tv__fpc_check_memfd(fd, 8192, seals, false, "arena", &e), TV_E_PROTOCOL);
    assert_int_equal(fchmod(fd, 0600), 0); /* its owner may write: refused */
    assert_int_equal(tv__fpc_check_memfd(fd, 8192, seals, true, "tier", &e), TV_E_PROTOCOL);
    assert_non_null(strstr(e.msg, "nor an unnamed read-only tmpfs file"));
    close(fd);
    snprintf(named, sizeof named, "%s/named", dir); /* a name: anyone may reach it */
    fd = open(named, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0400);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 8192), 0);
    assert_int_equal(tv__fpc_check_memfd(fd, 8192, seals, true, "tier", &e), TV_E_PROTOCOL);
    close(fd);
    assert_int_equal(unlink(named), 0);
    assert_int_equal(rmdir(dir), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_pass_larger_than_the_budget_keeps_its_head),
        cmocka_unit_test(test_another_generation_goes_first),
        cmocka_unit_test(test_a_chunk_in_use_is_never_the_victim),
        cmocka_unit_test(test_cache_dir_holds_unnamed_files),
        cmocka_unit_test(test_cache_dir_must_be_a_tmpfs),
        cmocka_unit_test(test_client_checks_the_tier_descriptor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
