"""gradsync: gradient synchronization for data-parallel training.

The C API for numpy arrays and torch CPU tensors, without copies (ctypes over
libgradsync.so; neither numpy nor torch is needed to import it):

    import numpy as np, gradsync
    with gradsync.Context() as ctx, gradsync.Comm(ctx) as comm:   # GS_RANK, GS_WORLD_SIZE, GS_STORE
        grad = np.ones(1000, np.float32)
        comm.allreduce(grad)                                     # in place
        req = comm.iallreduce(grad, op="avg"); req.wait()

Where torch and the C++ module _c10d are there, importing the package also
registers the torch.distributed backend "gradsync":

    import gradsync, torch.distributed as dist
    dist.init_process_group("gradsync", init_method="env://")   # torchrun, gsrun, file://, tcp://

The backend bootstraps through the store torch.distributed gives it (no
port of its own) and takes its deadline from init_process_group(timeout=).
See docs/python.md.
"""
import importlib.util
import warnings

from ._buffer import DType
from .comm import ANY_SOURCE, NO_COLOR, Comm, Op, RecvStatus
from .context import Context
from .errors import Error, MismatchError, PeerLostError, TimeoutError
from .ps import ParameterServer
from .request import Request

from . import launch

launch.export_torch_env()  # under mpirun or srun: torch's RANK, WORLD_SIZE, MASTER_* (see launch.py)

__all__ = ["ANY_SOURCE", "NO_COLOR", "Comm", "Context", "DType", "Error", "MismatchError", "Op",
           "ParameterServer", "PeerLostError", "RecvStatus", "Request", "TimeoutError", "version"]

BACKEND = "gradsync"


def version():
    """The loaded libgradsync's version ("0.2.0")."""
    from ._lib import lib
    return lib().gs_version().decode()


def _register_backend():
    """Registers the torch.distributed backend when this package has its module and torch is there.
    A module that is there but fails to load (a torch it was not built for) leaves the bindings usable:
    the reason is in backend_error, and a warning says so."""
    global backend_error
    if importlib.util.find_spec(__name__ + "._c10d") is None or importlib.util.find_spec("torch") is None:
        return False
    try:
        from . import _backend
    except ImportError as e:
        backend_error = e
        warnings.warn("gradsync: the torch.distributed backend is not registered: %s" % e)
        return False
    _backend.register()
    globals()["ProcessGroupGradsync"] = _backend.ProcessGroupGradsync
    __all__.append("ProcessGroupGradsync")
    return True


backend_error = None  # why the backend module did not load, if it is there and did not
backend_registered = _register_backend()
