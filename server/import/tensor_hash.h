/* Per-tensor content hashes computed while an import reads its shards:
 * XXH3-128 (xxHash 0.8, seed 0) of each tensor's bytes, as 32 lower-case
 * hex digits in xxHash's canonical (big-endian) order, recorded with the
 * generation (tensors.xxh3, migrations/0008_registry_notes.sql) for diffs.
 *
 * Invariants: a shard's hashes count only when its bytes were fed from
 * offset 0 to its end in order (a pass starting at 0 starts over; a gap, a
 * resumed shard whose first part was not read again, or overlapping tensor
 * ranges leave the shard without hashes, and its tensors are recorded
 * without one); one thread feeds a given shard at a time. */
#ifndef TV_IMPORT_TENSOR_HASH_H
#define TV_IMPORT_TENSOR_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "registry/registry.h"
#include "tensorvault/checkpoint.h"

typedef struct tv__thash tv__thash;

/* The hashers of every shard of ck (its tensors' file ranges). Returns 0
 * and *out; -ENOMEM. */
int tv__thash_new(const tv_checkpoint *ck, tv__thash **out, tv_error *err);
/* NULL-safe. */
void tv__thash_free(tv__thash *t);
/* Feeds bytes [file_off, file_off + len) of shard's file (t NULL: nothing). */
void tv__thash_feed(tv__thash *t, size_t shard, uint64_t file_off, const uint8_t *p, size_t len);
/* Tensor i's (checkpoint order) hash, or NULL when its shard was not
 * hashed whole, for tv__reg_tensors_insert_hashed: an array of
 * tv_checkpoint_n_tensors entries owned by t (NULL for t NULL). */
const char *const *tv__thash_hexes(tv__thash *t);

#endif
