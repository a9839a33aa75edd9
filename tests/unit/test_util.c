/* Status table, configuration parsing, logging and allocation. */
#include "gs_test.h"
#include "util/affinity.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/config.h"
#include "util/log.h"

#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct fake_env {
    const char *const *pairs; /* name, value, name, value, ..., NULL */
} fake_env;

static const char *fake_getenv(const char *name, void *arg)
{
    const fake_env *env = arg;
    for (const char *const *p = env->pairs; *p; p += 2)
        if (strcmp(*p, name) == 0)
            return p[1];
    return NULL;
}

static gs_status parse_with(gs_config *cfg, const char *const *pairs)
{
    fake_env env = {pairs};
    return gs_config_parse(cfg, fake_getenv, &env);
}

GS_TEST(status_names_and_messages_come_from_one_table)
{
    GS_ASSERT_EQ(GS_OK, 0);
    GS_ASSERT_STR_EQ(gs_status_name(GS_ERR_TIMEOUT), "GS_ERR_TIMEOUT");
    GS_ASSERT_STR_EQ(gs_status_name(GS_ERR_PEER_LOST), "GS_ERR_PEER_LOST");
    GS_ASSERT_STR_EQ(gs_status_name((gs_status)-999), "GS_UNKNOWN");
    GS_ASSERT_STR_EQ(gs_strerror(GS_OK), "success");
    GS_ASSERT_CONTAINS(gs_strerror(GS_ERR_REMOTE_ACCESS), "remote access");
#define CHECK_NEGATIVE(name, value, msg) GS_ASSERT(GS_##name <= 1);
    GS_STATUS_TABLE(CHECK_NEGATIVE)
#undef CHECK_NEGATIVE
}

GS_TEST(last_error_keeps_the_detail)
{
    gs_status st =
        gs_fail(GS_SUBSYS_UTIL, GS_ERR_PEER_LOST, "rank %d: peer %d gone during %s", 1, 3, "barrier");
    GS_ASSERT_EQ(st, GS_ERR_PEER_LOST);
    GS_ASSERT_STR_EQ(gs_last_error(),
                     "rank 1: peer 3 gone during barrier"); /* the status is the return value */
}

/* A caller adding its context to the detail passes gs_last_error() itself:
 * the text is whole, not cut or garbled by the overlap. */
GS_TEST(last_error_may_be_an_argument_of_the_next)
{
    gs_fail(GS_SUBSYS_UTIL, GS_ERR_IO, "rank 0: reading the checkpoint failed: %s",
            "No space left on device");
    gs_fail(GS_SUBSYS_UTIL, GS_ERR_IO, "rank 0: restore #%d: %s", 3, gs_last_error());
    GS_ASSERT_STR_EQ(gs_last_error(),
                     "rank 0: restore #3: rank 0: reading the checkpoint failed: No space left on device");
    gs_error_restore(gs_last_error() + 8); /* a part of itself */
    GS_ASSERT_STR_EQ(gs_last_error(),
                     "restore #3: rank 0: reading the checkpoint failed: No space left on device");
}

GS_TEST(peer_lost_sentence_reads_back)
{
    char text[256], cause[128];
    int peer = -1, writer = -1;
    gs_error_peer_lost_text(text, sizeof(text), 2, 1, "Connection reset by peer");
    GS_ASSERT_STR_EQ(text, "rank 2: rank 1 lost (connection reset by peer): did it exit or crash?");
    gs_error_peer_lost_text(text, sizeof(text), 2, 1, "WRITE_IMM to it failed");
    GS_ASSERT_STR_EQ(text, "rank 2: rank 1 lost (WRITE_IMM to it failed): did it exit or crash?");
    GS_ASSERT(gs_error_peer_lost_parse(gs_error_skip_rank(text, &writer), &peer, cause, sizeof(cause)));
    GS_ASSERT_EQ(writer, 2);
    GS_ASSERT_EQ(peer, 1);
    GS_ASSERT_STR_EQ(cause, "WRITE_IMM to it failed");
    GS_ASSERT(!gs_error_peer_lost_parse(text, &peer, cause, sizeof(cause))); /* with its "rank 2: " */
    GS_ASSERT(!gs_error_peer_lost_parse("rank 1 lost (x): did it exit?", &peer, cause, sizeof(cause)));
    GS_ASSERT(gs_error_skip_rank("ranks 2: x", &writer) != NULL && writer == -1);
    GS_ASSERT_EQ(gs_fail_peer_lost(GS_SUBSYS_UTIL, 0, 3, "its process %d is gone", 77), GS_ERR_PEER_LOST);
    GS_ASSERT_STR_EQ(gs_last_error(), "rank 0: rank 3 lost (its process 77 is gone): did it exit or crash?");
}

