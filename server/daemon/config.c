/* tensorvaultd configuration layers (see config.h). One table names every
 * key, its type, its bounds and where it lives in tv__config, so the INI
 * file, the environment and --set all parse a key the same way. */
#include "daemon/config.h"
#include "httpc/url.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fastpath/access.h"
#include "util/internal.h"

_Static_assert(TV__CFG_RULES_MAX == TV__FP_ACCESS_MAX_TEXT, "rule list sizes agree");

typedef enum {
    K_STR,
    K_UINT,
    K_SIZE,
    K_BOOL,
    K_ANON,
    K_LEVEL,
    K_LISTEN,
    K_MODE,
    K_SIZE4K
} key_type;

typedef struct key_def {
    const char *key;
    key_type type;
    size_t off;
    size_t len; /* K_STR: buffer bytes */
    uint64_t min, max;
} key_def;

#define F(field)  offsetof(tv__config, field)
#define SZ(field) sizeof(((tv__config *)0)->field)
static const key_def keys[] = {
    {"http.listen", K_LISTEN, F(http_listen), SZ(http_listen), 0, 0},
    {"http.threads", K_UINT, F(http_threads), 0, 0, 1024},
    {"http.connection_timeout_s", K_UINT, F(http_connection_timeout_s), 0, 1, 86400},
    {"http.per_ip_connections", K_UINT, F(http_per_ip_connections), 0, 1, 65536},
    {"http.memory_limit", K_SIZE, F(http_memory_limit), 0, 16u << 10, 1u << 30},
    {"http.max_body_bytes", K_SIZE, F(http_max_body_bytes), 0, 1, 1u << 30},
    {"http.max_header_bytes", K_SIZE, F(http_max_header_bytes), 0, 256, 1u << 20},
    {"http.anonymous_reads", K_ANON, F(http_anonymous_reads), 0, 0, 0},
    {"http.header_timeout_s", K_UINT, F(http_header_timeout_s), 0, 1, 3600},
    {"http.per_uid_connections", K_UINT, F(http_per_uid_connections), 0, 1, 65536},
    {"http.max_connections", K_UINT, F(http_max_connections), 0, 16, 1u << 20},
    {"http.allowed_hosts", K_STR, F(http_allowed_hosts), SZ(http_allowed_hosts), 0, 0},
    {"http.socket", K_STR, F(http_socket), SZ(http_socket), 0, 0},
    {"http.socket_mode", K_MODE, F(http_socket_mode), 0, 1, 0777},
    {"store.dir", K_STR, F(store_dir), SZ(store_dir), 1, 0},
    {"store.image", K_STR, F(store_image), SZ(store_image), 0, 0},
    {"store.image_size", K_SIZE, F(store_image_size), 0, 16u << 20, UINT64_C(1) << 50},
    {"store.device", K_STR, F(store_device), SZ(store_device), 0, 0},
    {"store.admin_token", K_STR, F(store_admin_token), SZ(store_admin_token), 1, 0},
    {"store.admin_token_mode", K_MODE, F(store_admin_token_mode), 0, 1, 0777},
    {"import.roots", K_STR, F(import_roots), SZ(import_roots), 0, 0},
    {"import.workers", K_UINT, F(import_workers), 0, 1, 64},
    {"import.queue", K_UINT, F(import_queue), 0, 1, 4096},
    {"import.strict", K_BOOL, F(import_strict), 0, 0, 0},
    {"import.origins", K_STR, F(import_origins), SZ(import_origins), 0, 0},
    {"import.http_retries", K_UINT, F(import_http_retries), 0, 0, 100},
    {"import.http_timeout", K_UINT, F(import_http_timeout), 0, 1, 86400},
    {"import.http_range", K_SIZE, F(import_http_range), 0, 64u << 10, 1u << 30},
    {"import.sidecar_max_bytes", K_SIZE, F(import_sidecar_max_bytes), 0, 1, 256u << 20},
    {"import.sidecar_total_bytes", K_SIZE, F(import_sidecar_total_bytes), 0, 1, 1u << 30},
    {"import.hf_endpoint", K_STR, F(import_hf_endpoint), SZ(import_hf_endpoint), 0, 0},
    {"import.hf_token_file", K_STR, F(import_hf_token_file), SZ(import_hf_token_file), 0, 0},
    {"import.hf_redirect_http", K_BOOL, F(import_hf_redirect_http), 0, 0, 0},
    {"import.hf_redirect_private", K_BOOL, F(import_hf_redirect_private), 0, 0, 0},
    {"s3.endpoint", K_STR, F(s3_endpoint), SZ(s3_endpoint), 0, 0},
    {"s3.region", K_STR, F(s3_region), SZ(s3_region), 0, 0},
    {"s3.access_key_id", K_STR, F(s3_access_key_id), SZ(s3_access_key_id), 0, 0},
    {"s3.secret_access_key", K_STR, F(s3_secret_access_key), SZ(s3_secret_access_key), 0, 0},
    {"s3.session_token", K_STR, F(s3_session_token), SZ(s3_session_token), 0, 0},
    {"log.level", K_LEVEL, F(log_level), 0, 0, 0},
    {"log.file", K_STR, F(log_file), SZ(log_file), 1, 0},
    {"demo.source", K_STR, F(demo_source), SZ(demo_source), 0, 0},
    {"fastpath.enabled", K_BOOL, F(fastpath_enabled), 0, 0, 0},
    {"fastpath.socket", K_STR, F(fastpath_socket), SZ(fastpath_socket), 1, 0},
    {"fastpath.mode", K_MODE, F(fastpath_mode), 0, 1, 0777},
    {"fastpath.slot_len", K_SIZE4K, F(fastpath_slot_len), 0, 4096, 256u << 20},
    {"fastpath.group_slots", K_UINT, F(fastpath_group_slots), 0, 2, 65536},
    {"fastpath.credit", K_UINT, F(fastpath_credit), 0, 1, 4096},
    {"fastpath.max_sessions", K_UINT, F(fastpath_max_sessions), 0, 1, 65536},
    {"fastpath.max_sessions_per_uid", K_UINT, F(fastpath_max_sessions_per_uid), 0, 0, 65536},
    {"fastpath.max_groups", K_UINT, F(fastpath_max_groups), 0, 1, 1024},
    {"fastpath.max_groups_per_uid", K_UINT, F(fastpath_max_groups_per_uid), 0, 0, 1024},
    {"fastpath.max_groups_per_model", K_UINT, F(fastpath_max_groups_per_model), 0, 0, 1024},
    {"fastpath.hold_timeout_ms", K_UINT, F(fastpath_hold_timeout_ms), 0, 100, 86400000},
    {"fastpath.max_requests", K_UINT, F(fastpath_max_requests), 0, 1, 1u << 20},
    {"fastpath.readahead", K_UINT, F(fastpath_readahead), 0, 0, 65536},
    {"fastpath.share_wait_ms", K_UINT, F(fastpath_share_wait_ms), 0, 10, 86400000},
    {"cache.bytes", K_SIZE, F(cache_bytes), 0, 0, UINT64_C(1) << 50},
    {"cache.view_bytes_per_uid", K_SIZE, F(cache_view_bytes_per_uid), 0, 0, UINT64_C(1) << 50},
    {"cache.dir", K_STR, F(cache_dir), SZ(cache_dir), 0, 0},
    {"fleet.postgres", K_STR, F(fleet_postgres), SZ(fleet_postgres), 0, 0},
    {"fleet.node", K_STR, F(fleet_node), SZ(fleet_node), 1, 0},
    {"fleet.url", K_STR, F(fleet_url), SZ(fleet_url), 0, 0},
    {"fleet.token", K_STR, F(fleet_token), SZ(fleet_token), 0, 0},
    {"fleet.object_store", K_STR, F(fleet_object_store), SZ(fleet_object_store), 0, 0},
    {"fleet.proxy", K_STR, F(fleet_proxy), SZ(fleet_proxy), 0, 0},
    {"fleet.quorum", K_UINT, F(fleet_quorum), 0, 0, 4096},
    {"fleet.rollout_timeout", K_UINT, F(fleet_rollout_timeout), 0, 1, 86400},
    {"fleet.pull_attempts", K_UINT, F(fleet_pull_attempts), 0, 1, 100},
    {"fleet.node_down_s", K_UINT, F(fleet_node_down_s), 0, 3, 86400},
};
#undef F
#undef SZ

