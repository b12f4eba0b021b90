/* libFuzzer target: the active-pointer parser (tv__snapfile_parse_active)
 * on arbitrary bytes. Invariants: any input returns 0 or TV_E_SNAPSHOT,
 * never aborts and never reads past size; an accepted pointer has gen > 0
 * and from >= -1, and re-encoding it the way the writer does ("<gen>\n" or
 * "<gen>\nfrom <from>\n") gives back exactly the input (plus the newline
 * when the input had none): the grammar has one spelling per value. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snap/snapfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int64_t gen = 0, from = 0;
    tv_error err;
    char again[TV__SNAPFILE_POINTER_MAX + 2];
    /* a heap copy of exactly size bytes, so ASan sees any overread */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    int rc = tv__snapfile_parse_active(buf, size, &gen, &from, &err);
    if (rc != 0 && rc != TV_E_SNAPSHOT)
        abort();
    if (rc == 0) {
        if (gen <= 0 || from < -1)
            abort();
        int n = from >= 0
                    ? snprintf(again, sizeof again, "%" PRId64 "\nfrom %" PRId64 "\n", gen, from)
                    : snprintf(again, sizeof again, "%" PRId64 "\n", gen);
        if (n < 0 || (size_t)n > sizeof again - 1)
            abort();
        bool same = (size_t)n == size && memcmp(again, buf, size) == 0;
        bool no_nl = from < 0 && (size_t)n == size + 1 && memcmp(again, buf, size) == 0;
        if (!same && !no_nl)
            abort();
    }
    free(buf);
    return 0;
}