GS_TEST(config_defaults_parse)
{
    static const char *const none[] = {NULL};
    gs_config cfg;
    GS_ASSERT_OK(parse_with(&cfg, none));
    GS_ASSERT_EQ(cfg.timeout_ms, 30000);
    GS_ASSERT_EQ(cfg.transport, GS_TRANSPORT_AUTO);
    GS_ASSERT_EQ(cfg.poll, GS_POLL_HYBRID);
    GS_ASSERT_U64_EQ(cfg.chunk_bytes, 256 * 1024);
    GS_ASSERT_EQ(cfg.rank, -1);
    GS_ASSERT_EQ(cfg.ib_fork_safe, 0);
}

GS_TEST(config_parses_every_form)
{
    static const char *const env[] = {"GS_TIMEOUT_MS",
                                      "1500",
                                      "GS_TRANSPORT",
                                      "TCP",
                                      "GS_CHUNK_BYTES",
                                      "4M",
                                      "GS_IB_FORK_SAFE",
                                      "yes",
                                      "GS_STORE",
                                      "10.0.0.1:29500",
                                      "GS_PS_SHARD_BYTES",
                                      "64KiB",
                                      NULL};
    gs_config cfg;
    char buf[64];
    GS_ASSERT_OK(parse_with(&cfg, env));
    GS_ASSERT_EQ(cfg.timeout_ms, 1500);
    GS_ASSERT_EQ(cfg.transport, GS_TRANSPORT_TCP);
    GS_ASSERT_U64_EQ(cfg.chunk_bytes, 4u << 20);
    GS_ASSERT_U64_EQ(cfg.ps_shard_bytes, 64u << 10);
    GS_ASSERT_EQ(cfg.ib_fork_safe, 1);
    GS_ASSERT_STR_EQ(cfg.store, "10.0.0.1:29500");
    for (int i = 0; i < gs_param_count(); i++) {
        if (strcmp(gs_param_at(i)->name, "GS_TRANSPORT") == 0) {
            gs_param_format(&cfg, i, buf, sizeof(buf));
            GS_ASSERT_STR_EQ(buf, "tcp");
        }
    }
}

static void expect_config_error(const char *var, const char *value, const char *form)
{
    const char *const env[] = {var, value, NULL};
    gs_config cfg;
    GS_ASSERT_STATUS(parse_with(&cfg, env), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), var);
    GS_ASSERT_CONTAINS(gs_last_error(), form);
}

GS_TEST(config_rejects_malformed_values_naming_the_variable)
{
    expect_config_error("GS_TIMEOUT_MS", "10s", "decimal integer");
    expect_config_error("GS_TIMEOUT_MS", "0", "positive");
    expect_config_error("GS_TIMEOUT_MS", "", "decimal integer");
    expect_config_error("GS_TRANSPORT", "rdma", "auto|shm|tcp|verbs");
    expect_config_error("GS_CHUNK_BYTES", "-4K", "byte count");
    expect_config_error("GS_CHUNK_BYTES", "4X", "byte count");
    expect_config_error("GS_CHUNK_BYTES", "99999999999999999999", "byte count");
    expect_config_error("GS_CHUNK_BYTES", "100", "at least 4K");
    expect_config_error("GS_IB_FORK_SAFE", "maybe", "yes/no");
    expect_config_error("GS_POLL", "spinning", "spin|event|hybrid");
}

