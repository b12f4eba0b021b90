/* Internals of the fast-path server shared by its files: the loop and its
 * sockets (fastpath.c), the per-session state machine, requests and outbox
 * (session.c), the read groups with their chunks, reads and legacy arenas
 * (group.c) over the memory tier (tier.c). Everything here is touched by
 * the loop thread only, except the counters (atomics) and what
 * tv__fp_sessions copies under fp->mu (the loop holds fp->mu while it
 * works on a turn's events).
 *
 * Invariants:
 *   - a group's chunk i is chunk i of its tier generation: its residency
 *     is the tier's (tier.h); the group adds the read in flight (replica
 *     tried, reader), the waits of version-3 requests and the legacy slots
 *     filling from it;
 *   - a legacy slot (the arena of version 1 and 2 sessions) is in exactly
 *     one state: FREE (in the group's LRU, keyed when it still holds a copy
 *     of a chunk: a cache hit reuses it), FILLING (keyed, waiting for its
 *     chunk's read, on that chunk's fill chain, never in the LRU) or READY
 *     (refs > 0, not in the LRU; at 0 refs it goes back to the LRU tail,
 *     still keyed); its bytes are a copy of the tier chunk's, made once the
 *     chunk is resident;
 *   - a session's credit use = copy references it holds + waits it has
 *     queued; view references use no credit; the scheduler issues a chunk
 *     only below credit;
 *   - a handle's held_since_ms is when it last released a copy reference,
 *     or began to hold one (held 0 -> 1); a group is starved in a turn when
 *     a session below its credit could not go on for want of staging (the
 *     group's chunks in use at group_slots, no free legacy slot, or a
 *     partly read chunk held by copies); handles holding copy references of
 *     a starved group for hold_timeout_ms since then end their session
 *     (TV_E_TIMEOUT, tv__fp_hold_sweep); a group is throttled in a turn when
 *     a read found no room in the tier's bound (the memory kept for members
 *     that have not taken it yet); members that took nothing for
 *     share_wait_ms while their debts keep such memory are declared stalled
 *     (tv__fp_share_sweep): their debts stop counting;
 *   - a request lives in its session's FIFO from READ to its DONE (or its
 *     handle's close); requests before s->issue have every chunk issued;
 *   - a session that broke the protocol (or whose peer left) is doomed: it
 *     is no longer read nor scheduled and is destroyed at the end of the
 *     turn, so no function frees a session its caller still uses. */
#ifndef TV_FASTPATH_FP_INTERNAL_H
#define TV_FASTPATH_FP_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/types.h>

#include "wire/wire.h"
#include "fastpath/fastpath.h"
#include "fastpath/tier.h"
#include "io/aio.h"
#include "reader/serve.h"
#include "snap/snapshot.h"
#include "tensorvault/tensorvault.h"

enum { FP_EV_LISTEN = 1, FP_EV_WAKE, FP_EV_SESSION, FP_EV_GROUP };
typedef struct fp_ev {
    int kind;
    void *ptr;
} fp_ev;

enum { FP_SLOT_FREE = 0, FP_SLOT_FILLING, FP_SLOT_READY };

typedef struct fp_wait fp_wait;
typedef struct fp_req fp_req;
typedef struct fp_handle fp_handle;
typedef struct fp_session fp_session;
typedef struct fp_group fp_group;
typedef struct fp_out fp_out;

/* A slot of a legacy arena (version 1 and 2 sessions): a copy of one chunk. */
typedef struct fp_slot {
    uint8_t state;
    bool keyed;  /* holds (or is filling with) a copy of chunk `chunk` */
    bool in_lru; /* FREE: in the group's LRU list */
    uint32_t chunk;
    uint32_t refs;      /* session references (CHUNK entries not released) */
    uint32_t lo, hi;    /* the chunk-relative bytes the copy holds, at the same offsets */
    int32_t hnext;      /* chain of the group's slot index (keyed slots only; -1 ends) */
    int32_t fnext;      /* FILLING: the next slot filling from the same chunk (-1 ends) */
    int32_t prev, next; /* LRU links (-1: none) */
    fp_wait *waits;
} fp_slot;

/* What a group adds to a tier chunk: the read in flight and who waits. */
typedef struct fp_chunk {
    uint32_t shard;
    uint32_t tried;   /* replicas of the shard tried for this read */
    uint32_t reading; /* replica index (shard-relative) of the read in flight */
    int last_err;     /* the last failed read's result */
    uint64_t reader;  /* id of the session whose request started the read (0: read ahead) */
    bool ahead;       /* read ahead and not used by a request yet */
    bool ahead_read;  /* the read in flight was started ahead (counted once it lands) */
    fp_wait *waits;   /* version-3 requests waiting for the read */
    int32_t fills;    /* legacy slots filling from it (fp_slot.fnext chain; -1: none) */
} fp_chunk;

