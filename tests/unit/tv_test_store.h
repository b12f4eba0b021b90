/* Store fixtures of the server unit tests (TV_SERVER_TESTS in
 * tests/CMakeLists.txt: they include server headers, which a core test may
 * not): a temp dir holding a store on sparse file images, the store opened
 * as the writer, checkpoints imported into it, and a daemon-side fast-path
 * server (tv__fp) on that store. Header-only like tv_test.h, whose helpers
 * (temp dirs, the shard writer, the fault table) come with it.
 *
 * Layout of one fixture: DIR = $TMPDIR/tv-test-TAG-XXXXXX holding the store
 * DIR/store, its images DIR/image0 .. DIR/imageN-1, the fast-path socket
 * DIR/run/tv.sock, and whatever the test writes there (checkpoints).
 * tv_test_store_teardown closes the writer and removes DIR.
 *
 * Use, in a cmocka setup:
 *     tv_test_store_dir(&f->s, "api");                 // DIR and the paths
 *     tv_test_store_create(&f->s, &(tv_test_store_opts){.image_size = 16 * MiB});
 *     tv_test_store_import(&f->s, "m", ck, NULL);      // activated
 * or tv_test_store_setup(&f->s, "api", NULL) for the first two at once.
 * Helpers that fail print the reason and fail the test (fail_msg). */
#ifndef TV_TEST_STORE_H
#define TV_TEST_STORE_H

#include "fastpath/fastpath.h"
#include "import/import.h"
#include "store/store.h"
#include "tv_test.h"

#define TV_TEST_STORE_MAX_IMAGES 4

typedef struct tv_test_store {
    char dir[160];                             /* the temp dir */
    char store[192];                           /* DIR/store */
    char image[TV_TEST_STORE_MAX_IMAGES][192]; /* DIR/imageI */
    char sock[192];                            /* DIR/run/tv.sock */
    int64_t dev[TV_TEST_STORE_MAX_IMAGES];     /* device ids of the images */
    size_t n_images;                           /* images initialised */
    tv__store *st;                             /* the writer (NULL when closed) */
} tv_test_store;

typedef struct tv_test_store_opts {
    size_t n_images;     /* 0 = 1 */
    uint64_t image_size; /* bytes per image; 0 = 16 MiB */
    uint64_t region_len; /* 0 = the rest of the image */
    bool no_open;        /* leave the writer closed (s->st NULL) */
} tv_test_store_opts;

/* Creates the temp dir and fills in every path; initialises nothing. */
static inline void tv_test_store_dir(tv_test_store *s, const char *tag)
{
    memset(s, 0, sizeof *s);
    tv_test_tmpdir(s->dir, sizeof s->dir, tag);
    tv_test_path(s->store, sizeof s->store, "%s/store", s->dir);
    for (int i = 0; i < TV_TEST_STORE_MAX_IMAGES; i++)
        tv_test_path(s->image[i], sizeof s->image[i], "%s/image%d", s->dir, i);
    tv_test_path(s->sock, sizeof s->sock, "%s/run/tv.sock", s->dir);
}

/* Initialises the store on o->n_images fresh sparse images (their device
 * ids in s->dev, in order) and opens it as the writer (s->st) unless
 * o->no_open. o may be NULL (one 16 MiB image, opened). */
static inline void tv_test_store_create(tv_test_store *s, const tv_test_store_opts *o)
{
    static const tv_test_store_opts dflt = {0};
    o = o ? o : &dflt;
    size_t n = o->n_images ? o->n_images : 1;
    TV_TEST_CHECK(n <= TV_TEST_STORE_MAX_IMAGES);
    for (size_t i = 0; i < n; i++) {
        tv_error err = {0};
        tv__store_init_opts io = {.image = s->image[i],
                                  .image_size_bytes = o->image_size ? o->image_size : 16u << 20,
                                  .region_len = o->region_len};
        if (tv__store_init(s->store, &io, &s->dev[i], &err))
            TV_TEST_DIE("store init %s: %s", s->image[i], err.msg);
    }
    s->n_images = n;
    if (!o->no_open) {
        tv_error err = {0};
        if (tv__store_open(s->store, TV__STORE_WRITE, &s->st, &err))
            TV_TEST_DIE("store open %s: %s", s->store, err.msg);
    }
}

/* tv_test_store_dir then tv_test_store_create. */
static inline void tv_test_store_setup(tv_test_store *s, const char *tag,
                                       const tv_test_store_opts *o)
{
    tv_test_store_dir(s, tag);
    tv_test_store_create(s, o);
}

/* Imports src as model through the writer (opened here when closed, and
 * left open); o NULL imports and activates. Returns the generation. */
static inline int64_t tv_test_store_import(tv_test_store *s, const char *model, const char *src,
                                           const tv__import_opts *o)
{
    static const tv__import_opts activate = {.activate = true};
    tv_error err = {0};
    if (!s->st && tv__store_open(s->store, TV__STORE_WRITE, &s->st, &err))
        TV_TEST_DIE("store open %s: %s", s->store, err.msg);
    tv__import_result res;
    memset(&res, 0, sizeof res);
    if (tv__import(s->st, model, src, o ? o : &activate, &res, &err))
        TV_TEST_DIE("import %s as %s: %s", src, model, err.msg);
    return res.generation;
}

/* Closes the writer (readers and other writers may then open the store). */
static inline void tv_test_store_close_writer(tv_test_store *s)
{
    tv__store_close(s->st);
    s->st = NULL;
}

/* Starts a fast-path server (tv__fp) on the store and returns it (the
 * caller stops it with tv__fp_stop): o as given, with socket_path s->sock
 * and store_dir s->store where o leaves them NULL. */
static inline tv__fp *tv_test_store_fp_start(const tv_test_store *s, const tv__fp_opts *o)
{
    tv__fp_opts fo = *o;
    if (!fo.socket_path)
        fo.socket_path = s->sock;
    if (!fo.store_dir)
        fo.store_dir = s->store;
    tv_error err = {0};
    tv__fp *fp = NULL;
    int rc = tv__fp_start(&fo, &fp, &err);
    if (rc)
        TV_TEST_DIE("tv__fp_start: %s (%d)", err.msg, rc);
    return fp;
}

/* Closes the writer, removes the temp dir; the fixture is zeroed (a second
 * call is a no-op). */
static inline void tv_test_store_teardown(tv_test_store *s)
{
    tv_test_store_close_writer(s);
    if (s->dir[0])
        tv_test_rmtree(s->dir);
    memset(s, 0, sizeof *s);
}

#endif
