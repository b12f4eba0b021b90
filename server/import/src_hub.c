/* Imports from the Hugging Face Hub: hf://REPO[@REVISION] (source.h) made
 * into a pull of import.c, over the Hub's documented HTTP API.
 *
 * Resolving (tv__src_hub_resolve, in the job's worker, never on an HTTP
 * thread): GET ENDPOINT/api/models/REPO/revision/REV?blobs=true gives the
 * commit (sha) and every file with its size, git blob id and, for an LFS
 * file, its SHA-256. Every file is then named by its resolve URL at that
 * commit, ENDPOINT/REPO/resolve/COMMIT/PATH, never at the branch, so a push
 * during the import cannot mix two revisions. The weights
 * (model.safetensors, or model.safetensors.index.json and its shards) are
 * streamed by the pull (src_http.c): the resolve URL's HEAD is redirected
 * to the Hub's file CDN, each hop checked (httpc.h: tv__http_redirects),
 * its X-Linked-Size and X-Linked-Etag compared with the listing, and the
 * shard's bytes hashed against the listing's SHA-256 before anything is
 * published (import.c). The index and the sidecars (non-weight files of
 * at most 4 MiB, subdirectories too: config, tokenizer, ...) are fetched
 * whole here and checked against their git blob SHA-1 (the Hub's ETag of a
 * file kept in git) or their LFS SHA-256.
 *
 * Invariants: the bearer token (HF_TOKEN) goes only to the endpoint's
 * origin, never to a redirect's target elsewhere; a 4xx is never tried
 * again (a gated repository, a missing revision fail at once, naming the
 * repository and the revision); connection errors, 5xx, 408 and 429 are
 * tried again as import.http_retries says; every transfer hears the job's
 * cancel within a second. */
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "import/source.h"
#include "util/hex.h"
#include "util/sha256.h"

/* ---- names ---- */

bool tv__src_is_hub(const char *src)
{
    return src && strncasecmp(src, "hf://", 5) == 0;
}

/* One part of a repo id: 1-96 bytes of [A-Za-z0-9._-], not starting or
 * ending with '-' or '.', no "--" or "..". */
static bool repo_part_ok(const char *p, size_t n)
{
    if (n == 0 || n > 96 || strchr("-.", p[0]) || strchr("-.", p[n - 1]))
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (!isalnum(c) && c != '.' && c != '_' && c != '-')
            return false;
        if (i && (c == '-' || c == '.') && p[i - 1] == c)
            return false;
    }
    return true;
}

static bool is_hex40(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++)
        if (!isxdigit((unsigned char)s[n]) || isupper((unsigned char)s[n]))
            return false;
    return n == 40;
}

int tv__hub_parse(const char *src, tv__hub_ref *out, tv_error *err)
{
    memset(out, 0, sizeof(*out));
    if (!tv__src_is_hub(src))
        return tv__seterr(err, TV_E_BAD_REQUEST, "'%.200s' is not an hf://REPO[@REVISION] source",
                          src ? src : "(null)");
    const char *r = src + 5, *at = strchr(r, '@');
    size_t rl = at ? (size_t)(at - r) : strlen(r);
    const char *slash = memchr(r, '/', rl);
    bool ok = rl > 0 && rl < sizeof(out->repo);
    if (ok && slash)
        ok = repo_part_ok(r, (size_t)(slash - r)) &&
             repo_part_ok(slash + 1, rl - (size_t)(slash - r) - 1);
    else if (ok)
        ok = repo_part_ok(r, rl);
    if (!ok)
        return tv__seterr(
            err, TV_E_BAD_REQUEST,
            "hf:// source '%.200s': the repository must be ORG/NAME (or NAME), each 1-96 bytes of [A-Za-z0-9._-], not starting or ending with '-' or '.', without '--' or '..'",
            src);
    memcpy(out->repo, r, rl);
    const char *rev = at ? at + 1 : "main";
    size_t vl = strlen(rev);
    ok = vl > 0 && vl < sizeof(out->rev) && rev[0] != '/' && rev[vl - 1] != '/' &&
         !strstr(rev, "..") && !strstr(rev, "//");
    for (size_t i = 0; ok && i < vl; i++) {
        unsigned char c = (unsigned char)rev[i];
        ok = isalnum(c) || strchr("._/+-", c);
    }
    if (!ok)
        return tv__seterr(
            err, TV_E_BAD_REQUEST,
            "hf:// source '%.200s': the revision after '@' must be a branch, a tag (1-255 bytes of [A-Za-z0-9._/+-], no '..', '//', or '/' at either end) or a 40-hex commit",
            src);
    memcpy(out->rev, rev, vl + 1);
    out->is_commit = is_hex40(rev);
    return 0;
}

