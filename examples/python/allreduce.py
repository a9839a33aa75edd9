"""A data-parallel step's gradient sync with the C API from Python, numpy
arrays in place (docs/python.md):

    PYTHONPATH=build/python build/tools/gsrun -n 2 /usr/bin/python3 examples/python/allreduce.py
"""
import numpy as np

import gradsync

with gradsync.Context() as ctx, gradsync.Comm(ctx) as comm:  # GS_RANK, GS_WORLD_SIZE, GS_STORE: gsrun's
    grads = [np.full(n, ctx.rank + 1, np.float32) for n in (1000, 10, 250000)]
    reqs = [comm.iallreduce(g, op="avg") for g in grads]  # started at once, in order
    for r in reqs:
        r.wait()  # raises gradsync.Error (GS_ERR_PEER_LOST, GS_ERR_TIMEOUT, ...) if it failed
    want = (comm.size + 1) / 2
    assert all((g == want).all() for g in grads)
    print("rank %d of %d over %s: mean gradient %g, as expected"
          % (comm.rank, comm.size, comm.transport, want))
