/* The fast path's memory tier: every model generation the fast path opened
 * keeps its chunks in one memfd (or, with cache.dir, one unnamed file on
 * that tmpfs) laid out like its objects (chunk i of the
 * generation, i.e. chunk k of shard s with i = the shard's first chunk + k,
 * at bytes [i x chunk_len, (i + 1) x chunk_len)), made resident by device
 * reads straight into it and evicted by punching its hole, under one memory
 * budget shared by every generation, least recently used first (but a
 * generation that needs room and is itself the least recently used gives
 * up its most recently used chunk: one pass larger than the budget keeps
 * its first chunks). A chunk read for one worker stays for the next; a generation stays after its
 * last handle closed (dormant) until the budget needs its memory. This file
 * is the bookkeeping: residency, pins, members' debts, the LRU and the
 * holes; the read groups (group.c) start the reads and serve the requests.
 *
 * Invariants:
 *   - a chunk is ABSENT (a hole: no page allocated by the tier), READING
 *     (one read in flight into [lo, hi)) or RESIDENT (bytes [lo, hi) of the
 *     chunk are the generation's, every one arrived); its accounted bytes
 *     are hi - lo while READING or RESIDENT, 0 when ABSENT;
 *   - a chunk is idle when RESIDENT with no reference (refs: copies in
 *     progress; vrefs: views) and no read; only an idle chunk is evicted,
 *     and eviction punches exactly its bytes: a byte a client was told is
 *     ready and still references is never freed nor rewritten;
 *   - the bound: resident bytes <= budget + the floors of the open
 *     generations (floor: the staging a read group may always use, its
 *     group_slots x chunk_len), and view-pinned bytes <= budget; a group
 *     that keeps its chunks in use (READING, or referenced by copies and no
 *     view) under its own floor can therefore always make a chunk resident
 *     once the unprotected idle chunks are evicted (tv__tier_reserve). With
 *     cache.dir on a tmpfs of a size, that size bounds it too (a page the
 *     full tmpfs cannot give fails the device read into it); the tmpfs
 *     holds at least the budget, and a group under its floor then waits
 *     for its own copies to end rather than being guaranteed a chunk;
 *   - debts: a generation has up to 64 members (its handles), each with a
 *     bit; a chunk owes every active member that has not taken it since it
 *     joined (joining puts every resident chunk in its debt). An idle
 *     chunk with a debt waits on its generation's owed list, never evicted;
 *     one without is on the tier's LRU (head: evicted first). A member the
 *     read groups declare stalled stops being active: its debts go, so no
 *     member waits on another for ever;
 *   - the memfd grows and shrinks never (F_SEAL_SHRINK | F_SEAL_GROW |
 *     F_SEAL_SEAL), its inode is the daemon's, read-only for it (0400), and
 *     clients get a descriptor opened read-only: a peer of another uid can
 *     only map it read-only. It has no F_SEAL_FUTURE_WRITE: that seal
 *     forbids punching holes. A file of cache.dir cannot carry seals (only
 *     memfds can): it is created unnamed and unlinkable (O_TMPFILE |
 *     O_EXCL), 0400, so no process but the daemon's uid or root can reach
 *     it writable to shrink it, and the daemon never does;
 *   - one thread (the fast-path loop) calls everything here; the counters
 *     are atomics other threads may read. */
#ifndef TV_FASTPATH_TIER_H
#define TV_FASTPATH_TIER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/internal.h"

typedef struct tv__tier tv__tier;
typedef struct tv__tier_gen tv__tier_gen;

enum { TV__TIER_ABSENT = 0, TV__TIER_READING = 1, TV__TIER_RESIDENT = 2 };
/* the pages the tier's memfds use (tv__tier_pages) */
enum { TV__TIER_PAGES_SMALL = 0, TV__TIER_PAGES_THP = 1, TV__TIER_PAGES_HUGETLB = 2 };
#define TV__TIER_MAX_MEMBERS 64u

typedef struct tv__tier_chunk {
    uint8_t state;
    uint8_t list;         /* 0 none, 1 the tier's LRU, 2 the generation's owed list */
    uint32_t lo, hi;      /* chunk-relative bytes read or being read */
    uint32_t refs, vrefs; /* copy references, view references */
    uint64_t taken;       /* member bits that took it since they joined */
    struct tv__tier_chunk *prev, *next;
    tv__tier_gen *g;
} tv__tier_chunk;