GS_TEST(config_warns_about_unknown_variables_with_the_closest_name)
{
    char *envp[] = {"GS_TIMEOUT_MS=5", "GS_TIMEOUT=5",      "GS_TRANSPRT=tcp",
                    "PATH=/bin",       "GS_ZZZZZZZZZZZZ=1", "GS_TEST_TRANSPORT=tcp",
                    "GS_RXE_OUT=/x",   "GS_TOOLS_DIR=/b",   NULL};
    GS_ASSERT_EQ(gs_config_warn_unknown(envp), 3);
    GS_ASSERT_STR_EQ(gs_param_closest("GS_TIMEOUT"), "GS_TIMEOUT_MS");
    GS_ASSERT_STR_EQ(gs_param_closest("GS_TRANSPRT"), "GS_TRANSPORT");
    GS_ASSERT_STR_EQ(gs_param_closest("GS_LOG_LEVL"), "GS_LOG_LEVEL");
    GS_ASSERT(gs_param_closest("GS_ZZZZZZZZZZZZ") == NULL);
}

typedef struct check_log {
    int count;
    int params[8];
    char text[2048];
} check_log;

static void log_problem(int param, const char *problem, void *arg)
{
    check_log *log = arg;
    if (log->count < 8)
        log->params[log->count] = param;
    log->count++;
    strncat(log->text, problem, sizeof(log->text) - strlen(log->text) - 2);
    strcat(log->text, "\n");
}

static int param_index(const char *var)
{
    for (int i = 0; i < gs_param_count(); i++)
        if (strcmp(gs_param_at(i)->name, var) == 0)
            return i;
    return -1;
}

GS_TEST(config_check_reports_every_problem_and_keeps_the_rest)
{
    char *envp[] = {"GS_TIMEOUT_MS=soon", "GS_ALGO=ring", "GS_LOG_SUBSYS=disk",    "GS_CHUNK_BYTES=1K",
                    "GS_TRANSPRT=tcp",    "PATH=/bin",    "GS_TEST_TRANSPORT=tcp", NULL};
    char *clean[] = {"GS_ALGO=rd", "HOME=/", NULL};
    check_log log = {0};
    gs_config cfg;
    GS_ASSERT_EQ(gs_config_check(envp, &cfg, log_problem, &log), 4);
    GS_ASSERT_EQ(log.count, 4);
    /* each malformed value in table order, then the range checks, then unknown names */
    GS_ASSERT_EQ(log.params[0], param_index("GS_TIMEOUT_MS"));
    GS_ASSERT_EQ(log.params[1], param_index("GS_CHUNK_BYTES"));
    GS_ASSERT_EQ(log.params[2], param_index("GS_LOG_SUBSYS"));
    GS_ASSERT_EQ(log.params[3], -1);
    GS_ASSERT_CONTAINS(log.text, "GS_TIMEOUT_MS='soon' is not valid: expected a decimal integer\n");
    GS_ASSERT_CONTAINS(log.text, "GS_CHUNK_BYTES=1024 is not valid: expected at least 4K\n");
    GS_ASSERT_CONTAINS(log.text, "GS_LOG_SUBSYS='disk' is not valid");
    GS_ASSERT_CONTAINS(log.text, "unknown variable GS_TRANSPRT ignored; did you mean GS_TRANSPORT?");
    /* defaults stand in for the malformed values; the good one is kept */
    GS_ASSERT_EQ(cfg.timeout_ms, 30000);
    GS_ASSERT_U64_EQ(cfg.chunk_bytes, 256 * 1024);
    GS_ASSERT_STR_EQ(cfg.log_subsys, "all");
    GS_ASSERT_EQ(cfg.algo, GS_ALGO_RING);
    memset(&log, 0, sizeof(log));
    GS_ASSERT_EQ(gs_config_check(clean, &cfg, log_problem, &log), 0);
    GS_ASSERT_EQ(log.count, 0);
    GS_ASSERT_EQ(cfg.algo, GS_ALGO_RD);
}

/* The public form (gradsync.h): a configuration of an environment, every
 * problem reported, values by name as gsinfo prints them. */
