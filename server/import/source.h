/* Where the importer reads a checkpoint from: a local path (src_file.c), a
 * local source opened once when the daemon checked the request
 * (src_local.c), or an HTTP(S) origin (src_http.c). One interface for all,
 * so the pipeline of import.c reads a shard the same way wherever it lies:
 *   tv__src_open        validates the checkpoint's headers (nothing else is
 *                       read) and keeps what later reads are checked
 *                       against (local: the fstat stamps; HTTP: length and
 *                       ETag / Last-Modified of every file);
 *   tv__src_shard_open  opens one shard for reading (local: checks it is
 *                       still the validated file);
 *   tv__src_shard_read  reads [off, off + len) into an aligned buffer; safe
 *                       from several threads on one open shard;
 *   tv__src_shard_check after the last read: nothing changed;
 *   tv__src_shard_close.
 * Any change of a shard under the importer is TV_E_SOURCE_CHANGED. */
#ifndef TV_IMPORT_SOURCE_H
#define TV_IMPORT_SOURCE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "httpc/httpc.h"
#include "httpc/url.h"
#include "tensorvault/checkpoint.h"
#include "util/internal.h"

/* HTTP(S) origins (import.http_* in the daemon's config). */
#define TV__SRC_HTTP_DEFAULT_RETRIES 4
#define TV__SRC_HTTP_DEFAULT_TIMEOUT 60          /* seconds */
#define TV__SRC_HTTP_DEFAULT_RANGE   (16u << 20) /* bytes per Range request */
typedef struct tv__src_http_opts {
    tv__s3_opts s3;     /* s3:// sources (httpc/url.h) */
    const char *proxy;  /* CURLOPT_PROXY for every request; NULL or "" = libcurl's default */
    unsigned retries;   /* per range, after the first try; backoff 100 ms doubling, <= 6.4 s */
    unsigned timeout_s; /* connect, and no byte for this long (0: default) */
    uint64_t range;     /* bytes per Range request (0: default) */
    /* Ends every transfer within a second once it says stop (the import's
     * cancel: tv__import sets it from tv__import_opts.cancelled); the
     * reads then fail with TV_E_CANCELLED. */
    tv__http_cancel cancel;
} tv__src_http_opts;

/* A fleet pull (server/fleet): a checkpoint the catalog describes, each
 * file at a URL of its own (a peer's blob route with a bearer token, the
 * object store, the origin) or in memory (the index the fleet thread
 * rebuilds from the catalog). import.origins does not apply: the fleet
 * thread builds the URLs from the catalog. */
typedef struct tv__src_pull_file {
    const char *name;   /* the checkpoint's name for it (shard file name, or the index) */
    const char *url;    /* http(s):// or s3:// URL; NULL: the bytes are data/data_len */
    const char *bearer; /* sent as "Authorization: Bearer ..." (peers); NULL: none */
    const void *data;   /* an in-memory file */
    size_t data_len;
    const char *sha256; /* 64 lowercase hex: the whole file's expected SHA-256; NULL: none */
    uint64_t len;       /* expected length (ignored for in-memory files) */
    bool sidecar;       /* a non-weight file kept with the generation, fetched whole into memory and
                           checked against sha256 */
} tv__src_pull_file;

typedef struct tv__src_pull {
    const char *first;   /* the file tv_checkpoint_open_io starts from */
    bool first_is_index; /* it is a model.safetensors.index.json */
    const tv__src_pull_file *files;
    size_t n_files;
    const char *source; /* what the generation records as its source */
    /* Called (from any import thread) for a file whose bytes hashed to
     * something other than its sha256 or whose requests failed for good,
     * before the import fails: the caller drops that source. May be NULL. */
    void (*on_bad_file)(void *ctx, size_t file_idx, int rc);
    void *bad_ctx;
} tv__src_pull;

/* Deep copy (data, strings and all; the callback and its ctx as they are)
 * and free (NULL-safe). Returns 0 or -ENOMEM. */
