/* libFuzzer target: the manifest snapshot reader on arbitrary bytes, with
 * the checksum check off so the structural checks face every input (the
 * input's total_len field is set to its size, so mutations that change the
 * length still get past the first check); a second open verifies the
 * checksum as well (never accepting what the first refused). Opens,
 * follows every record, and looks every decoded tensor name up in the
 * index.
 * Invariant: every call returns 0 or TV_E_SNAPSHOT (a lookup also
 * TV_E_NOT_FOUND); whatever decodes lies inside the image and keeps the
 * promises of snapshot.h; no crash, hang, leak or sanitizer report. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "snap/snapshot.h"

static void check(int rc, int also)
{
    if (rc != 0 && rc != TV_E_SNAPSHOT && rc != also)
        abort();
}

static void inside(const tv__snap *s, const void *p, uint64_t len)
{
    const uint8_t *b = p;
    if (b < s->base || (uint64_t)(b - s->base) > s->len || len > s->len - (uint64_t)(b - s->base))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    if (size >= TV__SNAP_HEADER_LEN)
        for (int i = 0; i < 8; i++)
            buf[16 + i] = (uint8_t)((uint64_t)size >> (8 * i));
    tv__snap s;
    int rc = tv__snap_open(buf, size, 0, &s, NULL);
    check(rc, 0);
    /* The checksum pass (XXH3-128) on the same bytes: only ever stricter. */
    tv__snap sv;
    int rcv = tv__snap_open(buf, size, TV__SNAP_VERIFY_CHECKSUM, &sv, NULL);
    check(rcv, 0);
    if (rcv == 0 && rc != 0)
        abort();
    if (rc == 0) {
        const char *name;
        size_t name_len;
        if (tv__snap_model(&s, &name, &name_len, NULL) != 0)
            abort();
        inside(&s, name, name_len + 1);
        for (uint32_t i = 0; i < s.n_devices; i++) {
            tv__snap_device_info d;
            rc = tv__snap_device(&s, i, &d, NULL);
            check(rc, 0);
            if (rc == 0)
                inside(&s, d.path, d.path_len + 1);
        }
        for (uint32_t i = 0; i < s.n_replicas; i++) {
            tv__snap_replica_info r;
            rc = tv__snap_replica(&s, i, &r, NULL);
            check(rc, 0);
            if (rc == 0 && (r.device >= s.n_devices || r.alloc_len == 0))
                abort();
        }
        for (uint32_t i = 0; i < s.n_shards; i++) {
            tv__snap_shard_info sh;
            rc = tv__snap_shard(&s, i, &sh, NULL);
            check(rc, 0);
            if (rc != 0)
                continue;
            inside(&s, sh.name, sh.name_len + 1);
            if (sh.data_off > sh.file_len || sh.n_replicas == 0 ||
                (uint64_t)sh.first_replica + sh.n_replicas > s.n_replicas)
                abort();
        }
        for (uint32_t i = 0; i < s.n_tensors; i++) {
            tv__snap_tensor_info t;
            tv__snap_shard_info sh;
            rc = tv__snap_tensor(&s, i, &t, NULL);
            check(rc, 0);
            if (rc != 0)
                continue;
            inside(&s, t.name, t.name_len + 1);
            inside(&s, t.shape_le, (uint64_t)t.rank * 8);
            uint64_t n = 1;
            for (uint32_t d = 0; d < t.rank; d++)
                n *= tv__snap_dim(&t, d);
            if (t.rank > TV_ST_MAX_RANK || t.end_off < t.begin_off || n != t.n_elements ||
                t.shard >= s.n_shards || t.nbytes != t.end_off - t.begin_off)
                abort();
            if (tv__snap_shard(&s, t.shard, &sh, NULL) == 0 &&
                t.end_off > sh.file_len - sh.data_off)
                abort();
            uint32_t j;
            rc = tv__snap_find(&s, t.name, t.name_len, &j, NULL);
            check(rc, TV_E_NOT_FOUND);
            if (rc == 0) {
                tv__snap_tensor_info u;
                if (j >= s.n_tensors)
                    abort();
                /* A found tensor has the name asked for (compared in full). */
                if (tv__snap_tensor(&s, j, &u, NULL) == 0 &&
                    (u.name_len != t.name_len || memcmp(u.name, t.name, t.name_len) != 0))
                    abort();
            }
        }
        check(tv__snap_find(&s, "absent", 6, NULL, NULL), TV_E_NOT_FOUND);
    }
    free(buf);
    return 0;
}
