/* Decoder for raw NVMe Identify Controller / Identify Namespace data, kept
 * apart from libnvme so it is built always and tested without hardware.
 *
 * Invariants: the input is untrusted device data: every index is bounded
 * (FLBAS against NLBAF and the 64-entry LBAF table), LBADS outside [9, 16]
 * is refused, the byte capacity is overflow-checked, and the output strings
 * are always NUL-terminated printable ASCII. Offsets follow the NVMe Base
 * Specification 2.0. */
#include <string.h>

#include "dev/dev.h"
#include "util/endian.h"

enum {
    ID_CTRL_SN_OFF = 4,
    ID_CTRL_SN_LEN = 20,
    ID_CTRL_MN_OFF = 24,
    ID_CTRL_MN_LEN = 40,
    ID_CTRL_FR_OFF = 64,
    ID_CTRL_FR_LEN = 8,
    ID_NS_NSZE_OFF = 0,
    ID_NS_NLBAF_OFF = 25,
    ID_NS_FLBAS_OFF = 26,
    ID_NS_NGUID_OFF = 104,
    ID_NS_EUI64_OFF = 120,
    ID_NS_LBAF_OFF = 128,
    ID_NS_LBAF_MAX = 64,
    LBADS_MIN = 9,
    LBADS_MAX = 16,
};

/* Copies an NVMe ASCII field, trimming the space (or NUL) padding at both
 * ends and replacing anything unprintable so it is safe in messages. */
static void copy_ascii(char *dst, const uint8_t *src, size_t len)
{
    size_t b = 0, e = len, i;

    while (e > b && (src[e - 1] == ' ' || src[e - 1] == '\0'))
        e--;
    while (b < e && src[b] == ' ')
        b++;
    for (i = b; i < e; i++)
        dst[i - b] = (src[i] >= 0x20 && src[i] < 0x7f) ? (char)src[i] : '?';
    dst[e - b] = '\0';
}

int tv__nvme_parse_identify(const void *id_ctrl_4096, const void *id_ns_4096, uint32_t nsid,
                            tv__dev_identity *out, tv_error *err)
{
    const uint8_t *c = id_ctrl_4096, *ns = id_ns_4096;
    tv__dev_identity id;
    unsigned nlbaf, flbas, fmt, lbads;
    uint32_t lbaf;
    uint64_t nsze, bytes;

    if (!c || !ns || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "nvme identify: NULL argument");
    memset(&id, 0, sizeof id);
    copy_ascii(id.serial, c + ID_CTRL_SN_OFF, ID_CTRL_SN_LEN);
    copy_ascii(id.model, c + ID_CTRL_MN_OFF, ID_CTRL_MN_LEN);
    copy_ascii(id.firmware, c + ID_CTRL_FR_OFF, ID_CTRL_FR_LEN);
    id.nsid = nsid;

    nsze = tv__le64_get(ns + ID_NS_NSZE_OFF);
    nlbaf = ns[ID_NS_NLBAF_OFF]; /* 0-based count of LBA formats */
    flbas = ns[ID_NS_FLBAS_OFF];
    /* Bits 3:0 are the low nibble of the format index, bits 6:5 the high
     * bits (used only with more than 16 formats). */
    fmt = (flbas & 0x0fu) | ((flbas >> 5) & 0x03u) << 4;
    if (nlbaf >= ID_NS_LBAF_MAX || fmt > nlbaf)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "nvme namespace %u: active LBA format %u outside the %u formats listed",
                          nsid, fmt, nlbaf + 1);
    lbaf = tv__le32_get(ns + ID_NS_LBAF_OFF + 4 * fmt);
    lbads = (lbaf >> 16) & 0xffu;
    if (lbads < LBADS_MIN || lbads > LBADS_MAX)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "nvme namespace %u: LBA format %u has LBADS %u (need %d..%d)", nsid, fmt,
                          lbads, LBADS_MIN, LBADS_MAX);
    if (nsze == 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "nvme namespace %u: size (NSZE) is 0", nsid);
    id.lba_size = 1u << lbads;
    id.capacity_lba = nsze;
    if (tv__mul_u64(nsze, id.lba_size, &bytes))
        return tv__seterr(err, TV_E_OVERFLOW, "nvme namespace %u: %llu blocks of %u bytes overflow",
                          nsid, (unsigned long long)nsze, id.lba_size);
    memcpy(id.nguid, ns + ID_NS_NGUID_OFF, sizeof id.nguid);
    memcpy(id.eui64, ns + ID_NS_EUI64_OFF, sizeof id.eui64);
    *out = id;
    return 0;
}