/* ---- hashes ---- */

void tv__hub_git_blob_sha1(const void *p, size_t len, char hex[41])
{
    char pre[40];
    unsigned char dig[20];
    unsigned int dl = 0;
    int n = snprintf(pre, sizeof(pre), "blob %zu", len);
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    hex[0] = '\0';
    if (!c)
        return;
    if (EVP_DigestInit_ex(c, EVP_sha1(), NULL) == 1 &&
        EVP_DigestUpdate(c, pre, (size_t)n + 1) == 1 && /* the NUL after the length */
        (len == 0 || EVP_DigestUpdate(c, p, len) == 1) && EVP_DigestFinal_ex(c, dig, &dl) == 1 &&
        dl == 20)
        tv__hex_encode(dig, 20, false, hex);
    EVP_MD_CTX_free(c);
}

/* ---- the listing ---- */

void tv__hub_listing_free(tv__hub_listing *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n_files; i++)
        free(l->files[i].path);
    free(l->files);
    free(l);
}

static bool hex_of_len(const char *s, size_t n)
{
    size_t i = 0;
    for (; s[i]; i++)
        if (!isxdigit((unsigned char)s[i]))
            return false;
    return i == n;
}

static void lower(char *s)
{
    for (; *s; s++)
        *s = (char)tolower((unsigned char)*s);
}

int tv__hub_listing_parse(const char *json, size_t len, tv__hub_listing **out, tv_error *err)
{
    json_error_t je;
    int rc = 0;
    *out = NULL;
    json_t *doc = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(doc)) {
        json_decref(doc);
        return tv__seterr(err, TV_E_BAD_REQUEST,
                          "the Hub's revision listing is not a JSON object (%.120s)", je.text);
    }
    const char *sha = json_string_value(json_object_get(doc, "sha"));
    json_t *sib = json_object_get(doc, "siblings");
    tv__hub_listing *l = calloc(1, sizeof(*l));
    if (!l) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto out;
    }
    if (!sha || !hex_of_len(sha, 40)) {
        rc = tv__seterr(err, TV_E_BAD_REQUEST,
                        "the Hub's revision listing has no 40-hex 'sha' (the commit)");
        goto out;
    }
    memcpy(l->commit, sha, 41);
    lower(l->commit);
    if (!json_is_array(sib)) {
        rc = tv__seterr(err, TV_E_BAD_REQUEST, "the Hub's revision listing has no 'siblings' list");
        goto out;
    }
    size_t n = json_array_size(sib);
    if (n && !(l->files = calloc(n, sizeof(*l->files)))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(sib, i), *lfs = json_object_get(e, "lfs");
        const char *path = json_string_value(json_object_get(e, "rfilename"));
        json_t *size = json_object_get(e, "size");
        const char *blob = json_string_value(json_object_get(e, "blobId"));
        tv__hub_file *f = &l->files[l->n_files];
        if (!json_is_object(e) || !path || !*path || strlen(path) > 1024) {
            rc = tv__seterr(err, TV_E_BAD_REQUEST,
                            "the Hub's revision listing: sibling %zu has no 'rfilename'", i);
            goto out;
        }
        if (size && (!json_is_integer(size) || json_integer_value(size) < 0)) {
            rc = tv__seterr(err, TV_E_BAD_REQUEST,
                            "the Hub's revision listing: '%.200s' has a bad 'size'", path);
            goto out;
        }
        if (blob && hex_of_len(blob, 40)) {
            memcpy(f->blob, blob, 41);
            lower(f->blob);
        }
        f->size = size ? (uint64_t)json_integer_value(size) : UINT64_MAX;
        if (lfs && !json_is_null(lfs)) {
            const char *s256 = json_string_value(json_object_get(lfs, "sha256"));
            json_t *ls = json_object_get(lfs, "size");
            if (!json_is_object(lfs) || !s256 || !hex_of_len(s256, 64) || !json_is_integer(ls) ||
                json_integer_value(ls) < 0) {
                rc = tv__seterr(
                    err, TV_E_BAD_REQUEST,
                    "the Hub's revision listing: '%.200s' has an 'lfs' entry without a 64-hex sha256 and a size",
                    path);
                goto out;
            }
            memcpy(f->sha256, s256, 65);
            lower(f->sha256);
            f->size = (uint64_t)json_integer_value(ls);
        }
        if (!(f->path = strdup(path))) {
            rc = tv__seterr(err, -ENOMEM, "out of memory");
            goto out;
        }
        l->n_files++;
    }
