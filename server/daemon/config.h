/* tensorvaultd configuration: every key has a default, then an INI file
 * (libinih, keys as [section] key = value), then TENSORVAULT_<SECTION>_<KEY>
 * environment variables, then flags (--listen, --store, --demo, --log-level,
 * --set section.key=value), each layer overriding the one before.
 *
 * Invariants: a key is known or refused (the message names where it came
 * from: "FILE:LINE", "environment TENSORVAULT_X" or "--set"); a value is
 * parsed and range-checked when it is set, so a loaded tv__config is always
 * valid; strings that do not fit their buffer are refused, never cut. */
#ifndef TV_DAEMON_CONFIG_H
#define TV_DAEMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensorvault/errors.h"

#define TV__CFG_STR_MAX    4096 /* bytes of a string value, NUL included */
#define TV__CFG_MAX_ROOTS  32
#define TV__CFG_MAX_ACCESS 64   /* [access] model keys */
#define TV__CFG_RULES_MAX  1024 /* bytes of one [access] rule list, NUL included */
#define TV__CFG_SOCKET_MAX 107  /* bytes of a UNIX socket path (sun_path less its NUL) */

/* http.anonymous_reads */
enum { TV__CFG_ANON_LOOPBACK = 0, TV__CFG_ANON_ALWAYS = 1, TV__CFG_ANON_NEVER = 2 };

typedef struct tv__config {
    char http_listen[256]; /* "HOST:PORT" or "[V6]:PORT"; port 0 = any free port */
    unsigned http_threads; /* 0 = online CPUs */
    unsigned http_connection_timeout_s;
    unsigned http_per_ip_connections;
    uint64_t http_memory_limit; /* bytes per connection */
    uint64_t http_max_body_bytes;
    uint64_t http_max_header_bytes;
    int http_anonymous_reads;                 /* TV__CFG_ANON_* */
    unsigned http_header_timeout_s;           /* a whole request must arrive within it */
    unsigned http_per_uid_connections;        /* per local user */
    unsigned http_max_connections;            /* over the TCP and UNIX listeners */
    char http_allowed_hosts[TV__CFG_STR_MAX]; /* ','-separated host[:port]; "" = the default */
    char http_socket[TV__CFG_STR_MAX];        /* default: store_dir + "/run/http.sock"; "" = none */
    bool http_socket_set;                     /* http.socket given by a layer */
    unsigned http_socket_mode;                /* its file mode */
    char store_dir[TV__CFG_STR_MAX];
    char store_image[TV__CFG_STR_MAX];       /* default: store_dir + "/store.img" */
    bool store_image_set;                    /* store.image given by a layer */
    uint64_t store_image_size;               /* bytes (sparse) */
    char store_device[TV__CFG_STR_MAX];      /* "" = use store_image */
    char store_admin_token[TV__CFG_STR_MAX]; /* default: store_dir + "/admin.token" */
    bool store_admin_token_set;              /* store.admin_token given by a layer */
    unsigned store_admin_token_mode;         /* its file mode: owner and group bits only */
    char import_roots[TV__CFG_STR_MAX];      /* ':'-separated, as given */
    unsigned import_workers;
    unsigned import_queue;
    bool import_strict;
    char import_origins[TV__CFG_STR_MAX]; /* ','-separated URL prefixes; "" = none */
    unsigned import_http_retries;         /* per Range request */
    unsigned import_http_timeout;         /* seconds without a byte */
    uint64_t import_http_range;           /* bytes per Range request */
    uint64_t import_sidecar_max_bytes;    /* per sidecar file; larger ones are skipped */
    uint64_t import_sidecar_total_bytes;  /* all sidecar files of an import */
    /* hf:// imports (import/src_hub.c): the Hub's endpoint ($HF_ENDPOINT
     * overrides it), a file holding the token ($HF_TOKEN overrides it), and
     * the redirect policy of its file CDN's hops */
    char import_hf_endpoint[TV__CFG_STR_MAX];
    char import_hf_token_file[TV__CFG_STR_MAX];
    bool import_hf_redirect_http;    /* hops to http:// too (else https only) */
    bool import_hf_redirect_private; /* hops to loopback/private/link-local addresses too */
    char hf_token[1024]; /* read at load: $HF_TOKEN, else the token file; never logged */
    char s3_endpoint[TV__CFG_STR_MAX]; /* "" = $AWS_ENDPOINT_URL, else AWS */
    char s3_region[64];                /* "" = $AWS_REGION, else us-east-1 */
    char s3_access_key_id[256];        /* "" = $AWS_ACCESS_KEY_ID */
    char s3_secret_access_key[256];    /* never logged */
    char s3_session_token[TV__CFG_STR_MAX];
    int log_level;                     /* TV_LOG_* of util/internal.h */
    char log_file[TV__CFG_STR_MAX];    /* "stderr" or a path (appended to) */
    char demo_source[TV__CFG_STR_MAX]; /* "" = no demo import */
    /* [fastpath]: the local fast path's socket and limits (server/fastpath) */
    bool fastpath_enabled;
    char fastpath_socket[TV__CFG_STR_MAX]; /* default: store_dir + "/run/tensorvault.sock" */
    bool fastpath_socket_set;              /* fastpath.socket given by a layer */
    unsigned fastpath_mode;                /* socket file mode (octal text) */
    uint64_t fastpath_slot_len;            /* bytes, a multiple of 4096 */
    unsigned fastpath_group_slots;         /* at least 2 x fastpath_credit */
    unsigned fastpath_credit;
    unsigned fastpath_max_sessions;
    unsigned fastpath_max_sessions_per_uid; /* sessions of one uid; 0 = max_sessions / 4 */
    unsigned fastpath_hold_timeout_ms;      /* slots held without a release while others wait */
    unsigned fastpath_max_groups;
    unsigned fastpath_max_groups_per_uid;   /* groups one uid has handles on; 0 = max_groups / 2 */
    unsigned fastpath_max_groups_per_model; /* generations of one model open; 0 = max_groups / 4 */
    unsigned fastpath_max_requests;
    unsigned fastpath_readahead;     /* chunks read ahead of a sequential reader (0: none) */
    unsigned fastpath_share_wait_ms; /* a group member taking no chunk this long while the
                                        memory kept for it is needed is left behind */
    /* [cache]: the fast path's memory tier (server/fastpath/tier.h) */
    uint64_t cache_bytes;              /* bytes kept resident beyond the groups' staging;
                                          default 1/8 of the physical memory; 0 = none */
    uint64_t cache_view_bytes_per_uid; /* bytes one uid's views may pin; 0 = cache_bytes */
    char cache_dir[TV__CFG_STR_MAX];   /* a tmpfs directory for the tier's files; "" = memfds */
    /* [access]: who may OPEN a model through the fast path (fastpath/access.h
     * syntax, checked when set): "default" and one key per model */
    char access_default[TV__CFG_RULES_MAX]; /* default: "uid:<getuid()> gid:<getgid()> token:*" */
    size_t n_access;
    struct tv__config_access {
        char model[256];
        char rules[TV__CFG_RULES_MAX];
    } access[TV__CFG_MAX_ACCESS]; /* a model set again replaces its entry */
    /* [fleet] (server/fleet): the fleet catalog; "" = standalone */
    char fleet_postgres[TV__CFG_STR_MAX];     /* libpq conninfo or URI */
    char fleet_node[256];                     /* this node's name; default: the hostname */
    char fleet_url[TV__CFG_STR_MAX];          /* how peers reach this node; default http://LISTEN */
    char fleet_token[128];                    /* the fleet's shared peer token; "" = none */
    char fleet_object_store[TV__CFG_STR_MAX]; /* s3://BUCKET/PREFIX/ for blobs; "" = none */
    char fleet_proxy[TV__CFG_STR_MAX];        /* HTTP proxy for pulls; "" = libcurl's default */
    unsigned fleet_quorum;                    /* default quorum of an alias move (0 = all) */
    unsigned fleet_rollout_timeout;           /* seconds before a quorum may switch */
    unsigned fleet_pull_attempts;             /* a pull's tries before it is failed */
    unsigned fleet_node_down_s;               /* a node unseen this long is down */
} tv__config;

