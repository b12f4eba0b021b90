/* SHA-256 helpers over OpenSSL EVP; see sha256.h. */
#include <errno.h>

#include <openssl/evp.h>

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
