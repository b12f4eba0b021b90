/* libFuzzer target: the Hugging Face Hub importer's parsers
 * (server/import/src_hub.c) on arbitrary bytes: a revision listing comes
 * from a remote server, an hf:// source from a REST body or the CLI.
 * Input: the whole input is parsed as a revision listing; its first line
 * (cut at a NUL) as an hf:// source, with and without the scheme.
 * Invariants: every function returns 0 or its documented code; an
 * accepted listing has a 40-hex lowercase commit and, for every file, a
 * non-empty path, a 40-hex or empty blob id and a 64-hex or empty SHA-256;
 * an accepted source has a repository of one or two parts and a revision
 * without "..", and parses again to the same. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "import/source.h"

static void hexlen(const char *s, size_t want_a, size_t want_b)
{
    size_t n = strlen(s);
    if (n != want_a && n != want_b)
        abort();
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            abort();
}

static void check_source(const char *s)
{
    tv__hub_ref r, again;
    tv_error err = {0};
    int rc = tv__hub_parse(s, &r, &err);
    if (rc != 0 && rc != TV_E_BAD_REQUEST)
        abort();
    if (rc)
        return;
    const char *slash = strchr(r.repo, '/');
    if (!r.repo[0] || (slash && strchr(slash + 1, '/')) || strstr(r.rev, "..") || !r.rev[0])
        abort();
    char back[TV__HUB_REPO_MAX + TV__HUB_REV_MAX + 8];
    snprintf(back, sizeof(back), "hf://%s@%s", r.repo, r.rev);
    if (tv__hub_parse(back, &again, &err) || strcmp(again.repo, r.repo) ||
        strcmp(again.rev, r.rev) || again.is_commit != r.is_commit)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tv__hub_listing *l = NULL;
    tv_error err = {0};
    int rc = tv__hub_listing_parse((const char *)data, size, &l, &err);
    if (rc != 0 && rc != TV_E_BAD_REQUEST && rc != -ENOMEM)
        abort();
    if (!rc) {
        hexlen(l->commit, 40, 40);
        for (size_t i = 0; i < l->n_files; i++) {
            if (!l->files[i].path || !l->files[i].path[0])
                abort();
            hexlen(l->files[i].blob, 0, 40);
            hexlen(l->files[i].sha256, 0, 64);
        }
    }
    tv__hub_listing_free(l);
    char line[600], with[610];
    size_t n = 0;
    while (n < size && n < sizeof(line) - 1 && data[n] != '\n' && data[n] != '\0')
        n++;
    memcpy(line, data, n);
    line[n] = '\0';
    check_source(line);
    snprintf(with, sizeof(with), "hf://%s", line);
    check_source(with);
    /* the sidecar name rule every pull and Hub name passes: what it lets
     * through stays inside the checkpoint's directory */
    if (tv__sidecar_path_valid(line, &err) == 0 &&
        (line[0] == '/' || strstr(line, "//") || strchr(line, '\\') || !strcmp(line, "..") ||
         !strncmp(line, "../", 3) || strstr(line, "/../") ||
         (n >= 3 && !strcmp(line + n - 3, "/.."))))
        abort();
    char hex[41];
    tv__hub_git_blob_sha1(data, size, hex);
    hexlen(hex, 40, 40);
    return 0;
}