static const char *const sections[] = {"http",     "store",  "import", "log",  "demo",
                                       "fastpath", "access", "fleet",  "cache"};

void tv__config_defaults(tv__config *c)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->http_listen, sizeof(c->http_listen), "127.0.0.1:8470");
    c->http_threads = 0;
    c->http_connection_timeout_s = 30;
    c->http_per_ip_connections = 256;
    c->http_memory_limit = 64u << 10;
    c->http_max_body_bytes = 64u << 10;
    c->http_max_header_bytes = 8u << 10;
    c->http_anonymous_reads = TV__CFG_ANON_LOOPBACK;
    c->http_header_timeout_s = 10;
    c->http_per_uid_connections = 256;
    c->http_max_connections = 4096;
    c->http_socket_mode = 0660;
    snprintf(c->store_dir, sizeof(c->store_dir), "./var");
    snprintf(c->store_image, sizeof(c->store_image), "./var/store.img");
    c->store_image_size = UINT64_C(16) << 30;
    snprintf(c->store_admin_token, sizeof(c->store_admin_token), "./var/admin.token");
    c->store_admin_token_mode = 0600;
    if (!getcwd(c->import_roots, sizeof(c->import_roots)))
        snprintf(c->import_roots, sizeof(c->import_roots), ".");
    c->import_workers = 2;
    c->import_queue = 16;
    c->import_strict = false;
    c->import_origins[0] = '\0'; /* no remote imports */
    c->import_http_retries = 4;
    c->import_http_timeout = 60;
    c->import_http_range = 8u << 20;
    c->import_sidecar_max_bytes = 4u << 20;
    c->import_sidecar_total_bytes = 32u << 20;
    snprintf(c->import_hf_endpoint, sizeof(c->import_hf_endpoint), "https://huggingface.co");
    c->log_level = TV_LOG_INFO;
    snprintf(c->log_file, sizeof(c->log_file), "stderr");
    c->fastpath_enabled = true;
    snprintf(c->fastpath_socket, sizeof(c->fastpath_socket), "./var/run/tensorvault.sock");
    c->fastpath_mode = 0660;
    c->fastpath_slot_len = 1u << 20;
    c->fastpath_group_slots = 128;
    c->fastpath_credit = 32;
    c->fastpath_max_sessions = 256;
    c->fastpath_max_sessions_per_uid = 0; /* max_sessions / 4 */
    c->fastpath_max_groups = 16;
    c->fastpath_max_groups_per_uid = 0;   /* max_groups / 2 */
    c->fastpath_max_groups_per_model = 0; /* max_groups / 4 */
    c->fastpath_hold_timeout_ms = 10000;
    c->fastpath_max_requests = 16384;
    c->fastpath_readahead = 16;
    c->fastpath_share_wait_ms = 2000;
    /* the memory tier: an eighth of the physical memory */
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    c->cache_bytes = pages > 0 && page > 0 ? (uint64_t)pages / 8u * (uint64_t)page : 1ull << 30;
    c->cache_view_bytes_per_uid = 0; /* cache.bytes */
    c->fleet_quorum = 0;             /* every node the placement names */
    c->fleet_rollout_timeout = 600;
    c->fleet_pull_attempts = 3;
    c->fleet_node_down_s = 30;
    if (gethostname(c->fleet_node, sizeof(c->fleet_node) - 1) != 0 || !c->fleet_node[0])
        snprintf(c->fleet_node, sizeof(c->fleet_node), "localhost");
    snprintf(c->access_default, sizeof(c->access_default), "uid:%u gid:%u token:*",
             (unsigned)getuid(), (unsigned)getgid());
}

