/* libFuzzer target: the safetensors shard parser on arbitrary bytes (the
 * input is the whole file image: length prefix, header, data). Invariant: any
 * input returns 0 or a TV_E_* code; no crash, leak or sanitizer report; an
 * accepted header has only names the registry can hold (non-empty, no NUL)
 * and dimensions within INT64_MAX; its __metadata__ pairs are all readable. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tensorvault/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tv_checkpoint *ck = NULL;
    tv_error err;
    tv_st_limits lim = {.max_header_len = 1 << 20, .max_shards = 0};
    int rc = tv_checkpoint_parse_shard(data, size, size, "fuzz", &lim, &ck, &err);
    if (rc == 0) {
        /* Walk everything the parser promised. */
        size_t n = tv_checkpoint_n_tensors(ck);
        uint64_t total = 0;
        for (size_t i = 0; i < n; i++) {
            tv_tensor_info t;
            size_t j;
            if (tv_checkpoint_tensor(ck, i, &t) || tv_checkpoint_find(ck, t.name, t.name_len, &j) ||
                j != i || t.file_off + t.nbytes > size)
                abort();
            if (t.name_len == 0 || strlen(t.name) != t.name_len)
                abort();
            for (uint32_t d = 0; d < t.rank; d++)
                if (t.shape[d] > (uint64_t)INT64_MAX)
                    abort();
            total += t.nbytes;
        }
        if (total != tv_checkpoint_total_bytes(ck))
            abort();
        /* And the __metadata__ pairs: every one readable, none past the count. */
        tv_shard_info si;
        const char *k, *v;
        if (tv_checkpoint_shard(ck, 0, &si) || (!si.has_metadata && si.n_metadata) ||
            si.n_tensors != n)
            abort();
        for (size_t j = 0; j < si.n_metadata; j++)
            if (tv_checkpoint_shard_metadata(ck, 0, j, &k, &v) || !k || !v)
                abort();
        if (tv_checkpoint_shard_metadata(ck, 0, si.n_metadata, &k, &v) != TV_E_INVALID_ARG)
            abort();
    } else if (ck != NULL || rc >= 0) {
        abort();
    }
    tv_checkpoint_close(ck);
    return 0;
}
