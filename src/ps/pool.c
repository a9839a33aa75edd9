/* A server's apply threads: helpers and the serve loop take chunks of one
 * shard's sum + optimizer in turn, the result bit for bit the
 * single-threaded one (pool.h). Knows chunks and futexes, not the
 * transport or the protocol. */
#include "ps/pool.h"

#include "util/alloc.h"
#include "util/clock.h"
#include "util/futex.h"
#include "util/log.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CHUNK_MIN  (64u * 1024u)    /* elements: 256 KiB of parameters per chunk at least */
#define SHARE_MIN  (4u * CHUNK_MIN) /* smaller shards: the caller alone (a 512 KiB one lost time shared) */
#define CHUNKS_MAX 0xffffu          /* chunk numbers fit in 16 bits of the claim word */
#define SPIN_TURNS 4096u            /* waiting for a helper's last chunk: spin, then yield */

typedef struct pool_job {
    const gs_ps_optim *o;
    float *w;
    const float *const *grads;
    int ngrads;
    float scale;
    float *state[2];
    uint64_t step;
    size_t count, chunk;
} pool_job;

struct gs_ps_pool {
    pool_job job;   /* written by the serve loop before the claim word that publishes it */
    uint64_t claim; /* generation << 32 | chunks << 16 | next chunk to take */
    uint32_t done;  /* chunks of this generation finished */
    uint32_t wake;  /* futex word: bumped for every job and at the end */
    bool stop;
    int nthreads;
    pthread_t *threads;
};

/* Takes the next chunk of generation gen; false when none is left (or
 * another job has begun). A successful take orders every read of the job
 * after the serve loop's writes of it. */
static bool take(gs_ps_pool *pool, uint32_t gen, uint32_t *chunk_p)
{
    uint64_t c = __atomic_load_n(&pool->claim, __ATOMIC_ACQUIRE);
    while ((uint32_t)(c >> 32) == gen && (c & 0xffffu) < ((c >> 16) & 0xffffu))
        if (__atomic_compare_exchange_n(&pool->claim, &c, c + 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            *chunk_p = (uint32_t)(c & 0xffffu);
            return true;
        }
    return false;
}

static void run_chunk(const pool_job *j, uint32_t chunk)
{
    size_t at = (size_t)chunk * j->chunk, n = j->count - at < j->chunk ? j->count - at : j->chunk;
    const float *grads[GS_PS_FUSE_MAX];
    float *state[2] = {j->state[0] ? j->state[0] + at : NULL, j->state[1] ? j->state[1] + at : NULL};
    for (int g = 0; g < j->ngrads; g++)
        grads[g] = j->grads[g] + at;
    gs_ps_optim_apply_sum(j->o, j->w + at, grads, j->ngrads, j->scale, state, j->step, n);
}

/* Takes and runs chunks of generation gen until none is left. */
static void work(gs_ps_pool *pool, uint32_t gen)
{
    uint32_t chunk;
    while (take(pool, gen, &chunk)) {
        run_chunk(&pool->job, chunk);
        __atomic_fetch_add(&pool->done, 1, __ATOMIC_RELEASE);
    }
}

static void *helper(void *arg)
{
    gs_ps_pool *pool = arg;
    for (;;) {
        uint32_t seen = __atomic_load_n(&pool->wake, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&pool->stop, __ATOMIC_ACQUIRE))
            break;
        work(pool, (uint32_t)(__atomic_load_n(&pool->claim, __ATOMIC_ACQUIRE) >> 32));
        gs_futex(&pool->wake, FUTEX_WAIT | FUTEX_PRIVATE_FLAG, seen,
                 NULL); /* returns at once if a job came meanwhile */
    }
    return NULL;
}

static void wake_all(gs_ps_pool *pool)
{
    __atomic_fetch_add(&pool->wake, 1, __ATOMIC_RELEASE);
    gs_futex(&pool->wake, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, INT_MAX, NULL);
}

gs_status gs_ps_pool_create(int rank, int helpers, gs_ps_pool **pool_p)
{
    gs_ps_pool *pool = gs_calloc(1, sizeof(*pool));
    gs_status st = GS_OK;
    if (!pool || !(pool->threads = gs_calloc((size_t)helpers, sizeof(pthread_t)))) {
        free(pool);
        return GS_ERR_NOMEM;
    }
    for (; pool->nthreads < helpers; pool->nthreads++) {
        int err = pthread_create(&pool->threads[pool->nthreads], NULL, helper, pool);
        if (err) {
            st = gs_fail(GS_SUBSYS_PS, GS_ERR_SYSTEM,
                         "rank %d: cannot start apply thread %d of %d: %s (lower GS_PS_APPLY_THREADS)", rank,
                         pool->nthreads + 1, helpers, strerror(err));
            break;
        }
    }
    if (st != GS_OK) {
        gs_ps_pool_destroy(pool);
        return st;
    }
    *pool_p = pool;
    return GS_OK;
}

void gs_ps_pool_destroy(gs_ps_pool *pool)
{
    if (!pool)
        return;
    __atomic_store_n(&pool->stop, true, __ATOMIC_RELEASE);
    wake_all(pool);
    for (int i = 0; i < pool->nthreads; i++)
        pthread_join(pool->threads[i], NULL);
    free(pool->threads);
    free(pool);
}

void gs_ps_pool_apply_sum(gs_ps_pool *pool, const gs_ps_optim *o, float *w, const float *const *grads,
                          int ngrads, float grad_scale, float *const *state, uint64_t step, size_t count)
{
    size_t chunk = CHUNK_MIN, nchunks;
    uint32_t gen, spins = 0;
    if (!pool || count < (size_t)SHARE_MIN || ngrads > GS_PS_FUSE_MAX) {
        gs_ps_optim_apply_sum(o, w, grads, ngrads, grad_scale, state, step, count);
        return;
    }
    while ((count + chunk - 1) / chunk > CHUNKS_MAX)
        chunk *= 2;
    nchunks = (count + chunk - 1) / chunk;
    /* Step 1: the job, then the claim word that publishes it; wake the helpers. */
    gen = (uint32_t)(__atomic_load_n(&pool->claim, __ATOMIC_RELAXED) >> 32) + 1;
    pool->job = (pool_job){.o = o,
                           .w = w,
                           .grads = grads,
                           .ngrads = ngrads,
                           .scale = grad_scale,
                           .state = {state[0], state[1]},
                           .step = step,
                           .count = count,
                           .chunk = chunk};
    __atomic_store_n(&pool->done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&pool->claim, (uint64_t)gen << 32 | (uint64_t)nchunks << 16, __ATOMIC_RELEASE);
    wake_all(pool);
    /* Step 2: take chunks like any helper. */
    work(pool, gen);
    /* Step 3: wait for the chunks helpers took (each a fraction of a millisecond of work). */
    while (__atomic_load_n(&pool->done, __ATOMIC_ACQUIRE) < nchunks) {
        if (++spins < SPIN_TURNS)
            gs_cpu_relax();
        else
            sched_yield();
    }
}
