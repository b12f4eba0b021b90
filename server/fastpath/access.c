/* The per-model access rules (see access.h): parsed once from the
 * configuration into rule lists, checked per fast-path OPEN on its loop
 * thread and per HTTP request on the HTTP threads.
 *
 * Invariants: every list keeps its normalized text beside the parsed
 * rules, so a refusal quotes exactly what is enforced; names were resolved
 * to ids when parsed, so a check never calls into NSS (no blocking lookup on
 * the loop thread). */
#include "fastpath/access.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { R_UID, R_GID, R_ANY, R_TOKEN, R_ANY_TOKEN, R_ANON };

typedef struct rule {
    int kind;
    uint32_t id;
    char *token; /* R_TOKEN: the token's name */
} rule;

typedef struct rule_list {
    rule *v;
    size_t n;
    char *text; /* normalized: the words joined by single spaces; "" for none */
} rule_list;

typedef struct model_rules {
    char *model;
    rule_list r;
} model_rules;

struct tv__fp_access {
    rule_list dflt;
    model_rules *m;
    size_t n_m;
};

#define WORDS_SEP " \t,"

static void list_free(rule_list *l)
{
    for (size_t i = 0; l->v && i < l->n; i++)
        free(l->v[i].token);
    free(l->v);
    free(l->text);
    l->v = NULL;
    l->text = NULL;
    l->n = 0;
}

/* Digits only, below UINT32_MAX ((uid_t)-1 means "none" to the kernel). */
static bool parse_id(const char *s, uint32_t *out)
{
    uint64_t v = 0;
    if (!*s)
        return false;
    for (; *s; s++) {
        if (!isdigit((unsigned char)*s))
            return false;
        v = v * 10 + (uint64_t)(*s - '0');
        if (v >= UINT32_MAX)
            return false;
    }
    *out = (uint32_t)v;
    return true;
}

static int lookup_user(const char *name, uint32_t *uid, tv_error *err)
{
    struct passwd pw, *res = NULL;
    long sz = sysconf(_SC_GETPW_R_SIZE_MAX);
    size_t len = sz > 0 ? (size_t)sz : 16384;
    char *buf = malloc(len);
    int rc;
    if (!buf)
        return tv__seterr(err, -ENOMEM, "out of memory");
    rc = getpwnam_r(name, &pw, buf, len, &res);
    if (rc == 0 && res)
        *uid = (uint32_t)pw.pw_uid;
    free(buf);
    if (rc == 0 && res)
        return 0;
    if (rc && rc != ENOENT && rc != ESRCH)
        return tv__seterr(err, TV_E_INVALID_ARG, "access rule 'user:%s': looking the user up: %s",
                          name, strerror(rc));
    return tv__seterr(err, TV_E_INVALID_ARG, "access rule 'user:%s': no such user", name);
}

static int lookup_group(const char *name, uint32_t *gid, tv_error *err)
{
    struct group gr, *res = NULL;
    long sz = sysconf(_SC_GETGR_R_SIZE_MAX);
    size_t len = sz > 0 ? (size_t)sz : 16384;
    char *buf = NULL;
    int rc = 0;
    /* a group with many members may need more than the hint */
    for (int tries = 0; tries < 6; tries++, len *= 4) {
        free(buf);
        if (!(buf = malloc(len)))
            return tv__seterr(err, -ENOMEM, "out of memory");
        rc = getgrnam_r(name, &gr, buf, len, &res);
        if (rc != ERANGE)
            break;
    }
    if (rc == 0 && res)
        *gid = (uint32_t)gr.gr_gid;
    free(buf);
    if (rc == 0 && res)
        return 0;
    if (rc && rc != ENOENT && rc != ESRCH)
        return tv__seterr(err, TV_E_INVALID_ARG, "access rule 'group:%s': looking the group up: %s",
                          name, strerror(rc));
    return tv__seterr(err, TV_E_INVALID_ARG, "access rule 'group:%s': no such group", name);
}

