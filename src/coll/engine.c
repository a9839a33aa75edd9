/*
 * The progress engine: started requests wait in a queue and run in order;
 * each runs its algorithm's steps until one has to wait; completions from
 * the transport (arrivals, finished writes, credits) let them continue.
 * Progress happens in the caller (test, wait, blocking calls) or, with
 * GS_PROGRESS_THREAD, in a thread that keeps polling while work is queued.
 *
 * Deadline: a request fails with GS_ERR_TIMEOUT when nothing has moved for
 * GS_TIMEOUT_MS; the error names the step and the peer it waits for.
 */
#include "coll/coll.h"

#include "util/clock.h"
#include "util/log.h"
#include "util/trace.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Takes the head request off the queue with its final status. */
static void finish_head(gs_comm *comm, gs_status status)
{
    gs_coll_req *req = comm->head;
    comm->head = req->next;
    if (!comm->head)
        comm->tail = NULL;
    req->next = NULL;
    gs_coll_user_close(&req->op);
    if (gs_trace_enabled())
        gs_coll_trace_end(&req->op, status);
    if (status == GS_OK && req->op.zc_class >= 0)
        gs_coll_zc_record(&req->op, gs_now_ns());
    if (req->op.seq > comm->seq_done)
        comm->seq_done = req->op.seq;
    if (status == GS_OK && req->op.kind == GS_COLL_ALLREDUCE_MULTI) {
        const uint8_t *src = req->op.recv;
        for (size_t i = 0; i < req->op.ntensors; i++) {
            size_t bytes = req->op.tensors[i].count * req->op.es;
            if (bytes)
                memcpy(req->op.tensors[i].recvbuf, src, bytes);
            src += bytes;
        }
    }
    req->status = status;
    if (comm->threaded)
        pthread_cond_broadcast(&comm->cond);
}

uint64_t gs_engine_current_seq(const gs_comm *comm)
{
    return comm->head ? comm->head->op.seq : comm->seq_done + 1;
}

/* Whether the failure stops the head request (or any new one). */
static bool blocked(const gs_comm *comm)
{
    return comm->failed != GS_OK && (!comm->head || comm->head->op.seq >= comm->failed_seq);
}

/* Runs one op's steps until one has to wait: GS_OK when the op is done. */
static gs_status run_op(gs_coll_op *op)
{
    for (;;) {
        if (!op->have_prim) {
            if (!op->algo->next(op, &op->prim))
                return GS_OK;
            op->have_prim = true;
        }
        gs_status st = gs_prim_run(op, &op->prim);
        if (st != GS_OK)
            return st;
        op->have_prim = false;
    }
}

/* Runs the queue from its head; a request reaching the head first checks
 * the messages that came for it early. */
static gs_status run_queue(gs_comm *comm)
{
    if (gs_trace_enabled())
        gs_coll_trace_tick(comm);
    while (comm->head) {
        gs_coll_op *op = &comm->head->op;
        gs_status st = GS_OK;
        if (!op->started) {
            op->started = true;
            if (gs_trace_enabled())
                gs_coll_trace_start(op);
            gs_coll_zc_choose(op); /* under the lock: the progress thread records */
            if (op->zc_class >= 0)
                op->start_ns = gs_now_ns();
            comm->progress_count++;
            st = gs_coll_user_open(op);
            if (st == GS_OK)
                st = gs_chan_check_queued(comm, op);
        }
        if (st == GS_OK)
            st = run_op(op);
        if (st == GS_INPROGRESS)
            return GS_OK;
        if (st != GS_OK) {
            gs_engine_fail(comm, st, op->seq, gs_last_error(), true);
            return st;
        }
        finish_head(comm, GS_OK);
    }
    return GS_OK;
}

/* Handles every completion polled (all of them: calls before a failed one
 * may still need the later ones). */
static gs_status dispatch(gs_comm *comm, int n)
{
    gs_status first = GS_OK;
    if (gs_trace_enabled())
        gs_coll_trace_tick(comm);
    for (int i = 0; i < n; i++) {
        gs_status st = gs_chan_complete(comm, &comm->wcs[i]);
        if (st != GS_OK && first == GS_OK) {
            first = st;
            gs_engine_fail(comm, st, gs_engine_current_seq(comm), gs_last_error(),
                           st != GS_ERR_PEER_LOST || comm->size > 2);
        }
    }
    return first;
}

