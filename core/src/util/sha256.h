/* Streaming SHA-256 over OpenSSL's EVP interface (uses SHA-NI / AVX2 code
 * paths where the CPU has them). Invariant: a context is usable again after
 * tv__sha256_final only through tv__sha256_init. */
#ifndef TV_UTIL_SHA256_H
#define TV_UTIL_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct tv__sha256 {
    void *md; /* EVP_MD_CTX */
} tv__sha256;

/* Returns 0 or -ENOMEM. */
int tv__sha256_init(tv__sha256 *h);
void tv__sha256_update(tv__sha256 *h, const void *p, size_t len);
/* Writes the digest and frees the context. */
void tv__sha256_final(tv__sha256 *h, uint8_t out[32]);
/* Frees without producing a digest. NULL-safe, safe twice. */
void tv__sha256_free(tv__sha256 *h);
/* The SHA-256 of [p, p + len) as 64 lowercase hex digits and a NUL.
 * Returns 0 or -ENOMEM (hex then ""). */
int tv__sha256_hex(const void *p, size_t len, char hex[65]);
#endif
