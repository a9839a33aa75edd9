/* One request model for every non-blocking call: collectives, point-to-point
 * and the parameter server. Each layer's request begins with a gs_req whose
 * class knows how to test and wait it; gs_req_test and gs_req_wait (req.c)
 * dispatch through it. Either releases the request once it has finished,
 * and a request whose start failed was never handed out. */
#ifndef GS_UTIL_REQ_H
#define GS_UTIL_REQ_H

#include "gradsync.h"

typedef struct gs_req_class {
    const char *layer; /* "coll", "ps": for the log */
    /* Non-blocking: GS_INPROGRESS while the request runs, else its final
     * status, the request released. */
    gs_status (*test)(gs_req *req);
    /* Blocks (the layer's deadline at most), releases the request and
     * returns its final status. */
    gs_status (*wait)(gs_req *req);
} gs_req_class;

struct gs_req {
    const gs_req_class *cls;
};

#endif