GS_TEST(public_config_reads_an_environment_and_gives_values_by_name)
{
    char *envp[] = {"GS_CHUNK_BYTES=12Q", "GS_ALGO=ring", "GS_TRANSPRT=tcp", "GS_JOB_TOKEN=secret", NULL};
    char *clean[] = {"HOME=/", NULL};
    check_log log = {0};
    gs_config *cfg = NULL;
    char buf[64];
    int problems = -1;
    uint64_t size = 0;

    GS_ASSERT_OK(gs_config_create(envp, log_problem, &log, &problems, &cfg));
    GS_ASSERT_EQ(problems, 2);
    GS_ASSERT_EQ(log.count, 2);
    GS_ASSERT_EQ(log.params[0], param_index("GS_CHUNK_BYTES"));
    GS_ASSERT_EQ(log.params[1], -1);
    GS_ASSERT_CONTAINS(log.text, "GS_CHUNK_BYTES='12Q' is not valid");
    GS_ASSERT_OK(gs_config_value(cfg, "GS_CHUNK_BYTES", buf, sizeof(buf)));
    GS_ASSERT_STR_EQ(buf, "262144"); /* the default stands in */
    GS_ASSERT_OK(gs_config_value(cfg, "GS_ALGO", buf, sizeof(buf)));
    GS_ASSERT_STR_EQ(buf, "ring");
    GS_ASSERT_OK(gs_config_value(cfg, "GS_JOB_TOKEN", buf, sizeof(buf)));
    GS_ASSERT_STR_EQ(buf, "(set)"); /* a secret stays one */
    GS_ASSERT_OK(gs_config_value(cfg, "GS_TIMEOUT_MS", buf, 3));
    GS_ASSERT_STR_EQ(buf, "30"); /* truncated to cap - 1 */
    GS_ASSERT_STATUS(gs_config_value(cfg, "GS_CHUNK_BYTE", buf, sizeof(buf)), GS_ERR_INVALID);
    GS_ASSERT_CONTAINS(gs_last_error(),
                       "gs_config_value: no parameter GS_CHUNK_BYTE (did you mean GS_CHUNK_BYTES?)");
    GS_ASSERT_STATUS(gs_config_value(cfg, "GS_ALGO", buf, 0), GS_ERR_INVALID);
    gs_config_destroy(cfg);
    /* no report function, a clean environment */
    GS_ASSERT_OK(gs_config_create(clean, NULL, NULL, &problems, &cfg));
    GS_ASSERT_EQ(problems, 0);
    GS_ASSERT_OK(gs_config_value(cfg, "GS_JOB_TOKEN", buf, sizeof(buf)));
    GS_ASSERT_STR_EQ(buf, "");
    gs_config_destroy(cfg);
    GS_ASSERT_STATUS(gs_config_create(clean, NULL, NULL, NULL, NULL), GS_ERR_INVALID);
    /* the table and the size forms */
    GS_ASSERT(gs_param_at(-1) == NULL && gs_param_at(gs_param_count()) == NULL);
    GS_ASSERT_STR_EQ(gs_param_at(param_index("GS_ALGO"))->choices, "auto|ring|rd|direct|hier");
    GS_ASSERT_STR_EQ(gs_param_at(param_index("GS_CHUNK_BYTES"))->type, "SIZE");
    GS_ASSERT_STR_EQ(gs_param_at(param_index("GS_CHUNK_BYTES"))->default_value, "256K");
    GS_ASSERT_OK(gs_size_parse("64K", &size));
    GS_ASSERT_U64_EQ(size, 65536);
    GS_ASSERT_OK(gs_size_parse("2G", &size));
    GS_ASSERT_U64_EQ(size, 2ull << 30);
    GS_ASSERT_STATUS(gs_size_parse("1x", &size), GS_ERR_CONFIG);
    GS_ASSERT_STATUS(gs_size_parse("-1", &size), GS_ERR_CONFIG);
}

GS_TEST(config_parse_stops_at_a_bad_log_subsys)
{
    expect_config_error("GS_LOG_SUBSYS", "tcp,disk", "comma-separated list");
}

