/* The fast-path server of tensorvaultd: a UNIX SOCK_SEQPACKET socket where
 * co-located workers open models (a lease for the connection's lifetime)
 * and read tensors through shared staging arenas (docs/fastpath.md).
 *
 * Invariants:
 *   - one loop thread (epoll) owns every session, every read group and
 *     their io_uring instances; the HTTP threads only read its counters and
 *     ask for a sessions listing (under a mutex, copied out);
 *   - sessions that opened the same model generation share one read group:
 *     one tv_model (the lease: a shared flock on the snapshot file, so gc
 *     never frees the generation while a session has it open), one sealed
 *     snapshot memfd, one staging arena (memfd, fixed slots, read-only for
 *     clients) and one chunk table, so a chunk wanted by several sessions
 *     at about the same time is read from the device once;
 *   - a chunk is a slot_len-aligned piece of one shard's object (clipped to
 *     the object's extent): the arena only ever holds bytes of the group's
 *     own objects, so a peer allowed that model sees nothing else;
 *   - a session holds at most `credit` slot references (delivered and not
 *     released, or awaited); the scheduler serves sessions round-robin; a
 *     session of a group that waits for a free slot while other sessions
 *     of that group hold references without releasing any for
 *     hold_timeout_ms ends those sessions (ERROR TV_E_TIMEOUT, fatal) and
 *     their slots return: so a client that stops releasing only stalls
 *     itself (however many of them share the group); memory is bounded by
 *     max_groups x group_slots x slot_len plus fixed per-session state;
 *   - a peer is checked (SO_PEERCRED / SO_PEERGROUPS) at connect by the
 *     peer callback, then per OPEN by the admit callback; a peer that may
 *     open no model at all is refused at connect (ERROR TV_E_PEER_DENIED,
 *     fatal) before a session exists for it, so it holds nothing; a
 *     refused OPEN gets an ERROR and nothing else;
 *   - no uid holds more than max_sessions_per_uid sessions: a connection
 *     over it, or over max_sessions, is refused at connect (ERROR
 *     TV_E_BUSY, fatal), so one user cannot take every session; likewise
 *     no uid has handles on more than max_groups_per_uid read groups and no
 *     model has more than max_groups_per_model generations open (an OPEN
 *     over either, or over max_groups, gets ERROR TV_E_BUSY, not fatal), so
 *     one user, or one model, cannot take every group;
 *   - a protocol violation closes that session only (ERROR fatal, then
 *     close); its references and waits are dropped, its slots return;
 *   - a slot is reused only when no session references it and no read is
 *     in flight into it: nothing is written into bytes a client was told
 *     are ready and has not released. */
#ifndef TV_FASTPATH_FASTPATH_H
#define TV_FASTPATH_FASTPATH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "util/internal.h"

#define TV__FP_MAX_SPEC_COPY 513 /* TV__FP_MAX_SPEC (wire/wire.h) + NUL */

typedef struct tv__fp tv__fp;

/* Called on the loop thread twice for every OPEN: first with generation 0
 * and the model name taken from the spec, before anything is opened (apply
 * the access rules only: a refused peer learns nothing of the model, not
 * even whether it exists), then after the spec opened with the resolved
 * model and generation. Return 0 to admit; TV_E_PEER_DENIED (message names
 * the uid and the model), TV_E_NOT_FOUND (for instance a retired
 * generation: "generation 3 of m is retired") or any error to refuse: the
 * client gets an ERROR with that code and message.
 * gids[0] is the peer's primary gid (SO_PEERCRED), then its supplementary
 * groups (SO_PEERGROUPS); n_gids >= 1. */
typedef int (*tv__fp_admit_fn)(void *ctx, const char *model, int64_t generation, pid_t pid,
                               uid_t uid, const gid_t *gids, size_t n_gids, tv_error *err);

/* Called on the loop thread (with admit_ctx) for every new connection,
 * before a session is made for it: return 0 to take it, TV_E_PEER_DENIED
 * (message naming the uid) to refuse it: the peer gets that ERROR (fatal)
 * before its HELLO is read and the connection closes, holding nothing. The
 * daemon refuses there a peer its access rules let open no model at all.
 * gids as for admit. */
typedef int (*tv__fp_peer_fn)(void *ctx, pid_t pid, uid_t uid, const gid_t *gids, size_t n_gids,
                              tv_error *err);

