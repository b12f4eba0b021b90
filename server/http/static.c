/* Lookups of the embedded dashboard files (see static.h). */
#include "http/static.h"

#include <string.h>

const char *const tv__static_headers[][2] = {
    {"Content-Security-Policy", TV__STATIC_CSP},
    {"X-Content-Type-Options", "nosniff"},
    {"Referrer-Policy", "no-referrer"},
    {"Cache-Control", "no-cache"},
};
const size_t tv__static_nheaders = sizeof(tv__static_headers) / sizeof(tv__static_headers[0]);

#define VENDOR_CHART "vendor/chart.min.js"

bool tv__static_name_ok(const char *name)
{
    if (!name || !*name || strstr(name, ".."))
        return false;
    for (const char *p = name; *p; p++) {
        char ch = *p;
        bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
                  (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
        if (!ok)
            return false;
    }
    return true;
}

static const tv__static_file *by_name(const char *name)
{
    for (size_t i = 0; i < tv__static_nfiles; i++)
        if (!strcmp(tv__static_files[i].name, name))
            return &tv__static_files[i];
    return NULL;
}

const tv__static_file *tv__static_find(const char *path)
{
    if (!path)
        return NULL;
    if (!strcmp(path, "/"))
        return by_name("index.html");
    if (strncmp(path, "/ui/", 4))
        return NULL;
    const char *name = path + 4;
    if (!strcmp(name, VENDOR_CHART))
        return by_name(VENDOR_CHART);
    return tv__static_name_ok(name) ? by_name(name) : NULL;
}

bool tv__static_not_modified(const tv__static_file *f, const char *inm)
{
    if (!f || !inm)
        return false;
    size_t el = strlen(f->etag);
    const char *p = inm;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (!*p)
            break;
        if (*p == '*')
            return true;
        if (!strncmp(p, "W/", 2))
            p += 2;
        const char *end = p;
        if (*end == '"') {
            end = strchr(end + 1, '"');
            end = end ? end + 1 : p + strlen(p);
        } else {
            while (*end && *end != ',' && *end != ' ' && *end != '\t')
                end++;
        }
        if ((size_t)(end - p) == el && !strncmp(p, f->etag, el))
            return true;
        p = end;
    }
    return false;
}
