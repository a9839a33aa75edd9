#include "ps/ps.h"
#include "util/log.h"
gs_status gs_ps_recover_server(gs_ps *ps)
{
    return gs_fail(GS_SUBSYS_PS, GS_ERR_UNSUPPORTED, "rank %d: recovery not built yet", ps->rank);
}
gs_status gs_ps_recover(gs_ps *ps)
{
    return gs_fail(GS_SUBSYS_PS, GS_ERR_UNSUPPORTED, "rank %d: recovery not built yet", ps->rank);
}
