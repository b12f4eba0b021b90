/* Hexadecimal text for bytes: digests, identity fields, uuids and %XX
 * escapes, in one encoder and one decoder.
 *
 * Invariants: the encoder always writes 2 * len digits and a NUL; the
 * decoder is exact (the text is exactly two digits per output byte, nothing
 * skipped, nothing left over) and writes nothing to out unless it succeeds. */
#ifndef TV_UTIL_HEX_H
#define TV_UTIL_HEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Writes the 2 * len hex digits of in[0, len) and a NUL to out (2 * len + 1
 * bytes): lower case, or upper case when upper (URI-style %XX escapes). */
void tv__hex_encode(const uint8_t *in, size_t len, bool upper, char *out);

/* The value of one hex digit (either case), or -1. */
int tv__hex_digit(char c);

/* Decodes the text s[0, s_len) (either case) into out[0, out_len).
 * Returns 0; -EINVAL when s_len != 2 * out_len, s is NULL or a character is
 * not a hex digit (out is then left untouched). */
int tv__hex_decode(const char *s, size_t s_len, uint8_t *out, size_t out_len);

#endif