gs_status gs_engine_progress(gs_comm *comm)
{
    int n, max = (int)(sizeof(comm->wcs) / sizeof(comm->wcs[0]));
    gs_status st;
    if (blocked(comm))
        return comm->failed;
    do {
        st = gs_tp_poll(comm->tp, comm->wcs, max, &n);
        if (st != GS_OK) {
            gs_engine_fail(comm, st, gs_engine_current_seq(comm), gs_last_error(), true);
            return st;
        }
        st = dispatch(comm, n);
        if (st != GS_OK)
            return st;
    } while (n == max);
    st = gs_p2p_progress(comm);
    if (st != GS_OK) {
        gs_engine_fail(comm, st, gs_engine_current_seq(comm), gs_last_error(), true);
        return st;
    }
    st = run_queue(comm);
    /* credits the messages just posted did not carry; 2 ranks between calls:
     * the next call's first message carries them (the peer cannot finish
     * that call without it anyway) */
    if (comm->failed == GS_OK && (comm->head || comm->size > 2))
        gs_chan_flush_credits(comm);
    return st;
}

/* The head request made no progress for GS_TIMEOUT_MS. */
static void time_out(gs_comm *comm)
{
    char call[200], wait[200], text[500];
    const gs_coll_op *op = &comm->head->op;
    gs_desc_format_op(op, call, sizeof(call));
    if (op->have_prim)
        gs_prim_describe_wait(op, &op->prim, wait, sizeof(wait));
    else
        snprintf(wait, sizeof(wait), "between steps");
    snprintf(text, sizeof(text), "rank %d: %s made no progress for %lld ms (GS_TIMEOUT_MS): %s", comm->rank,
             call, (long long)comm->cfg->timeout_ms, wait);
    gs_fail(GS_SUBSYS_COLL, GS_ERR_TIMEOUT, "%s", text);
    gs_engine_fail(comm, GS_ERR_TIMEOUT, op->seq, text, true);
}

/* Whether the head request made no progress for GS_TIMEOUT_MS. Reads the
 * clock: callers on a fast path call it now and then. */
static bool overdue(gs_comm *comm)
{
    uint64_t now = gs_now_ns();
    if (comm->progress_count != comm->progress_seen) {
        comm->progress_seen = comm->progress_count;
        comm->progress_ns = now;
    }
    return comm->head && comm->cfg->timeout_ms >= 0 &&
           now - comm->progress_ns > (uint64_t)comm->cfg->timeout_ms * 1000000ull;
}

/* Whether the head request waits on peers' shared-memory posts. */
static const gs_coll_op *box_waiter(const gs_comm *comm)
{
    const gs_coll_op *op = comm->head ? &comm->head->op : NULL;
    return op && op->box && op->have_prim && op->prim.kind == GS_PRIM_RECV_ALL ? op : NULL;
}

/* How long a waiting rank polls (yielding) before it blocks. */
static uint64_t spin_ns(const gs_comm *comm)
{
    if (comm->cfg->poll == GS_POLL_SPIN)
        return UINT64_MAX;
    return comm->cfg->poll == GS_POLL_EVENT
               ? 0
               : (uint64_t)(comm->cfg->spin_us > 0 ? comm->cfg->spin_us : 0) * 1000u;
}

/* Blocks in the transport until a completion comes, at most until the
 * head request's deadline. */
static gs_status wait_completions(gs_comm *comm)
{
    int n, max = (int)(sizeof(comm->wcs) / sizeof(comm->wcs[0]));
    int64_t left_ms = comm->cfg->timeout_ms - (int64_t)((gs_now_ns() - comm->progress_ns) / 1000000u);
    gs_status st = gs_tp_wait(comm->tp, comm->wcs, max, &n, left_ms < 1 ? 1 : (int)left_ms);
    if (st == GS_ERR_TIMEOUT)
        return GS_OK; /* the caller sees the deadline passed */
    if (st != GS_OK) {
        gs_engine_fail(comm, st, gs_engine_current_seq(comm), gs_last_error(), true);
        return st;
    }
    return dispatch(comm, n);
}

