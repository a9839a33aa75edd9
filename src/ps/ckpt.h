/*
 * Checkpoint files of one server (format in ps_proto.h): written whole to a
 * temporary file, fsync'ed and renamed over the old one, so a reader finds
 * either the previous or the new checkpoint, never a mix; read back with
 * every size checked and both CRCs verified.
 */
#ifndef GS_PS_CKPT_H
#define GS_PS_CKPT_H

#include "gradsync.h"
#include "ps/ps_proto.h"

#include <stddef.h>
#include <stdint.h>

/* What the file says about the job, besides the shards. */
typedef struct gs_ps_ckpt_meta {
    gs_ps_optim optim;
    gs_ps_mode mode;
    uint32_t server, servers, workers;
    uint32_t epoch;
    uint64_t shard_bytes;
    uint64_t step; /* smallest shard version */
    const gs_ps_ckpt_key *keys;
    uint32_t nkeys;
} gs_ps_ckpt_meta;

/* One shard: its record and where its arrays are (in the server's memory
 * when writing, in the loaded file when reading). */
typedef struct gs_ps_ckpt_view {
    gs_ps_ckpt_shard rec;
    const uint64_t *applied; /* [workers] pushes of each worker applied */
    const float *params;     /* [rec.count] */
    const float *state[2];   /* [nstate][rec.count] */
} gs_ps_ckpt_view;

/* A checkpoint read back: views point into buf. */
typedef struct gs_ps_ckpt {
    gs_ps_ckpt_meta meta;
    gs_ps_ckpt_view *shards;
    uint32_t nshards;
    void *buf;
    size_t len;
} gs_ps_ckpt;

/* "<prefix>.server<i>.ckpt". */
void gs_ps_ckpt_path(char *buf, size_t cap, const char *prefix, uint32_t server);
/* Writes atomically (see above). GS_ERR_IO naming the file and the failing
 * step; the old file is then untouched. */
gs_status gs_ps_ckpt_write(const char *path, const gs_ps_ckpt_meta *meta, const gs_ps_ckpt_view *shards,
                           uint32_t nshards);
/* *ck_p = NULL when the file does not exist; GS_ERR_IO when it cannot be
 * read or is damaged (bad magic, version, sizes or CRC), naming which. */
gs_status gs_ps_ckpt_read(const char *path, gs_ps_ckpt **ck_p);
void gs_ps_ckpt_free(gs_ps_ckpt *ck);

#endif
