/* Name -> tensor index: open addressing with linear probing over a table at
 * most half full, keyed by a seeded 64-bit hash (seeded per checkpoint so a
 * hostile header cannot precompute collisions).
 *
 * Invariants: lookups never allocate; the table is sized once, at build
 * time, to a power of two >= 2 x n_tensors. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "st/st_internal.h"
#include "util/hash.h"

void tv__nameidx_free(tv__nameidx *ix)
{
    free(ix->hashes);
    free(ix->slots);
    ix->hashes = NULL;
    ix->slots = NULL;
    ix->mask = 0;
}

int tv__nameidx_build(tv_checkpoint *ck, tv_error *err)
{
    tv__nameidx *ix = &ck->idx;
    tv__nameidx_free(ix);
    if (ck->n_tensors > UINT32_MAX / 4)
        return tv__seterr(err, -ENOMEM, "too many tensors (%zu)", ck->n_tensors);
    uint32_t cap = 16;
    while (cap < 2 * ck->n_tensors)
        cap *= 2;
    if (getrandom(&ix->seed, sizeof(ix->seed), GRND_NONBLOCK) != sizeof(ix->seed))
        ix->seed = (uint64_t)(uintptr_t)ck ^ 0x5851F42D4C957F2Dull;
    ix->hashes = malloc(sizeof(uint32_t) * cap);
    ix->slots = calloc(cap, sizeof(uint32_t));
    if (!ix->hashes || !ix->slots) {
        tv__nameidx_free(ix);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    ix->mask = cap - 1;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const tv__tensor *t = &ck->tensors[i];
        const char *name = ck->strings + t->name_off;
        uint64_t h = tv__hash_bytes(name, t->name_len, ix->seed);
        for (uint32_t pos = (uint32_t)h & ix->mask;; pos = (pos + 1) & ix->mask) {
            if (ix->slots[pos] == 0) {
                ix->slots[pos] = (uint32_t)i + 1;
                ix->hashes[pos] = (uint32_t)h;
                break;
            }
            const tv__tensor *o = &ck->tensors[ix->slots[pos] - 1];
            if (ix->hashes[pos] == (uint32_t)h && o->name_len == t->name_len &&
                memcmp(ck->strings + o->name_off, name, t->name_len) == 0) {
                int rc =
                    o->shard == t->shard
                        ? tv__seterr(err, TV_E_ST_DUPLICATE_KEY,
                                     "shard '%s': duplicate object key: tensor '%s' appears twice",
                                     ck->strings + ck->shards[t->shard].name_off, name)
                        : tv__seterr(err, TV_E_IDX_DUPLICATE_TENSOR,
                                     "tensor '%s' is present in shard '%s' and in shard '%s'", name,
                                     ck->strings + ck->shards[o->shard].name_off,
                                     ck->strings + ck->shards[t->shard].name_off);
                tv__nameidx_free(ix);
                return rc;
            }
        }
    }
    return 0;
}

TV_API int tv_checkpoint_find(const tv_checkpoint *ck, const char *name, size_t name_len,
                              size_t *index)
{
    if (!ck || !name || !ck->idx.slots)
        return TV_E_NOT_FOUND;
    const tv__nameidx *ix = &ck->idx;
    uint64_t h = tv__hash_bytes(name, name_len, ix->seed);
    for (uint32_t pos = (uint32_t)h & ix->mask;; pos = (pos + 1) & ix->mask) {
        uint32_t s = ix->slots[pos];
        if (s == 0)
            return TV_E_NOT_FOUND;
        const tv__tensor *t = &ck->tensors[s - 1];
        if (ix->hashes[pos] == (uint32_t)h && t->name_len == name_len &&
            memcmp(ck->strings + t->name_off, name, name_len) == 0) {
            if (index)
                *index = s - 1;
            return 0;
        }
    }
}