#define TV__FP_DEFAULT_SLOT_LEN     (1u << 20)
#define TV__FP_DEFAULT_GROUP_SLOTS  128u
#define TV__FP_DEFAULT_CREDIT       32u
#define TV__FP_DEFAULT_MAX_SESSIONS 256u
#define TV__FP_DEFAULT_MAX_GROUPS   16u
#define TV__FP_DEFAULT_MAX_REQUESTS 16384u
#define TV__FP_DEFAULT_MAX_HANDLES  16u
#define TV__FP_DEFAULT_READAHEAD    16u /* the daemon's [fastpath] readahead default */
/* A client copies a chunk and releases it in micro- to milliseconds (a GPU
 * copy and a stream sync included): 10 s without one while others wait is
 * a stuck or hostile client, and a waiting loader loses at most that. */
#define TV__FP_DEFAULT_HOLD_TIMEOUT_MS 10000u
/* Ranks of one job start within a few seconds of each other and read at
 * their own pace: 2 s without taking a chunk, while the memory kept for
 * it is needed, is a rank that stopped (or reads another subset). */
#define TV__FP_DEFAULT_SHARE_WAIT_MS 2000u

typedef struct tv__fp_opts {
    const char *socket_path; /* created (parent directory too, 0750), unlinked first if stale */
    unsigned socket_mode;    /* chmod after bind: 0660 by default (0 = 0660) */
    const char *store_dir;   /* tv_model_open(store_dir, spec) per new group */
    int engine;              /* TV_ENGINE_* for the groups' aio */
    bool no_direct;          /* buffered reads (tests on tmpfs) */
    uint32_t slot_len;       /* 0 = default; multiple of 4096 (raised to the devices' io_align) */
    uint32_t group_slots;    /* slots per group arena; 0 = default; >= 2 x credit */
    uint32_t credit;         /* slot references per session; 0 = default */
    uint32_t max_sessions;   /* further connections are answered ERROR TV_E_BUSY and closed */
    /* sessions of one uid: its further connections are answered ERROR
     * TV_E_BUSY and closed; 0 = max_sessions / 4 (at least 1): 64 of the
     * default 256, a job of 8 tensor-parallel ranks x a few engines, and
     * three other users still find room */
    uint32_t max_sessions_per_uid;
    uint32_t max_groups; /* distinct open model generations; further OPENs: TV_E_BUSY */
    /* model generations one uid may have handles on at once; an OPEN that
     * would make one more: ERROR TV_E_BUSY; 0 = max_groups / 2 (at least 1) */
    uint32_t max_groups_per_uid;
    /* generations of one model open at once; an OPEN of one more: ERROR
     * TV_E_BUSY; 0 = max_groups / 4 (at least 1) */
    uint32_t max_groups_per_model;
    uint32_t max_requests;     /* outstanding per session; more is a protocol error */
    uint32_t max_handles;      /* open handles per session; more: ERROR TV_E_BUSY for that OPEN */
    uint32_t hello_timeout_ms; /* a connection that sends no HELLO this long is closed (so idle
                                  connections cannot hold every session); 0 = 10000 */
    /* a session that holds slot references of a group without releasing
     * any this long, while another session of the group waits for a free
     * slot, is closed (ERROR TV_E_TIMEOUT); 0 = default */
    uint32_t hold_timeout_ms;
    tv__fp_admit_fn admit; /* NULL = admit the daemon's own uid, or a peer whose gid or a
                              supplementary group is the daemon's gid */
    tv__fp_peer_fn peer;   /* NULL = take every connection when admit is set, else refuse
                              the peers that the default admission refuses */
    void *admit_ctx;       /* of admit and peer */
    uint32_t readahead;    /* chunks read ahead past a sequential request when its session has
                              nothing more queued (at most group_slots / 4); 0 = none */
    /* the memory tier's budget (cache.bytes): bytes kept resident beyond the
     * open groups' staging, least recently used generation chunks evicted
     * first; also the most bytes views may pin. 0 = default (1/8 of the
     * physical memory), < 0 = none (chunks stay only while their group is
     * open and within its staging; no view is granted) */
    int64_t cache_len;
    /* cache.dir: a directory on a tmpfs for the tier's files (tier.h:
     * tv__tier_create); NULL or "" = memfds */
    const char *cache_dir;
    /* a member of a group that takes no chunk this long while the chunks
     * owed to it keep the tier full is declared stalled: the others stop
     * keeping memory for it; 0 = default */
    uint32_t share_wait_ms;
    /* bytes the views of one uid's sessions may pin (summed over its
     * handles); 0 = the tier's budget */
    uint64_t view_len_per_uid;
} tv__fp_opts;