/* One word into r. */
static int parse_word(const char *w, rule *r, tv_error *err)
{
    r->id = 0;
    r->token = NULL;
    if (!strcmp(w, "*")) {
        r->kind = R_ANY;
        return 0;
    }
    if (!strcmp(w, "anonymous")) {
        r->kind = R_ANON;
        return 0;
    }
    if (!strcmp(w, "token:*")) {
        r->kind = R_ANY_TOKEN;
        return 0;
    }
    if (!strncmp(w, "token:", 6) && w[6]) {
        r->kind = R_TOKEN;
        if (!(r->token = strdup(w + 6)))
            return tv__seterr(err, -ENOMEM, "out of memory");
        return 0;
    }
    if (!strncmp(w, "uid:", 4) || !strncmp(w, "gid:", 4)) {
        r->kind = w[0] == 'u' ? R_UID : R_GID;
        if (parse_id(w + 4, &r->id))
            return 0;
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "access rule '%.64s': %s is a decimal id below 4294967295", w,
                          r->kind == R_UID ? "a uid" : "a gid");
    }
    if (!strncmp(w, "user:", 5) && w[5]) {
        r->kind = R_UID;
        return lookup_user(w + 5, &r->id, err);
    }
    if (!strncmp(w, "group:", 6) && w[6]) {
        r->kind = R_GID;
        return lookup_group(w + 6, &r->id, err);
    }
    return tv__seterr(
        err, TV_E_INVALID_ARG,
        "access rule '%.64s': expected uid:N, gid:N, user:NAME, group:NAME, *, token:NAME, token:* or anonymous",
        w);
}

static int list_parse(const char *text, rule_list *out, tv_error *err)
{
    size_t tl = strlen(text), n = 0, at = 0;
    char *copy = NULL, *save = NULL;
    int rc = 0;
    memset(out, 0, sizeof(*out));
    if (tl >= TV__FP_ACCESS_MAX_TEXT)
        return tv__seterr(err, TV_E_INVALID_ARG, "access rules: %zu bytes, at most %d", tl,
                          TV__FP_ACCESS_MAX_TEXT - 1);
    if (!(copy = strdup(text)) || !(out->text = calloc(1, tl + 1)) ||
        !(out->v = calloc(tl / 2 + 1, sizeof(*out->v)))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto fail;
    }
    for (char *w = strtok_r(copy, WORDS_SEP, &save); w; w = strtok_r(NULL, WORDS_SEP, &save)) {
        if ((rc = parse_word(w, &out->v[n], err)))
            goto fail;
        out->n = ++n;
        size_t wl = strlen(w);
        if (at)
            out->text[at++] = ' ';
        memcpy(out->text + at, w, wl);
        at += wl;
    }
    out->text[at] = '\0';
    out->n = n;
    free(copy);
    return 0;
fail:
    free(copy);
    list_free(out);
    return rc;
}

int tv__fp_access_validate(const char *rules, tv_error *err)
{
    rule_list l;
    int rc;
    if (!rules)
        return tv__seterr(err, TV_E_INVALID_ARG, "access rules: NULL");
    if ((rc = list_parse(rules, &l, err)))
        return rc;
    list_free(&l);
    return 0;
}

void tv__fp_access_free(tv__fp_access *a)
{
    if (!a)
        return;
    list_free(&a->dflt);
    for (size_t i = 0; i < a->n_m; i++) {
        free(a->m[i].model);
        list_free(&a->m[i].r);
    }
    free(a->m);
    free(a);
}

int tv__fp_access_create(const char *dflt, const char *const *models, const char *const *rules,
                         size_t n, tv__fp_access **out, tv_error *err)
{
    char own[64];
    tv__fp_access *a = NULL;
    int rc = 0;
    if (!out || (n && (!models || !rules)))
        return tv__seterr(err, TV_E_INVALID_ARG, "access rules: NULL argument");
    *out = NULL;
    if (!dflt) {
        snprintf(own, sizeof own, "uid:%u gid:%u token:*", (unsigned)getuid(), (unsigned)getgid());
        dflt = own;
    }
    if (!(a = calloc(1, sizeof(*a))) || (n && !(a->m = calloc(n, sizeof(*a->m))))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = list_parse(dflt, &a->dflt, err))) {
        char why[sizeof(err->msg)];
        snprintf(why, sizeof why, "%s", err ? err->msg : "");
        tv__seterr(err, rc, "[access] default: %s", why);
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        model_rules *mr = NULL;
        if (!models[i] || !rules[i]) {
            rc = tv__seterr(err, TV_E_INVALID_ARG, "access rules: NULL model or list %zu", i);
            goto fail;
        }
        for (size_t j = 0; j < a->n_m; j++)
            if (!strcmp(a->m[j].model, models[i]))
                mr = &a->m[j];
        rule_list l;
        if ((rc = list_parse(rules[i], &l, err))) {
            char why[sizeof(err->msg)];
            snprintf(why, sizeof why, "%s", err ? err->msg : "");
            tv__seterr(err, rc, "[access] %.256s: %s", models[i], why);
            goto fail;
        }
        if (mr) {
            list_free(&mr->r);
            mr->r = l;
            continue;
        }
        mr = &a->m[a->n_m];
        if (!(mr->model = strdup(models[i]))) {
            list_free(&l);
            rc = tv__seterr(err, -ENOMEM, "out of memory");
            goto fail;
        }
        mr->r = l;
        a->n_m++;
    }
    *out = a;
    return 0;