int tv__src_pull_dup(const tv__src_pull *p, tv__src_pull **out, tv_error *err);
void tv__src_pull_free(tv__src_pull *p);
/* The index of the file named name, or SIZE_MAX. */
size_t tv__src_pull_find(const tv__src_pull *p, const char *name);
/* Tells p's caller file idx is bad (rc: why); no-op without a callback,
 * and for TV_E_CANCELLED (a cancelled transfer says nothing of its source). */
void tv__src_pull_bad(const tv__src_pull *p, size_t idx, int rc);

/* True when src names an http://, https:// or s3:// URL (then the importer
 * reads it from the network, never from a path). */
bool tv__src_is_url(const char *src);

typedef struct tv__src tv__src;
typedef struct tv__src_local tv__src_local; /* src_local.c */

typedef struct tv__src_stamp {
    uint64_t dev_id, inode, size;
    int64_t mtime_ns, ctime_ns;
} tv__src_stamp;

/* One open shard. */
typedef struct tv__src_shard {
    tv__src *src;
    const tv_shard_info *si;
    size_t idx;
    /* local file */
    int fd;
    bool held;          /* reopened from a source held open: no path to look at again */
    bool leased;        /* holds a read lease: a writer's open is seen */
    atomic_bool direct; /* reads with O_DIRECT (reader threads may turn it off) */
    tv__src_stamp st;
} tv__src_shard;

/* Opens src (a path: file, index or directory; or a URL, see src_http.c)
 * and validates its checkpoint into *ck. real (real_len bytes) receives
 * what the generation records as its source: the resolved path, or the
 * URL. ho: HTTP options (NULL: defaults). Returns 0 or the checkpoint's,
 * the filesystem's or the origin's errors. */
int tv__src_open(const char *src, const tv__src_http_opts *ho, tv__src **out, tv_checkpoint **ck,
                 char *real, size_t real_len, tv_error *err);
void tv__src_free(tv__src *s);
/* tv__src_open for a local source opened once (l must outlive the
 * source): the checkpoint is validated from what l holds, every file read
 * through it (src_local.c); real receives tv__src_local_real(l). */
int tv__src_open_local(const tv__src_local *l, tv__src **out, tv_checkpoint **ck, char *real,
                       size_t real_len, tv_error *err);
/* tv__src_open for a pull (p must outlive the source): the checkpoint is
 * validated from p->first; real receives p->source. */
int tv__src_open_pull(const tv__src_pull *p, const tv__src_http_opts *ho, tv__src **out,
                      tv_checkpoint **ck, char *real, size_t real_len, tv_error *err);

int tv__src_shard_open(tv__src *s, size_t idx, const tv_shard_info *si, tv__src_shard *sh,
                       tv_error *err);
/* Reads len bytes at off into buf (cap bytes, aligned for O_DIRECT). */
int tv__src_shard_read(tv__src_shard *sh, uint8_t *buf, size_t len, size_t cap, uint64_t off,
                       tv_error *err);
int tv__src_shard_check(tv__src_shard *sh, tv_error *err);
/* A hint: [off, off + len) is read next (local buffered reads). */
void tv__src_shard_willneed(tv__src_shard *sh, uint64_t off, size_t len);
void tv__src_shard_close(tv__src_shard *sh);
/* What identifies the version of shard si an origin served (its validated
 * ETag, else Last-Modified), or NULL: a local file or an origin that sent
 * neither. Valid while s is. */
const char *tv__src_validator(tv__src *s, const tv_shard_info *si);

/* ---- local files (src_file.c) ---- */
int tv__src_file_open(const tv_shard_info *si, tv__src_shard *sh, tv_error *err);
int tv__src_file_read(tv__src_shard *sh, uint8_t *buf, size_t len, size_t cap, uint64_t off,
                      tv_error *err);
int tv__src_file_check(const tv__src_shard *sh, tv_error *err);
void tv__src_file_close(tv__src_shard *sh);

/* The identity and change stamps of an fstat. */
struct stat;
void tv__src_stamp_of(const struct stat *sb, tv__src_stamp *s);
/* Opens a shard whose descriptor fd (taken over, closed on failure) was
 * opened from a source held open; want: the stamps taken when it was
 * validated. As tv__src_file_open otherwise. */
