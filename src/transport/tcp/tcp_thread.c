/* The progress thread. While the caller polls, it stays out of the way
 * (asleep on its eventfd, looking again when the caller could have gone
 * quiet); once the caller has not polled for GS_TCP_TAKEOVER_NS it sleeps in
 * poll() on every socket and runs the progress engine when one is ready, so
 * a rank that computes, or waits in the store, still serves its peers' READs,
 * atomics and acknowledgements. With GS_PROGRESS_THREAD=1 it serves all the
 * time. It shares tp->lock with the caller. */
#include "transport/tcp/tcp.h"

#include "util/clock.h"
#include "util/log.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

void gs_tcp_wake_thread(gs_tcp_tp *tp)
{
    uint64_t one = 1;
    if (tp->thread_on && write(tp->thread_wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        gs_log_warn(TCP, "rank %d: waking the progress thread failed: %s", tp->base.rank, strerror(errno));
}

/* Under the lock: one progress pass, then the descriptors to sleep on. */
static int thread_pass(gs_tcp_tp *tp, struct pollfd *pfds)
{
    int n = 0;
    gs_tcp_progress(tp);
    gs_tcp_ack_flush(tp);
    pfds[n++] = (struct pollfd){.fd = tp->thread_wake_fd, .events = POLLIN};
    for (int p = 0; p < tp->base.size; p++) {
        gs_tcp_ep *ep = gs_tcp_ep_at(tp, p);
        if (ep && !ep->dead)
            n += gs_tcp_ep_pollfds(ep, pfds + n);
    }
    return n;
}

/* Under the lock: how long to stay out of the caller's way (0: serve now). */
static int dormant_ms(const gs_tcp_tp *tp)
{
    uint64_t now = gs_now_ns(), quiet_at = tp->user_ns + GS_TCP_TAKEOVER_NS;
    if (tp->base.cfg->progress_thread || (tp->waiters == 0 && now >= quiet_at))
        return 0;
    /* a blocked waiter watches the sockets itself; a polling caller is looked
     * at again after a full period (so the caller is disturbed rarely) */
    return (int)(GS_TCP_TAKEOVER_NS / 1000000ull);
}

static void *thread_main(void *arg)
{
    gs_tcp_tp *tp = arg;
    struct pollfd *pfds = malloc((2 * (size_t)tp->base.size + 1) * sizeof(*pfds));
    uint64_t drain;
    if (!pfds) {
        gs_log_error(TCP, "rank %d: the progress thread has no memory; peers are served only while polling",
                     tp->base.rank);
        return NULL;
    }
    gs_log_set_rank(tp->base.rank);
    for (;;) {
        int n = 1, timeout;
        pthread_mutex_lock(&tp->lock);
        if (tp->thread_stop) {
            pthread_mutex_unlock(&tp->lock);
            break;
        }
        timeout = dormant_ms(tp);
        pfds[0] = (struct pollfd){.fd = tp->thread_wake_fd, .events = POLLIN};
        if (timeout == 0) {
            n = thread_pass(tp, pfds);
            timeout = 100; /* at most, so that operation deadlines are checked */
        }
        pthread_mutex_unlock(&tp->lock);
        if (poll(pfds, (nfds_t)n, timeout) > 0 && (pfds[0].revents & POLLIN) &&
            read(tp->thread_wake_fd, &drain, sizeof(drain)) < 0 && errno != EAGAIN)
            gs_log_warn(TCP, "rank %d: reading the progress thread's eventfd failed: %s", tp->base.rank,
                        strerror(errno));
    }
    free(pfds);
    return NULL;
}

gs_status gs_tcp_thread_start(gs_tcp_tp *tp)
{
    int rc;
    tp->thread_wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (tp->thread_wake_fd < 0)
        return gs_fail(GS_SUBSYS_TCP, GS_ERR_SYSTEM, "rank %d: eventfd for the progress thread failed: %s",
                       tp->base.rank, strerror(errno));
    tp->thread_stop = false;
    tp->thread_on = true;
    rc = pthread_create(&tp->thread, NULL, thread_main, tp);
    if (rc != 0) {
        tp->thread_on = false;
        close(tp->thread_wake_fd);
        tp->thread_wake_fd = -1;
        return gs_fail(GS_SUBSYS_TCP, GS_ERR_SYSTEM, "rank %d: starting the progress thread failed: %s",
                       tp->base.rank, strerror(rc));
    }
    return GS_OK;
}

void gs_tcp_thread_stop(gs_tcp_tp *tp)
{
    if (!tp->thread_on)
        return;
    pthread_mutex_lock(&tp->lock);
    tp->thread_stop = true;
    gs_tcp_wake_thread(tp);
    pthread_mutex_unlock(&tp->lock);
    pthread_join(tp->thread, NULL);
    tp->thread_on = false;
    close(tp->thread_wake_fd);
    tp->thread_wake_fd = -1;
}