out:
    json_decref(doc);
    if (rc)
        tv__hub_listing_free(l);
    else
        *out = l;
    return rc;
}

/* ---- requests ---- */

typedef struct hub {
    tv__hub_ref ref;
    char endpoint[TV__URL_MAX];                        /* no trailing '/' */
    char what[TV__HUB_REPO_MAX + TV__HUB_REV_MAX + 8]; /* "hf://REPO@REV" for messages */
    const char *token;                                 /* HF_TOKEN, or NULL */
    char *auth;                                        /* "Authorization: Bearer ..." or NULL */
    tv__http_redirects redirects;
    const tv__src_http_opts *ho;
    unsigned retries, timeout_s;
    tv__http_cancel cancel;
} hub;

typedef struct fetch {
    uint8_t *buf;
    size_t got, cap, max;
    bool overflow;
    char etag[128], xerr[64], xmsg[256];
    tv__http_refusal refusal;
} fetch;

static size_t on_body(char *p, size_t sz, size_t n, void *arg)
{
    fetch *f = arg;
    size_t len = sz * n;
    if (len > f->max - f->got) {
        f->overflow = true;
        return 0;
    }
    if (f->got + len > f->cap) {
        size_t cap = f->cap ? f->cap : 4096;
        while (cap < f->got + len)
            cap *= 2;
        uint8_t *b = realloc(f->buf, cap);
        if (!b)
            return 0;
        f->buf = b;
        f->cap = cap;
    }
    memcpy(f->buf + f->got, p, len);
    f->got += len;
    return len;
}

static size_t on_header(char *p, size_t sz, size_t n, void *arg)
{
    fetch *f = arg;
    size_t len = sz * n;
    if (len >= 5 && strncmp(p, "HTTP/", 5) == 0)
        f->etag[0] = f->xerr[0] = f->xmsg[0] = '\0';
    tv__http_header_value(p, len, "ETag", f->etag, sizeof(f->etag));
    tv__http_header_value(p, len, "X-Error-Code", f->xerr, sizeof(f->xerr));
    tv__http_header_value(p, len, "X-Error-Message", f->xmsg, sizeof(f->xmsg));
    return len;
}

static bool is_redirect(long st)
{
    return st == 301 || st == 302 || st == 303 || st == 307 || st == 308;
}

/* One GET of url0 with its redirects followed hop by hop: *status is the
 * last answer's. Returns 0 (any status), or an error with *retry saying
 * whether another try may do better. */