fail:
    tv__fp_access_free(a);
    return rc;
}

static const rule_list *rules_of(const tv__fp_access *a, const char *model)
{
    for (size_t i = 0; i < a->n_m; i++)
        if (!strcmp(a->m[i].model, model))
            return &a->m[i].r;
    return &a->dflt;
}

const char *tv__fp_access_rules(const tv__fp_access *a, const char *model)
{
    if (!a || !model)
        return NULL;
    return rules_of(a, model)->text;
}

/* Whether rule r admits peer p. */
static bool rule_admits(const rule *r, const tv__access_peer *p)
{
    switch (r->kind) {
    case R_ANY:
        return p->local;
    case R_UID:
        return p->local && r->id == (uint32_t)p->uid;
    case R_GID:
        for (size_t g = 0; p->local && g < p->n_gids; g++)
            if (r->id == (uint32_t)p->gids[g])
                return true;
        return false;
    case R_TOKEN:
        return p->token && !strcmp(r->token, p->token);
    case R_ANY_TOKEN:
        return p->token != NULL;
    case R_ANON:
        return !p->local && !p->token;
    default:
        return false;
    }
}

static bool list_admits(const rule_list *l, const tv__access_peer *p)
{
    for (size_t i = 0; i < l->n; i++)
        if (rule_admits(&l->v[i], p))
            return true;
    return false;
}

/* The refusal: who, which model, what is allowed. */
static int deny(const rule_list *l, const char *model, const tv__access_peer *p, const char *verb,
                tv_error *err)
{
    const char *allowed = l->n ? l->text : "nobody";
    if (p->token)
        return tv__seterr(err, TV_E_PEER_DENIED,
                          "token '%.128s' may not %s model '%.256s' (allowed: %s)", p->token, verb,
                          model, allowed);
    if (!p->local)
        return tv__seterr(
            err, TV_E_PEER_DENIED,
            "an anonymous client (no token, not a local user) may not %s model '%.256s' (allowed: %s)",
            verb, model, allowed);
    char gid[32];
    if (p->n_gids)
        snprintf(gid, sizeof gid, "%u", (unsigned)p->gids[0]);
    else
        snprintf(gid, sizeof gid, "none");
    return tv__seterr(err, TV_E_PEER_DENIED,
                      "uid %u (gid %s) may not %s model '%.256s' (allowed: %s)", (unsigned)p->uid,
                      gid, verb, model, allowed);
}

int tv__access_check_peer(const tv__fp_access *a, const char *model, const tv__access_peer *p,
                          tv_error *err)
{
    if (!a || !model || !p || (p->n_gids && !p->gids))
        return tv__seterr(err, TV_E_INVALID_ARG, "access check: NULL argument");
    const rule_list *l = rules_of(a, model);
    return list_admits(l, p) ? 0 : deny(l, model, p, "read", err);
}

int tv__fp_access_check(const tv__fp_access *a, const char *model, uid_t uid, const gid_t *gids,
                        size_t n, tv_error *err)
{
    if (!a || !model || (n && !gids))
        return tv__seterr(err, TV_E_INVALID_ARG, "access check: NULL argument");
    tv__access_peer p = {.local = true, .uid = uid, .gids = gids, .n_gids = n};
    const rule_list *l = rules_of(a, model);
    return list_admits(l, &p) ? 0 : deny(l, model, &p, "open", err);
}

/* The peer may open some model when it passes the default list (every model
 * without a list of its own) or any model's list. */
int tv__fp_access_any(const tv__fp_access *a, uid_t uid, const gid_t *gids, size_t n, tv_error *err)
{
    if (!a || (n && !gids))
        return tv__seterr(err, TV_E_INVALID_ARG, "access check: NULL argument");
    tv__access_peer p = {.local = true, .uid = uid, .gids = gids, .n_gids = n};
    if (list_admits(&a->dflt, &p))
        return 0;
    for (size_t i = 0; i < a->n_m; i++)
        if (list_admits(&a->m[i].r, &p))
            return 0;
    char gid[32];
    if (n)
        snprintf(gid, sizeof gid, "%u", (unsigned)gids[0]);
    else
        snprintf(gid, sizeof gid, "none");
    return tv__seterr(
        err, TV_E_PEER_DENIED,
        "uid %u (gid %s) may open no model on this daemon (no [access] rule list allows it)",
        (unsigned)uid, gid);
}
