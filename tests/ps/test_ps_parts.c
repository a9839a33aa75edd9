/* The parameter server's parts that need no peers: sharding plan, optimizers,
 * fixed-point conversion, CRC-32C, checkpoint files, formats. */
#include "gs_test.h"
#include "ps/ckpt.h"
#include "util/crc32c.h"
#include "ps/fixed.h"
#include "ps/optim.h"
#include "ps/plan.h"
#include "ps/ps_proto.h"

#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- sharding plan ------------------------------------------------------ */

GS_TEST(plan_cuts_keys_into_near_equal_shards_within_the_limit)
{
    gs_ps_plan plan;
    GS_ASSERT_OK(gs_ps_plan_init(&plan, 3, 4000, sizeof(float)));
    GS_ASSERT_OK(gs_ps_plan_add(&plan, 7, 2501)); /* 10004 bytes: 3 shards of 834/834/833 */
    const gs_ps_key_info *k = gs_ps_plan_find(&plan, 7);
    GS_ASSERT(k != NULL);
    GS_ASSERT_EQ(k->nshards, 3);
    size_t total = 0;
    for (size_t i = 0; i < k->nshards; i++) {
        const gs_ps_shard_info *sh = &plan.shards[k->first_shard + i];
        GS_ASSERT_EQ(sh->offset, total);
        GS_ASSERT_LE(sh->count * sizeof(float), 4000);
        GS_ASSERT_GE(sh->count, 833);
        GS_ASSERT_LE(sh->count, 834);
        GS_ASSERT_EQ(sh->index, i);
        total += sh->count;
    }
    GS_ASSERT_EQ(total, 2501);
    /* one shard per server: each of the three got one */
    GS_ASSERT_EQ(plan.nslots[0], 1);
    GS_ASSERT_EQ(plan.nslots[1], 1);
    GS_ASSERT_EQ(plan.nslots[2], 1);
    gs_ps_plan_free(&plan);
}

GS_TEST(plan_balances_servers_by_bytes)
{
    gs_ps_plan plan;
    uint64_t total = 0, max = 0, min = UINT64_MAX;
    GS_ASSERT_OK(gs_ps_plan_init(&plan, 4, 1 << 16, sizeof(float)));
    /* a mix of big and small keys, like a model's layers */
    static const size_t sizes[] = {1, 100000, 10, 3000, 250000, 64, 64, 17, 50000, 16384, 1 << 20, 5};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        GS_ASSERT_OK(gs_ps_plan_add(&plan, 100 + i, sizes[i]));
        total += sizes[i] * sizeof(float);
    }
    for (int s = 0; s < 4; s++) {
        max = plan.load[s] > max ? plan.load[s] : max;
        min = plan.load[s] < min ? plan.load[s] : min;
    }
    uint64_t sum = 0;
    for (int s = 0; s < 4; s++)
        sum += plan.load[s];
    GS_ASSERT_U64_EQ(sum, total);
    /* greedy least-loaded keeps the spread within one shard */
    GS_ASSERT_LE(max - min, 1 << 16);
    /* slots are dense per server, in plan order */
    uint32_t next[4] = {0};
    for (size_t i = 0; i < plan.nshards; i++) {
        GS_ASSERT_EQ(plan.shards[i].slot, next[plan.shards[i].server]);
        next[plan.shards[i].server]++;
    }
    gs_ps_plan_free(&plan);
}

GS_TEST(plan_is_deterministic_and_refuses_bad_keys)
{
    gs_ps_plan a, b;
    GS_ASSERT_OK(gs_ps_plan_init(&a, 2, 1000, sizeof(float)));
    GS_ASSERT_OK(gs_ps_plan_init(&b, 2, 1000, sizeof(float)));
    for (uint64_t k = 0; k < 20; k++) {
        GS_ASSERT_OK(gs_ps_plan_add(&a, k, 37 * k + 1));
        GS_ASSERT_OK(gs_ps_plan_add(&b, k, 37 * k + 1));
    }
    GS_ASSERT_EQ(a.nshards, b.nshards);
    GS_ASSERT(memcmp(a.shards, b.shards, a.nshards * sizeof(*a.shards)) == 0);
    GS_ASSERT_STATUS(gs_ps_plan_add(&a, 3, 10), GS_ERR_INVALID);
    GS_ASSERT_CONTAINS(gs_last_error(), "already registered");
    GS_ASSERT_STATUS(gs_ps_plan_add(&a, 99, 0), GS_ERR_INVALID);
    gs_ps_plan_free(&a);
    gs_ps_plan_free(&b);
    GS_ASSERT_STATUS(gs_ps_plan_init(&a, 0, 1000, 4), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_ps_plan_init(&a, 1, 3, 4), GS_ERR_INVALID);
}

