/* Copy-out pool of the read engine: the copies of one staged read from its
 * staging slot into host destinations, spread over copy_threads threads
 * (the thread running tv__io_run and copy_threads - 1 workers), so neither
 * the memcpy nor the page faults of destinations in fresh memory (the
 * kernel zeroing each new page on first touch) cap a fast device at one
 * core.
 *
 * Invariants: a run is fork-join: tv__io_copy_flush returns only when every
 * piece it was given has been copied, so the staging slot can be reused and
 * the request's bytes count as delivered exactly as with an inline memcpy;
 * every piece is a sub-range of one (destination, source) pair computed by
 * complete() (engine.c), so nothing outside [dest, dest + len) is written;
 * workers start on the first run that needs them (a handle that only reads
 * small tensors never starts one) and are joined by fini; when they cannot
 * start, copies are inline (identical bytes). Both backends share this:
 * io_uring and pread batches copy the same way. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/io_internal.h"

/* Entries shorter than this are copied inline; longer ones are cut into
 * pieces of at least this size. */
#define COPY_MIN_PIECE (64u * 1024u)

uint32_t tv__io_copy_default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    return n < TV__IO_DEFAULT_COPY_THREADS ? (uint32_t)n : TV__IO_DEFAULT_COPY_THREADS;
}

static void *copy_worker(void *arg)
{
    tv__io *io = arg;
    pthread_mutex_lock(&io->cp_mu);
    for (;;) {
        while (!io->cp_stop && io->cp_next >= io->cp_n)
            pthread_cond_wait(&io->cp_work, &io->cp_mu);
        if (io->cp_stop)
            break;
        tv__io_piece p = io->cp_v[io->cp_next++];
        pthread_mutex_unlock(&io->cp_mu);
        memcpy(p.dst, p.src, p.n);
        pthread_mutex_lock(&io->cp_mu);
        if (++io->cp_fin == io->cp_n)
            pthread_cond_signal(&io->cp_done);
    }
    pthread_mutex_unlock(&io->cp_mu);
    return NULL;
}

/* Starts the workers once; false (copies stay inline) when that fails. */
static bool copy_start(tv__io *io)
{
    int rc;
    if (io->cp_ready)
        return true;
    if (io->cp_failed)
        return false;
    io->cp_cap = (size_t)(2 * (io->chunk_len / COPY_MIN_PIECE) + 2);
    io->cp_v = calloc(io->cp_cap, sizeof(*io->cp_v));
    io->cp_threads = calloc(io->cp_want - 1, sizeof(*io->cp_threads));
    if (!io->cp_v || !io->cp_threads) {
        rc = ENOMEM;
        goto fail;
    }
    if ((rc = pthread_mutex_init(&io->cp_mu, NULL)))
        goto fail;
    if ((rc = pthread_cond_init(&io->cp_work, NULL))) {
        pthread_mutex_destroy(&io->cp_mu);
        goto fail;
    }
    if ((rc = pthread_cond_init(&io->cp_done, NULL))) {
        pthread_cond_destroy(&io->cp_work);
        pthread_mutex_destroy(&io->cp_mu);
        goto fail;
    }
    io->cp_sync = true;
    for (uint32_t t = 0; t + 1 < io->cp_want; t++) {
        if ((rc = pthread_create(&io->cp_threads[t], NULL, copy_worker, io)))
            break;
        io->cp_started++;
    }
    if (io->cp_started == 0)
        goto fail;
    if (rc)
        tv__log(TV_LOG_INFO, "copy-out: %u of %u worker threads started: %s", io->cp_started,
                io->cp_want - 1, strerror(rc));
    io->cp_ready = true;
    return true;
fail:
    tv__log(TV_LOG_INFO, "copy-out workers not started (%s): copying inline", strerror(rc));
    io->cp_failed = true;
    return false;
}

void tv__io_copy_fini(tv__io *io)
{
    if (io->cp_sync) {
        pthread_mutex_lock(&io->cp_mu);
        io->cp_stop = true;
        pthread_cond_broadcast(&io->cp_work);
        pthread_mutex_unlock(&io->cp_mu);
        for (uint32_t t = 0; t < io->cp_started; t++)
            pthread_join(io->cp_threads[t], NULL);
        io->cp_started = 0;
        pthread_cond_destroy(&io->cp_done);
        pthread_cond_destroy(&io->cp_work);
        pthread_mutex_destroy(&io->cp_mu);
        io->cp_sync = false;
    }
    free(io->cp_threads);
    free(io->cp_v);
    io->cp_threads = NULL;
    io->cp_v = NULL;
    io->cp_ready = false;
}

void tv__io_copy_add(tv__io *io, void *dst, const void *src, size_t n)
{
    if (io->cp_want <= 1 || n < 2 * COPY_MIN_PIECE || !copy_start(io)) {
        memcpy(dst, src, n);
        return;
    }
    /* One piece per copy thread for a whole-chunk copy, never below the
     * minimum: an entry of n bytes gives at most 2 n / COPY_MIN_PIECE pieces,
     * and the entries of one op sum to at most chunk_len (cp_cap). */
    size_t per = (size_t)(io->chunk_len / io->cp_want);
    if (per < COPY_MIN_PIECE)
        per = COPY_MIN_PIECE;
    size_t k = n / per + (n % per != 0), at = 0;
    if (io->cp_pend + k > io->cp_cap) {
        memcpy(dst, src, n);
        return;
    }
    for (size_t i = 0; i < k; i++) {
        size_t len = i + 1 < k ? n / k : n - at;
        io->cp_v[io->cp_pend++] =
            (tv__io_piece){(uint8_t *)dst + at, (const uint8_t *)src + at, len};
        at += len;
    }
}

void tv__io_copy_flush(tv__io *io)
{
    size_t n = io->cp_pend;
    if (!n)
        return;
    if (n == 1) { /* one piece: waking the workers would only add a lock round trip */
        memcpy(io->cp_v[0].dst, io->cp_v[0].src, io->cp_v[0].n);
        io->cp_pend = 0;
        return;
    }
    pthread_mutex_lock(&io->cp_mu);
    io->cp_n = n;
    io->cp_next = 0;
    io->cp_fin = 0;
    pthread_cond_broadcast(&io->cp_work);
    while (io->cp_next < io->cp_n) {
        tv__io_piece p = io->cp_v[io->cp_next++];
        pthread_mutex_unlock(&io->cp_mu);
        memcpy(p.dst, p.src, p.n);
        pthread_mutex_lock(&io->cp_mu);
        io->cp_fin++;
    }
    while (io->cp_fin < io->cp_n)
        pthread_cond_wait(&io->cp_done, &io->cp_mu);
    io->cp_n = io->cp_next = io->cp_fin = 0;
    pthread_mutex_unlock(&io->cp_mu);
    io->cp_pend = 0;
}
