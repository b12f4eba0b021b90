/* Per-tensor content hashes of an import (import/tensor_hash.h).
 *
 * Invariants: each shard's ranges are sorted by file offset and one
 * streaming XXH3 state walks them as the bytes arrive; a tensor's hex is
 * set only when its last byte was fed; a shard is complete only when every
 * range was finalized from a pass that started at offset 0. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "import/tensor_hash.h"
#include "util/hex.h"
#include "util/internal.h"

typedef struct th_range {
    uint64_t begin, end; /* file offsets */
    size_t tensor;       /* checkpoint index */
} th_range;

typedef struct th_shard {
    th_range *r;
    size_t n, cur;
    uint64_t next_off; /* where the next feed must start */
    bool bad;          /* overlapping ranges: never complete */
    bool broken;       /* this pass skipped bytes */
    bool complete;
    bool started; /* st holds a tensor in progress */
    XXH3_state_t *st;
} th_shard;

struct tv__thash {
    th_shard *sh;
    size_t n_shards;
    const char **names; /* tensor names (the checkpoint's) */
    char (*hex)[33];
    const char **out; /* tv__thash_hexes */
    size_t n_tensors;
};

static int by_begin(const void *a, const void *b)
{
    const th_range *x = a, *y = b;
    return x->begin < y->begin   ? -1
           : x->begin > y->begin ? 1
                                 : (x->end > y->end) - (x->end < y->end);
}

void tv__thash_free(tv__thash *t)
{
    if (!t)
        return;
    for (size_t s = 0; t->sh && s < t->n_shards; s++) {
        free(t->sh[s].r);
        XXH3_freeState(t->sh[s].st);
    }
    free(t->sh);
    free(t->names);
    free(t->hex);
    free(t->out);
    free(t);
}

int tv__thash_new(const tv_checkpoint *ck, tv__thash **out, tv_error *err)
{
    tv__thash *t = calloc(1, sizeof *t);
    size_t ns = tv_checkpoint_n_shards(ck), nt = tv_checkpoint_n_tensors(ck);
    *out = NULL;
    if (!t || !(t->sh = calloc(ns ? ns : 1, sizeof *t->sh)) ||
        !(t->names = calloc(nt ? nt : 1, sizeof *t->names)) ||
        !(t->hex = calloc(nt ? nt : 1, sizeof *t->hex)) ||
        !(t->out = calloc(nt ? nt : 1, sizeof *t->out)))
        goto nomem;
    t->n_shards = ns;
    t->n_tensors = nt;
    for (size_t s = 0; s < ns; s++) {
        tv_shard_info si;
        tv_checkpoint_shard(ck, s, &si);
        if (!(t->sh[s].r = calloc(si.n_tensors ? si.n_tensors : 1, sizeof(th_range))) ||
            !(t->sh[s].st = XXH3_createState()))
            goto nomem;
    }
    for (size_t i = 0; i < nt; i++) {
        tv_tensor_info ti;
        tv_checkpoint_tensor(ck, i, &ti);
        t->names[i] = ti.name;
        if (ti.shard >= ns)
            continue;
        th_shard *sh = &t->sh[ti.shard];
        sh->r[sh->n++] =
            (th_range){.begin = ti.file_off, .end = ti.file_off + ti.nbytes, .tensor = i};
    }
    for (size_t s = 0; s < ns; s++) {
        th_shard *sh = &t->sh[s];
        qsort(sh->r, sh->n, sizeof *sh->r, by_begin);
        for (size_t k = 1; k < sh->n; k++)
            if (sh->r[k].begin < sh->r[k - 1].end)
                sh->bad = true;
    }
    *out = t;
    return 0;
nomem:
    tv__thash_free(t);
    return tv__seterr(err, -ENOMEM, "out of memory for the tensor hashes");
}

static void finish_one(tv__thash *t, th_shard *sh)
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(sh->st));
    tv__hex_encode(c.digest, sizeof c.digest, false, t->hex[sh->r[sh->cur].tensor]);
    sh->started = false;
    sh->cur++;
}

void tv__thash_feed(tv__thash *t, size_t shard, uint64_t file_off, const uint8_t *p, size_t len)
{
    if (!t || shard >= t->n_shards)
        return;
    th_shard *sh = &t->sh[shard];
    if (sh->bad)
        return;
    if (file_off == 0) { /* a pass from the start: start over */
        sh->cur = 0;
        sh->started = false;
        sh->broken = false;
        sh->complete = false;
        sh->next_off = 0;
    }
    if (sh->broken || file_off != sh->next_off) {
        sh->broken = true;
        return;
    }
    uint64_t end = file_off + len;
    sh->next_off = end;
    while (sh->cur < sh->n) {
        const th_range *r = &sh->r[sh->cur];
        if (r->begin > end || (r->begin == end && r->end > r->begin))
            break;
        if (!sh->started) {
            XXH3_128bits_reset(sh->st);
            sh->started = true;
        }
        uint64_t a = r->begin > file_off ? r->begin : file_off;
        uint64_t b = r->end < end ? r->end : end;
        if (b > a)
            XXH3_128bits_update(sh->st, p + (a - file_off), (size_t)(b - a));
        if (r->end > end)
            break;
        finish_one(t, sh);
    }
    if (sh->cur == sh->n)
        sh->complete = true;
}

const char *const *tv__thash_hexes(tv__thash *t)
{
    if (!t)
        return NULL;
    for (size_t i = 0; i < t->n_tensors; i++)
        t->out[i] = NULL;
    for (size_t s = 0; s < t->n_shards; s++) {
        const th_shard *sh = &t->sh[s];
        if (!sh->complete || sh->bad || sh->broken)
            continue;
        for (size_t k = 0; k < sh->n; k++)
            t->out[sh->r[k].tensor] = t->hex[sh->r[k].tensor];
    }
    return t->out;
}