struct tv__tier_gen {
    tv__tier *t;
    char name[256];
    int64_t gen;
    uint8_t key[32]; /* the snapshot's checksum: the same key, the same bytes */
    int fd;          /* read-write, the daemon's */
    uint8_t *base;   /* the daemon's mapping, read-write */
    size_t len;      /* n_chunks x chunk_len */
    uint32_t n_chunks, chunk_len;
    uint64_t page_len; /* its memfd's pages: the tier's, or 4096 where hugetlb failed */
    tv__tier_chunk *c;
    bool open;             /* a read group uses it */
    uint64_t floor_len;    /* while open: its staging allowance */
    uint64_t resident_len; /* bytes READING or RESIDENT */
    uint64_t vpinned_len;  /* bytes of chunks with views */
    uint32_t n_inuse;      /* chunks READING, or referenced by copies and no view */
    uint64_t members;      /* member bits in use */
    uint64_t active;       /* members whose debts count */
    tv__tier_chunk *owed_head, *owed_tail;
    int64_t used_ms; /* the last time it was opened or closed (CLOCK_MONOTONIC) */
    tv__tier_gen *prev, *next;
};

typedef struct tv__tier_stats {
    uint64_t budget_len;     /* cache.bytes */
    uint64_t bound_len;      /* budget + the open generations' floors, at most
                                cache.dir's tmpfs size */
    uint64_t resident_len;   /* bytes READING or RESIDENT, every generation */
    uint64_t vpinned_len;    /* bytes of chunks pinned by views */
    uint64_t generations;    /* generations with a memfd (open or dormant) */
    uint64_t evictions;      /* chunks evicted (holes punched) */
    uint64_t evicted_len;    /* their bytes */
    uint64_t scrubbed_len;   /* stray pages punched by tv__tier_scrub */
    uint64_t punch_failures; /* holes the kernel refused to punch */
    uint32_t pages;          /* TV__TIER_PAGES_* */
    uint64_t page_len;       /* 4096, or the huge page's bytes */
} tv__tier_stats;

/* A tier of budget_len bytes (0: nothing is kept beyond the open groups'
 * floors, and no view is granted). dir (cache.dir; NULL or "" = none): a
 * directory on a tmpfs whose unnamed files hold the generations instead of
 * memfds, on transparent huge pages when that tmpfs is mounted with
 * huge=within_size or always (whatever shmem_enabled says for memfds,
 * unless it says deny): the page a file there reports (st_blksize). Without dir it chooses its
 * pages: hugetlb when the system has free huge pages for the whole budget, else shared-memory THP
 * when the kernel gives it to memfds (shmem_enabled always / within_size / advise), else small
 * pages. The choice is logged. Returns 0 and *out; TV_E_INVALID_ARG (dir missing, not a directory
 * on a tmpfs, a tmpfs smaller than budget_len, or no unnamed file can be created there: named);
 * -ENOMEM. */
int tv__tier_create(uint64_t budget_len, const char *dir, tv__tier **out, tv_error *err);
/* Frees every generation (none may be open any more). NULL-safe. */
void tv__tier_destroy(tv__tier *t);
/* The page size chunks must be a multiple of (4096, or the huge page's). */
uint64_t tv__tier_page_len(const tv__tier *t);
/* Forces small pages for the generations made from now on (tests). */
void tv__tier_use_small_pages(tv__tier *t);

/* The generation kept for (name, gen, key), or NULL. */
tv__tier_gen *tv__tier_find(tv__tier *t, const char *name, int64_t gen, const uint8_t key[32]);
/* A new generation of n_chunks chunks of chunk_len bytes (a multiple of
 * tv__tier_page_len), mapped here at an address aligned to align (a power
 * of two, at least 4096). Nothing is resident. Returns 0 and *out;
 * TV_E_INVALID_ARG (sizes); TV_E_OVERFLOW; -errno (memfd, mmap). */