/* Per-chunk reference counts of a handle (copy or view): open addressing. */
typedef struct fp_refmap {
    uint32_t *key, *val; /* key UINT32_MAX: empty */
    uint32_t cap, n;
} fp_refmap;

struct fp_wait {
    fp_req *req;
    uint32_t slot; /* the legacy slot, or (version 3) the chunk it waits on */
    uint64_t k;
    bool shared;
    fp_wait *sprev, *snext; /* in the slot */
    fp_wait *rprev, *rnext; /* in the request */
};

struct fp_req {
    uint64_t req_id;
    fp_handle *h;
    uint32_t tensor; /* tensor index; unused for a header read */
    uint32_t shard;
    bool header;   /* a shard header read (READ flag TV__FP_READ_SHARD_HEADER, version 2) */
    uint64_t P, E; /* object-relative [P, E) */
    uint64_t next_k, end_k;
    bool small; /* a small read that does not follow the handle's previous one: only its
                   envelope is read (a chunk-sized read would cost 20x a 4 KiB one) */
    bool view;  /* READ flag TV__FP_READ_VIEW (version 3): view references */
    uint32_t n_waits;
    fp_wait *waits;
    fp_req *prev, *next; /* session FIFO */
    fp_req *hnext;       /* req_id hash chain */
};

struct fp_handle {
    uint32_t id;
    fp_session *s;
    fp_group *g;
    char spec[TV__FP_MAX_SPEC_COPY];
    bool legacy;           /* a version 1 or 2 session's: the group's legacy arena */
    uint32_t *refs;        /* legacy: references per slot of the legacy arena */
    fp_refmap crefs;       /* version 3: copy references per chunk */
    fp_refmap vrefs;       /* version 3: view references per chunk */
    uint64_t view_len;     /* bytes of the chunks it holds views on */
    uint32_t held;         /* copy references held (legacy slots or chunks) */
    int64_t held_since_ms; /* CLOCK_MONOTONIC: the last release, or held 0 -> 1 */
    uint32_t n_reqs;
    uint64_t bytes_delivered;
    int member;           /* its bit among the tier generation's members, -1: none */
    int64_t last_take_ms; /* CLOCK_MONOTONIC: when it joined or last took a chunk */
    bool stalled;         /* declared stalled (tv__fp_share_sweep) since its last take */
    bool seq_valid;       /* last_shard / last_end hold the previous request's end */
    uint32_t last_shard;
    uint64_t last_end;
};

struct fp_out {
    fp_out *next;
    uint32_t len;
    uint32_t entries;
    int fds[TV__FP_N_FDS_OPENED];
    uint32_t n_fds;
    uint8_t buf[];
};

struct fp_session {
    fp_ev ev;
    tv__fp *fp;
    int fd;
    uint64_t id;
    pid_t pid;
    uid_t uid;
    gid_t gid;
    gid_t *gids; /* primary gid first, then SO_PEERGROUPS */
    size_t n_gids;
    int64_t connected_unix;
    int64_t connected_ms; /* CLOCK_MONOTONIC: the HELLO deadline counts from it */
    bool hello;
    uint16_t version; /* negotiated by HELLO; TV__FP_V1 before it (a fatal ERROR's header) */
    bool doomed;
    int fatal_code; /* doomed with an ERROR to send (0: peer left, or stop) */
    char fatal_msg[TV__FP_MAX_TEXT + 1];
    char why[TV__FP_MAX_TEXT + 1]; /* doomed without ERROR: why (log) */
    uint32_t ep_events;
    fp_handle **handles; /* max_handles entries, NULL = free */
    uint32_t n_handles;
    uint32_t next_handle;
    fp_req *rq_head, *rq_tail, *issue;
    fp_req **hash;
    uint32_t hash_mask;
    uint32_t n_reqs;
    uint32_t held, waits;
    uint64_t bytes_delivered, requests_done;
    tv__fp_chunk_ent *pchunk;
    uint32_t n_pchunk;
    tv__fp_done_ent *pdone;
    uint32_t n_pdone;
    bool dirty; /* pending entries or outbox to send at the end of the turn */
    fp_out *out_head, *out_tail;
    uint64_t out_entries;
    fp_session *prev, *next;
};

