/* SHA-256 helpers over OpenSSL EVP; see sha256.h. */
#include <errno.h>

#include <openssl/evp.h>

#include "util/hex.h"
#include "util/sha256.h"

int tv__sha256_init(tv__sha256 *h)
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c || EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(c);
        h->md = NULL;
        return -ENOMEM;
    }
    h->md = c;
    return 0;
}

void tv__sha256_update(tv__sha256 *h, const void *p, size_t len)
{
    if (h->md && len)
        EVP_DigestUpdate(h->md, p, len);
}

void tv__sha256_final(tv__sha256 *h, uint8_t out[32])
{
    unsigned n = 32;
    if (h->md)
        EVP_DigestFinal_ex(h->md, out, &n);
    tv__sha256_free(h);
}

void tv__sha256_free(tv__sha256 *h)
{
    if (h && h->md) {
        EVP_MD_CTX_free(h->md);
        h->md = NULL;
    }
}

int tv__sha256_hex(const void *p, size_t len, char hex[65])
{
    tv__sha256 h;
    uint8_t dig[32];
    hex[0] = '\0';
    if (tv__sha256_init(&h))
        return -ENOMEM;
    tv__sha256_update(&h, p, len);
    tv__sha256_final(&h, dig);
    tv__hex_encode(dig, 32, false, hex);
    return 0;
}
