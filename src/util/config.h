/* Configuration: read once from the environment into a struct passed down.
 * One table (util/params.def) names every GS_* variable, its type, default
 * and meaning. */
#ifndef GS_UTIL_CONFIG_H
#define GS_UTIL_CONFIG_H

#include "gradsync.h"

#include <stdbool.h>
#include <stdint.h>

#define GS_CONFIG_STR_MAX 256

/* The parameters' table is util/params.def (one GS_PARAM row each). */

#define GS_CFG_TYPE_INT          int64_t
#define GS_CFG_TYPE_SIZE         uint64_t
#define GS_CFG_TYPE_BOOL         bool
#define GS_CFG_TYPE_ENUM         int
#define GS_CFG_FIELD_STR(field)  char field[GS_CONFIG_STR_MAX];
#define GS_CFG_FIELD_INT(field)  GS_CFG_TYPE_INT field;
#define GS_CFG_FIELD_SIZE(field) GS_CFG_TYPE_SIZE field;
#define GS_CFG_FIELD_BOOL(field) GS_CFG_TYPE_BOOL field;
#define GS_CFG_FIELD_ENUM(field) GS_CFG_TYPE_ENUM field;

/* gs_config (declared opaque in gradsync.h): one field per parameter. */
struct gs_config {
#define GS_PARAM(field, var, type, def, choices, help) GS_CFG_FIELD_##type(field)
#include "util/params.def"
#undef GS_PARAM
};

/* Enum values, in the order of their choices strings. */
/* GS_TRANSPORT's values; MIXED is never configured: auto picks it (a
 * transport per peer) and descriptors name it. */
enum { GS_TRANSPORT_AUTO, GS_TRANSPORT_SHM, GS_TRANSPORT_TCP, GS_TRANSPORT_VERBS, GS_TRANSPORT_MIXED };
enum { GS_POLL_SPIN, GS_POLL_EVENT, GS_POLL_HYBRID };
enum { GS_ALGO_AUTO, GS_ALGO_RING, GS_ALGO_RD, GS_ALGO_DIRECT, GS_ALGO_HIER };
enum { GS_TCP_ZCOPY_AUTO, GS_TCP_ZCOPY_ON, GS_TCP_ZCOPY_OFF };
enum { GS_ROLE_AUTO, GS_ROLE_WORKER, GS_ROLE_SERVER };
enum { GS_PS_SYNC, GS_PS_ASYNC };
enum { GS_PS_AGG_WRITE, GS_PS_AGG_ATOMIC };

typedef const char *(*gs_getenv_fn)(const char *name, void *arg);

/* Parses every parameter through getenv_fn (defaults where unset). A bad
 * value is GS_ERR_CONFIG with gs_last_error() naming the variable and the
 * accepted forms. */
gs_status gs_config_parse(gs_config *cfg, gs_getenv_fn getenv_fn, void *arg);
/* Warns about each GS_* variable in envp that no parameter has, with the
 * closest known name. Returns how many it warned about. */
int gs_config_warn_unknown(char *const *envp);
/* Checks the configuration in envp as gs_config_parse and
 * gs_config_warn_unknown do, reporting every problem (a malformed value: the
 * variable, the value, the accepted forms; an unknown GS_* name: the closest
 * known one) instead of stopping at the first. cfg gets the configuration,
 * the default in place of each malformed value. Returns how many problems. */
int gs_config_check(char *const *envp, gs_config *cfg, gs_config_report_fn report, void *arg);
/* The process configuration, parsed from the environment on first use. */
gs_status gs_config_get(const gs_config **cfg_p);
/* The current value of parameter i (gs_param_at's index), formatted. */
void gs_param_format(const gs_config *cfg, int i, char *buf, size_t cap);
/* The closest parameter name to name (edit distance), or NULL if none is close. */
const char *gs_param_closest(const char *name);
/* gs_config_value and gs_ctx_param: parameter name's value in cfg, as the
 * header says; caller names the public call in the error text. */
gs_status gs_config_param_value(const gs_config *cfg, const char *caller, const char *name, char *buf,
                                size_t cap);

#endif