typedef struct fp_shard {
    uint64_t data_off, file_len;
    uint64_t object_len; /* the replicas' alloc_len: the last chunk's read stops there */
    uint32_t first_replica, n_replicas;
    uint32_t first_chunk; /* its chunk 0 is the generation's chunk first_chunk */
} fp_shard;

struct fp_group {
    fp_ev ev;
    tv__fp *fp;
    char name[256];
    int64_t gen;
    tv_model *m;
    const tv__snap *snap;
    int snap_fd;
    size_t snap_len;
    /* the memory tier: the generation's chunks */
    tv__tier_gen *tg;
    int tier_ro_fd;     /* its memfd opened read-only: what version-3 sessions map */
    uint32_t chunk_len; /* = slot_len of both arenas: a multiple of every io_align */
    uint32_t n_chunks;
    fp_chunk *chunks;
    uint32_t staging; /* chunks in use at most: group_slots */
    bool whole_only;  /* huge pages: chunks are read whole (no small envelopes) */
    /* reads: one aio per window of the tier mapping (an aio region is at most 16 GiB) */
    tv__aio **aio;
    uint32_t n_aio;
    uint32_t window_chunks;
    uint32_t in_flight;
    uint32_t queue_depth; /* min(group_slots, FP_MAX_QUEUE_DEPTH): reads in flight at most */
    bool flush_needed;
    bool starved;   /* this turn a session below its credit found no staging here */
    bool throttled; /* this turn a read found no room in the tier's bound */
    uint64_t mark;  /* == fp->mark: counted already (tv__fp_group_open's per-uid count) */
    uint32_t n_handles;
    bool dying; /* last handle closed: on fp->dying, freed at the end of the turn */
    /* the legacy arena (made for the first version 1 or 2 handle) */
    int arena_fd;
    uint8_t *arena;
    size_t arena_len;
    uint32_t n_slots;
    fp_slot *slots;
    int32_t lru_head, lru_tail;
    uint32_t n_fresh; /* slots [n_fresh, n_slots) were never used: not in the LRU, and their
                         arena pages not allocated yet */
    int32_t *index;   /* n_index chain heads of keyed slots by chunk */
    uint32_t index_mask;
    uint32_t io_align; /* the largest io_align of the group's devices (small reads' envelope) */
    fp_shard *shards;
    uint32_t n_shards;
    tv__snap_replica_info *replicas;
    uint32_t n_replicas;
    tv__model_dev *devs;
    uint32_t n_devs;
    fp_group *prev, *next;
};

/* The view pins of one uid on one generation's tier: each chunk counted
 * once however many of the uid's handles view it (cache.view_bytes_per_uid
 * bounds the memory a uid pins, and N workers of one user viewing one
 * model pin it once). */
typedef struct fp_uid_views {
    struct fp_uid_views *next;
    uid_t uid;
    const tv__tier_gen *tg;
    fp_refmap holders; /* chunk -> the uid's handles holding a view on it */
    uint64_t len;      /* bytes of those chunks */
} fp_uid_views;

struct tv__fp {
    tv__fp_opts o;
    char *socket_path, *store_dir;
    int listen_fd, epoll_fd, wake_fd;
    fp_ev listen_ev, wake_ev;
    pthread_t thread;
    bool thread_started;
    atomic_bool stop;
    pthread_mutex_t mu;
    uid_t uid;
    gid_t gid;
    fp_session *s_head, *s_tail;
    uint32_t n_sessions;
    uint64_t next_session_id;
    fp_group *g_head;
    uint32_t n_groups;
    tv__tier *tier;          /* the memory tier: every group's chunks, dormant generations */
    fp_uid_views *uid_views; /* per uid and generation: the chunks its views pin */
    int64_t scrub_ms;        /* the next tv__tier_scrub pass (CLOCK_MONOTONIC) */
    uint64_t mark;           /* the last per-uid group count's mark (fp_group.mark) */
    fp_group *dying;         /* groups whose last handle closed this turn (next-linked): freed by
                                tv__fp_groups_reap once the turn's replies went out */
    bool again;              /* a slot or credit came free after this turn's scheduling */
    bool accept_paused;      /* accept ran out of descriptors: the listening socket is out of
                                epoll, retried every FP_ACCEPT_RETRY_MS (fastpath.c) */
    bool accept_warned;      /* said so once since the last successful accept */
    /* the loop's current epoll batch: a group freed while it is handled
     * clears its later events there (NULL when no batch is running) */
    struct epoll_event *evs;
    int n_evs, ev_next;
    atomic_uint_fast64_t st_sessions, st_sessions_total, st_groups, st_device_read, st_delivered,
        st_shared, st_refused, st_protocol, st_readahead, st_readahead_hit, st_slots_used,
        st_tier_hits, st_tier_hit_bytes, st_tier_misses, st_tier_miss_bytes, st_views,
        st_view_refused, st_stalls;
    uint8_t rbuf[TV__FP_MAX_MSG];
    uint8_t sbuf[TV__FP_MAX_MSG];
};

