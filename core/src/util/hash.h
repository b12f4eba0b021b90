/* The seeded 64-bit name hash shared by the checkpoint name index (st/) and
 * the snapshot format's name index (snap/).
 *
 * Invariants: the function is part of the snapshot format (docs/formats.md,
 * "Name index"): a snapshot's index slots were placed with it, so its output
 * for a given (bytes, seed) never changes; it reads exactly n bytes and
 * never allocates. */
#ifndef TV_UTIL_HASH_H
#define TV_UTIL_HASH_H

#include <stddef.h>
#include <stdint.h>

/* Hash of the n bytes at p (p may be NULL when n is 0) under seed. */
uint64_t tv__hash_bytes(const void *p, size_t n, uint64_t seed);

#endif