/* access.default or access.MODEL: the list checked now (syntax, names). */
static int set_access(tv__config *c, const char *model, const char *value, const char *where,
                      tv_error *err)
{
    tv_error e = {0};
    size_t n = strlen(value), ml = strlen(model);
    if (n >= TV__CFG_RULES_MAX)
        return tv__seterr(err, TV_E_INVALID_ARG, "%s: access.%s: value is %zu bytes, at most %d",
                          where, model, n, TV__CFG_RULES_MAX - 1);
    if (tv__fp_access_validate(value, &e))
        return tv__seterr(err, TV_E_INVALID_ARG, "%s: access.%s: %s", where, model, e.msg);
    if (!strcmp(model, "default")) {
        memcpy(c->access_default, value, n + 1);
        return 0;
    }
    if (ml == 0 || ml >= sizeof(c->access[0].model))
        return tv__seterr(err, TV_E_INVALID_ARG, "%s: access.%.64s: a model name is 1..%zu bytes",
                          where, model, sizeof(c->access[0].model) - 1);
    size_t i = 0;
    while (i < c->n_access && strcmp(c->access[i].model, model))
        i++;
    if (i == TV__CFG_MAX_ACCESS)
        return tv__seterr(err, TV_E_INVALID_ARG, "%s: access.%s: more than %d models in [access]",
                          where, model, TV__CFG_MAX_ACCESS);
    memcpy(c->access[i].model, model, ml + 1);
    memcpy(c->access[i].rules, value, n + 1);
    if (i == c->n_access)
        c->n_access++;
    return 0;
}

/* "123", "64K", "1M", "16G", "2T" (powers of 1024; an optional trailing B or
 * iB). Returns false for anything else or an overflow. */
static bool parse_size(const char *s, uint64_t *out)
{
    if (!*s || !isdigit((unsigned char)*s))
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return false;
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case 'K':
        shift = 10;
        end++;
        break;
    case 'M':
        shift = 20;
        end++;
        break;
    case 'G':
        shift = 30;
        end++;
        break;
    case 'T':
        shift = 40;
        end++;
        break;
    default:
        break;
    }
    if (shift && (*end == 'i' || *end == 'I'))
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end)
        return false;
    uint64_t r;
    if (tv__mul_u64(v, UINT64_C(1) << shift, &r))
        return false;
    *out = r;
    return true;
}