/* ---- optimizers --------------------------------------------------------- */

/* Each rule written out again, element by element, as the reference. */
static void reference_step(const gs_ps_optim *o, float *w, const float *g, float scale, float *m, float *v,
                           uint64_t t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * scale + o->weight_decay * w[i];
        if (o->kind == GS_PS_SGD) {
            w[i] = w[i] - o->lr * gi;
        } else if (o->kind == GS_PS_MOMENTUM) {
            m[i] = o->momentum * m[i] + gi;
            w[i] = w[i] - o->lr * m[i];
        } else {
            float ss = (float)((double)o->lr / (1.0 - pow((double)o->beta1, (double)t)));
            float bc2 = (float)sqrt(1.0 - pow((double)o->beta2, (double)t));
            m[i] = o->beta1 * m[i] + (1.0f - o->beta1) * gi;
            v[i] = o->beta2 * v[i] + (1.0f - o->beta2) * (gi * gi);
            w[i] = w[i] - ss * (m[i] / (sqrtf(v[i]) / bc2 + o->eps));
        }
    }
}

static void check_optimizer(gs_ps_optim o)
{
    enum { N = 257, STEPS = 5 };
    float w[N], wr[N], g[N], s0[N] = {0}, s1[N] = {0}, r0[N] = {0}, r1[N] = {0};
    float *state[2] = {s0, s1};
    GS_ASSERT_OK(gs_ps_optim_check(&o));
    for (int i = 0; i < N; i++)
        w[i] = wr[i] = 0.01f * (float)(i - 128);
    for (uint64_t t = 1; t <= STEPS; t++) {
        for (int i = 0; i < N; i++)
            g[i] = sinf((float)(i * 7 + (int)t)) * 0.5f;
        gs_ps_optim_apply(&o, w, g, 0.5f, state, t, N);
        reference_step(&o, wr, g, 0.5f, r0, r1, t, N);
    }
    GS_ASSERT(memcmp(w, wr, sizeof(w)) == 0);
    GS_ASSERT(w[3] != 0.01f * (3 - 128)); /* it moved */
}

GS_TEST(optimizers_match_their_formulas_bit_for_bit)
{
    check_optimizer((gs_ps_optim){.kind = GS_PS_SGD, .lr = 0.1f});
    check_optimizer((gs_ps_optim){.kind = GS_PS_SGD, .lr = 0.05f, .weight_decay = 0.01f});
    check_optimizer(
        (gs_ps_optim){.kind = GS_PS_MOMENTUM, .lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-4f});
    check_optimizer(
        (gs_ps_optim){.kind = GS_PS_ADAM, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f});
    check_optimizer((gs_ps_optim){
        .kind = GS_PS_ADAM, .lr = 1e-2f, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-6f, .weight_decay = 0.1f});
}

