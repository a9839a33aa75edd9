/* A server's checkpoint files: writing one (temporary file, fsync, rename)
 * and reading one back with every size and both CRCs checked (ckpt.h; the
 * format is ps_proto.h's). Knows files and shards, not the transport. */
#include "ps/ckpt.h"

#include "util/crc32c.h"
#include "ps/optim.h"
#include "util/alloc.h"
#include "util/log.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void gs_ps_ckpt_path(char *buf, size_t cap, const char *prefix, uint32_t server)
{
    snprintf(buf, cap, "%s.server%u.ckpt", prefix, server);
}

/* ---- writing ------------------------------------------------------------ */

typedef struct ckpt_writer {
    int fd;
    const char *path; /* the temporary file, for errors */
    uint32_t crc;
    uint64_t bytes;
    gs_status st;
} ckpt_writer;

static void put_raw(ckpt_writer *w, const void *data, size_t len)
{
    const char *p = data;
    while (w->st == GS_OK && len > 0) {
        ssize_t n = write(w->fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            w->st = gs_fail(GS_SUBSYS_PS, GS_ERR_IO, "checkpoint: writing %s failed: %s (check disk space)",
                            w->path, n < 0 ? strerror(errno) : "no progress");
        else {
            p += n;
            len -= (size_t)n;
        }
    }
}

/* Appends to the payload (counted in the CRC). */
static void put(ckpt_writer *w, const void *data, size_t len)
{
    w->crc = gs_crc32c(w->crc, data, len);
    w->bytes += len;
    put_raw(w, data, len);
}

static uint32_t header_crc(const gs_ps_ckpt_header *h)
{
    gs_ps_ckpt_header copy = *h;
    copy.header_crc = 0;
    return gs_crc32c(0, &copy, sizeof(copy));
}

/* The fields the header shares by name with gs_ps_ckpt_meta, and with its
 * optimizer: fill_header copies them in, meta_from_header back. */
#define CKPT_META_FIELDS(X)  X(server) X(servers) X(workers) X(nkeys) X(epoch) X(step) X(shard_bytes)
#define CKPT_OPTIM_FIELDS(X) X(lr) X(momentum) X(beta1) X(beta2) X(eps) X(weight_decay)

static void fill_header(gs_ps_ckpt_header *h, const gs_ps_ckpt_meta *m, uint32_t nshards)
{
    memset(h, 0, sizeof(*h));
    memcpy(h->magic, GS_PS_CKPT_MAGIC, sizeof(h->magic));
    h->version = GS_PS_CKPT_VERSION;
    h->optimizer = (uint8_t)m->optim.kind;
    h->mode = (uint8_t)m->mode;
    h->nstate = (uint8_t)gs_ps_optim_nstate(m->optim.kind);
    h->header_bytes = sizeof(*h);
    h->nshards = nshards;
#define TO_HEADER(f)       h->f = m->f;
#define OPTIM_TO_HEADER(f) h->f = m->optim.f;
    CKPT_META_FIELDS(TO_HEADER)
    CKPT_OPTIM_FIELDS(OPTIM_TO_HEADER)
#undef TO_HEADER
#undef OPTIM_TO_HEADER
}

/* f32 arrays are padded to 8 bytes so that every record stays 8-byte aligned. */
static uint64_t padded(uint64_t count)
{
    return (count * sizeof(float) + 7) / 8 * 8;
}

static void put_array(ckpt_writer *w, const float *data, uint64_t count)
{
    static const char zeros[8];
    put(w, data, count * sizeof(float));
    put(w, zeros, padded(count) - count * sizeof(float));
}

static void put_payload(ckpt_writer *w, const gs_ps_ckpt_meta *m, const gs_ps_ckpt_view *shards,
                        uint32_t nshards)
{
    int nstate = gs_ps_optim_nstate(m->optim.kind);
    put(w, m->keys, (size_t)m->nkeys * sizeof(*m->keys));
    for (uint32_t i = 0; i < nshards; i++) {
        const gs_ps_ckpt_view *v = &shards[i];
        put(w, &v->rec, sizeof(v->rec));
        put(w, v->applied, (size_t)m->workers * sizeof(uint64_t));
        put_array(w, v->params, v->rec.count);
        for (int s = 0; s < nstate; s++)
            put_array(w, v->state[s], v->rec.count);
    }
}

static gs_status sync_dir(const char *path)
{
    char copy[PATH_MAX];
    int fd;
    gs_status st = GS_OK;
    snprintf(copy, sizeof(copy), "%s", path);
    fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0)
        st = gs_fail(GS_SUBSYS_PS, GS_ERR_IO, "checkpoint: syncing the directory of %s failed: %s", path,
                     strerror(errno));
    if (fd >= 0)
        close(fd);
    return st;
}

