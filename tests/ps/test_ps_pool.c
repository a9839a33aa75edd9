/* The server's apply threads: a shard's fused sum + optimizer shared among
 * threads equals the single-threaded pass bit for bit, for every optimizer,
 * gradient count and thread count, step after step. */
#include "gs_test.h"
#include "ps/pool.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define COUNT ((size_t)5 * 65536 + 12345) /* shared (1 MiB and more), several chunks, a ragged end */
#define STEPS 3

static float *floats(size_t n)
{
    float *p = calloc(n, sizeof(float));
    if (!p)
        abort();
    return p;
}

/* Runs STEPS steps both ways; true when weights and optimizer state agree bit for bit. */
static bool same_as_one_thread(gs_ps_optim o, int ngrads, int helpers)
{
    gs_ps_pool *pool = NULL;
    float *w = floats(COUNT), *wr = floats(COUNT), *g[3];
    float *st[2] = {floats(COUNT), floats(COUNT)}, *str[2] = {floats(COUNT), floats(COUNT)};
    bool same;
    for (int k = 0; k < ngrads; k++)
        g[k] = floats(COUNT);
    for (size_t i = 0; i < COUNT; i++)
        w[i] = wr[i] = 0.001f * (float)(i % 1000) - 0.5f;
    if (gs_ps_pool_create(0, helpers, &pool) != GS_OK)
        abort();
    for (uint64_t t = 1; t <= STEPS; t++) {
        for (int k = 0; k < ngrads; k++)
            for (size_t i = 0; i < COUNT; i++)
                g[k][i] = sinf((float)(i * 3 + (size_t)k * 11 + t)) * 0.25f;
        gs_ps_pool_apply_sum(pool, &o, w, (const float *const *)g, ngrads, 0.5f, st, t, COUNT);
        gs_ps_optim_apply_sum(&o, wr, (const float *const *)g, ngrads, 0.5f, str, t, COUNT);
    }
    gs_ps_pool_destroy(pool);
    same = memcmp(w, wr, COUNT * sizeof(float)) == 0 && memcmp(st[0], str[0], COUNT * sizeof(float)) == 0 &&
           memcmp(st[1], str[1], COUNT * sizeof(float)) == 0 &&
           w[COUNT - 1] != 0.001f * (float)((COUNT - 1) % 1000) - 0.5f;
    free(w);
    free(wr);
    for (int k = 0; k < ngrads; k++)
        free(g[k]);
    for (int s = 0; s < 2; s++) {
        free(st[s]);
        free(str[s]);
    }
    return same;
}

GS_TEST(pool_equals_one_thread_bit_for_bit)
{
    const gs_ps_optim optims[] = {
        {.kind = GS_PS_SGD, .lr = 0.1f, .weight_decay = 0.01f},
        {.kind = GS_PS_MOMENTUM, .lr = 0.1f, .momentum = 0.9f},
        {.kind = GS_PS_ADAM, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f},
    };
    for (size_t o = 0; o < sizeof(optims) / sizeof(optims[0]); o++)
        for (int ngrads = 2; ngrads <= 3; ngrads++)
            for (int helpers = 1; helpers <= 3; helpers += 2)
                GS_ASSERT(same_as_one_thread(optims[o], ngrads, helpers));
}

GS_TEST(pool_created_and_destroyed_without_work)
{
    gs_ps_pool *pool = NULL;
    GS_ASSERT_OK(gs_ps_pool_create(0, 2, &pool));
    GS_ASSERT(pool != NULL);
    gs_ps_pool_destroy(pool);
    gs_ps_pool_destroy(NULL);
}