GS_TEST(optimizer_values_by_hand)
{
    /* SGD: w = 1 - 0.5 * (2 * 0.5 + 0.1 * 1) = 0.45 */
    gs_ps_optim sgd = {.kind = GS_PS_SGD, .lr = 0.5f, .weight_decay = 0.1f};
    float w = 1.0f, g = 2.0f, b = 0.0f, m = 0.0f, v = 0.0f;
    float *st[2] = {&m, &v};
    gs_ps_optim_apply(&sgd, &w, &g, 0.5f, st, 1, 1);
    GS_ASSERT(fabsf(w - 0.45f) < 1e-7f);
    /* momentum: b = 0 + 1 = 1, w = 0 - 1 = -1; then b = 0.5 + 1, w = -1 - 1.5 */
    gs_ps_optim mom = {.kind = GS_PS_MOMENTUM, .lr = 1.0f, .momentum = 0.5f};
    float *mst[1] = {&b};
    w = 0.0f;
    g = 1.0f;
    gs_ps_optim_apply(&mom, &w, &g, 1.0f, mst, 1, 1);
    gs_ps_optim_apply(&mom, &w, &g, 1.0f, mst, 2, 1);
    GS_ASSERT(fabsf(w + 2.5f) < 1e-6f);
    /* Adam's first step moves by lr * sign(g) (up to eps) */
    gs_ps_optim adam = {.kind = GS_PS_ADAM, .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    w = 1.0f;
    g = -3.0f;
    gs_ps_optim_apply(&adam, &w, &g, 1.0f, st, 1, 1);
    GS_ASSERT(fabsf(w - 1.1f) < 1e-6f);
}

GS_TEST(optimizer_check_names_the_bad_field)
{
    gs_ps_optim o = {.kind = GS_PS_ADAM, .lr = 0.1f, .beta1 = 1.0f, .beta2 = 0.9f, .eps = 1e-8f};
    GS_ASSERT_STATUS(gs_ps_optim_check(&o), GS_ERR_INVALID);
    GS_ASSERT_CONTAINS(gs_last_error(), "beta1");
    o = (gs_ps_optim){.kind = GS_PS_SGD, .lr = NAN};
    GS_ASSERT_STATUS(gs_ps_optim_check(&o), GS_ERR_INVALID);
    GS_ASSERT_CONTAINS(gs_last_error(), "lr");
    o = (gs_ps_optim){.kind = GS_PS_OPTIMIZER_COUNT, .lr = 1};
    GS_ASSERT_STATUS(gs_ps_optim_check(&o), GS_ERR_INVALID);
    GS_ASSERT_EQ(gs_ps_optim_nstate(GS_PS_SGD), 0);
    GS_ASSERT_EQ(gs_ps_optim_nstate(GS_PS_MOMENTUM), 1);
    GS_ASSERT_EQ(gs_ps_optim_nstate(GS_PS_ADAM), 2);
}

/* ---- fixed point -------------------------------------------------------- */

GS_TEST(fixed_point_is_exact_for_integers_and_bounded)
{
    gs_ps_fixed fx;
    int64_t q[4], acc[4] = {0};
    float out[4];
    size_t bad = 99;
    GS_ASSERT_OK(gs_ps_fixed_init(&fx, 32, 4));
    GS_ASSERT(fx.bound == INT64_MAX / 4);
    const float g[4] = {3.0f, -7.0f, 0.5f, 1048576.0f};
    for (int w = 0; w < 4; w++) {
        GS_ASSERT_OK(gs_ps_fixed_encode(&fx, g, q, 4, &bad));
        for (int i = 0; i < 4; i++) {
            GS_ASSERT(!gs_ps_fixed_wrapped(acc[i], q[i]));
            acc[i] += q[i];
        }
    }
    gs_ps_fixed_decode(&fx, acc, out, 4);
    GS_ASSERT(out[0] == 12.0f && out[1] == -28.0f && out[2] == 2.0f && out[3] == 4194304.0f);
    /* 2^31 / 4 = 2^29 is the largest magnitude; just above it is refused */
    GS_ASSERT(gs_ps_fixed_max_abs(&fx) < 536870912.0 && gs_ps_fixed_max_abs(&fx) > 536870911.0);
    const float big[3] = {1.0f, -536870912.0f, 2.0f};
    GS_ASSERT_STATUS(gs_ps_fixed_encode(&fx, big, q, 3, &bad), GS_ERR_OVERFLOW);
    GS_ASSERT_EQ(bad, 1);
    const float nan[2] = {0.0f, NAN};
    GS_ASSERT_STATUS(gs_ps_fixed_encode(&fx, nan, q, 2, &bad), GS_ERR_OVERFLOW);
    GS_ASSERT_EQ(bad, 1);
    const float inf[1] = {INFINITY};
    GS_ASSERT_STATUS(gs_ps_fixed_encode(&fx, inf, q, 1, &bad), GS_ERR_OVERFLOW);
    GS_ASSERT_STATUS(gs_ps_fixed_init(&fx, 63, 1), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_ps_fixed_init(&fx, 8, 0), GS_ERR_INVALID);
}

GS_TEST(fixed_point_detects_a_wrap)
{
    GS_ASSERT(gs_ps_fixed_wrapped(INT64_MAX - 5, 6));
    GS_ASSERT(!gs_ps_fixed_wrapped(INT64_MAX - 5, 5));
    GS_ASSERT(gs_ps_fixed_wrapped(INT64_MIN + 1, -2));
    GS_ASSERT(!gs_ps_fixed_wrapped(-5, 5));
    /* a worker's bound times W never wraps; one more does */
    gs_ps_fixed fx;
    int64_t acc = 0;
    GS_ASSERT_OK(gs_ps_fixed_init(&fx, 0, 3));
    for (int w = 0; w < 3; w++) {
        GS_ASSERT(!gs_ps_fixed_wrapped(acc, fx.bound));
        acc += fx.bound;
    }
    GS_ASSERT(gs_ps_fixed_wrapped(acc, fx.bound));
}

GS_TEST(fixed_point_rounds_to_nearest)
{
    gs_ps_fixed fx;
    int64_t q[3];
    size_t bad;
    GS_ASSERT_OK(gs_ps_fixed_init(&fx, 2, 1));
    const float g[3] = {0.3f, -0.3f, 0.125f}; /* *4: 1.2 -> 1, -1.2 -> -1, 0.5 -> 0 (ties to even) */
    GS_ASSERT_OK(gs_ps_fixed_encode(&fx, g, q, 3, &bad));
    GS_ASSERT_EQ(q[0], 1);
    GS_ASSERT_EQ(q[1], -1);
    GS_ASSERT_EQ(q[2], 0);
}

/* ---- CRC-32C -------------------------------------------------------------- */

GS_TEST(crc32c_known_values_and_both_paths_agree)
{
    GS_ASSERT_U64_EQ(gs_crc32c(0, "123456789", 9), 0xe3069283u);
    GS_ASSERT_U64_EQ(gs_crc32c_table(0, "123456789", 9), 0xe3069283u);
    GS_ASSERT_U64_EQ(gs_crc32c(0, "", 0), 0);
    uint8_t buf[1031];
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (uint8_t)(i * 131 + 7);
    for (size_t len = 0; len < sizeof(buf); len += 97) {
        uint32_t whole = gs_crc32c(0, buf, len);
        GS_ASSERT_U64_EQ(whole, gs_crc32c_table(0, buf, len));
        /* continuing over two pieces gives the same */
        GS_ASSERT_U64_EQ(whole, gs_crc32c(gs_crc32c(0, buf, len / 3), buf + len / 3, len - len / 3));
    }
}

/* ---- checkpoint files --------------------------------------------------- */

static void temp_prefix(char *buf, size_t cap)
{
    snprintf(buf, cap, "/tmp/gs_ps_test_%d", (int)getpid());
}

typedef struct ckpt_fixture {
    gs_ps_ckpt_key keys[2];
    uint64_t applied[2][3];
    float params[2][5], m[2][5], v[2][5];
    gs_ps_ckpt_view views[2];
    gs_ps_ckpt_meta meta;
} ckpt_fixture;

static void fixture_init(ckpt_fixture *f)
{
    memset(f, 0, sizeof(*f));
    f->keys[0] = (gs_ps_ckpt_key){11, 5};
    f->keys[1] = (gs_ps_ckpt_key){12, 3};
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < 5; i++) {
            f->params[s][i] = (float)(s * 10 + i) + 0.25f;
            f->m[s][i] = -(float)i;
            f->v[s][i] = (float)(i * i);
        }
        for (int w = 0; w < 3; w++)
            f->applied[s][w] = 40 + (uint64_t)s + (uint64_t)w;
        f->views[s] = (gs_ps_ckpt_view){.rec = {.key = 11 + (uint64_t)s,
                                                .index = 0,
                                                .offset = 0,
                                                .count = s ? 3 : 5,
                                                .version = 42 + (uint64_t)s,
                                                .opt_steps = 42 + (uint64_t)s},
                                        .applied = f->applied[s],
                                        .params = f->params[s],
                                        .state = {f->m[s], f->v[s]}};
    }
    f->meta = (gs_ps_ckpt_meta){
        .optim = {.kind = GS_PS_ADAM, .lr = 0.001f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f},
        .mode = GS_PS_MODE_SYNC,
        .server = 1,
        .servers = 2,
        .workers = 3,
        .epoch = 2,
        .shard_bytes = 4096,
        .step = 42,
        .keys = f->keys,
        .nkeys = 2};
}

