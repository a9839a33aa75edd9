"""The torch.distributed backend "gradsync" (the C++ module _c10d), registered
when `import gradsync` finds both torch and the module."""
import datetime

import torch.distributed as _dist

from ._lib import lib as _lib

# The library first, as the package finds it (GS_LIBRARY, the install path, the build tree):
# the module's own reference to libgradsync.so.0 then binds to that same copy (one soname, one
# copy in the process), whatever the module's RUNPATH says.
_lib()
from ._c10d import ProcessGroupGradsync  # noqa: E402

BACKEND = "gradsync"


def _create(store, rank, size, timeout):
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    return ProcessGroupGradsync(store, rank, size, timeout)


def register():
    if not hasattr(_dist.Backend, BACKEND.upper()):  # a second import must not register twice
        _dist.Backend.register_backend(BACKEND, _create)