gs_status gs_engine_block(gs_comm *comm, int timeout_ms)
{
    int n, max = (int)(sizeof(comm->wcs) / sizeof(comm->wcs[0]));
    gs_status st = gs_tp_wait(comm->tp, comm->wcs, max, &n, timeout_ms < 1 ? 1 : timeout_ms);
    if (st == GS_ERR_TIMEOUT)
        return GS_OK;
    if (st != GS_OK) {
        gs_engine_fail(comm, st, gs_engine_current_seq(comm), gs_last_error(), true);
        return st;
    }
    return dispatch(comm, n);
}

gs_status gs_engine_submit(gs_comm *comm, gs_coll_req *req)
{
    gs_status st;
    gs_engine_lock(comm);
    if (comm->failed != GS_OK && comm->seq_issued + 1 >= comm->failed_seq) {
        st = comm->failed;
        gs_engine_fail_name(comm, req->op.kind);
        gs_error_restore(comm->failed_text);
        gs_engine_unlock(comm);
        return st;
    }
    req->status = GS_INPROGRESS;
    req->next = NULL;
    req->op.seq = ++comm->seq_issued;
    if (comm->tail)
        comm->tail->next = req;
    else
        comm->head = req;
    comm->tail = req;
    if (comm->threaded)
        pthread_cond_broadcast(&comm->cond);
    else if (req->op.box && comm->head == req)
        run_queue(comm); /* start at once; a shared-memory post needs no poll first */
    else
        gs_engine_progress(comm); /* start at once: the first sends need no one */
    gs_engine_unlock(comm);
    return GS_OK;
}

/* Queues and starts req as call seq, as gs_engine_submit and run_queue
 * would; checks the messages that came for it early. */
static gs_status quick_enter(gs_comm *comm, gs_coll_req *req, uint64_t seq)
{
    gs_coll_op *op = &req->op;
    req->status = GS_INPROGRESS;
    req->next = NULL;
    op->seq = seq;
    comm->head = comm->tail = req;
    op->started = true;
    if (gs_trace_enabled())
        gs_coll_trace_start(op);
    comm->progress_count++;
    return gs_chan_check_queued(comm, op);
}

/* The post of req's only column is made (the cursor past its send step):
 * the receive step becomes the current one and runs, in a tight spin on
 * the peer's post word first (a few microseconds at most), then in the
 * engine. */
static gs_status quick_gather(gs_comm *comm, gs_coll_req *req)
{
    gs_coll_op *op = &req->op;
    gs_status st;
    op->have_prim = op->algo->next(op, &op->prim);
    for (unsigned i = 0; !comm->oversubscribed && i < 4096 && !gs_box_ready(op); i++)
        ;
    st = gs_box_gather(op, &op->prim);
    if (st == GS_INPROGRESS)
        return gs_engine_wait(comm, req);
    if (st != GS_OK) {
        gs_engine_fail(comm, st, op->seq, gs_last_error(), true);
        return gs_engine_wait(comm, req);
    }
    op->have_prim = false;
    finish_head(comm, GS_OK);
    return GS_OK;
}

/* Whether op is direct's two steps over the boxes in one column (post, then
 * read every post), with nothing after them: what the quick path runs. */
static bool quick_shape(const gs_coll_op *op)
{
    bool kind = op->kind == GS_COLL_ALLREDUCE || op->kind == GS_COLL_REDUCE || op->kind == GS_COLL_GATHER ||
                op->kind == GS_COLL_SCATTER || op->kind == GS_COLL_ALLGATHER || op->kind == GS_COLL_ALLTOALL;
    return kind && op->algo == &gs_direct_algo && op->box && op->ncols == 1 && !op->parts && !op->box_ref;
}

gs_status gs_engine_quick(gs_comm *comm, gs_coll_req *req)
{
    gs_coll_op *op = &req->op;
    gs_status st;
    if (!quick_shape(op)) {
        st = gs_engine_submit(comm, req);
        return st == GS_OK ? gs_engine_wait(comm, req) : st;
    }
    comm->quick_calls++;
    st = quick_enter(comm, req, ++comm->seq_issued);
    if (st != GS_OK) {
        gs_engine_fail(comm, st, op->seq, gs_last_error(), true);
        return gs_engine_wait(comm, req);
    }
    /* the send step (direct's step 0) */
    op->algo->next(op, &op->prim);
    gs_box_post(op, &op->prim);
    return quick_gather(comm, req);
}