/* ---- fastpath.c ---- */
/* CLOCK_MONOTONIC in milliseconds. */
int64_t tv__fp_now_ms(void);
/* Sets the epoll interest of a session (EPOLLIN, EPOLLOUT while its outbox
 * is non-empty). */
void tv__fp_session_arm(fp_session *s);
/* Closes a client socket so that what the daemon sent on it stays readable:
 * shut down both ways, what the client sent read and dropped, closed. */
void tv__fp_hangup(tv__fp *fp, int fd);

/* ---- session.c ---- */
/* A connecting peer as the kernel knows it. */
typedef struct fp_peer {
    pid_t pid;
    uid_t uid;   /* (uid_t)-1 when the kernel gave no credentials */
    gid_t gid;   /* the primary gid, (gid_t)-1 likewise */
    gid_t *gids; /* the primary gid first, then SO_PEERGROUPS (malloc'd) */
    size_t n_gids;
} fp_peer;
/* Reads the credentials of fd's peer (SO_PEERCRED, SO_PEERGROUPS) into *p.
 * Returns 0; -ENOMEM (*p holds nothing to free then). */
int tv__fp_peer_read(int fd, fp_peer *p);
/* Frees what tv__fp_peer_read allocated. NULL-safe. */
void tv__fp_peer_free(fp_peer *p);
/* A session on fd for peer p (its gids are taken: p holds none after).
 * Returns 0 and *out; -ENOMEM (p untouched). */
int tv__fp_session_new(tv__fp *fp, int fd, fp_peer *p, fp_session **out);
/* Reads what the socket holds (at most a bounded number of messages) and
 * handles each. */
void tv__fp_session_on_input(fp_session *s);
/* Sends what the outbox holds until the socket is full. */
void tv__fp_session_on_output(fp_session *s);
/* Dooms a session with a fatal ERROR (code, message): first call wins. */
void tv__fp_session_fail(fp_session *s, int code, const char *fmt, ...) TV_PRINTF(3, 4);
/* Dooms a session without an ERROR (peer left, stop): why is logged. */
void tv__fp_session_drop(fp_session *s, const char *why);
/* Destroys a doomed session: handles closed, ERROR sent (when fatal),
 * socket closed, unlinked from fp. */
void tv__fp_session_destroy(fp_session *s);
/* One scheduling pass over every session; returns true when a chunk was
 * issued or delivered. Marks the groups it found starved or throttled. */
bool tv__fp_schedule(tv__fp *fp);
/* After tv__fp_schedule: fails (TV_E_TIMEOUT) every session whose handle
 * on a starved group holds copy references without a release for
 * hold_timeout_ms; their slots return when they are destroyed at the end of
 * the turn. Returns the milliseconds until the next such deadline, or -1
 * when no handle of a starved group holds anything. */
int tv__fp_hold_sweep(tv__fp *fp);
/* After tv__fp_schedule: in every throttled group, declares stalled the
 * members that took no chunk for share_wait_ms while their debts keep
 * memory (tv__tier_member_active false). Returns the milliseconds until
 * the next such deadline, or -1. */
int tv__fp_share_sweep(tv__fp *fp);
/* Encodes a session's pending CHUNK / DONE entries into its outbox. */
void tv__fp_session_flush(fp_session *s);
/* Wait w (the head of its list) was served: by legacy slot idx (the slot
 * is READY) or, for a version-3 request, by chunk idx (resident): it
 * becomes a reference of w's session (a view reference for a view
 * request) and a CHUNK entry; w is freed, its request finished (DONE) when
 * that was its last chunk, or failed when a view could not be pinned. */
void tv__fp_wait_deliver(fp_group *g, uint32_t idx, fp_wait *w);
/* Request r failed: ERROR{code, req_id, msg} then DONE{code}; r freed. */
void tv__fp_req_fail(fp_req *r, int code, const char *msg);

/* ---- group.c ---- */
/* Opens spec for session s: model, admit, group join or create. Returns 0
 * and *out (the group, its n_handles counted); the error otherwise (err
 * says why; *refused is set when admit refused it). */
int tv__fp_group_open(tv__fp *fp, fp_session *s, const char *spec, fp_group **out, bool *refused,
                      tv_error *err);
/* Makes g's legacy arena for its first version 1 or 2 handle. Returns 0 or
 * the error (err says why). */