static int get_once(hub *hb, const char *url0, fetch *fr, long *status, bool *retry, tv_error *err)
{
    char url[TV__URL_MAX + 1], o0[300], o1[300];
    char errbuf[CURL_ERROR_SIZE];
    bool hop = false;
    int rc = 0;
    snprintf(url, sizeof(url), "%s", url0);
    for (unsigned hops = 0;; hops++) {
        CURL *c = curl_easy_init();
        struct curl_slist *hdrs = NULL;
        if (!c)
            return tv__seterr(err, -ENOMEM, "libcurl: no handle");
        fr->got = 0;
        fr->overflow = false;
        tv__http_setup(c, url, (long)hb->timeout_s, "tensorvault-import",
                       hb->ho ? hb->ho->proxy : NULL, on_header, on_body, fr, errbuf, &hb->cancel);
        fr->refusal.refused = false;
        if (hb->auth && !hop && !(hdrs = curl_slist_append(NULL, hb->auth))) {
            curl_easy_cleanup(c);
            return tv__seterr(err, -ENOMEM, "out of memory");
        }
        if (hdrs)
            curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
        if (hop && !hb->redirects.allow_private)
            tv__http_refuse_private(c, &fr->refusal);
        CURLcode cc = curl_easy_perform(c);
        char *loc = NULL;
        *status = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
        curl_easy_getinfo(c, CURLINFO_REDIRECT_URL, &loc);
        char next[TV__URL_MAX + 1] = "";
        if (loc && strlen(loc) < sizeof(next))
            memcpy(next, loc, strlen(loc) + 1);
        curl_slist_free_all(hdrs);
        if (fr->refusal.refused) {
            rc = tv__seterr(
                err, TV_E_FORBIDDEN,
                "GET %s: the redirect leads to %s, a loopback, private or link-local address (import.hf_redirect_private allows it)",
                url, fr->refusal.ip);
        } else if (tv__http_was_cancelled(cc, &hb->cancel)) {
            rc = tv__seterr(err, TV_E_CANCELLED, "GET %s: cancelled", url);
        } else if (cc != CURLE_OK && fr->overflow) {
            rc = tv__seterr(err, -EFBIG, "GET %s: the answer is over %zu bytes", url, fr->max);
        } else if (cc != CURLE_OK) {
            *retry = true;
            rc = tv__seterr(err, -EIO, "GET %s: %s", url,
                            errbuf[0] ? errbuf : curl_easy_strerror(cc));
        }
        curl_easy_cleanup(c);
        if (rc || !is_redirect(*status))
            return rc;
        if (!next[0])
            return tv__seterr(err, -EPROTO, "GET %s: the Hub answered %ld without a Location", url,
                              *status);
        if (hops >= hb->redirects.max)
            return tv__seterr(err, TV_E_FORBIDDEN,
                              "GET %s: more than %u redirects (the last to '%.300s')", url0,
                              hb->redirects.max, next);
        if ((rc = tv__http_redirect_check(&hb->redirects, url0, next, err)))
            return rc;
        if (tv__http_origin(url0, o0, sizeof(o0)) || tv__http_origin(next, o1, sizeof(o1)) ||
            strcmp(o0, o1) != 0)
            hop = true; /* the bearer stays with the endpoint */
        memcpy(url, next, strlen(next) + 1);
    }
}

/* A GET tried again after connection errors, 5xx, 408 and 429. */
static int get(hub *hb, const char *url, fetch *fr, long *status, tv_error *err)
{
    for (unsigned i = 0;; i++) {
        bool retry = false;
        int rc = get_once(hb, url, fr, status, &retry, err);
        if (!rc && (*status >= 500 || *status == 408 || *status == 429)) {
            retry = true;
            rc = tv__seterr(err, -EIO, "GET %s: the Hub answered %ld", url, *status);
        }
        if (!rc || !retry || i >= hb->retries)
            return rc;
        tv__log(TV_LOG_WARN, "import: %s; trying again (%u of %u)", err ? err->msg : url, i + 1,
                hb->retries);
        if (tv__http_backoff(i, &hb->cancel))
            return tv__seterr(err, TV_E_CANCELLED, "GET %s: cancelled", url);
    }
}

