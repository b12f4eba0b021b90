/* pread backend of the read engine: n_threads workers created with the
 * engine pull ops from one shared queue, read them with tv__sys.pread (so
 * tests can inject faults) into the op's staging slot or destination, and
 * push them to a done queue that the thread running tv__io_run reaps.
 *
 * Invariants: both queues are rings of queue_depth indexes guarded by one
 * mutex (never more than queue_depth ops exist); a worker owns an op from
 * pop to push; the fault hook is called after every pread, in the worker;
 * destroy joins every worker (the engine is idle then). */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "io/io_internal.h"
#include "util/sys.h"

int64_t tv__io_pread_faulted(int fd, uint32_t dev, uint8_t *buf, uint64_t off, uint64_t len)
{
    ssize_t n = tv__sys.pread(fd, buf, (size_t)len, (off_t)off);
    int64_t res = n < 0 ? -(int64_t)errno : (int64_t)n;
    tv__io_fault_apply(dev, off, len, &res);
    return res;
}

static void read_op(tv__io_op *op)
{
    uint64_t t0 = tv__io_now_ns();
    while (tv__io_op_step(op, tv__io_pread_faulted(op->fd, op->dev, op->buf + op->done,
                                                   op->off + op->done, op->len - op->done)))
        ;
    op->elapsed_ns = tv__io_now_ns() - t0;
}

static void *worker(void *arg)
{
    tv__io *io = arg;
    pthread_mutex_lock(&io->mu);
    for (;;) {
        while (!io->stop && io->wq_n == 0)
            pthread_cond_wait(&io->work_cv, &io->mu);
        if (io->wq_n == 0)
            break; /* stop requested and nothing left */
        uint32_t i = io->wq[io->wq_head];
        io->wq_head = (io->wq_head + 1) % io->qd;
        io->wq_n--;
        pthread_mutex_unlock(&io->mu);

        read_op(&io->ops[i]);

        pthread_mutex_lock(&io->mu);
        io->dq[(io->dq_head + io->dq_n) % io->qd] = i;
        io->dq_n++;
        pthread_cond_signal(&io->done_cv);
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

int tv__io_pread_init(tv__io *io)
{
    pthread_condattr_t ca;
    int rc;
    io->wq = calloc(io->qd, sizeof(*io->wq));
    io->dq = calloc(io->qd, sizeof(*io->dq));
    io->threads = calloc(io->n_threads, sizeof(*io->threads));
    if (!io->wq || !io->dq || !io->threads)
        return -ENOMEM;
    if ((rc = pthread_mutex_init(&io->mu, NULL)))
        return -rc;
    if ((rc = pthread_condattr_init(&ca))) {
        pthread_mutex_destroy(&io->mu);
        return -rc;
    }
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if ((rc = pthread_cond_init(&io->done_cv, &ca))) {
        pthread_condattr_destroy(&ca);
        pthread_mutex_destroy(&io->mu);
        return -rc;
    }
    pthread_condattr_destroy(&ca);
    if ((rc = pthread_cond_init(&io->work_cv, NULL))) {
        pthread_cond_destroy(&io->done_cv);
        pthread_mutex_destroy(&io->mu);
        return -rc;
    }
    io->sync_ok = true;
    for (uint32_t t = 0; t < io->n_threads; t++) {
        if ((rc = pthread_create(&io->threads[t], NULL, worker, io)))
            return -rc; /* fini joins the ones started */
        io->n_started++;
    }
    return 0;
}

void tv__io_pread_fini(tv__io *io)
{
    if (io->sync_ok) {
        pthread_mutex_lock(&io->mu);
        io->stop = true;
        pthread_cond_broadcast(&io->work_cv);
        pthread_mutex_unlock(&io->mu);
        for (uint32_t t = 0; t < io->n_started; t++)
            pthread_join(io->threads[t], NULL);
        io->n_started = 0;
        pthread_cond_destroy(&io->work_cv);
        pthread_cond_destroy(&io->done_cv);
        pthread_mutex_destroy(&io->mu);
        io->sync_ok = false;
    }
    free(io->threads);
    free(io->wq);
    free(io->dq);
    io->threads = NULL;
    io->wq = io->dq = NULL;
}

int tv__io_pread_submit(tv__io *io, uint32_t i)
{
    pthread_mutex_lock(&io->mu);
    io->wq[(io->wq_head + io->wq_n) % io->qd] = i;
    io->wq_n++;
    pthread_cond_signal(&io->work_cv);
    pthread_mutex_unlock(&io->mu);
    return 0;
}

int tv__io_pread_reap(tv__io *io, uint32_t *out)
{
    struct timespec dl;
    int rc = 0;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += io->timeout_ms / 1000;
    dl.tv_nsec += (long)(io->timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&io->mu);
    while (io->dq_n == 0 && rc == 0)
        rc = pthread_cond_timedwait(&io->done_cv, &io->mu, &dl);
    if (io->dq_n) {
        *out = io->dq[io->dq_head];
        io->dq_head = (io->dq_head + 1) % io->qd;
        io->dq_n--;
        rc = 0;
    } else {
        rc = rc == ETIMEDOUT ? TV_E_TIMEOUT : -rc;
    }
    pthread_mutex_unlock(&io->mu);
    return rc;
}
