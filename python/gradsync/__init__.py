"""gradsync: gradient synchronization for data-parallel training.

Importing the package registers the torch.distributed backend "gradsync":

    import gradsync, torch.distributed as dist
    dist.init_process_group("gradsync", init_method="env://")   # torchrun, gsrun, file://, tcp://

The backend bootstraps through the store torch.distributed gives it (no
port of its own) and takes its deadline from init_process_group(timeout=).
"""
import datetime

import torch
import torch.distributed as _dist

from . import launch
from ._c10d import ProcessGroupGradsync

launch.export_torch_env()  # under mpirun or srun: torch's RANK, WORLD_SIZE, MASTER_* (see launch.py)

__all__ = ["ProcessGroupGradsync"]

BACKEND = "gradsync"


def _create(store, rank, size, timeout):
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    return ProcessGroupGradsync(store, rank, size, timeout)


if not hasattr(_dist.Backend, BACKEND.upper()):  # a second import must not register twice
    _dist.Backend.register_backend(BACKEND, _create)
