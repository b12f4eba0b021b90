/* Snapshot files in a store directory, readable without SQLite:
 *
 *   DIR/snapshots/<escaped model>/<gen>.tvsnap   one immutable image per generation
 *   DIR/snapshots/<escaped model>/active         text: the active generation number
 *                                                (and the one it replaced)
 *   DIR/snapshots/<escaped model>/alias.<alias>  text: the generation the alias names
 *   DIR/snapshots/<escaped model>/deactivated    the active pointer a deactivation
 *                                                moved away, until it is committed
 *
 * Invariants:
 *   - every file appears atomically (temporary file, fdatasync, rename,
 *     fsync of the directory), so a reader sees a whole file or none;
 *   - a generation's file is never replaced in place: writing one that
 *     exists fails with -EEXIST (a reader's flock on it stays meaningful);
 *   - a reader holds a shared flock on the file it opened for its whole
 *     lifetime: that lock is the reader lease. tv__snapfile_remove takes the
 *     exclusive lock without waiting and unlinks under it, so it never
 *     removes a leased file, and a reader that opened the file just before
 *     the unlink notices (link count 0) and does not use it;
 *   - escaping is injective: '/', '%', control bytes (< 0x20, 0x7f) and a
 *     leading '.' become %XX (upper-case hex); when the result would exceed
 *     TV__SNAPFILE_ESCAPED_MAX bytes it becomes a %XX-safe prefix of at
 *     most 128 bytes + "%~" + the SHA-256 (hex) of the name, which no plain
 *     escape contains. Escaped names never start with '.', so temporary
 *     files (".tmp-*") never collide with them.
 *   - files are opened safely: never through a symbolic link (O_NOFOLLOW
 *     on the file; DIR/snapshots and the model directory must be real
 *     directories, checked with O_NOFOLLOW | O_DIRECTORY), never blocking
 *     on a FIFO (O_NONBLOCK, then fstat); anything but a regular file in a
 *     snapshot's or pointer's place is TV_E_SNAPSHOT.
 * Only the store's writer (holder of DIR/lock) writes or removes these
 * files. Paths are at most TV__SNAPFILE_PATH_MAX bytes including the NUL. */
#ifndef TV_SNAP_SNAPFILE_H
#define TV_SNAP_SNAPFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/internal.h"

#define TV__SNAPFILE_DIR          "snapshots"
#define TV__SNAPFILE_EXT          ".tvsnap"
#define TV__SNAPFILE_ACTIVE       "active"
#define TV__SNAPFILE_DEACTIVATED  "deactivated"
#define TV__SNAPFILE_TMP_PREFIX   ".tmp-"
#define TV__SNAPFILE_ESCAPED_MAX  200 /* longer escapes use the hashed form */
#define TV__SNAPFILE_PATH_MAX     4096
#define TV__SNAPFILE_MAX_LEN      (1ull << 30) /* largest image a reader loads */
#define TV__SNAPFILE_POINTER_MAX  64           /* longest valid active pointer */
#define TV__SNAPFILE_ALIAS_PREFIX "alias."
#define TV__SNAPFILE_ALIAS_MAX    64 /* = TV__ALIAS_MAX of the registry */

/* Escapes model (NUL-terminated, non-empty) into out (out_len >=
 * TV__SNAPFILE_ESCAPED_MAX + 1 always suffices). Returns 0;
 * TV_E_INVALID_ARG (NULL or empty model); -ENAMETOOLONG (out too small);
 * -ENOMEM. */
int tv__snapfile_escape(const char *model, char *out, size_t out_len, tv_error *err);

/* DIR/snapshots/<escaped>, DIR/snapshots/<escaped>/<gen>.tvsnap (gen > 0)
 * and DIR/snapshots/<escaped>/active. Return 0; TV_E_INVALID_ARG (NULL
 * argument, gen <= 0); -ENAMETOOLONG; -ENOMEM. */
int tv__snapfile_model_dir(const char *dir, const char *model, char *out, size_t out_len,
                           tv_error *err);
int tv__snapfile_path(const char *dir, const char *model, int64_t gen, char *out, size_t out_len,
                      tv_error *err);
int tv__snapfile_active_path(const char *dir, const char *model, char *out, size_t out_len,
                             tv_error *err);

/* Sets *exists: true when a regular file is there (lstat: a symbolic
 * link, FIFO or directory in its place is not a snapshot; writing one then
 * fails with -EEXIST and the caller replaces the entry). Returns 0, the
 * path errors, or -errno from lstat (not ENOENT). */
int tv__snapfile_exists(const char *dir, const char *model, int64_t gen, bool *exists,
                        tv_error *err);

/* Writes generation gen's image atomically (creating DIR/snapshots and the
 * model directory if needed, mode 0755; the file is 0644). Returns 0;
 * -EEXIST when the generation's file already exists (never replaced);
 * TV_E_INVALID_ARG (NULL buf, len 0, gen <= 0); the path errors; -errno
 * from mkdir/open/pwrite/fdatasync/rename/fsync (pwrite and fdatasync go
 * through tv__sys). On failure the temporary file is removed. */