/* A 4xx of the Hub as an error naming the repository and revision. */
static int hub_status(const hub *hb, const char *url, const char *file, long st, const fetch *fr,
                      tv_error *err)
{
    const char *code = fr->xerr[0] ? fr->xerr : "no X-Error-Code";
    const char *msg = fr->xmsg[0] ? fr->xmsg : "";
    if (st == 401 || st == 403)
        return tv__seterr(
            err, TV_E_FORBIDDEN,
            "%s%s%s: the Hub answered %ld (%s%s%.200s): a gated or private repository needs a token of an account that was granted access, given to the daemon (HF_TOKEN in its environment, or import.hf_token_file)",
            hb->what, file ? ": " : "", file ? file : "", st, code, msg[0] ? ": " : "", msg);
    if (st == 404)
        return tv__seterr(err, TV_E_NOT_FOUND,
                          "%s%s%s: the Hub answered 404 (%s%s%.200s): no such %s", hb->what,
                          file ? ": " : "", file ? file : "", code, msg[0] ? ": " : "", msg,
                          !strcmp(code, "RevisionNotFound") ? "revision"
                          : !strcmp(code, "EntryNotFound")  ? "file"
                          : file                            ? "file"
                                                            : "repository or revision");
    return tv__seterr(err, -EIO, "%s: GET %s: the Hub answered %ld", hb->what, url, st);
}

/* ---- resolving ---- */

/* ENDPOINT/REPO/resolve/COMMIT/PATH, PATH's bytes outside [A-Za-z0-9._~/-]
 * percent-escaped. */
static int resolve_url(const hub *hb, const char *commit, const char *path, char *out,
                       size_t out_len)
{
    int n = snprintf(out, out_len, "%s/%s/resolve/%s/", hb->endpoint, hb->ref.repo, commit);
    if (n < 0 || (size_t)n >= out_len)
        return -1;
    size_t o = (size_t)n;
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        if (o + 4 >= out_len)
            return -1;
        if (isalnum(*p) || strchr("._~/-", *p))
            out[o++] = (char)*p;
        else
            o += (size_t)snprintf(out + o, out_len - o, "%%%02X", *p);
    }
    out[o] = '\0';
    return 0;
}

static bool ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

/* A top-level, non-hidden file whose name the importer may use. */
static bool plain_top(const char *path)
{
    if (path[0] == '.' || strchr(path, '/') || strchr(path, '\\'))
        return false;
    for (const unsigned char *p = (const unsigned char *)path; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return false;
    return true;
}

/* A sidecar by the importer's rules (sidecar.c): not a weight, an index or
 * a dot file, a valid path within the depth a directory walk searches. */
static bool sidecar_kind(const char *path)
{
    size_t depth = 0;
    for (const char *p = path; *p; p++)
        depth += *p == '/';
    return !tv__sidecar_excluded(path) && tv__sidecar_path_valid(path, NULL) == 0 &&
           depth <= TV__SIDECAR_MAX_DEPTH;
}

/* Fetches file f whole (at most max bytes) and checks its bytes: the LFS
 * SHA-256, else the git blob SHA-1 of the listing and of the ETag. *data
 * (malloc'd) and sha_hex (its SHA-256). */
static int fetch_small(hub *hb, const char *commit, const tv__hub_file *f, uint8_t **data,
                       size_t *len, char sha_hex[65], tv_error *err)
{
    char url[TV__URL_MAX + 1], sha1[41], etag[80];
    fetch fr = {.max = TV__HUB_SMALL_MAX};
    long st = 0;
    int rc;
    *data = NULL;
    if (resolve_url(hb, commit, f->path, url, sizeof(url)))
        return tv__seterr(err, TV_E_BAD_REQUEST, "%s: '%.200s': the file's URL is too long",
                          hb->what, f->path);
    if ((rc = get(hb, url, &fr, &st, err)))
        goto fail;
    if (st != 200) {
        rc = hub_status(hb, url, f->path, st, &fr, err);
        goto fail;
    }
    if (f->size != UINT64_MAX && fr.got != f->size) {
        rc = tv__seterr(err, TV_E_HASH_MISMATCH,
                        "%s: '%s' is %zu bytes; the Hub's listing says %llu", hb->what, f->path,
                        fr.got, (unsigned long long)f->size);
        goto fail;
    }
    if (tv__sha256_hex(fr.buf ? (void *)fr.buf : (void *)"", fr.got, sha_hex)) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto fail;
    }
    tv__hub_git_blob_sha1(fr.buf ? (void *)fr.buf : (void *)"", fr.got, sha1);
    const char *e = fr.etag;
    if (!strncmp(e, "W/", 2))
        e += 2;
    snprintf(etag, sizeof(etag), "%.*s", (int)strcspn(e + (*e == '"'), "\""), e + (*e == '"'));
    lower(etag);
    if (f->sha256[0] ? strcmp(sha_hex, f->sha256) != 0
                     : (f->blob[0] && strcmp(sha1, f->blob) != 0) ||
                           (hex_of_len(etag, 40) && strcmp(sha1, etag) != 0)) {
        rc = tv__seterr(
            err, TV_E_HASH_MISMATCH,
            "%s: '%s': its bytes hash to sha256 %s, git blob %s; the Hub says %s (listing) / ETag %s",
            hb->what, f->path, sha_hex, sha1, f->sha256[0] ? f->sha256 : f->blob,
            fr.etag[0] ? fr.etag : "(none)");
        goto fail;
    }
    *data = fr.buf ? fr.buf : malloc(1);
    *len = fr.got;
    return *data ? 0 : tv__seterr(err, -ENOMEM, "out of memory");
fail:
    free(fr.buf);
    return rc;
}

