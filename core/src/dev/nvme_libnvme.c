/* NVMe identity through libnvme (>= 1.3): NSID of the namespace open on fd,
 * then Identify Controller and Identify Namespace, decoded by
 * tv__nvme_parse_identify.
 *
 * Invariants: only the raw 4096-byte structures cross into our code, so the
 * decoding is the same (and tested) with or without libnvme. The admin
 * commands need CAP_SYS_ADMIN; a failure is reported, never fatal here. */
#include <errno.h>
#include <libnvme.h>
#include <string.h>

#include "dev/dev.h"

_Static_assert(sizeof(struct nvme_id_ctrl) == TV__NVME_IDENTIFY_LEN, "identify controller size");
_Static_assert(sizeof(struct nvme_id_ns) == TV__NVME_IDENTIFY_LEN, "identify namespace size");

static int nvme_fail(tv_error *err, const char *what, uint32_t nsid, int rc)
{
    if (rc < 0) {
        int e = errno ? errno : EIO;
        return tv__seterr(err, -e, "nvme %s (nsid %u): %s", what, nsid, strerror(e));
    }
    return tv__seterr(err, -EIO, "nvme %s (nsid %u): NVMe status 0x%x", what, nsid, (unsigned)rc);
}

int tv__nvme_identify(int fd, tv__dev_identity *out, tv_error *err)
{
    struct nvme_id_ctrl ctrl;
    struct nvme_id_ns ns;
    __u32 nsid = 0;
    int rc;

    if (fd < 0 || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "nvme identify: bad argument");
    errno = 0;
    if (nvme_get_nsid(fd, &nsid) < 0)
        return nvme_fail(err, "get nsid", 0, -1);
    memset(&ctrl, 0, sizeof ctrl);
    memset(&ns, 0, sizeof ns);
    errno = 0;
    rc = nvme_identify_ctrl(fd, &ctrl);
    if (rc != 0)
        return nvme_fail(err, "identify controller", nsid, rc);
    errno = 0;
    rc = nvme_identify_ns(fd, nsid, &ns);
    if (rc != 0)
        return nvme_fail(err, "identify namespace", nsid, rc);
    return tv__nvme_parse_identify(&ctrl, &ns, nsid, out, err);
}
