/* Checkpoints through the job: written on a worker's request and when serving
 * ends; a new job with the same GS_PS_CHECKPOINT resumes from them (the
 * parameters, the optimizer's state and each worker's step), so that the two
 * jobs together equal one uninterrupted run, bit for bit. */
#include "ps_job.h"

#include "ps/ckpt.h"
#include "ps/optim.h"

#include <glob.h>
#include <unistd.h>

enum { FIRST_STEPS = 3, SECOND_STEPS = 2 };

typedef struct reference {
    float *w, *m, *v, *sum, *g;
} reference;

/* The uninterrupted run: steps [0, upto) of the optimizer on the summed gradients. */
static void reference_run(reference *r, const gs_ps_optim *o, int k, int workers, int upto, size_t n)
{
    float *state[2];
    *r = (reference){calloc(n, 4), calloc(n, 4), calloc(n, 4), calloc(n, 4), calloc(n, 4)};
    state[0] = r->m;
    state[1] = r->v;
    ps_fill_init(k, r->w, n);
    for (int t = 0; t < upto; t++) {
        ps_fill_grad(k, 0, (uint64_t)t, r->sum, n);
        for (int w = 1; w < workers; w++) {
            ps_fill_grad(k, w, (uint64_t)t, r->g, n);
            for (size_t i = 0; i < n; i++)
                r->sum[i] = r->sum[i] + r->g[i];
        }
        gs_ps_optim_apply(o, r->w, r->sum, 1.0f / (float)workers, state, (uint64_t)t + 1, n);
    }
}

static void ref_free(reference *r)
{
    free(r->w), free(r->m), free(r->v), free(r->sum), free(r->g);
}

/* Steps [from, from + count) of every key; after each, the parameters equal the reference. */
static void assert_same(const float *got, const float *want, size_t n, int k, int step)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], 4) != 0)
            gs_test_fail_here(__FILE__, __LINE__, "key %d after step %d, element %zu: %.9g, reference %.9g",
                              k, step, i, (double)got[i], (double)want[i]);
}

static void train(gs_ps *ps, ps_job *job, int from, int count)
{
    int me = gs_ps_index(ps), W = gs_ps_num_workers(ps);
    for (int k = 0; k < job->nkeys; k++) {
        size_t n = job->counts[k];
        float *g = malloc(n * 4), *out = malloc(n * 4);
        reference ref;
        /* a resumed job starts where the first left off */
        GS_ASSERT_OK(gs_ps_pull(ps, job->keys[k], out));
        reference_run(&ref, &job->optim, k, W, from, n);
        assert_same(out, ref.w, n, k, from);
        ref_free(&ref);
        for (int t = from; t < from + count; t++) {
            ps_fill_grad(k, me, (uint64_t)t, g, n);
            GS_ASSERT_OK(gs_ps_push_pull(ps, job->keys[k], g, out));
        }
        reference_run(&ref, &job->optim, k, W, from + count, n);
        assert_same(out, ref.w, n, k, from + count);
        ref_free(&ref);
        free(g);
        free(out);
    }
}

static void first_job(gs_ps *ps, ps_job *job)
{
    train(ps, job, 0, FIRST_STEPS);
    if (gs_ps_index(ps) == 0)
        GS_ASSERT_OK(gs_ps_checkpoint(ps)); /* on request, while serving */
}

static void second_job(gs_ps *ps, ps_job *job)
{
    train(ps, job, FIRST_STEPS, SECOND_STEPS);
}

static void remove_checkpoints(const char *prefix)
{
    char pattern[256];
    glob_t g;
    snprintf(pattern, sizeof(pattern), "%s.server*", prefix);
    if (glob(pattern, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++)
            unlink(g.gl_pathv[i]);
        globfree(&g);
    }
}

GS_TEST_TP(checkpoint_on_request_and_resume_in_a_new_job)
{
    char prefix[128], path[160];
    gs_ps_ckpt *ck = NULL;
    snprintf(prefix, sizeof(prefix), "/tmp/gs_ps_ckpt_%s_%d", transport, (int)getpid());
    remove_checkpoints(prefix);
    ps_job job = ps_job_default(transport, 2, 2);
    job.optim = (gs_ps_optim){.kind = GS_PS_ADAM, .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    job.checkpoint = prefix;
    job.checkpoint_every = 0; /* only on request and at the end */
    ps_job_key(&job, 21, 3000);
    ps_job_key(&job, 22, 5);
    job.worker = first_job;
    ps_job_run(&job);
    /* every server's file holds the end of the first job */
    for (int s = 0; s < 2; s++) {
        gs_ps_ckpt_path(path, sizeof(path), prefix, (uint32_t)s);
        GS_ASSERT_OK(gs_ps_ckpt_read(path, &ck));
        GS_ASSERT(ck != NULL);
        GS_ASSERT_EQ(ck->meta.step, FIRST_STEPS);
        GS_ASSERT_EQ(ck->meta.nkeys, 2);
        GS_ASSERT_EQ(ck->meta.optim.kind, GS_PS_ADAM);
        for (uint32_t i = 0; i < ck->nshards; i++) {
            const gs_ps_ckpt_view *v = &ck->shards[i];
            int k = v->rec.key == 21 ? 0 : 1;
            reference ref;
            GS_ASSERT_EQ(v->applied[1], FIRST_STEPS);
            GS_ASSERT_EQ(v->rec.opt_steps, FIRST_STEPS);
            /* parameters and both Adam moments as the uninterrupted run has them */
            reference_run(&ref, &job.optim, k, 2, FIRST_STEPS, job.counts[k]);
            assert_same(v->params, ref.w + v->rec.offset, v->rec.count, k, FIRST_STEPS);
            assert_same(v->state[0], ref.m + v->rec.offset, v->rec.count, k, FIRST_STEPS);
            assert_same(v->state[1], ref.v + v->rec.offset, v->rec.count, k, FIRST_STEPS);
            ref_free(&ref);
        }
        gs_ps_ckpt_free(ck);
    }
    /* a new job with the same prefix carries on from there */
    job.worker = second_job;
    ps_job_run(&job);
    remove_checkpoints(prefix);
}

GS_TEST_TP(checkpoint_of_another_job_shape_is_refused)
{
    char prefix[128];
    snprintf(prefix, sizeof(prefix), "/tmp/gs_ps_ckpt_shape_%s_%d", transport, (int)getpid());
    remove_checkpoints(prefix);
    ps_job job = ps_job_default(transport, 1, 2);
    job.checkpoint = prefix;
    ps_job_key(&job, 1, 100);
    job.worker = first_job;
    ps_job_run(&job);
    /* the same file, read by a job whose optimizer differs: refused, naming what differs */
    ps_job other = ps_job_default(transport, 1, 2);
    gs_ps_ckpt *ck = NULL;
    char path[160];
    gs_ps_ckpt_path(path, sizeof(path), prefix, 0);
    GS_ASSERT_OK(gs_ps_ckpt_read(path, &ck));
    GS_ASSERT(ck && ck->meta.optim.kind == GS_PS_SGD);
    gs_ps_ckpt_free(ck);
    other.checkpoint = prefix;
    other.optim = (gs_ps_optim){.kind = GS_PS_MOMENTUM, .lr = 0.1f, .momentum = 0.5f};
    ps_job_key(&other, 1, 100);
    other.worker = first_job;
    other.expect_create = GS_ERR_CONFIG;
    ps_job_run(&other);
    remove_checkpoints(prefix);
}