GS_TEST(checkpoint_round_trip_keeps_everything)
{
    char prefix[64], path[128];
    ckpt_fixture f;
    gs_ps_ckpt *ck = NULL;
    temp_prefix(prefix, sizeof(prefix));
    gs_ps_ckpt_path(path, sizeof(path), prefix, 1);
    GS_ASSERT_CONTAINS(path, ".server1.ckpt");
    fixture_init(&f);
    GS_ASSERT_OK(gs_ps_ckpt_write(path, &f.meta, f.views, 2));
    GS_ASSERT_OK(gs_ps_ckpt_read(path, &ck));
    GS_ASSERT(ck != NULL);
    GS_ASSERT_EQ(ck->nshards, 2);
    GS_ASSERT_EQ(ck->meta.nkeys, 2);
    GS_ASSERT_EQ(ck->meta.keys[1].key, 12);
    GS_ASSERT_EQ(ck->meta.keys[1].count, 3);
    GS_ASSERT_EQ(ck->meta.optim.kind, GS_PS_ADAM);
    GS_ASSERT(ck->meta.optim.lr == 0.001f);
    GS_ASSERT_EQ(ck->meta.workers, 3);
    GS_ASSERT_EQ(ck->meta.epoch, 2);
    GS_ASSERT_EQ(ck->meta.step, 42);
    for (int s = 0; s < 2; s++) {
        const gs_ps_ckpt_view *v = &ck->shards[s];
        GS_ASSERT_EQ(v->rec.key, 11 + s);
        GS_ASSERT_EQ(v->rec.version, 42 + s);
        GS_ASSERT(memcmp(v->params, f.params[s], v->rec.count * sizeof(float)) == 0);
        GS_ASSERT(memcmp(v->state[0], f.m[s], v->rec.count * sizeof(float)) == 0);
        GS_ASSERT(memcmp(v->state[1], f.v[s], v->rec.count * sizeof(float)) == 0);
        GS_ASSERT(memcmp(v->applied, f.applied[s], sizeof(f.applied[s])) == 0);
    }
    gs_ps_ckpt_free(ck);
    unlink(path);
}