/* The pull being built (files owned here until handed over). */
typedef struct build {
    tv__src_pull_file *files;
    size_t n;
    uint64_t sidecar_bytes;        /* fetched so far */
    uint64_t side_max, side_total; /* import.sidecar_max_bytes, import.sidecar_total_bytes */
} build;

static void build_free(build *b)
{
    for (size_t i = 0; i < b->n; i++) {
        free((char *)b->files[i].name);
        free((char *)b->files[i].url);
        free((char *)b->files[i].bearer);
        free((char *)b->files[i].sha256);
        free((void *)b->files[i].data);
    }
    free(b->files);
}

/* Adds file f of the listing: fetched whole now and checked (the index,
 * a sidecar within the caps), or named by its resolve URL for the pull (an
 * LFS weight, streamed; a sidecar over import.sidecar_max_bytes, which the
 * importer lists as skipped without fetching it; one past
 * import.sidecar_total_bytes, which fails the import there, naming the key). */
static int add_file(hub *hb, const tv__hub_listing *l, const tv__hub_file *f, bool sidecar,
                    build *b, tv_error *err)
{
    bool stream = sidecar ? f->size > b->side_max || b->sidecar_bytes + f->size > b->side_total
                          : f->sha256[0] && !ends_with(f->path, ".json");
    tv__src_pull_file *pf = &b->files[b->n];
    char url[TV__URL_MAX + 1], sha[65];
    memset(pf, 0, sizeof(*pf));
    pf->sidecar = sidecar;
    if (!(pf->name = strdup(f->path)))
        return tv__seterr(err, -ENOMEM, "out of memory");
    b->n++; /* freed with the others from here on */
    if (stream) {
        if (resolve_url(hb, l->commit, f->path, url, sizeof(url)))
            return tv__seterr(err, TV_E_BAD_REQUEST, "%s: '%.200s': the file's URL is too long",
                              hb->what, f->path);
        pf->url = strdup(url);
        pf->sha256 = f->sha256[0] ? strdup(f->sha256) : NULL;
        pf->bearer = hb->token ? strdup(hb->token) : NULL;
        pf->len = f->size;
        if (!pf->url || (f->sha256[0] && !pf->sha256) || (hb->token && !pf->bearer))
            return tv__seterr(err, -ENOMEM, "out of memory");
        return 0;
    }
    if (f->size != UINT64_MAX && f->size > TV__HUB_SMALL_MAX)
        return tv__seterr(err, TV_E_TOO_LARGE,
                          "%s: '%s' (%llu bytes) is kept in git, not LFS, and over %u bytes",
                          hb->what, f->path, (unsigned long long)f->size, TV__HUB_SMALL_MAX);
    uint8_t *data = NULL;
    size_t len = 0;
    int rc = fetch_small(hb, l->commit, f, &data, &len, sha, err);
    if (rc)
        return rc;
    pf->data = data;
    pf->data_len = len;
    pf->len = len;
    if (!(pf->sha256 = strdup(sha)))
        return tv__seterr(err, -ENOMEM, "out of memory");
    if (sidecar)
        b->sidecar_bytes += len;
    return 0;
}