int tv__tier_gen_new(tv__tier *t, const char *name, int64_t gen, const uint8_t key[32],
                     uint32_t n_chunks, uint32_t chunk_len, uint64_t align, tv__tier_gen **out,
                     tv_error *err);
/* Unmaps and closes g and forgets its chunks (no reference, view or read
 * may remain). NULL-safe. */
void tv__tier_gen_free(tv__tier_gen *g);
/* A descriptor of g's memfd opened read-only (for a client), or -errno. */
int tv__tier_gen_ro_fd(tv__tier_gen *g);
/* A read group opens g (floor_len: its staging) or closes it (its floor
 * and members go; then tv__tier_trim). */
void tv__tier_gen_open(tv__tier_gen *g, uint64_t floor_len);
void tv__tier_gen_close(tv__tier_gen *g);

/* Makes room for chunk idx to become READING over [lo, hi) (from ABSENT,
 * or from idle RESIDENT to read more of it), evicting unprotected idle
 * chunks as needed: the LRU's head first, but g's most recently used idle
 * chunk when the head is g's own (scan resistance). Returns 0 (the
 * chunk is READING, accounted); TV_E_BUSY when the bound leaves no room
 * even so (nothing changed: the chunks that would have to go are in use,
 * pinned by views, or owed to active members). */
int tv__tier_reserve(tv__tier_gen *g, uint32_t idx, uint32_t lo, uint32_t hi);
/* The read of chunk idx ended: ok -> RESIDENT; else ABSENT, its hole
 * punched (a failed read may have written part of it). */
void tv__tier_landed(tv__tier_gen *g, uint32_t idx, bool ok);
/* Copy references (a CHUNK entry to copy from, until RELEASE). */
void tv__tier_ref(tv__tier_gen *g, uint32_t idx);
void tv__tier_unref(tv__tier_gen *g, uint32_t idx, uint32_t n);
/* View references: 0, or TV_E_BUSY when pinning the chunk (not pinned
 * yet) would take the view-pinned bytes past the budget. */
int tv__tier_vref(tv__tier_gen *g, uint32_t idx);
void tv__tier_vunref(tv__tier_gen *g, uint32_t idx, uint32_t n);
/* Evicts unprotected idle chunks while the tier is over its bound. */
void tv__tier_trim(tv__tier *t);
/* Whether chunk idx is in use (READING, or copy references and no view). */
bool tv__tier_inuse(const tv__tier_gen *g, uint32_t idx);

/* A member joins g: its bit (every resident chunk is now in its debt), or
 * -1 when g has 64 members already (the newcomer then protects nothing). */
int tv__tier_member_join(tv__tier_gen *g);
/* Member bit took chunk idx (its debt on it is paid). */
void tv__tier_member_take(tv__tier_gen *g, int bit, uint32_t idx);
/* Member bit becomes active (its debts protect chunks) or not (stalled:
 * its debts stop protecting anything). */
void tv__tier_member_active(tv__tier_gen *g, int bit, bool active);
/* Member bit leaves g (its debts go). */
void tv__tier_member_leave(tv__tier_gen *g, int bit);
/* Whether some idle chunk of g is protected only by member bit's debt. */
bool tv__tier_member_owed(const tv__tier_gen *g, int bit);

/* Punches pages of g allocated outside its accounted bytes (a client that
 * touched a hole of its read-only mapping makes the kernel allocate a
 * page there): only when the memfd holds more than its chunks take in
 * whole pages, then every whole page of an ABSENT chunk and of a RESIDENT
 * chunk outside [lo, hi) (a page holding resident bytes stays). Returns
 * the bytes punched. */
uint64_t tv__tier_scrub(tv__tier_gen *g);
/* The memfd's allocated bytes as the kernel counts them (fstat), or 0. */
uint64_t tv__tier_gen_allocated(const tv__tier_gen *g);

/* The dormant generation used least recently with nothing resident (for
 * the caller to free), or NULL. */
tv__tier_gen *tv__tier_empty_dormant(tv__tier *t);
/* Every generation, most recently made first (iteration). */
tv__tier_gen *tv__tier_gens(tv__tier *t);

/* Counters (any thread; NULL t: zeros). */
void tv__tier_get_stats(const tv__tier *t, tv__tier_stats *out);

#endif