int tv__snapfile_write(const char *dir, const char *model, int64_t gen, const void *buf, size_t len,
                       tv_error *err);

/* The active pointer's bytes (docs/formats.md): "<gen>" with an optional
 * newline, or "<gen>\nfrom <prev>\n" where prev is the generation it
 * replaced (0: none). Numbers are decimal digits without sign or leading
 * zeros (prev may be "0"), gen > 0, both <= INT64_MAX; at most
 * TV__SNAPFILE_POINTER_MAX bytes. A pure function of the bytes (fuzzed).
 * Returns 0, *gen and *from (-1 when there is no "from" line);
 * TV_E_SNAPSHOT (malformed); TV_E_INVALID_ARG (NULL). */
int tv__snapfile_parse_active(const void *buf, size_t len, int64_t *gen, int64_t *from,
                              tv_error *err);

/* Points the model's active pointer at gen, written atomically (temporary
 * file, fdatasync, rename over the old pointer, fsync of the directory):
 * "<gen>\n", or with from >= 0 "<gen>\nfrom <from>\n" (the activation
 * protocol records the generation it replaces, see snapbuild.h). gen 0
 * removes the pointer (absent is fine; from must be < 0). Returns 0;
 * TV_E_INVALID_ARG; TV_E_SNAPSHOT (a directory above is a symbolic link);
 * the path errors; -errno. */
int tv__snapfile_write_pointer(const char *dir, const char *model, int64_t gen, int64_t from,
                               tv_error *err);
/* tv__snapfile_write_pointer(dir, model, gen, -1, err); gen < 0 is
 * TV_E_INVALID_ARG. */
int tv__snapfile_write_active(const char *dir, const char *model, int64_t gen, tv_error *err);

/* Reads the active pointer (opened safely, see above). Returns 0, *gen > 0
 * and *from (-1: no "from" line); TV_E_NOT_FOUND (no pointer: the model has
 * no active generation or does not exist); TV_E_SNAPSHOT (malformed, or not
 * a regular file); the path errors; -errno. */
int tv__snapfile_read_pointer(const char *dir, const char *model, int64_t *gen, int64_t *from,
                              tv_error *err);
/* The same without *from. */
int tv__snapfile_read_active(const char *dir, const char *model, int64_t *gen, tv_error *err);

/* Deactivation (docs/formats.md 1.12b): renames the active pointer to
 * DIR/snapshots/<escaped>/deactivated (replacing an older one), then fsyncs
 * the directory: readers see no active generation from the rename on, and
 * the pointer's bytes stay behind so that a writer killed before its
 * commit is told apart from a lost pointer. *moved = whether the rename
 * happened (false: there was no pointer; nothing written); on an error
 * with *moved true the rename is done and only its fsync failed. Returns
 * 0; TV_E_SNAPSHOT (a directory above is a symbolic link); the path
 * errors; -errno from rename/fsync. */
int tv__snapfile_deactivate(const char *dir, const char *model, bool *moved, tv_error *err);
/* Undoes tv__snapfile_deactivate: renames "deactivated" back to "active"
 * and fsyncs the directory. Returns 0; TV_E_NOT_FOUND (no such file); the
 * path errors; -errno. */
int tv__snapfile_undo_deactivate(const char *dir, const char *model, tv_error *err);
/* Reads the moved pointer like tv__snapfile_read_pointer. Returns 0, *gen
 * and *from; TV_E_NOT_FOUND (none); TV_E_SNAPSHOT (malformed, not a
 * regular file); the path errors; -errno. */
int tv__snapfile_read_deactivated(const char *dir, const char *model, int64_t *gen, int64_t *from,
                                  tv_error *err);
/* Removes the moved pointer (unlink, fsync of the directory); absent is
 * fine. Returns 0; the path errors; -errno. */
int tv__snapfile_remove_deactivated(const char *dir, const char *model, tv_error *err);

/* The alias rule (the registry's tv__alias_name_valid, without messages):
 * [A-Za-z][A-Za-z0-9._-]{0,63} and not "active". A digits-only string is
 * never an alias, so NAME@3 always means a generation. */
bool tv__snapfile_alias_valid(const char *alias);

/* DIR/snapshots/<escaped>/alias.<alias>. Returns 0; TV_E_NAME (not an alias
 * name); the path errors. */
int tv__snapfile_alias_path(const char *dir, const char *model, const char *alias, char *out,
                            size_t out_len, tv_error *err);

/* Points the alias at gen ("<gen>\n", written atomically like the active
 * pointer); gen 0 removes the pointer (absent is fine). Returns 0;
 * TV_E_NAME; TV_E_INVALID_ARG; TV_E_SNAPSHOT; the path errors; -errno. */
int tv__snapfile_write_alias(const char *dir, const char *model, const char *alias, int64_t gen,
                             tv_error *err);