GS_TEST(checkpoint_missing_file_is_not_an_error)
{
    gs_ps_ckpt *ck = (gs_ps_ckpt *)1;
    GS_ASSERT_OK(gs_ps_ckpt_read("/tmp/gs_ps_test_no_such_file.ckpt", &ck));
    GS_ASSERT(ck == NULL);
}

static void flip_byte(const char *path, long at)
{
    FILE *fp = fopen(path, "r+b");
    GS_ASSERT(fp != NULL);
    GS_ASSERT_EQ(fseek(fp, at, SEEK_SET), 0);
    int c = fgetc(fp);
    GS_ASSERT_EQ(fseek(fp, at, SEEK_SET), 0);
    fputc(c ^ 0x40, fp);
    fclose(fp);
}

GS_TEST(checkpoint_damage_is_detected)
{
    char prefix[64], path[128];
    ckpt_fixture f;
    gs_ps_ckpt *ck = NULL;
    struct stat sb;
    temp_prefix(prefix, sizeof(prefix));
    gs_ps_ckpt_path(path, sizeof(path), prefix, 0);
    fixture_init(&f);
    /* a flipped payload byte */
    GS_ASSERT_OK(gs_ps_ckpt_write(path, &f.meta, f.views, 2));
    GS_ASSERT_EQ(stat(path, &sb), 0);
    flip_byte(path, (long)sb.st_size - 9);
    GS_ASSERT_STATUS(gs_ps_ckpt_read(path, &ck), GS_ERR_IO);
    GS_ASSERT_CONTAINS(gs_last_error(), "payload CRC");
    /* a flipped header byte */
    GS_ASSERT_OK(gs_ps_ckpt_write(path, &f.meta, f.views, 2));
    flip_byte(path, 40);
    GS_ASSERT_STATUS(gs_ps_ckpt_read(path, &ck), GS_ERR_IO);
    GS_ASSERT_CONTAINS(gs_last_error(), "header CRC");
    /* truncated */
    GS_ASSERT_OK(gs_ps_ckpt_write(path, &f.meta, f.views, 2));
    GS_ASSERT_EQ(truncate(path, sb.st_size - 4), 0);
    GS_ASSERT_STATUS(gs_ps_ckpt_read(path, &ck), GS_ERR_IO);
    GS_ASSERT_CONTAINS(gs_last_error(), "truncated");
    /* not a checkpoint */
    FILE *fp = fopen(path, "wb");
    fputs("hello, this is not a checkpoint file at all, just some text that is long enough to have a "
          "header's worth of bytes in it, believe it or not",
          fp);
    fclose(fp);
    GS_ASSERT_STATUS(gs_ps_ckpt_read(path, &ck), GS_ERR_IO);
    GS_ASSERT_CONTAINS(gs_last_error(), "magic");
    unlink(path);
}