/* Fills c with the defaults (import.roots = the current directory). */
void tv__config_defaults(tv__config *c);

/* Sets one key ("section.key") from its text; where names the origin for
 * the message. Returns 0; TV_E_INVALID_ARG naming where, the key and (for a
 * bad value) the value and what is expected. */
int tv__config_set(tv__config *c, const char *key, const char *value, const char *where,
                   tv_error *err);

/* Applies an INI file. Returns 0; -errno when it cannot be read (the message
 * names the file); TV_E_INVALID_ARG "FILE:LINE: ..." for a syntax error, an
 * unknown section or key, or a bad value. */
int tv__config_load_file(tv__config *c, const char *path, tv_error *err);

/* Applies the TENSORVAULT_<SECTION>_<KEY> variables of envp (NULL-ended) for
 * the sections http, store, import, log, demo, fastpath, access, fleet and cache.
 * The section matches in any case; the key is lower-cased
 * (TENSORVAULT_FASTPATH_MAX_SESSIONS sets fastpath.max_sessions), except
 * that an [access] model name is taken exactly as written, model names
 * being case-sensitive: TENSORVAULT_ACCESS_Llama sets access.Llama (and
 * TENSORVAULT_ACCESS_LLAMA access.LLAMA, another model);
 * TENSORVAULT_ACCESS_DEFAULT, in any case, sets access.default. Other
 * TENSORVAULT_* variables (TENSORVAULT_URL, TENSORVAULT_STORE, ... of the
 * CLI) are not the daemon's and are ignored. Returns 0 or
 * TV_E_INVALID_ARG. */
int tv__config_load_env(tv__config *c, char *const *envp, tv_error *err);

/* What the command line asks for. */
typedef enum { TV__CFG_RUN = 0, TV__CFG_HELP, TV__CFG_VERSION } tv__config_action;

/* The whole chain: defaults, the --config file, envp, then the flags of
 * argv; then store.image, store.admin_token and fastpath.socket follow
 * store.dir unless they were given. Returns 0 and *action; TV_E_INVALID_ARG
 * for an unknown flag, a flag missing its value, fastpath.group_slots under
 * 2 x fastpath.credit, a fastpath.socket given longer than
 * TV__CFG_SOCKET_MAX, a store.admin_token_mode that lets others read the
 * token (or anyone but its owner write it, or execute it), or any error of
 * the layers above. */
int tv__config_load(tv__config *c, int argc, char *const *argv, char *const *envp,
                    tv__config_action *action, tv_error *err);

/* Splits c->import_roots on ':' into roots (pointers into buf, which must
 * hold TV__CFG_STR_MAX bytes); empty pieces are skipped. Returns the count. */
size_t tv__config_roots(const tv__config *c, char *buf, const char *roots[TV__CFG_MAX_ROOTS]);

/* Usage text of tensorvaultd (ends with a newline). */
const char *tv__config_usage(void);

#endif