int tv__src_file_open_fd(int fd, const tv_shard_info *si, const tv__src_stamp *want,
                         tv__src_shard *sh, tv_error *err);

/* ---- local sources opened once (src_local.c) ---- */
/* A local import source opened when the request is checked, before the job
 * is queued, so that no rename or symlink swap between the check and the
 * job can change what is imported: the file named (O_PATH, pinned) and the
 * directory its checkpoint's files are named in (O_PATH), or the directory
 * named. Every file the job reads is opened through these descriptors
 * (openat), and what was actually opened must lie inside an import root
 * (its real path, read from /proc/self/fd) and follow tv_checkpoint_open's
 * rules for a directory's files (st/dirrules.h). A job's two descriptors
 * are closed when it ends or is cancelled. */

/* Whether real lies under root (both real paths): equal, or root + '/' +
 * more, so "/data2" is not under "/data"; every absolute path is under "/". */
bool tv__path_under(const char *real, const char *root);
/* The error of an import source path that does not open or resolve (e, an
 * errno): -ENOENT (missing), TV_E_FORBIDDEN (not readable),
 * TV_E_BAD_REQUEST (too long, a loop), else -e; the message names it. */
int tv__src_path_error(const char *path, int e, tv_error *err);

/* Opens path (a .safetensors file, an index or a directory) and checks that
 * what was opened lies under one of the n_roots import roots (real paths;
 * roots NULL: no check). Returns 0 and *out; -ENOENT (missing),
 * TV_E_FORBIDDEN (not readable), TV_E_BAD_REQUEST (a malformed path or a
 * loop), TV_E_OUTSIDE_ROOTS, other -errno; each message names the source. */
int tv__src_local_open(const char *path, const char *const *roots, size_t n_roots,
                       tv__src_local **out, tv_error *err);
/* The real path of what was opened, when it was. */
const char *tv__src_local_real(const tv__src_local *l);
/* NULL-safe. */
void tv__src_local_free(tv__src_local *l);

/* The files one import opened through l (the importer's side). */
typedef struct tv__src_local_files tv__src_local_files;
/* Validates l's checkpoint into *ck, opening its files through l. */
int tv__src_local_validate(const tv__src_local *l, tv__src_local_files **out, tv_checkpoint **ck,
                           tv_error *err);
/* A new descriptor (own file description: own flags, own lease) on shard
 * si, the file validation opened, and the stamps taken then. */
int tv__src_local_reopen(tv__src_local_files *fs, const tv_shard_info *si, int *fd,
                         tv__src_stamp *want, tv_error *err);
/* NULL-safe: closes every file. */
void tv__src_local_files_free(tv__src_local_files *fs);

/* ---- HTTP(S) origins (src_http.c) ---- */
typedef struct tv__src_http tv__src_http;
int tv__src_http_open(const char *url, const tv__src_http_opts *ho, tv__src_http **out,
                      tv_checkpoint **ck, tv_error *err);
int tv__src_http_open_pull(const tv__src_pull *p, const tv__src_http_opts *ho, tv__src_http **out,
                           tv_checkpoint **ck, tv_error *err);
void tv__src_http_free(tv__src_http *h);
int tv__src_http_read(tv__src_http *h, size_t idx, const tv_shard_info *si, uint8_t *buf,
                      size_t len, uint64_t off, tv_error *err);
/* The validated ETag (else Last-Modified) of file name, or NULL (none). */
const char *tv__src_http_validator(tv__src_http *h, const char *name);

/* ---- sidecar files (sidecar.c) ----
 * The small non-weight files of a checkpoint (config.json, the tokenizer's
 * files, a model card ...) the importer stores with the generation, in the
 * registry (migrations/0007_sidecar_files.sql). Every source gives them as
 * in-memory files through tv__src_sidecars:
 *   local    every regular file of the checkpoint directory and its
 *            subdirectories, opened through the directory held (openat,
 *            O_NOFOLLOW but for the links a Hugging Face snapshot holds),
 *            under the same rules as its shards (st/dirrules.h);
 *   http(s)  a directory cannot be listed: tv__sidecar_well_known beside the
 *            index, each taken when the origin answers 200 (404: absent);
 *   pull     every file of the pull with sidecar set. */