static bool parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < TV_ARRAY_LEN(yes); i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return true;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return true;
        }
    }
    return false;
}

/* HOST:PORT with a non-empty host (IPv6 in brackets) and a port 0..65535. */
static bool listen_valid(const char *s)
{
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s || !colon[1] || strlen(colon + 1) > 5)
        return false;
    if (s[0] == '[' && colon[-1] != ']')
        return false;
    unsigned long port = 0;
    for (const char *p = colon + 1; *p; p++) {
        if (!isdigit((unsigned char)*p))
            return false;
        port = port * 10 + (unsigned long)(*p - '0');
    }
    return port <= 65535;
}

int tv__config_set(tv__config *c, const char *key, const char *value, const char *where,
                   tv_error *err)
{
    const key_def *k = NULL;
    if (!strncmp(key, "access.", 7))
        return set_access(c, key + 7, value, where, err);
    for (size_t i = 0; i < TV_ARRAY_LEN(keys); i++)
        if (strcmp(keys[i].key, key) == 0)
            k = &keys[i];
    if (!k)
        return tv__seterr(err, TV_E_INVALID_ARG, "%s: unknown configuration key '%s'", where, key);
    char *base = (char *)c + k->off;
    uint64_t v = 0;
    switch (k->type) {
    case K_STR:
    case K_LISTEN: {
        size_t n = strlen(value);
        if (n >= k->len)
            return tv__seterr(err, TV_E_INVALID_ARG, "%s: %s: value is %zu bytes, at most %zu",
                              where, key, n, k->len - 1);
        if (k->min && n == 0)
            return tv__seterr(err, TV_E_INVALID_ARG, "%s: %s: value must not be empty", where, key);
        if (k->type == K_LISTEN && !listen_valid(value))
            return tv__seterr(err, TV_E_INVALID_ARG,
                              "%s: %s: '%s' is not HOST:PORT (port 0..65535; IPv6 as [ADDR]:PORT)",
                              where, key, value);
        memcpy(base, value, n + 1);
        if (k->off == offsetof(tv__config, store_image))
            c->store_image_set = true;
        if (k->off == offsetof(tv__config, store_admin_token))
            c->store_admin_token_set = true;
        if (k->off == offsetof(tv__config, fastpath_socket))
            c->fastpath_socket_set = true;
        if (k->off == offsetof(tv__config, http_socket))
            c->http_socket_set = true;
        return 0;
    }
    case K_MODE: {
        unsigned long m = 0;
        bool ok = *value != '\0' && strlen(value) <= 4;
        for (const char *p = value; ok && *p; p++) {
            ok = *p >= '0' && *p <= '7';
            m = m * 8 + (unsigned long)(*p - '0');
        }
        if (!ok || m < k->min || m > k->max)
            return tv__seterr(err, TV_E_INVALID_ARG,
                              "%s: %s: '%s' is not an octal file mode (0001..0777, e.g. 0660)",
                              where, key, value);
        *(unsigned *)(void *)base = (unsigned)m;
        return 0;
    }
    case K_UINT:
    case K_SIZE:
    case K_SIZE4K: {
        bool ok;
        if (k->type == K_SIZE4K && parse_size(value, &v) && v % 4096)
            return tv__seterr(err, TV_E_INVALID_ARG, "%s: %s: '%s' is not a multiple of 4096",
                              where, key, value);
        if (k->type != K_UINT) {
            ok = parse_size(value, &v);
        } else {
            char *end;
            errno = 0;
            unsigned long long u = strtoull(value, &end, 10);
            ok = isdigit((unsigned char)value[0]) && !*end && !errno;
            v = u;
        }
        if (!ok || v < k->min || v > k->max)
            return tv__seterr(err, TV_E_INVALID_ARG,
                              "%s: %s: '%s' is not %s in %" PRIu64 "..%" PRIu64, where, key, value,
                              k->type != K_UINT ? "a size (bytes, or with K/M/G/T)" : "an integer",
                              k->min, k->max);
        if (k->type != K_UINT)
            *(uint64_t *)(void *)base = v;
        else
            *(unsigned *)(void *)base = (unsigned)v;
        return 0;
    }
    case K_BOOL: {
        bool b;
        if (!parse_bool(value, &b))
            return tv__seterr(err, TV_E_INVALID_ARG,
                              "%s: %s: '%s' is not a boolean (true/false, yes/no, on/off, 1/0)",
                              where, key, value);
        *(bool *)(void *)base = b;
        return 0;
    }
    case K_ANON: {
        static const char *const names[] = {"loopback", "always", "never"};
        for (int i = 0; i < 3; i++) {
            if (strcmp(value, names[i]) == 0) {
                *(int *)(void *)base = i;
                return 0;
            }
        }
        return tv__seterr(err, TV_E_INVALID_ARG, "%s: %s: '%s' is not loopback, always or never",
                          where, key, value);
    }
    case K_LEVEL: {
        static const char *const names[] = {"debug", "info", "warn", "error"};
        for (int i = 0; i < 4; i++) {
            if (strcmp(value, names[i]) == 0) {
                *(int *)(void *)base = TV_LOG_DEBUG + i;
                return 0;
            }
        }
        return tv__seterr(err, TV_E_INVALID_ARG, "%s: %s: '%s' is not debug, info, warn or error",
                          where, key, value);
    }
    }
    return tv__seterr(err, TV_E_INTERNAL, "%s: %s: unhandled key type", where, key);
}

