/* Hardware test of NVMe detection and identity (core/src/dev): opens a real
 * NVMe namespace read-only and cross-checks geometry and identity with
 * sysfs. Never writes. Exits 77 (skipped) with the reason when there is no
 * namespace (/sys/block/nvme*n*) or it cannot be opened.
 * TV_TEST_NVME=/dev/nvmeXnY picks the namespace. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "dev/dev.h"
#include "tv_test.h"

static char g_name[256]; /* nvme0n1 */
static char g_path[300]; /* /dev/nvme0n1 */

static bool find_namespace(void)
{
    const char *env = getenv("TV_TEST_NVME");
    if (env && *env) {
        const char *base = strrchr(env, '/');
        snprintf(g_path, sizeof g_path, "%s", env);
        snprintf(g_name, sizeof g_name, "%s", base ? base + 1 : env);
        return true;
    }
    DIR *dir = opendir("/sys/block");
    struct dirent *e;
    bool found = false;
    if (!dir)
        return false;
    while ((e = readdir(dir)) != NULL) {
        if (tv__dev_is_nvme_name(e->d_name) && strchr(e->d_name, 'c') == NULL &&
            (!found || strcmp(e->d_name, g_name) < 0)) {
            snprintf(g_name, sizeof g_name, "%s", e->d_name);
            found = true;
        }
    }
    closedir(dir);
    if (found)
        snprintf(g_path, sizeof g_path, "/dev/%s", g_name);
    return found;
}

/* Reads a sysfs attribute, trimmed; "" when absent. */
static void sysfs_attr(const char *rel, char *out, size_t n)
{
    char path[600];
    snprintf(path, sizeof path, "/sys/block/%s/%s", g_name, rel);
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    if (!fgets(out, (int)n, f))
        out[0] = '\0';
    fclose(f);
    size_t len = strlen(out);
    while (len && (out[len - 1] == '\n' || out[len - 1] == ' '))
        out[--len] = '\0';
    size_t b = 0;
    while (out[b] == ' ')
        b++;
    memmove(out, out + b, strlen(out + b) + 1);
}

static void test_open_geometry(void **state)
{
    (void)state;
    tv__dev *d = NULL;
    tv_error err = {0};
    char attr[128];

    if (tv__dev_open(g_path, TV__DEV_O_RDONLY, &d, &err) != 0)
        fail_msg("open %s: %s", g_path, err.msg);
    print_message("%s: kind %s, lba %u, %llu bytes, io_align %u, object_align %llu, direct %d\n",
                  g_path, tv__dev_kind_name(d->kind), d->lba_size,
                  (unsigned long long)d->size_bytes, d->io_align,
                  (unsigned long long)d->object_align, d->direct);
    assert_true(d->kind == TV__DEV_NVME || d->kind == TV__DEV_BLOCK);
    assert_true(d->direct);
    sysfs_attr("queue/logical_block_size", attr, sizeof attr);
    assert_int_equal(d->lba_size, strtoul(attr, NULL, 10));
    sysfs_attr("size", attr, sizeof attr); /* always in 512-byte units */
    assert_int_equal(d->size_bytes, strtoull(attr, NULL, 10) * 512u);
    uint32_t io;
    uint64_t obj;
    assert_int_equal(tv__dev_compute_align(d->lba_size, &io, &obj, NULL), 0);
    assert_int_equal(d->io_align, io);
    assert_int_equal(d->object_align, obj);
    tv__dev_close(d);
}

static void test_identity(void **state)
{
    (void)state;
    tv__dev *d = NULL;
    tv_error err = {0};
    char attr[128];

    assert_int_equal(tv__dev_open(g_path, TV__DEV_O_RDONLY, &d, &err), 0);
    if (d->kind != TV__DEV_NVME) {
        print_message("%s opened as a plain block device (no libnvme in this build, or the "
                      "identify command failed): identity not checked\n",
                      g_path);
        tv__dev_close(d);
        skip();
    }
    print_message("serial \"%s\" model \"%s\" fw \"%s\" nsid %u lba %u capacity %llu\n",
                  d->ident.serial, d->ident.model, d->ident.firmware, d->ident.nsid,
                  d->ident.lba_size, (unsigned long long)d->ident.capacity_lba);
    assert_int_equal(d->ident.lba_size, d->lba_size);
    assert_int_equal(d->ident.capacity_lba * d->ident.lba_size, d->size_bytes);
    assert_true(d->ident.serial[0] != '\0');
    sysfs_attr("device/serial", attr, sizeof attr);
    if (attr[0])
        assert_string_equal(d->ident.serial, attr);
    sysfs_attr("device/model", attr, sizeof attr);
    if (attr[0])
        assert_string_equal(d->ident.model, attr);
    sysfs_attr("nsid", attr, sizeof attr);
    if (attr[0])
        assert_int_equal(d->ident.nsid, strtoul(attr, NULL, 10));

    /* A label made for this namespace (in memory only) checks clean. */
    uint8_t uuid[16];
    tv__label l;
    assert_int_equal(tv__uuid_random(uuid, NULL), 0);
    if (d->size_bytes >= 4 * d->object_align) {
        assert_int_equal(
            tv__label_init(&l, d, uuid, d->object_align, d->size_bytes - d->object_align, &err), 0);
        assert_int_equal(tv__label_check(&l, &l, d, &err), 0);
    }
    tv__dev_close(d);
}

static void test_direct_read(void **state)
{
    (void)state;
    tv__dev *d = NULL;
    tv_error err = {0};

    assert_int_equal(tv__dev_open(g_path, TV__DEV_O_RDONLY, &d, &err), 0);
    uint8_t *b = tv__dev_alloc_aligned(d, 1024 * 1024);
    assert_non_null(b);
    assert_int_equal(tv__dev_pread_full(d, b, 1024 * 1024, 0, &err), 0);
    assert_int_equal(tv__dev_pread_full(d, b, d->io_align, d->size_bytes - d->io_align, &err), 0);
    assert_int_equal(tv__dev_pread_full(d, b, d->io_align, d->size_bytes, &err), TV_E_INVALID_ARG);
    free(b);
    tv__dev_close(d);
}

int main(void)
{
    if (!find_namespace())
        tv_test_skip("no NVMe namespace on this machine (/sys/block/nvme*n* is empty); set "
                     "TV_TEST_NVME=/dev/nvmeXnY to choose one");
    int fd = open(g_path, O_RDONLY);
    if (fd < 0)
        tv_test_skip("cannot open %s: %s (needs read access, usually root)", g_path,
                     strerror(errno));
    close(fd);
    printf("testing NVMe namespace %s (read-only)\n", g_path);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_geometry),
        cmocka_unit_test(test_identity),
        cmocka_unit_test(test_direct_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
