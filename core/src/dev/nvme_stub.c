/* NVMe identity in builds without libnvme: always not-supported, so an NVMe
 * namespace is used as a plain block device (kind "block"). */
#include "dev/dev.h"

int tv__nvme_identify(int fd, tv__dev_identity *out, tv_error *err)
{
    (void)fd;
    (void)out;
    return tv__seterr(err, TV_E_NOT_SUPPORTED, "built without libnvme: no NVMe identity");
}