/* Debian's libinih calls the handler without a line number but returns the
 * line of the first handler failure, so the handler keeps the failing key and
 * value and tv__config_load_file redoes that one set with "FILE:LINE". */
typedef struct ini_ctx {
    tv__config *c;
    int rc;
    bool no_section;
    char key[320];
    char value[TV__CFG_STR_MAX];
} ini_ctx;

static int ini_on_key(void *user, const char *section, const char *name, const char *value)
{
    ini_ctx *x = user;
    snprintf(x->value, sizeof(x->value), "%s", value);
    if (!*section) {
        x->no_section = true;
        snprintf(x->key, sizeof(x->key), "%s", name);
        x->rc = TV_E_INVALID_ARG;
        return 0;
    }
    int n = snprintf(x->key, sizeof(x->key), "%s.%s", section, name);
    if (n < 0 || (size_t)n >= sizeof(x->key) || strlen(value) >= sizeof(x->value)) {
        x->rc = TV_E_INVALID_ARG;
        return 0;
    }
    x->rc = tv__config_set(x->c, x->key, value, "", NULL);
    return x->rc == 0;
}

/* The fleet keys that have a shape: checked once every layer is applied. */
static int fleet_validate(const tv__config *c, tv_error *err)
{
    size_t n = strlen(c->fleet_token);
    for (size_t i = 0; i < n; i++)
        if (c->fleet_token[i] <= ' ' || c->fleet_token[i] > '~')
            return tv__seterr(err, TV_E_INVALID_ARG,
                              "fleet.token: printable characters without spaces only");
    if (n && n < 16)
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "fleet.token: at least 16 characters (tensorvault token create prints 43)");
    size_t l = strlen(c->fleet_object_store);
    if (l && (strncmp(c->fleet_object_store, "s3://", 5) || l < 7 ||
              c->fleet_object_store[l - 1] != '/' || c->fleet_object_store[5] == '/'))
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "fleet.object_store '%s' is not s3://BUCKET/ or s3://BUCKET/PREFIX/ (ending in '/')",
            c->fleet_object_store);
    if (c->fleet_url[0] && strncmp(c->fleet_url, "http://", 7) &&
        strncmp(c->fleet_url, "https://", 8))
        return tv__seterr(err, TV_E_INVALID_ARG, "fleet.url '%s' is not an http:// or https:// URL",
                          c->fleet_url);
    return 0;
}

int tv__config_load_file(tv__config *c, const char *path, tv_error *err)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        int e = errno;
        return tv__seterr(err, -e, "cannot read configuration file %s: %s", path, strerror(e));
    }
    ini_ctx *x = calloc(1, sizeof(*x));
    if (!x) {
        fclose(f);
        return tv__seterr(err, -ENOMEM, "%s: out of memory while parsing", path);
    }
    x->c = c;
    int rc = 0;
    int r = ini_parse_file(f, ini_on_key, x);
    fclose(f);
    if (x->rc && x->no_section) {
        rc = tv__seterr(err, TV_E_INVALID_ARG, "%s:%d: key '%s' outside a [section]", path, r,
                        x->key);
    } else if (x->rc) {
        char where[TV__CFG_STR_MAX + 32];
        snprintf(where, sizeof(where), "%s:%d", path, r);
        tv__config scratch;
        tv__config_defaults(&scratch);
        rc = tv__config_set(&scratch, x->key, x->value, where, err);
        if (rc == 0)
            rc = tv__seterr(err, TV_E_INVALID_ARG, "%s: %s: value too long", where, x->key);
    } else if (r > 0) {
        rc = tv__seterr(err, TV_E_INVALID_ARG,
                        "%s:%d: syntax error (expected [section] or key = value)", path, r);
    } else if (r < 0) {
        rc = tv__seterr(err, -ENOMEM, "%s: out of memory while parsing", path);
    }
    free(x);
    return rc;
}