/* Reads an alias pointer. Returns 0 and *gen > 0; TV_E_NOT_FOUND (no such
 * pointer); TV_E_NAME; TV_E_SNAPSHOT (malformed, a "from" line, not a
 * regular file); the path errors; -errno. */
int tv__snapfile_read_alias(const char *dir, const char *model, const char *alias, int64_t *gen,
                            tv_error *err);

typedef struct tv__snapfile_alias {
    char name[TV__SNAPFILE_ALIAS_MAX + 1];
} tv__snapfile_alias;

/* The alias pointers present in the model's directory (names only, in
 * directory order; entries whose name breaks the alias rule are skipped).
 * A missing directory is an empty list. *out is malloc'd (free()).
 * Returns 0; the path errors; -errno; -ENOMEM. */
int tv__snapfile_list_aliases(const char *dir, const char *model, tv__snapfile_alias **out,
                              size_t *n, tv_error *err);

/* Removes the model's directory (writer only, for a deleted model): every
 * generation file through tv__snapfile_remove (so a leased one stops it
 * with TV_E_LEASED), the active, moved and alias pointers and temporary files,
 * then the directory itself and an fsync of DIR/snapshots. A missing
 * directory is success. Anything else in the directory is left and makes
 * the rmdir fail (-ENOTEMPTY, naming it). Returns 0 or those errors. */
int tv__snapfile_remove_model(const char *dir, const char *model, tv_error *err);

/* Opens generation gen (0 = the one the active pointer names; the pointer is
 * re-read if that file vanished under it), takes a SHARED flock on it (the
 * reader lease: keep *fd open for the reader's lifetime, close it to
 * release) and maps it read-only into *buf (*len bytes; release with
 * tv__snapfile_unmap, never free()). The mapping stays valid after *fd is
 * closed: snapshot files are immutable (never truncated or rewritten in
 * place, only unlinked), so no page of it can vanish (no SIGBUS).
 * Validation of the bytes is tv__snap_open's job.
 * Returns 0; TV_E_NOT_FOUND (no such file, no active pointer, or the file
 * was removed by gc while opening); TV_E_SNAPSHOT (a symbolic link, FIFO,
 * directory or other non-regular file in its place or in place of a
 * directory above it, a malformed pointer, empty or over
 * TV__SNAPFILE_MAX_LEN); TV_E_INVALID_ARG; the path errors; -errno from
 * open/flock/fstat/mmap. On failure *fd is -1 and *buf NULL. */
int tv__snapfile_open(const char *dir, const char *model, int64_t gen, int *fd, void **buf,
                      size_t *len, tv_error *err);
/* The same, and *opened (may be NULL) receives the generation whose file
 * was opened (gen, or the one the pointer named). */
int tv__snapfile_open_gen(const char *dir, const char *model, int64_t gen, int64_t *opened, int *fd,
                          void **buf, size_t *len, tv_error *err);
/* Opens the generation alias names (tv__snapfile_read_alias), like
 * tv__snapfile_open_gen; the pointer is re-read if the file vanished under
 * it (the alias moved and gc removed the old generation). *opened (may be
 * NULL) = the generation opened. Returns those of tv__snapfile_open_gen and
 * tv__snapfile_read_alias (TV_E_NOT_FOUND: no such alias; TV_E_NAME). */
int tv__snapfile_open_alias(const char *dir, const char *model, const char *alias, int64_t *opened,
                            int *fd, void **buf, size_t *len, tv_error *err);
/* Unmaps an image tv__snapfile_open returned (buf NULL: no-op). */
void tv__snapfile_unmap(void *buf, size_t len);

/* For gc: tries LOCK_EX|LOCK_NB on a new open file description of the
 * generation's file and releases it at once. *leased = true when a reader
 * holds a shared lock; false when none does, the file does not exist or is
 * not a regular file (no reader can hold it).
 * Returns 0, TV_E_INVALID_ARG, the path errors, or -errno. */
int tv__snapfile_try_exclusive(const char *dir, const char *model, int64_t gen, bool *leased,
                               tv_error *err);

/* Removes the generation's file under the exclusive lock (taken without
 * waiting), then fsyncs the directory. A missing file is success; a
 * symbolic link, FIFO or socket in its place is unlinked (never followed or
 * opened); a directory there is TV_E_SNAPSHOT.
 * Returns 0; TV_E_LEASED (a reader holds it: nothing removed);
 * TV_E_INVALID_ARG; the path errors; -errno. */
int tv__snapfile_remove(const char *dir, const char *model, int64_t gen, tv_error *err);

/* Removes leftover temporary files (".tmp-*") of interrupted writes in the
 * model's directory. Call only as the store's writer. A missing directory
 * is success. *n (may be NULL) receives the count. Returns 0 or -errno. */
int tv__snapfile_clean_temps(const char *dir, const char *model, size_t *n, tv_error *err);

#endif