GS_TEST(checkpoint_replace_is_atomic)
{
    /* a failed write (unwritable directory) leaves the old file as it was */
    char prefix[64], path[128];
    ckpt_fixture f;
    gs_ps_ckpt *ck = NULL;
    temp_prefix(prefix, sizeof(prefix));
    gs_ps_ckpt_path(path, sizeof(path), prefix, 2);
    fixture_init(&f);
    GS_ASSERT_OK(gs_ps_ckpt_write(path, &f.meta, f.views, 2));
    f.meta.step = 43;
    f.params[0][0] = 99.0f;
    GS_ASSERT_OK(gs_ps_ckpt_write(path, &f.meta, f.views, 2));
    GS_ASSERT_OK(gs_ps_ckpt_read(path, &ck));
    GS_ASSERT_EQ(ck->meta.step, 43);
    GS_ASSERT(ck->shards[0].params[0] == 99.0f);
    gs_ps_ckpt_free(ck);
    /* no temporary file is left behind */
    char tmp[160];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    GS_ASSERT(access(tmp, F_OK) != 0);
    GS_ASSERT_STATUS(gs_ps_ckpt_write("/proc/no/such/dir/x.ckpt", &f.meta, f.views, 2), GS_ERR_IO);
    GS_ASSERT_CONTAINS(gs_last_error(), "GS_PS_CHECKPOINT");
    unlink(path);
}

/* ---- formats ------------------------------------------------------------ */

GS_TEST(immediates_round_trip)
{
    uint32_t imm = gs_ps_imm_push(GS_PS_IMM_PUSH, GS_PS_MAX_SERVER_SHARDS - 1, 4097);
    GS_ASSERT_EQ(gs_ps_imm_kind(imm), GS_PS_IMM_PUSH);
    GS_ASSERT_EQ(gs_ps_imm_shard(imm), GS_PS_MAX_SERVER_SHARDS - 1);
    GS_ASSERT_EQ(gs_ps_imm_step(imm), 1);
    imm = gs_ps_imm_push(GS_PS_IMM_ATOMIC, 5, 4095);
    GS_ASSERT_EQ(gs_ps_imm_kind(imm), GS_PS_IMM_ATOMIC);
    GS_ASSERT_EQ(gs_ps_imm_shard(imm), 5);
    GS_ASSERT_EQ(gs_ps_imm_step(imm), 4095);
    imm = gs_ps_imm_notice(GS_PS_MAX_WORKER_SHARDS - 1);
    GS_ASSERT_EQ(gs_ps_imm_kind(imm), GS_PS_IMM_NOTICE);
    GS_ASSERT_EQ(gs_ps_imm_notice_shard(imm), GS_PS_MAX_WORKER_SHARDS - 1);
    imm = gs_ps_imm_ctrl(GS_PS_CTRL_RECOVER, 0xabcdef);
    GS_ASSERT_EQ(gs_ps_imm_kind(imm), GS_PS_IMM_CTRL);
    GS_ASSERT_EQ(gs_ps_imm_ctrl_cmd(imm), GS_PS_CTRL_RECOVER);
    GS_ASSERT_EQ(gs_ps_imm_ctrl_arg(imm), 0xabcdef);
}

GS_TEST(region_layouts_are_aligned)
{
    GS_ASSERT_EQ(gs_ps_param_data_off(1) % GS_PS_ALIGN, 0);
    GS_ASSERT_EQ(gs_ps_param_data_off(3), 64 + 128);
    GS_ASSERT_EQ(gs_ps_param_region_bytes(2, 1), 64 + 64 + 64);
    GS_ASSERT_EQ(gs_ps_slot_bytes(17), 128);
    GS_ASSERT_EQ(gs_ps_acc_data_off(9), 64 + 128);
    GS_ASSERT_EQ(gs_ps_acc_region_bytes(1, 3), 64 + 64 + 64);
}