int tv__config_load_env(tv__config *c, char *const *envp, tv_error *err)
{
    static const char prefix[] = "TENSORVAULT_";
    for (size_t i = 0; envp && envp[i]; i++) {
        const char *e = envp[i];
        if (strncmp(e, prefix, sizeof(prefix) - 1) != 0)
            continue;
        const char *eq = strchr(e, '=');
        if (!eq)
            continue;
        const char *name = e + sizeof(prefix) - 1;
        size_t name_len = (size_t)(eq - name);
        char key[320];
        if (name_len >= sizeof(key))
            continue;
        const char *section = NULL;
        for (size_t s = 0; s < TV_ARRAY_LEN(sections); s++) {
            size_t sl = strlen(sections[s]);
            if (name_len > sl + 1 && strncasecmp(name, sections[s], sl) == 0 && name[sl] == '_')
                section = sections[s];
        }
        if (!section)
            continue; /* the CLI's variables, or none of ours */
        size_t sl = strlen(section);
        memcpy(key, section, sl);
        key[sl] = '.';
        /* A key is lower-cased; an [access] model name is taken as written
         * (model names are case-sensitive: lower-cased, a rule for model
         * "Llama" would be one for "llama", and Llama would fall back to the
         * default list), except the key default, in any case. */
        bool dflt = name_len - sl - 1 == 7 && strncasecmp(name + sl + 1, "default", 7) == 0;
        bool as_written = !strcmp(section, "access") && !dflt;
        for (size_t j = sl + 1; j < name_len; j++)
            key[j] = as_written ? name[j] : (char)tolower((unsigned char)name[j]);
        key[name_len] = '\0';
        char where[300];
        snprintf(where, sizeof(where), "environment %.*s", (int)name_len + 12, e);
        int rc = tv__config_set(c, key, eq + 1, where, err);
        if (rc)
            return rc;
    }
    return 0;
}

const char *tv__config_usage(void)
{
    return "usage: tensorvaultd [--config FILE] [--listen HOST:PORT] [--store DIR] [--demo PATH]\n"
           "                    [--log-level debug|info|warn|error] [--set SECTION.KEY=VALUE]...\n"
           "                    [--help] [--version]\n"
           "The tensorvault registry as a service (REST API under /v1, metrics at /metrics).\n"
           "Every key has a default; a --config FILE (INI), then TENSORVAULT_<SECTION>_<KEY>\n"
           "environment variables, then flags override it (see deploy/tensorvaultd.ini).\n"
           "  --config FILE      INI file with [http] [store] [import] [log] [demo] [fastpath]\n"
           "                     [access] [fleet] [cache] sections\n"
           "  --listen HOST:PORT http.listen (default 127.0.0.1:8470; port 0 = any free port)\n"
           "  --store DIR        store.dir (default ./var; the image defaults to DIR/store.img)\n"
           "  --demo PATH        demo.source: import PATH as model 'demo' when the store is empty\n"
           "  --log-level LEVEL  log.level\n"
           "  --set KEY=VALUE    any key, e.g. --set import.workers=4\n"
           "  --help             this text\n"
           "  --version          the version\n";
}

/* A flag's value: "--flag VALUE" or "--flag=VALUE". */
static int flag_value(int argc, char *const *argv, int *i, const char *flag, const char **out,
                      tv_error *err)
{
    const char *a = argv[*i];
    size_t fl = strlen(flag);
    if (a[fl] == '=') {
        *out = a + fl + 1;
        return 0;
    }
    if (*i + 1 >= argc)
        return tv__seterr(err, TV_E_INVALID_ARG, "%s needs a value (see tensorvaultd --help)",
                          flag);
    *out = argv[++*i];
    return 0;
}

static bool is_flag(const char *a, const char *flag)
{
    size_t fl = strlen(flag);
    return strncmp(a, flag, fl) == 0 && (a[fl] == '\0' || a[fl] == '=');
}

/* s3.* left empty take the AWS_* environment (read once, here). The key
 * pair comes whole from one place: a config key id never pairs with an
 * environment secret. */
static const char *env_get(char *const *envp, const char *name)
{
    size_t n = strlen(name);
    for (; envp && *envp; envp++)
        if (strncmp(*envp, name, n) == 0 && (*envp)[n] == '=')
            return *envp + n + 1;
    return NULL;
}

static int env_into(char *dst, size_t len, char *const *envp, const char *name, tv_error *err)
{
    const char *v = env_get(envp, name);
    if (dst[0] || !v || !*v)
        return 0;
    if (strlen(v) >= len)
        return tv__seterr(err, TV_E_INVALID_ARG, "$%s is longer than %zu bytes", name, len - 1);
    memcpy(dst, v, strlen(v) + 1);
    return 0;
}

