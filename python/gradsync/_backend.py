"""The torch.distributed backend "gradsync" (the C++ module _c10d), registered
when `import gradsync` finds both torch and the module."""
import datetime

import torch.distributed as _dist

# The module links libgradsync.so.0 (its RUNPATH: the build tree's src/, or the install's lib/),
# the file the ctypes bindings load later from the same place: the loader maps it once.
from ._c10d import ProcessGroupGradsync

BACKEND = "gradsync"


def _create(store, rank, size, timeout):
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    return ProcessGroupGradsync(store, rank, size, timeout)


def register():
    if not hasattr(_dist.Backend, BACKEND.upper()):  # a second import must not register twice
        _dist.Backend.register_backend(BACKEND, _create)