gs_status gs_ps_ckpt_write(const char *path, const gs_ps_ckpt_meta *meta, const gs_ps_ckpt_view *shards,
                           uint32_t nshards)
{
    char tmp[PATH_MAX];
    gs_ps_ckpt_header h;
    ckpt_writer w = {.fd = -1, .path = tmp};

    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    w.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (w.fd < 0)
        return gs_fail(GS_SUBSYS_PS, GS_ERR_IO,
                       "checkpoint: creating %s failed: %s (is GS_PS_CHECKPOINT a "
                       "writable path prefix?)",
                       tmp, strerror(errno));
    /* Step 1: the payload after a placeholder header, its CRC on the way. */
    fill_header(&h, meta, nshards);
    put_raw(&w, &h, sizeof(h));
    put_payload(&w, meta, shards, nshards);
    /* Step 2: the real header, then everything to disk. */
    h.payload_bytes = w.bytes;
    h.payload_crc = w.crc;
    h.header_crc = header_crc(&h);
    if (w.st == GS_OK && pwrite(w.fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h))
        w.st = gs_fail(GS_SUBSYS_PS, GS_ERR_IO, "checkpoint: writing the header of %s failed: %s", tmp,
                       strerror(errno));
    if (w.st == GS_OK && fsync(w.fd) != 0)
        w.st = gs_fail(GS_SUBSYS_PS, GS_ERR_IO, "checkpoint: fsync of %s failed: %s", tmp, strerror(errno));
    if (close(w.fd) != 0 && w.st == GS_OK)
        w.st = gs_fail(GS_SUBSYS_PS, GS_ERR_IO, "checkpoint: closing %s failed: %s", tmp, strerror(errno));
    /* Step 3: replace the old file in one step. */
    if (w.st == GS_OK && rename(tmp, path) != 0)
        w.st = gs_fail(GS_SUBSYS_PS, GS_ERR_IO, "checkpoint: renaming %s to %s failed: %s", tmp, path,
                       strerror(errno));
    if (w.st != GS_OK)
        unlink(tmp);
    else
        w.st = sync_dir(path);
    return w.st;
}

/* ---- reading ------------------------------------------------------------ */

static gs_status load_file(const char *path, void **buf_p, size_t *len_p, int *missing_p)
{
    struct stat sb;
    char *buf = NULL;
    size_t got = 0;
    gs_status st = GS_OK;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    *missing_p = fd < 0 && errno == ENOENT;
    if (fd < 0)
        return *missing_p ? GS_OK
                          : gs_fail(GS_SUBSYS_PS, GS_ERR_IO, "checkpoint: opening %s failed: %s", path,
                                    strerror(errno));
    if (fstat(fd, &sb) != 0)
        st = gs_fail(GS_SUBSYS_PS, GS_ERR_IO, "checkpoint: stat of %s failed: %s", path, strerror(errno));
    else if (!(buf = malloc((size_t)sb.st_size + 1)))
        st = gs_fail(GS_SUBSYS_PS, GS_ERR_NOMEM, "checkpoint: no memory to load %s (%lld bytes)", path,
                     (long long)sb.st_size);
    while (st == GS_OK && got < (size_t)sb.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)sb.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            st = gs_fail(GS_SUBSYS_PS, GS_ERR_IO, "checkpoint: reading %s failed: %s", path,
                         n < 0 ? strerror(errno) : "file shrank while reading");
        else
            got += (size_t)n;
    }
    close(fd);
    if (st != GS_OK) {
        free(buf);
        return st;
    }
    *buf_p = buf;
    *len_p = got;
    return GS_OK;
}

/* A bounds-checked walk through the payload. */
typedef struct cursor {
    const char *p;
    size_t left;
} cursor;

static const void *take(cursor *c, uint64_t len)
{
    const void *at = c->p;
    if (len > c->left)
        return NULL;
    c->p += len;
    c->left -= len;
    return at;
}

static gs_status damaged(const char *path, const char *what)
{
    return gs_fail(GS_SUBSYS_PS, GS_ERR_IO,
                   "checkpoint %s is damaged (%s): restore a good copy or remove it to start fresh", path,
                   what);
}