/* Binds the socket and starts the loop thread. Returns 0 and *out;
 * TV_E_INVALID_ARG (bad opts, a socket path over 107 bytes: named);
 * -EADDRINUSE (another live daemon answers on that socket); -errno. */
int tv__fp_start(const tv__fp_opts *opts, tv__fp **out, tv_error *err);
/* Closes every session (clients see EOF: TV_E_DISCONNECTED), waits for the
 * reads in flight, closes the groups (leases released), joins the thread,
 * unlinks the socket. NULL-safe. */
void tv__fp_stop(tv__fp *fp);

typedef struct tv__fp_handle_info {
    uint32_t handle;
    char model[256];
    char spec[TV__FP_MAX_SPEC_COPY];
    int64_t generation;
    uint64_t bytes_delivered;
    uint64_t view_bytes; /* bytes of the chunks its views pin */
    bool legacy;         /* a version 1 or 2 handle: copies out of the legacy arena */
    bool stalled;        /* declared stalled: the others keep no memory for it */
} tv__fp_handle_info;

typedef struct tv__fp_session_info {
    uint64_t id;
    pid_t pid;
    uid_t uid;
    gid_t gid;
    int64_t connected_unix;   /* seconds */
    uint64_t bytes_delivered; /* sum over the open handles (handles[i].bytes_delivered) */
    uint64_t requests_done;   /* DONE entries sent over the session's life */
    uint32_t slots_held;      /* copy references held now (CHUNK entries not released) */
    uint64_t view_bytes;      /* bytes of the chunks its views pin (summed over handles) */
    uint16_t version;         /* the protocol version negotiated (0 before HELLO) */
    size_t n_handles;
    tv__fp_handle_info *handles;
} tv__fp_session_info;

/* A copy of the live sessions (in connection order). Free with
 * tv__fp_sessions_free. Returns 0; -ENOMEM. */
int tv__fp_sessions(tv__fp *fp, tv__fp_session_info **out, size_t *n);
void tv__fp_sessions_free(tv__fp_session_info *s, size_t n);

typedef struct tv__fp_stats {
    uint64_t sessions;            /* live now */
    uint64_t sessions_total;      /* accepted since start */
    uint64_t groups;              /* open read groups now */
    uint64_t device_read_bytes;   /* bytes read from devices into arenas */
    uint64_t delivered_bytes;     /* bytes announced in CHUNK entries (summed over sessions) */
    uint64_t shared_bytes;        /* delivered bytes served from a chunk another session caused */
    uint64_t refused_total;       /* OPENs refused by admit */
    uint64_t protocol_errors;     /* sessions closed for a protocol violation */
    uint64_t readahead_bytes;     /* device bytes read ahead (also in device_read_bytes) */
    uint64_t readahead_hit_bytes; /* of those, bytes of chunks a request then used */
    uint64_t slots_used;          /* legacy arena slots the open groups ever used */
    /* the memory tier (tier.h) */
    uint64_t tier_hits;           /* chunks a request found resident (no read, no wait) */
    uint64_t tier_hit_bytes;      /* the bytes delivered from them */
    uint64_t tier_misses;         /* chunks a request had to wait a device read for */
    uint64_t tier_miss_bytes;     /* the bytes delivered from them */
    uint64_t tier_budget_bytes;   /* cache.bytes (0: none) */
    uint64_t tier_bound_bytes;    /* budget + the open groups' staging */
    uint64_t tier_resident_bytes; /* bytes resident or being read, every generation */
    uint64_t tier_view_bytes;     /* bytes pinned by views */
    uint64_t tier_generations;    /* generations with memory (open or dormant) */
    uint64_t tier_evictions;      /* chunks evicted (holes punched) */
    uint64_t tier_evicted_bytes;  /* their bytes */
    uint64_t tier_scrubbed_bytes; /* stray pages punched (a client touched a hole) */
    uint64_t tier_page_bytes;     /* the tier's page size: 4096 or a huge page's */
    uint32_t tier_pages;          /* TV__TIER_PAGES_*: 0 small, 1 THP, 2 hugetlb */
    uint64_t views;               /* view requests served */
    uint64_t views_refused;       /* view requests refused (TV_E_BUSY: pins over the budget) */
    uint64_t member_stalls;       /* members declared stalled */
} tv__fp_stats;

/* Counters (atomics: any thread). NULL fp gives zeros. */
void tv__fp_get_stats(const tv__fp *fp, tv__fp_stats *out);

#endif
