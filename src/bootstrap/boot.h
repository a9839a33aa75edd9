/* The context and the bootstrap layer's internal interface. */
#ifndef GS_BOOTSTRAP_BOOT_H
#define GS_BOOTSTRAP_BOOT_H

#include "gradsync.h"
#include "util/config.h"

typedef struct gs_store_client gs_store_client;
typedef struct gs_store_server gs_store_server;

/* Where rank, size and store address came from. */
typedef struct gs_boot_info {
    int rank;
    int size;
    int local_rank;       /* -1 if unknown */
    char store_host[256]; /* host name or address of the store */
    int store_port;
    const char *source;   /* "GS_*", "torchrun", "Open MPI", "Slurm" */
} gs_boot_info;

struct gs_ctx {
    gs_config cfg;           /* copy of the process configuration */
    gs_boot_info boot;
    int rank;
    int size;
    char host_id[128];       /* identical exactly for ranks that can share memory */
    gs_store_client *store;
    gs_store_server *server; /* rank 0 when it serves the store, else NULL */
};

/* Fills info from the launcher's environment (see gs_ctx_create). */
gs_status gs_boot_discover(const gs_config *cfg, gs_getenv_fn getenv_fn, void *arg, gs_boot_info *info_p);

#endif