static gs_status check_header(const char *path, const gs_ps_ckpt_header *h, size_t len)
{
    if (memcmp(h->magic, GS_PS_CKPT_MAGIC, sizeof(h->magic)) != 0)
        return damaged(path, "not a gradsync checkpoint: bad magic");
    if (h->version != GS_PS_CKPT_VERSION)
        return damaged(path, "unknown format version");
    if (h->header_bytes != sizeof(*h) || header_crc(h) != h->header_crc)
        return damaged(path, "header CRC mismatch");
    if (h->payload_bytes != len - sizeof(*h))
        return damaged(path, "length differs from the header's (truncated?)");
    if (h->optimizer >= GS_PS_OPTIMIZER_COUNT || h->nstate != gs_ps_optim_nstate(h->optimizer))
        return damaged(path, "unknown optimizer");
    return GS_OK;
}

static void meta_from_header(gs_ps_ckpt_meta *m, const gs_ps_ckpt_header *h)
{
    m->optim = (gs_ps_optim){.kind = (gs_ps_optimizer)h->optimizer};
    m->mode = (gs_ps_mode)h->mode;
#define FROM_HEADER(f)       m->f = h->f;
#define OPTIM_FROM_HEADER(f) m->optim.f = h->f;
    CKPT_META_FIELDS(FROM_HEADER)
    CKPT_OPTIM_FIELDS(OPTIM_FROM_HEADER)
#undef FROM_HEADER
#undef OPTIM_FROM_HEADER
}

static gs_status parse(const char *path, gs_ps_ckpt *ck, const gs_ps_ckpt_header *h)
{
    cursor c = {(const char *)ck->buf + sizeof(*h), (size_t)h->payload_bytes};
    if (gs_crc32c(0, c.p, c.left) != h->payload_crc)
        return damaged(path, "payload CRC mismatch");
    meta_from_header(&ck->meta, h);
    ck->meta.keys = take(&c, (uint64_t)h->nkeys * sizeof(gs_ps_ckpt_key));
    ck->shards = gs_calloc(h->nshards ? h->nshards : 1, sizeof(*ck->shards));
    if (!ck->meta.keys)
        return damaged(path, "key table runs past the end");
    if (!ck->shards)
        return GS_ERR_NOMEM;
    for (uint32_t i = 0; i < h->nshards; i++) {
        gs_ps_ckpt_view *v = &ck->shards[i];
        const gs_ps_ckpt_shard *rec = take(&c, sizeof(*rec));
        if (!rec || rec->count > c.left / sizeof(float))
            return damaged(path, "shard record runs past the end");
        v->rec = *rec;
        v->applied = take(&c, (uint64_t)h->workers * sizeof(uint64_t));
        v->params = take(&c, padded(rec->count));
        for (int s = 0; s < h->nstate; s++)
            v->state[s] = take(&c, padded(rec->count));
        if (!v->applied || !v->params || (h->nstate > 0 && !v->state[h->nstate - 1]))
            return damaged(path, "shard data runs past the end");
    }
    if (c.left != 0)
        return damaged(path, "bytes left after the last shard");
    ck->nshards = h->nshards;
    return GS_OK;
}

gs_status gs_ps_ckpt_read(const char *path, gs_ps_ckpt **ck_p)
{
    gs_ps_ckpt_header h;
    int missing = 0;
    gs_ps_ckpt *ck = gs_calloc(1, sizeof(*ck));
    gs_status st = ck ? load_file(path, &ck->buf, &ck->len, &missing) : GS_ERR_NOMEM;
    if (st == GS_OK && missing) {
        gs_ps_ckpt_free(ck);
        *ck_p = NULL;
        return GS_OK;
    }
    if (st == GS_OK && ck->len < sizeof(h))
        st = damaged(path, "shorter than its header");
    if (st == GS_OK) {
        memcpy(&h, ck->buf, sizeof(h));
        st = check_header(path, &h, ck->len);
    }
    if (st == GS_OK)
        st = parse(path, ck, &h);
    if (st != GS_OK) {
        gs_ps_ckpt_free(ck);
        return st;
    }
    *ck_p = ck;
    return GS_OK;
}

void gs_ps_ckpt_free(gs_ps_ckpt *ck)
{
    if (!ck)
        return;
    free(ck->shards);
    free(ck->buf);
    free(ck);
}
