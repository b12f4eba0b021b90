/* libFuzzer target: the Hugging Face index validator on arbitrary bytes.
 * Invariant: any input returns 0 or an error code; no crash or leak. */
#include <stdint.h>
#include <stdlib.h>

#include "tensorvault/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t n_shards = 0, n_tensors = 0;
    tv_error err;
    tv_st_limits lim = {.max_header_len = 0, .max_shards = 64};
    int rc = tv_index_validate_buffer(data, size, &lim, &n_shards, &n_tensors, &err);
    if (rc == 0 && (n_shards > 64 || n_shards > n_tensors + 1))
        abort();
    if (rc > 0)
        abort();
    return 0;
}