static const tv__hub_file *find(const tv__hub_listing *l, const char *path)
{
    for (size_t i = 0; i < l->n_files; i++)
        if (!strcmp(l->files[i].path, path))
            return &l->files[i];
    return NULL;
}

/* The pull of listing l: the weights, the index, the sidecars. */
static int make_pull(hub *hb, const tv__hub_listing *l, tv__src_pull **out, tv_error *err)
{
    int rc = 0;
    build b = {0};
    tv__src_pull *p = NULL;
    const tv__hub_file *idx = find(l, "model.safetensors.index.json");
    const tv__hub_file *one = find(l, "model.safetensors");
    if (!idx && !one)
        return tv__seterr(
            err, TV_E_CKPT_NOT_FOUND,
            "%s (commit %s) has no safetensors weights: neither model.safetensors nor model.safetensors.index.json among its %zu files",
            hb->what, l->commit, l->n_files);
    if (!(b.files = calloc(l->n_files, sizeof(*b.files))))
        return tv__seterr(err, -ENOMEM, "out of memory");
    const tv__src_hub_opts *o = hb->ho ? hb->ho->hub : NULL;
    b.side_max = o && o->sidecar_max_len ? o->sidecar_max_len : TV__SIDECAR_DEFAULT_MAX;
    b.side_total = o && o->sidecar_total_len ? o->sidecar_total_len : TV__SIDECAR_DEFAULT_TOTAL;
    size_t n_side = 0;
    for (size_t i = 0; i < l->n_files && !rc; i++) {
        const tv__hub_file *f = &l->files[i];
        bool weight = plain_top(f->path) && ends_with(f->path, ".safetensors");
        if (f == idx || (weight && (idx || f == one)))
            rc = add_file(hb, l, f, false, &b, err);
        else if (sidecar_kind(f->path) && f->size != UINT64_MAX && n_side < TV__SIDECAR_MAX_FILES) {
            rc = add_file(hb, l, f, true, &b, err);
            n_side++;
        }
    }
    if (rc)
        goto fail;
    char src[sizeof(hb->ref.repo) + 48], what[sizeof(hb->what) + 64];
    snprintf(src, sizeof(src), "hf://%s@%s", hb->ref.repo, l->commit);
    if (hb->ref.is_commit)
        snprintf(what, sizeof(what), "%s", src);
    else
        snprintf(what, sizeof(what), "%s (commit %s)", hb->what, l->commit);
    tv__src_pull tmpl = {.first = idx ? idx->path : one->path,
                         .first_is_index = idx != NULL,
                         .files = b.files,
                         .n_files = b.n,
                         .source = src,
                         .redirects = hb->redirects,
                         .hub = true,
                         .what = what};
    if ((rc = tv__src_pull_dup(&tmpl, &p, err)))
        goto fail;
    *out = p;
fail:
    build_free(&b);
    return rc;
}