gs_status gs_engine_resume(gs_comm *comm, gs_coll_req *req)
{
    gs_coll_op *op = &req->op;
    gs_status st = quick_enter(comm, req, comm->seq_issued);
    op->algo->next(op, &op->prim); /* the send step: posted */
    op->box_post = gs_box_posts(comm);
    if (st != GS_OK) {
        gs_engine_fail(comm, st, op->seq, gs_last_error(), true);
        return gs_engine_wait(comm, req);
    }
    return quick_gather(comm, req);
}

gs_status gs_engine_wait(gs_comm *comm, gs_coll_req *req)
{
    gs_status st;
    uint64_t idle_ns = 0;
    gs_engine_lock(comm);
    for (unsigned turn = 1; req->status == GS_INPROGRESS; turn++) {
        if (comm->threaded) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&comm->cond, &comm->lock, &ts);
            continue;
        }
        /* waiting on shared memory: look at the transport only now and then
         * while spinning; every turn once sleeping (a turn then sleeps up to
         * 1 ms), so the transport's liveness checks, made every so many
         * polls, see a dead peer within about a second */
        if (box_waiter(comm) && (turn & 63) != 0 && idle_ns < spin_ns(comm))
            run_queue(comm);
        else
            gs_engine_progress(comm);
        if (req->status != GS_INPROGRESS)
            break;
        if ((turn & 63) == 0) {
            if (overdue(comm)) {
                time_out(comm);
                break;
            }
            idle_ns = gs_now_ns() - comm->progress_ns;
        }
        const gs_coll_op *boxed = box_waiter(comm);
        if (boxed) {
            gs_box_idle(comm, boxed, idle_ns, turn);
        } else if (comm->oversubscribed && idle_ns < spin_ns(comm)) {
            sched_yield(); /* the rank we wait for may need this CPU */
        } else if (gs_p2p_busy(comm)) {
            sched_yield(); /* p2p posts wait for room: no completion would wake us */
        } else {
            overdue(comm);
            wait_completions(comm);
        }
    }
    st = req->status;
    if (st != GS_OK)
        gs_error_restore(comm->failed_text);
    gs_engine_unlock(comm);
    return st;
}

gs_status gs_engine_test(gs_comm *comm, gs_coll_req *req)
{
    gs_status st;
    gs_engine_lock(comm);
    if (!comm->threaded && req->status == GS_INPROGRESS) {
        gs_engine_progress(comm);
        if (req->status == GS_INPROGRESS && overdue(comm))
            time_out(comm);
    }
    st = req->status;
    if (st != GS_OK && st != GS_INPROGRESS)
        gs_error_restore(comm->failed_text);
    gs_engine_unlock(comm);
    return st;
}

/* ---- the progress thread ------------------------------------------------ */

static void backoff(unsigned idle)
{
    if (idle < 64) {
        gs_cpu_relax();
    } else if (idle < 256) {
        sched_yield();
    } else {
        struct timespec ts = {0, idle < 4096 ? 2000 : 50000};
        nanosleep(&ts, NULL);
    }
}

static void *progress_main(void *arg)
{
    gs_comm *comm = arg;
    unsigned idle = 0;
    pthread_mutex_lock(&comm->lock);
    while (!comm->stop) {
        if (!comm->head || blocked(comm)) {
            pthread_cond_wait(&comm->cond, &comm->lock);
            continue;
        }
        uint64_t before = comm->progress_count;
        gs_coll_req *head = comm->head;
        gs_engine_progress(comm);
        if (overdue(comm))
            time_out(comm);
        if (comm->progress_count != before || comm->head != head) {
            idle = 0;
            continue;
        }
        pthread_mutex_unlock(&comm->lock);
        backoff(idle++);
        pthread_mutex_lock(&comm->lock);
    }
    pthread_mutex_unlock(&comm->lock);
    return NULL;
}

gs_status gs_engine_thread_start(gs_comm *comm)
{
    int err = pthread_create(&comm->thread, NULL, progress_main, comm);
    if (err != 0)
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_SYSTEM, "rank %d: starting the progress thread failed: %s",
                       comm->rank, strerror(err));
    comm->threaded = true;
    return GS_OK;
}

void gs_engine_thread_stop(gs_comm *comm)
{
    pthread_mutex_lock(&comm->lock);
    comm->stop = true;
    pthread_cond_broadcast(&comm->cond);
    pthread_mutex_unlock(&comm->lock);
    pthread_join(comm->thread, NULL);
    comm->threaded = false;
}