int tv__fp_group_legacy(fp_group *g, tv_error *err);
/* One handle of the group closed: at the last one the group leaves fp's
 * list for fp->dying (an OPEN of the same generation in this turn takes it
 * back); the teardown (aio, lease) waits for tv__fp_groups_reap, so no
 * reply of the turn waits for it. Its tier generation stays (dormant) while
 * it has resident chunks and the tier room for them. */
void tv__fp_group_unref(fp_group *g);
/* Destroys the groups on fp->dying (end of turn, after the replies were
 * sent; and at stop), then frees dormant tier generations with nothing
 * resident (and the oldest past FP_MAX_DORMANT). */
void tv__fp_groups_reap(tv__fp *fp);
/* Sequential readahead: starts reads of the whole chunks from_k, from_k +
 * 1, .. of shard (at most min(readahead, group_slots / 4) of them, inside
 * the shard's object) that are neither resident nor being read, while the
 * group has staging to spare (fewer than half its group_slots in use) and
 * the tier room without evicting a chunk a member is owed; reader = the
 * session id. No wait, no reference, no credit: once read they are idle
 * resident chunks, owed to every member that has not taken them, so they
 * stay for the members behind. */
void tv__fp_readahead(fp_group *g, uint32_t shard, uint64_t from_k, uint64_t reader);
/* A request uses chunk idx: a chunk read ahead counts as a readahead hit once. */
void tv__fp_chunk_used(fp_group *g, uint32_t idx);
/* Reaps the group's completions. */
void tv__fp_group_on_event(fp_group *g);
/* Submits queued reads of every group. */
void tv__fp_groups_flush(tv__fp *fp);
/* Reads of at most FP_SMALL_READ bytes and slot_len / 16 that do not follow
 * the handle's previous request read only their io-aligned envelope inside
 * the chunk. */
#define FP_SMALL_READ (64u << 10)
/* What tv__fp_chunk_get found or did for chunk idx. */
enum { FP_GOT_RESIDENT, FP_GOT_READING, FP_GOT_STARTED, FP_GOT_BLOCKED, FP_GOT_FAILED };
/* Makes chunk-relative bytes [need_lo, need_hi) of chunk idx resident:
 * RESIDENT (they are), READING (a read in flight will bring them: wait on
 * it), STARTED (a read of [lo, hi) started now: lo, hi multiples of
 * io_align, hi clipped to the chunk; 0 and UINT32_MAX: the whole chunk),
 * BLOCKED (not now: no staging, or a partly read chunk another session
 * references (g->starved set); no room in the tier (g->throttled set); the
 * read queue full; a partly read chunk the asking handle references),
 * FAILED (no replica could be read: err set). reader = the session id,
 * member its handle's member bit (-1: none), own_refs the references the
 * handle holds on chunk idx. */
int tv__fp_chunk_get(fp_group *g, uint32_t idx, uint32_t need_lo, uint32_t need_hi, uint32_t lo,
                     uint32_t hi, uint64_t reader, int member, uint32_t own_refs, tv_error *err);
/* The chunk index of chunk k of shard. */
uint32_t tv__fp_chunk_index(const fp_group *g, uint32_t shard, uint64_t k);
/* Legacy slots: the one holding (or filling with) a copy of chunk-relative
 * bytes [lo, hi) of chunk idx, or -1; a free one taken for chunk idx (its
 * copy of [lo, hi) made now from the resident chunk, or FILLING until the
 * chunk's read lands: the caller says which), or -1 when none is free. */
int32_t tv__fp_slot_find(fp_group *g, uint32_t idx, uint32_t lo, uint32_t hi);
int32_t tv__fp_slot_take_free(fp_group *g, uint32_t idx, bool filling);
/* Removes a cached free slot from the LRU (a cache hit). */
void tv__fp_slot_take(fp_group *g, uint32_t idx);
/* Drops n references of legacy slot idx; at 0 a READY slot returns to the LRU. */
void tv__fp_slot_unref(fp_group *g, uint32_t idx, uint32_t n);

/* ---- refmap (session.c) ---- */
/* Adds n to key's count. Returns 0 or -ENOMEM. */
int tv__fp_refmap_add(fp_refmap *m, uint32_t key, uint32_t n);
/* key's count (0 when absent). */
uint32_t tv__fp_refmap_get(const fp_refmap *m, uint32_t key);
/* Subtracts 1 from key's count (the entry goes at 0). Returns false when
 * key had none. */
bool tv__fp_refmap_dec(fp_refmap *m, uint32_t key);
void tv__fp_refmap_free(fp_refmap *m);

#endif
