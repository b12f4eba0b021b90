/* libFuzzer target: the NVMe Identify Controller / Identify Namespace decoder
 * on arbitrary bytes. The input is split into two 4096-byte pages (controller
 * then namespace, zero-padded when short); 4 more bytes, when present, give
 * the NSID. Invariants: any input returns 0, TV_E_INVALID_ARG or
 * TV_E_OVERFLOW, never aborts; on success the LBA size is a power of two in
 * [512, 65536], the capacity is non-zero and fits in bytes, and every string
 * is NUL-terminated printable ASCII without padding at either end. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dev/dev.h"
#include "util/endian.h"

static void check_ascii(const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);
    if (n == cap)
        abort();
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] > 0x7e)
            abort();
    if (n && (s[0] == ' ' || s[n - 1] == ' '))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t ctrl[TV__NVME_IDENTIFY_LEN], ns[TV__NVME_IDENTIFY_LEN];
    const size_t page = TV__NVME_IDENTIFY_LEN;
    uint32_t nsid = 1;
    tv__dev_identity id;
    tv_error err;
    uint64_t bytes;

    memset(ctrl, 0, page);
    memset(ns, 0, page);
    memcpy(ctrl, data, size < page ? size : page);
    if (size > page)
        memcpy(ns, data + page, size - page < page ? size - page : page);
    if (size >= 2 * page + 4)
        nsid = tv__le32_get(data + 2 * page);

    int rc = tv__nvme_parse_identify(ctrl, ns, nsid, &id, &err);
    if (rc == TV_E_INVALID_ARG || rc == TV_E_OVERFLOW)
        return 0;
    if (rc != 0)
        abort();
    if (id.lba_size < 512 || id.lba_size > 65536 || (id.lba_size & (id.lba_size - 1)) ||
        id.capacity_lba == 0 || __builtin_mul_overflow(id.capacity_lba, id.lba_size, &bytes) ||
        id.nsid != nsid)
        abort();
    check_ascii(id.serial, sizeof id.serial);
    check_ascii(id.model, sizeof id.model);
    check_ascii(id.firmware, sizeof id.firmware);
    return 0;
}
