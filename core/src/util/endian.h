/* Little-endian field access for on-disk and on-wire structures (the label,
 * the snapshot, NVMe identify data, the safetensors length prefix).
 *
 * Invariants: byte-by-byte, so neither host byte order nor the alignment of
 * p matters (compilers fold these into single loads and stores); p must
 * hold 2, 4 or 8 bytes. */
#ifndef TV_UTIL_ENDIAN_H
#define TV_UTIL_ENDIAN_H

#include <stdint.h>

static inline uint16_t tv__le16_get(const uint8_t *p)
{
    return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}
static inline uint32_t tv__le32_get(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t tv__le64_get(const uint8_t *p)
{
    return (uint64_t)tv__le32_get(p) | (uint64_t)tv__le32_get(p + 4) << 32;
}
static inline void tv__le16_put(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void tv__le32_put(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}
static inline void tv__le64_put(uint8_t *p, uint64_t v)
{
    tv__le32_put(p, (uint32_t)v);
    tv__le32_put(p + 4, (uint32_t)(v >> 32));
}

#endif
