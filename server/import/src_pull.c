/* Fleet pulls (source.h: tv__src_pull): copies, lookups and the bad-file
 * callback; the reading is src_http.c's. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "import/source.h"

static char *dup_or_null(const char *s, bool *fail)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    *fail |= !d;
    return d;
}

int tv__src_pull_dup(const tv__src_pull *p, tv__src_pull **out, tv_error *err)
{
    *out = NULL;
    if (!p || !p->n_files || !p->files)
        return tv__seterr(err, TV_E_INVALID_ARG, "an empty pull");
    tv__src_pull *c = calloc(1, sizeof(*c));
    tv__src_pull_file *fs = calloc(p->n_files, sizeof(*fs));
    bool fail = !c || !fs;
    if (c) {
        c->first = dup_or_null(p->first, &fail);
        c->first_is_index = p->first_is_index;
        c->source = dup_or_null(p->source, &fail);
        c->on_bad_file = p->on_bad_file;
        c->bad_ctx = p->bad_ctx;
        c->files = fs;
        c->n_files = fs ? p->n_files : 0;
    }
    for (size_t i = 0; fs && i < p->n_files; i++) {
        const tv__src_pull_file *a = &p->files[i];
        fs[i].name = dup_or_null(a->name, &fail);
        fs[i].url = dup_or_null(a->url, &fail);
        fs[i].bearer = dup_or_null(a->bearer, &fail);
        fs[i].sha256 = dup_or_null(a->sha256, &fail);
        fs[i].len = a->len;
        fs[i].sidecar = a->sidecar;
        if (a->data) {
            void *d = malloc(a->data_len ? a->data_len : 1);
            if (d)
                memcpy(d, a->data, a->data_len);
            fs[i].data = d;
            fs[i].data_len = a->data_len;
            fail |= !d;
        }
    }
    if (fail) {
        if (!c)
            free(fs);
        tv__src_pull_free(c);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    *out = c;
    return 0;
}

void tv__src_pull_free(tv__src_pull *p)
{
    if (!p)
        return;
    tv__src_pull_file *fs = (tv__src_pull_file *)p->files;
    for (size_t i = 0; fs && i < p->n_files; i++) {
        free((char *)fs[i].name);
        free((char *)fs[i].url);
        free((char *)fs[i].bearer);
        free((char *)fs[i].sha256);
        free((void *)fs[i].data);
    }
    free(fs);
    free((char *)p->first);
    free((char *)p->source);
    free(p);
}

size_t tv__src_pull_find(const tv__src_pull *p, const char *name)
{
    for (size_t i = 0; p && name && i < p->n_files; i++)
        if (p->files[i].name && !strcmp(p->files[i].name, name))
            return i;
    return SIZE_MAX;
}

void tv__src_pull_bad(const tv__src_pull *p, size_t idx, int rc)
{
    if (rc == TV_E_CANCELLED) /* the import was cancelled: says nothing of the source */
        return;
    if (p && p->on_bad_file && idx < p->n_files)
        p->on_bad_file(p->bad_ctx, idx, rc);
}
