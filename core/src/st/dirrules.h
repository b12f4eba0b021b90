/* Where the files of a checkpoint directory are: which file of a directory
 * is the checkpoint, and where a file it names (a shard of an index, the
 * file picked) may resolve to. One set of rules for the two ways a
 * checkpoint is opened: by path (tv_checkpoint_open: realpath and lstat)
 * and by descriptor (the daemon's sources opened once,
 * server/import/src_local.c: openat on a directory held open, then what
 * was opened).
 *
 * Invariants: the rules are the same whichever way the inputs were found,
 * and so are the error codes and messages; nothing here touches the
 * filesystem except the listing of the directory given. */
#ifndef TV_ST_DIRRULES_H
#define TV_ST_DIRRULES_H

#include <dirent.h>
#include <stdbool.h>

#include "tensorvault/errors.h"

/* Picks the checkpoint file of the directory listed by d (read to its end,
 * not closed): model.safetensors.index.json, else the only
 * *.safetensors.index.json, else model.safetensors, else the only
 * *.safetensors. Writes the entry's name into out (NAME_MAX + 1 bytes);
 * dir names the directory in messages. Returns 0 or TV_E_CKPT_NOT_FOUND. */
int tv__st_pick_in_dir(DIR *d, const char *dir, char *out, tv_error *err);

/* The rule for entry name (may hold '/'; what names it in messages:
 * "shard", "checkpoint file") of the directory whose real path is real_dir,
 * which resolved to real: it lies inside real_dir, or real_dir is in a
 * Hugging Face hub cache snapshot (models--ORG--NAME/snapshots/REV/...) and
 * the entry is itself a symbolic link (is_link) whose directory resolves
 * inside real_dir (real_parent; NULL: it does not resolve) to a regular
 * file (is_reg) directly in models--ORG--NAME/blobs/. Returns 0 or
 * TV_E_IDX_SHARD_ESCAPE naming the entry, where it resolved and why. */
int tv__st_check_entry(const char *real_dir, const char *name, const char *what, const char *real,
                       bool is_link, const char *real_parent, bool is_reg, tv_error *err);

#endif
