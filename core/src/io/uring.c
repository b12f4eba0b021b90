/* io_uring backend of the read engine: one ring of queue_depth entries
 * (COOP_TASKRUN where the kernel has it), plain reads; with fixed_buffers
 * the staging ring registered as queue_depth fixed buffers (read_fixed) for
 * staged ops, plain reads for direct-to-destination ops or when
 * registration is refused.
 *
 * Invariants: user_data is the op index (cancel requests carry
 * TV__URING_CANCEL_BIT and are never reported); the fault hook sees every
 * read completion before tv__io_op_step interprets it; a short read's
 * remainder is re-queued here, so reap only returns finished ops; at most
 * queue_depth reads plus as many cancels are outstanding (the CQ holds
 * twice the SQ entries). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "io/io_internal.h"

#define TV__URING_CANCEL_BIT (1ull << 63)

/* A ring whose completions wait for the thread's next io_uring_enter
 * (COOP_TASKRUN) instead of interrupting it: the thread running tv__io_run
 * copies staged bytes between its waits and enters the kernel for every
 * completion anyway. Kernels before 5.19 refuse the flag: a plain ring. */
int tv__io_ring_init(unsigned entries, struct io_uring *ring, unsigned cq_entries)
{
    struct io_uring_params p = {0};
    p.flags = IORING_SETUP_COOP_TASKRUN | (cq_entries ? IORING_SETUP_CQSIZE : 0);
    p.cq_entries = cq_entries;
    int rc = io_uring_queue_init_params(entries, ring, &p);
    if (rc == -EINVAL) {
        memset(&p, 0, sizeof(p));
        p.flags = cq_entries ? IORING_SETUP_CQSIZE : 0;
        p.cq_entries = cq_entries;
        rc = io_uring_queue_init_params(entries, ring, &p);
    }
    return rc;
}

int tv__io_uring_init(tv__io *io)
{
    int rc = tv__io_ring_init(io->qd, &io->ring, 0);
    if (rc < 0)
        return rc;
    io->ring_ok = true;
    return 0;
}

void tv__io_uring_fini(tv__io *io)
{
    if (!io->ring_ok)
        return;
    tv__io_uring_unregister(io);
    io_uring_queue_exit(&io->ring);
    io->ring_ok = false;
}

int tv__io_uring_register(tv__io *io)
{
    struct iovec *iov;
    int rc;
    if (!io->ring_ok || !io->staging)
        return -EINVAL;
    tv__io_uring_unregister(io);
    iov = calloc(io->qd, sizeof(*iov));
    if (!iov)
        return -ENOMEM;
    for (uint32_t i = 0; i < io->qd; i++) {
        iov[i].iov_base = io->staging + (size_t)i * io->chunk_len;
        iov[i].iov_len = io->chunk_len;
    }
    rc = io_uring_register_buffers(&io->ring, iov, io->qd);
    free(iov);
    if (rc == 0)
        io->reg_base = io->staging;
    return rc;
}

void tv__io_uring_unregister(tv__io *io)
{
    if (io->ring_ok && io->reg_base)
        io_uring_unregister_buffers(&io->ring);
    io->reg_base = NULL;
}

static struct io_uring_sqe *get_sqe(tv__io *io)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    if (!sqe && tv__io_uring_flush(io) == 0)
        sqe = io_uring_get_sqe(&io->ring);
    return sqe;
}

static int prep(tv__io *io, uint32_t i)
{
    tv__io_op *op = &io->ops[i];
    struct io_uring_sqe *sqe = get_sqe(io);
    uint8_t *buf = op->buf + op->done;
    unsigned n = (unsigned)(op->len - op->done);
    if (!sqe)
        return -EBUSY;
    if (op->fixed && io->reg_base)
        io_uring_prep_read_fixed(sqe, op->fd, buf, n, op->off + op->done, (int)op->slot);
    else
        io_uring_prep_read(sqe, op->fd, buf, n, op->off + op->done);
    io_uring_sqe_set_data64(sqe, i);
    io->n_unsubmitted++;
    return 0;
}

int tv__io_uring_submit(tv__io *io, uint32_t i)
{
    io->ops[i].t_start_ns = tv__io_now_ns();
    return prep(io, i);
}

int tv__io_uring_flush(tv__io *io)
{
    unsigned spins = 0;
    while (io->n_unsubmitted) {
        int rc = io_uring_submit(&io->ring);
        if (rc > 0) {
            io->n_unsubmitted -=
                (uint32_t)rc > io->n_unsubmitted ? io->n_unsubmitted : (uint32_t)rc;
            continue;
        }
        if ((rc == -EINTR || rc == -EAGAIN || rc == -EBUSY || rc == 0) && ++spins < 1000)
            continue;
        return rc ? rc : -EIO;
    }
    return 0;
}

void tv__io_uring_cancel(tv__io *io, uint32_t i)
{
    struct io_uring_sqe *sqe = get_sqe(io);
    if (!sqe)
        return;
    io_uring_prep_cancel64(sqe, i, 0);
    io_uring_sqe_set_data64(sqe, TV__URING_CANCEL_BIT | i);
    io->n_unsubmitted++;
    tv__io_uring_flush(io);
}

int tv__io_uring_reap(tv__io *io, uint32_t *out)
{
    struct __kernel_timespec ts = {.tv_sec = io->timeout_ms / 1000,
                                   .tv_nsec = (long long)(io->timeout_ms % 1000) * 1000000};
    for (;;) {
        struct io_uring_cqe *cqe = NULL;
        int rc = tv__io_uring_flush(io);
        if (rc)
            return rc;
        rc = io_uring_wait_cqe_timeout(&io->ring, &cqe, &ts);
        if (rc == -EINTR)
            continue;
        if (rc == -ETIME)
            return TV_E_TIMEOUT;
        if (rc < 0)
            return rc;
        uint64_t ud = io_uring_cqe_get_data64(cqe);
        int64_t res = cqe->res;
        io_uring_cqe_seen(&io->ring, cqe);
        if (ud & TV__URING_CANCEL_BIT)
            continue;
        if (ud >= io->qd || !io->ops[ud].inflight)
            continue; /* cannot happen: only ops are tagged with indexes */
        tv__io_op *op = &io->ops[ud];
        tv__io_fault_apply(op->dev, op->off + op->done, op->len - op->done, &res);
        if (tv__io_op_step(op, res) && !op->timed_out) {
            if ((rc = prep(io, (uint32_t)ud)) == 0)
                continue;
            op->result = rc;
        }
        op->elapsed_ns = tv__io_now_ns() - op->t_start_ns;
        *out = (uint32_t)ud;
        return 0;
    }
}
