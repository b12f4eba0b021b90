/* Power-loss simulation for the tests (SQLite's test6.c idea): every write
 * to a file since that file's last successful fsync/fdatasync is volatile,
 * and a "power loss" at sync point k throws all of them away.
 *
 * What is interposed (in a forked child only, the parent is untouched):
 *   - tv__sys.pwrite / ftruncate: an undo record (the bytes and the file size
 *     before the write) is kept per file, keyed by st_dev/st_ino;
 *   - tv__sys.fsync / fdatasync: a sync point; on success the file's undo
 *     records are dropped (its writes are durable); an fsync of a directory
 *     is a sync point too;
 *   - SQLite: a wrapper VFS registered as the default (before the command
 *     opens the registry) whose xWrite/xTruncate keep undo records of the
 *     main database and the WAL and whose xSync is a sync point, exactly as
 *     in test6.c. The -shm is not durable state: it is left as the dead
 *     process left it, and SQLite rebuilds it from the WAL (the child's
 *     death released its locks);
 *   - tv__sys.open (O_CREAT of a new file) / rename / rename_noreplace /
 *     link / unlink / mkdir, once tv_pl_model_dirs named a stash directory:
 *     a directory entry is durable only after an fsync of its directory; a
 *     file replaced or unlinked meanwhile is kept alive under a hard link in
 *     the stash until then;
 *   - tv__sys_crash_hook: records the last crash point passed, for the trace.
 * Sync points are numbered 1, 2, ... over all of them in call order.
 *
 * Power loss at sync point k: the k-th sync is not performed; instead every
 * unsynced write of every file is reverted (old bytes restored, size put
 * back), every directory operation since its directory's last fsync is
 * undone, newest first, and the child _exit()s at once, so no cleanup code
 * runs.
 * TV_PL_AT_END: the command runs to its end, then its unsynced writes are
 * dropped (loss after the last sync completed). A loss anywhere between
 * sync k-1 and sync k (at a crash point, say) leaves exactly the state of
 * a loss at sync k, since nothing becomes durable but at a sync: cutting
 * at every sync and at the end covers every moment of the command.
 *
 * Not modelled: the directory entries SQLite makes (its files are taken as
 * durable when created or deleted: SQLite fsyncs their directory itself),
 * and entries made by calls that bypass tv__sys; a rename is durable with
 * its target's directory (the suite renames within one directory); writes
 * are lost whole or, with tv_pl_keep_random, sector by sector (never a torn
 * sector); block devices (the suite uses file images). */
#ifndef TV_TEST_POWERLOSS_H
#define TV_TEST_POWERLOSS_H

#include <stdbool.h>
#include <stdint.h>

#define TV_PL_MAX_SYNCS 1024
#define TV_PL_COUNT     0    /* no power loss: count the sync points */
#define TV_PL_AT_END    (-1) /* power loss after the command returned */
#define TV_PL_CUT       1000 /* tv_pl_run's result when the power was cut */

typedef struct tv_pl_sync {
    char op[12];    /* "fsync", "fdatasync", "xSync" */
    char file[80];  /* the file's name (last two path components) */
    char after[32]; /* the last crash point passed before it ("" if none) */
} tv_pl_sync;

/* Shared between the parent and the child (MAP_SHARED). */
typedef struct tv_pl_trace {
    int n_syncs;    /* sync points reached (a cut one included) */
    bool cut;       /* the power was cut */
    int n_reverted; /* undo records applied at the cut */
    tv_pl_sync sync[TV_PL_MAX_SYNCS];
} tv_pl_trace;

/* Turns on the model of directory entries for later tv_pl_run calls:
 * stash_dir (on the same filesystem as the files the commands touch, and
 * not inside a directory they list) holds the hard links that keep
 * replaced and unlinked files revertible. NULL turns it off. */
void tv_pl_model_dirs(const char *stash_dir);

/* For later tv_pl_run calls: seed 0 (the default) drops every unsynced
 * write at a cut; any other seed keeps a random subset instead, as test6.c
 * does: each 512-byte sector an unsynced write touched ends with its
 * newest bytes with probability 1/2, 7/8 or 31/32 (chosen per cut), else
 * its synced ones, each file with its old or its new size, and a
 * prefix of the unsynced directory operations survives (metadata is
 * journalled in order). What was synced is kept either way. */
void tv_pl_keep_random(uint64_t seed);

/* A zeroed trace in shared memory (NULL on failure); free with
 * tv_pl_trace_free. */
tv_pl_trace *tv_pl_trace_new(void);
void tv_pl_trace_free(tv_pl_trace *t);

/* Runs fn(ctx) in a fork()ed child with the hooks above armed and power
 * loss at sync point cut (1-based; TV_PL_COUNT: never; TV_PL_AT_END: after
 * fn returned). trace (reset here) receives the sync points the child saw.
 * The child's stdout and stderr go to /dev/null unless TV_PL_VERBOSE is set.
 * Returns TV_PL_CUT when the power was cut, fn's result (0..255) when it
 * returned without a cut, or -1 when the child died otherwise (a signal:
 * the message is printed). The parent must have no thread and no SQLite
 * connection open when calling it. */
int tv_pl_run(int (*fn)(void *ctx), void *ctx, int cut, tv_pl_trace *trace);

#endif
