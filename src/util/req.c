/* gs_req_test and gs_req_wait: one pair for every layer's requests (req.h). */
#include "util/req.h"

#include "util/log.h"

gs_status gs_req_test(gs_req *req)
{
    if (!req || !req->cls)
        return gs_fail(GS_SUBSYS_UTIL, GS_ERR_INVALID, "gs_req_test: req is NULL or not a started request");
    return req->cls->test(req);
}

gs_status gs_req_wait(gs_req *req)
{
    if (!req || !req->cls)
        return gs_fail(GS_SUBSYS_UTIL, GS_ERR_INVALID, "gs_req_wait: req is NULL or not a started request");
    return req->cls->wait(req);
}
