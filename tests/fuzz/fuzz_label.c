/* libFuzzer target: the on-device store label decoder on arbitrary bytes (the
 * input is padded with zeros or truncated to the 512-byte label).
 * Invariants: any input returns 0 or TV_E_DEVICE_MISMATCH, never aborts; a
 * label that decodes re-encodes to exactly the same 512 bytes. The checksum
 * would stop the fuzzer at the first mutation, so each input is also decoded
 * a second time with a valid checksum over its first 480 bytes: that copy
 * must decode whenever magic, version and length are right. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dev/dev.h"
#include "util/endian.h"
#include "util/sha256.h"

#define SUM_OFF 480 /* offsetof(tv__label, sha256): 32 bytes of SHA-256 over [0, 480) */

static void check(const uint8_t in[TV__LABEL_LEN], int must_decode)
{
    tv__label l;
    tv_error err;
    uint8_t again[TV__LABEL_LEN];
    int rc = tv__label_decode(in, &l, &err);
    if (rc != 0 && rc != TV_E_DEVICE_MISMATCH)
        abort();
    if (rc != 0) {
        if (must_decode)
            abort();
        return;
    }
    if (memcmp(l.magic, TV__LABEL_MAGIC, 8) || l.version != TV__LABEL_VERSION ||
        l.label_len != TV__LABEL_LEN)
        abort();
    tv__label_encode(&l, again);
    if (memcmp(again, in, TV__LABEL_LEN) != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t buf[TV__LABEL_LEN] = {0};
    tv__sha256 h;
    memcpy(buf, data, size < sizeof buf ? size : sizeof buf);
    check(buf, 0);

    if (tv__sha256_init(&h))
        return 0;
    tv__sha256_update(&h, buf, SUM_OFF);
    tv__sha256_final(&h, buf + SUM_OFF);
    check(buf, !memcmp(buf, TV__LABEL_MAGIC, 8) && tv__le32_get(buf + 8) == TV__LABEL_VERSION &&
                   tv__le32_get(buf + 12) == TV__LABEL_LEN);
    return 0;
}