GS_TEST(config_process_copy_reports_bad_environment)
{
    const gs_config *cfg;
    setenv("GS_TIMEOUT_MS", "soon", 1);
    GS_ASSERT_STATUS(gs_config_get(&cfg), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), "GS_TIMEOUT_MS='soon'");
}

GS_TEST(log_lines_carry_host_pid_rank_and_honor_level_and_subsys)
{
    char path[] = "/tmp/gs_test_log_XXXXXX", text[4096] = {0}, expect[64];
    int fd = mkstemp(path);
    GS_ASSERT_GE(fd, 0);
    GS_ASSERT_OK(gs_log_configure(GS_LOG_INFO, "boot,tcp", path));
    gs_log_set_rank(5);
    gs_log_info(BOOT, "store up on port %d", 1234);
    gs_log_debug(BOOT, "too detailed");
    gs_log_info(SHM, "other subsystem");
    gs_log_warn(TCP, "tcp warning");
    GS_ASSERT_GT(read(fd, text, sizeof(text) - 1), 0);
    close(fd);
    unlink(path);
    snprintf(expect, sizeof(expect), ":%d r5 ", (int)getpid());
    GS_ASSERT_CONTAINS(text, expect);
    GS_ASSERT_CONTAINS(text, "INFO boot: store up on port 1234");
    GS_ASSERT_CONTAINS(text, "WARN tcp: tcp warning");
    GS_ASSERT(!strstr(text, "too detailed"));
    GS_ASSERT(!strstr(text, "other subsystem"));
    GS_ASSERT_STATUS(gs_log_configure(GS_LOG_INFO, "boot,nosuch", NULL), GS_ERR_CONFIG);
}

GS_TEST(pages_are_aligned_and_touched)
{
    void *p;
    size_t len = 3 * gs_page_size() + 5;
    GS_ASSERT_OK(gs_pages_alloc(len, &p));
    GS_ASSERT_EQ((uintptr_t)p % gs_page_size(), 0);
    memset(p, 0xab, len);
    GS_ASSERT_EQ(((unsigned char *)p)[len - 1], 0xab);
    gs_pages_free(p, len);
}

GS_TEST(deadlines_expire)
{
    uint64_t d = gs_deadline_after_ms(20);
    GS_ASSERT(!gs_deadline_passed(d));
    GS_ASSERT_LE(gs_deadline_left_ms(d), 20);
    usleep(30000);
    GS_ASSERT(gs_deadline_passed(d));
    GS_ASSERT_EQ(gs_deadline_left_ms(d), 0);
    GS_ASSERT_EQ(gs_deadline_left_ms(gs_deadline_after_ms(-1)), -1);
}

GS_TEST(dtype_sizes_and_names)
{
    GS_ASSERT_EQ(gs_dtype_size(GS_BF16), 2);
    GS_ASSERT_EQ(gs_dtype_size(GS_I64), 8);
    GS_ASSERT_EQ(gs_dtype_size((gs_dtype)99), 0);
    GS_ASSERT_STR_EQ(gs_dtype_name(GS_F16), "f16");
    GS_ASSERT_STR_EQ(gs_redop_name(GS_AVG), "avg");
}

GS_TEST(affinity_pins_by_local_rank_or_rejects_a_bad_list)
{
    cpu_set_t set;
    int cpu = -2;
    GS_ASSERT_OK(gs_affinity_apply("", 0, &cpu));
    GS_ASSERT_EQ(cpu, -1);
    GS_ASSERT_STATUS(gs_affinity_apply("0,x", 0, &cpu), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), "GS_CPU_AFFINITY='0,x'");
    GS_ASSERT_STATUS(gs_affinity_apply("-1", 0, &cpu), GS_ERR_CONFIG);
    GS_ASSERT_OK(gs_affinity_apply("0", 5, &cpu));
    GS_ASSERT_EQ(cpu, 0);
    GS_ASSERT_OK(gs_affinity_apply("auto", 1, &cpu));
    GS_ASSERT_GE(cpu, 0);
    GS_ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
    GS_ASSERT_EQ(CPU_COUNT(&set), 1);
    GS_ASSERT(CPU_ISSET(cpu, &set));
}
