/*
 * Which peer is gone. The transport's poll and wait report GS_ERR_PEER_LOST
 * without saying which endpoint (the detail is in the log text), but a post
 * to a lost endpoint returns GS_ERR_PEER_LOST at once: so a zero-length,
 * unsignaled WRITE to each candidate's control region tells them apart
 * without disturbing a live peer.
 */
#include "ps/ps.h"

#include "util/log.h"

void gs_ps_find_lost(gs_ps *ps, const int *ranks, int n, const bool *skip, bool *lost_p)
{
    for (int i = 0; i < n; i++) {
        gs_status st;
        lost_p[i] = false;
        if (skip && skip[i])
            continue;
        st = gs_ep_write(gs_tp_ep(ps->tp, ranks[i]), NULL, NULL, 0, &ps->ctrl_rmrs[ranks[i]], 0, 0, 0);
        lost_p[i] = st == GS_ERR_PEER_LOST || st == GS_ERR_FLUSHED;
        if (lost_p[i])
            gs_log_debug(PS, "rank %d: probe: rank %d is gone", ps->rank, ranks[i]);
    }
}