static int s3_from_env(tv__config *c, char *const *envp, tv_error *err)
{
    int rc;
    if ((rc = env_into(c->s3_endpoint, sizeof(c->s3_endpoint), envp, "AWS_ENDPOINT_URL", err)) ||
        (rc = env_into(c->s3_region, sizeof(c->s3_region), envp, "AWS_REGION", err)) ||
        (rc = env_into(c->s3_region, sizeof(c->s3_region), envp, "AWS_DEFAULT_REGION", err)))
        return rc;
    if (!c->s3_access_key_id[0] && !c->s3_secret_access_key[0] &&
        ((rc = env_into(c->s3_access_key_id, sizeof(c->s3_access_key_id), envp, "AWS_ACCESS_KEY_ID",
                        err)) ||
         (rc = env_into(c->s3_secret_access_key, sizeof(c->s3_secret_access_key), envp,
                        "AWS_SECRET_ACCESS_KEY", err)) ||
         (rc = env_into(c->s3_session_token, sizeof(c->s3_session_token), envp, "AWS_SESSION_TOKEN",
                        err))))
        return rc;
    if (!c->s3_access_key_id[0] != !c->s3_secret_access_key[0])
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "s3.access_key_id and s3.secret_access_key go together (one is empty)");
    return 0;
}

/* The Hub's settings of the daemon's environment: HF_ENDPOINT over
 * import.hf_endpoint, HF_TOKEN over import.hf_token_file (the file's first
 * line). The daemon fetches, so the token is the daemon's: a client's
 * HF_TOKEN is never sent to it. */
static int hf_from_env(tv__config *c, char *const *envp, tv_error *err)
{
    const char *ep = env_get(envp, "HF_ENDPOINT"), *tok = env_get(envp, "HF_TOKEN");
    if (ep && *ep) {
        if (strlen(ep) >= sizeof(c->import_hf_endpoint))
            return tv__seterr(err, TV_E_INVALID_ARG, "$HF_ENDPOINT is too long");
        snprintf(c->import_hf_endpoint, sizeof(c->import_hf_endpoint), "%s", ep);
    }
    if (c->import_hf_endpoint[0] && strncmp(c->import_hf_endpoint, "https://", 8) &&
        strncmp(c->import_hf_endpoint, "http://", 7))
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "import.hf_endpoint '%s' is not an http:// or https:// URL",
                          c->import_hf_endpoint);
    c->hf_token[0] = '\0';
    if (tok && *tok) {
        if (strlen(tok) >= sizeof(c->hf_token))
            return tv__seterr(err, TV_E_INVALID_ARG, "$HF_TOKEN is longer than %zu bytes",
                              sizeof(c->hf_token) - 1);
        snprintf(c->hf_token, sizeof(c->hf_token), "%s", tok);
        return 0;
    }
    if (!c->import_hf_token_file[0])
        return 0;
    FILE *f = fopen(c->import_hf_token_file, "r");
    if (!f) {
        int e = errno;
        return tv__seterr(err, -e, "import.hf_token_file %s: %s", c->import_hf_token_file,
                          strerror(e));
    }
    bool got = fgets(c->hf_token, sizeof(c->hf_token), f) != NULL;
    fclose(f);
    if (!got)
        c->hf_token[0] = '\0';
    c->hf_token[strcspn(c->hf_token, "\r\n")] = '\0';
    if (!c->hf_token[0])
        return tv__seterr(err, TV_E_INVALID_ARG, "import.hf_token_file %s holds no token",
                          c->import_hf_token_file);
    return 0;
}