#define TV__SIDECAR_DEFAULT_MAX   (4u << 20)  /* import.sidecar_max_bytes */
#define TV__SIDECAR_DEFAULT_TOTAL (32u << 20) /* import.sidecar_total_bytes */
#define TV__SIDECAR_PATH_MAX      512         /* bytes of a sidecar's path, NUL excluded */
#define TV__SIDECAR_MAX_FILES     1024        /* files of one generation */
#define TV__SIDECAR_MAX_DEPTH     8           /* subdirectory levels searched */

/* The names an http(s):// origin is asked for beside the checkpoint. */
extern const char *const tv__sidecar_well_known[];

typedef struct tv__sidecar_caps {
    uint64_t max_len;   /* per file; a larger file is skipped (0: the default) */
    uint64_t total_len; /* all files together; more fails the import (0: the default) */
} tv__sidecar_caps;

typedef struct tv__sidecar {
    char *path; /* relative, '/'-separated, checked by tv__sidecar_path_valid */
    uint8_t *data;
    size_t len;
    char sha256[65]; /* lowercase hex */
} tv__sidecar;

typedef struct tv__sidecars {
    tv__sidecar *files; /* sorted by path */
    size_t n, cap;
    char **skipped; /* "skipped: NAME (why)", one per file not kept */
    size_t n_skipped, cap_skipped;
    uint64_t total_len;
} tv__sidecars;

/* The path rule for a sidecar's name (a pull's or an origin's, and what a
 * directory walk builds): 1..TV__SIDECAR_PATH_MAX bytes, '/'-separated
 * components, none empty, "." or "..", no leading '/', no backslash, no
 * control character (bytes < 0x20 and 0x7f). Returns 0 or TV_E_BAD_REQUEST
 * naming the path and the fault. */
int tv__sidecar_path_valid(const char *path, tv_error *err);
/* Whether a file of a checkpoint directory is not a sidecar: a dot-file
 * (any component starting with '.'), a *.safetensors shard, a
 * *.safetensors.index.json index, or a known weight format (*.bin, *.pt,
 * *.pth, *.ckpt, *.h5, *.msgpack, *.onnx, *.gguf). Takes the path. */
bool tv__sidecar_excluded(const char *path);
/* Adds a file to set: copies path and data, hashes it. A file over
 * caps->max_len is not kept but listed as skipped "(N bytes > cap)"; one
 * that would take the set over caps->total_len is TV_E_TOO_LARGE naming
 * import.sidecar_total_bytes; a path already in the set is TV_E_BAD_REQUEST.
 * Returns 0, those, -ENOMEM. */
int tv__sidecars_add(tv__sidecars *set, const tv__sidecar_caps *caps, const char *path,
                     const void *data, size_t len, tv_error *err);
/* Lists a file not kept: "skipped: PATH (why)". Returns 0 or -ENOMEM. */
int tv__sidecars_skip(tv__sidecars *set, const char *path, const char *why);
/* Sorts by path (the order the registry and every listing shows). */
void tv__sidecars_sort(tv__sidecars *set);
/* Frees what set holds and empties it (NULL-safe, safe twice). */
void tv__sidecars_clear(tv__sidecars *set);

/* The sidecar files of s (opened by tv__src_open*) into set (empty).
 * Returns 0; TV_E_TOO_LARGE (over caps->total_len); TV_E_BAD_REQUEST (a
 * pull's file with a hostile path); TV_E_HASH_MISMATCH (a pull's file not
 * its sha256); the source's read errors. */
int tv__src_sidecars(tv__src *s, const tv__sidecar_caps *caps, tv__sidecars *set, tv_error *err);
/* Local: the files of l's directory (tv__src_local: the directory named,
 * or the one the file named lies in). */
int tv__src_local_sidecars(const tv__src_local *l, const tv__sidecar_caps *caps, tv__sidecars *set,
                           tv_error *err);
/* HTTP(S) origins and pulls. */
int tv__src_http_sidecars(tv__src_http *h, const tv__sidecar_caps *caps, tv__sidecars *set,
                          tv_error *err);

#endif