/* hb from src and the options. */
static int hub_init(hub *hb, const char *src, const tv__src_http_opts *ho, tv_error *err)
{
    int rc;
    memset(hb, 0, sizeof(*hb));
    if ((rc = tv__hub_parse(src, &hb->ref, err)))
        return rc;
    const tv__src_hub_opts *o = ho ? ho->hub : NULL;
    const char *ep = o ? o->endpoint : getenv("HF_ENDPOINT");
    const char *tok = o ? o->token : getenv("HF_TOKEN");
    if (o && (!ep || !*ep))
        return tv__seterr(err, TV_E_OUTSIDE_ROOTS,
                          "%s: hf:// imports are off in this daemon (import.hf_endpoint is empty)",
                          src);
    if (!ep || !*ep)
        ep = TV__HUB_DEFAULT_ENDPOINT;
    size_t el = strlen(ep);
    while (el && ep[el - 1] == '/')
        el--;
    if (el >= sizeof(hb->endpoint) - 1 ||
        (strncasecmp(ep, "https://", 8) && strncasecmp(ep, "http://", 7)))
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "the Hub's endpoint '%.200s' (import.hf_endpoint, HF_ENDPOINT) is not an http(s):// URL",
            ep);
    memcpy(hb->endpoint, ep, el);
    snprintf(hb->what, sizeof(hb->what), "hf://%s@%s", hb->ref.repo, hb->ref.rev);
    if (tok && *tok) {
        hb->token = tok;
        if (asprintf(&hb->auth, "Authorization: Bearer %s", tok) < 0) {
            hb->auth = NULL;
            return tv__seterr(err, -ENOMEM, "out of memory");
        }
    }
    if (o)
        hb->redirects = o->redirects;
    if (!hb->redirects.max)
        hb->redirects.max = TV__HTTP_DEFAULT_REDIRECTS;
    hb->ho = ho;
    hb->retries = ho ? ho->retries : TV__SRC_HTTP_DEFAULT_RETRIES;
    hb->timeout_s = ho && ho->timeout_s ? ho->timeout_s : TV__SRC_HTTP_DEFAULT_TIMEOUT;
    if (ho)
        hb->cancel = ho->cancel;
    return 0;
}

int tv__src_hub_resolve(const char *src, const tv__src_http_opts *ho, tv__src_pull **out,
                        tv_error *err)
{
    hub hb;
    fetch fr = {.max = TV__HUB_LISTING_MAX};
    tv__hub_listing *l = NULL;
    char url[TV__URL_MAX + 1], rev[3 * TV__HUB_REV_MAX];
    long st = 0;
    int rc;
    *out = NULL;
    if ((rc = hub_init(&hb, src, ho, err)))
        goto out;
    size_t o = 0; /* the revision as one path segment: '/' escaped */
    for (const char *p = hb.ref.rev; *p; p++)
        o += (size_t)snprintf(rev + o, sizeof(rev) - o, *p == '/' || *p == '+' ? "%%%02X" : "%c",
                              (unsigned char)*p);
    int n = snprintf(url, sizeof(url), "%s/api/models/%s/revision/%s?blobs=true", hb.endpoint,
                     hb.ref.repo, rev);
    if (n < 0 || (size_t)n >= sizeof(url)) {
        rc = tv__seterr(err, TV_E_BAD_REQUEST, "%s: the listing's URL is too long", hb.what);
        goto out;
    }
    if ((rc = get(&hb, url, &fr, &st, err)))
        goto out;
    if (st != 200) {
        rc = hub_status(&hb, url, NULL, st, &fr, err);
        goto out;
    }
    if ((rc = tv__hub_listing_parse((const char *)fr.buf, fr.got, &l, err))) {
        char msg[sizeof(err->msg)];
        snprintf(msg, sizeof(msg), "%s", err ? err->msg : "");
        tv__seterr(err, rc == TV_E_BAD_REQUEST ? -EPROTO : rc, "%s: %s", hb.what, msg);
        rc = rc == TV_E_BAD_REQUEST ? -EPROTO : rc;
        goto out;
    }
    if (hb.ref.is_commit && strcmp(l->commit, hb.ref.rev) != 0) {
        rc = tv__seterr(err, -EPROTO, "%s: the Hub's listing names commit %s", hb.what, l->commit);
        goto out;
    }
    tv__log(TV_LOG_INFO, "import: %s is commit %s (%zu files)", hb.what, l->commit, l->n_files);
    rc = make_pull(&hb, l, out, err);
out:
    tv__hub_listing_free(l);
    free(fr.buf);
    free(hb.auth);
    return rc;
}