int tv__config_load(tv__config *c, int argc, char *const *argv, char *const *envp,
                    tv__config_action *action, tv_error *err)
{
    int rc = 0;
    const char *config_file = NULL;
    *action = TV__CFG_RUN;
    tv__config_defaults(c);
    /* First pass: --help, --version, --config and unknown flags. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            *action = TV__CFG_HELP;
            return 0;
        }
        if (strcmp(a, "--version") == 0) {
            *action = TV__CFG_VERSION;
            return 0;
        }
        if (is_flag(a, "--config")) {
            if ((rc = flag_value(argc, argv, &i, "--config", &v, err)))
                return rc;
            config_file = v;
        } else if (is_flag(a, "--listen") || is_flag(a, "--store") || is_flag(a, "--demo") ||
                   is_flag(a, "--log-level") || is_flag(a, "--set")) {
            const char *flag = a;
            char name[16];
            size_t n = strcspn(a, "=");
            snprintf(name, sizeof(name), "%.*s", (int)n, flag);
            if ((rc = flag_value(argc, argv, &i, name, &v, err)))
                return rc;
        } else {
            return tv__seterr(err, TV_E_INVALID_ARG,
                              "unknown argument '%s' (see tensorvaultd --help)", a);
        }
    }
    if (config_file && (rc = tv__config_load_file(c, config_file, err)))
        return rc;
    if ((rc = tv__config_load_env(c, envp, err)))
        return rc;
    /* Second pass: the flags, in order. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (is_flag(a, "--config")) {
            flag_value(argc, argv, &i, "--config", &v, err);
        } else if (is_flag(a, "--listen")) {
            flag_value(argc, argv, &i, "--listen", &v, err);
            rc = tv__config_set(c, "http.listen", v, "--listen", err);
        } else if (is_flag(a, "--store")) {
            flag_value(argc, argv, &i, "--store", &v, err);
            rc = tv__config_set(c, "store.dir", v, "--store", err);
        } else if (is_flag(a, "--demo")) {
            flag_value(argc, argv, &i, "--demo", &v, err);
            rc = tv__config_set(c, "demo.source", v, "--demo", err);
        } else if (is_flag(a, "--log-level")) {
            flag_value(argc, argv, &i, "--log-level", &v, err);
            rc = tv__config_set(c, "log.level", v, "--log-level", err);
        } else if (is_flag(a, "--set")) {
            flag_value(argc, argv, &i, "--set", &v, err);
            const char *eq = strchr(v, '=');
            char key[320];
            if (!eq || eq == v || (size_t)(eq - v) >= sizeof(key))
                return tv__seterr(err, TV_E_INVALID_ARG, "--set: '%s' is not SECTION.KEY=VALUE", v);
            memcpy(key, v, (size_t)(eq - v));
            key[eq - v] = '\0';
            rc = tv__config_set(c, key, eq + 1, "--set", err);
        }
        if (rc)
            return rc;
    }
    if ((rc = tv__url_origins_validate(c->import_origins, err)) || (rc = fleet_validate(c, err)))
        return rc;
    if ((rc = s3_from_env(c, envp, err)) || (rc = hf_from_env(c, envp, err)))
        return rc;
    /* The image follows the store directory unless it was given. */
    if (!c->store_image_set) {
        int n = snprintf(c->store_image, sizeof(c->store_image), "%s/store.img", c->store_dir);
        if (n < 0 || (size_t)n >= sizeof(c->store_image))
            return tv__seterr(err, TV_E_INVALID_ARG,
                              "store.dir '%s' is too long for the default store.image",
                              c->store_dir);
    }
    /* The admin token file too. */
    if (!c->store_admin_token_set) {
        int n = snprintf(c->store_admin_token, sizeof(c->store_admin_token), "%s/admin.token",
                         c->store_dir);
        if (n < 0 || (size_t)n >= sizeof(c->store_admin_token))
            return tv__seterr(err, TV_E_INVALID_ARG,
                              "store.dir '%s' is too long for the default store.admin_token",
                              c->store_dir);
    }
    /* An admin token is the whole store: its owner may read and write it,
     * its group read it, no one else anything. */
    if ((c->store_admin_token_mode & 0137) || !(c->store_admin_token_mode & 0400))
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "store.admin_token_mode %04o: the owner reads the admin token file, the group may read it, no one else has any access (0600, 0640, 0400 or 0440)",
            c->store_admin_token_mode);
    /* The fast path's socket too; a default that does not fit a socket
     * address is left for the daemon to report (it runs without the fast
     * path), one that was given is refused here. */
    if (!c->fastpath_socket_set) {
        int n = snprintf(c->fastpath_socket, sizeof(c->fastpath_socket), "%s/run/tensorvault.sock",
                         c->store_dir);
        if (n < 0 || (size_t)n >= sizeof(c->fastpath_socket))
            c->fastpath_socket[0] = '\0'; /* too long: the daemon says so */
    }
    if (!c->http_socket_set) {
        int n = snprintf(c->http_socket, sizeof(c->http_socket), "%s/run/http.sock", c->store_dir);
        if (n < 0 || (size_t)n >= sizeof(c->http_socket) || n > TV__CFG_SOCKET_MAX)
            c->http_socket[0] = '\0'; /* too long: the daemon says so */
    }
    if (c->http_socket_set && strlen(c->http_socket) > TV__CFG_SOCKET_MAX)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "http.socket '%s' is %zu bytes: a UNIX socket path is at most %d",
                          c->http_socket, strlen(c->http_socket), TV__CFG_SOCKET_MAX);
    if (c->fastpath_socket_set && strlen(c->fastpath_socket) > TV__CFG_SOCKET_MAX)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "fastpath.socket '%s' is %zu bytes: a UNIX socket path is at most %d",
                          c->fastpath_socket, strlen(c->fastpath_socket), TV__CFG_SOCKET_MAX);
    if (c->fastpath_group_slots < 2 * c->fastpath_credit)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "fastpath.group_slots %u is under 2 x fastpath.credit (%u)",
                          c->fastpath_group_slots, c->fastpath_credit);
    return 0;
}

size_t tv__config_roots(const tv__config *c, char *buf, const char *roots[TV__CFG_MAX_ROOTS])
{
    size_t n = 0;
    memcpy(buf, c->import_roots, sizeof(c->import_roots));
    for (char *save = NULL, *p = strtok_r(buf, ":", &save); p && n < TV__CFG_MAX_ROOTS;
         p = strtok_r(NULL, ":", &save))
        roots[n++] = p;
    return n;
}
