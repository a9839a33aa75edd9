"""gradsync's errors as exceptions: a failed call raises gradsync.Error
(a RuntimeError) carrying the status name and gs_last_error()'s sentence;
the statuses a program may want to handle apart have subclasses."""
import builtins

from ._lib import lib

OK = 0
INPROGRESS = 1
_ERR_TIMEOUT = -5
_ERR_PEER_LOST = -6
_ERR_MISMATCH = -10


class Error(RuntimeError):
    """A gradsync call failed.

    status: the gs_status value (negative); name: its name ("GS_ERR_MISMATCH");
    detail: gs_last_error()'s sentence (rank, operation, peer, cause); call: the C function.
    """

    def __init__(self, call, status, name, detail):
        self.call, self.status, self.name, self.detail = call, status, name, detail
        super().__init__("%s failed: %s: %s" % (call, name, detail or "(no detail)"))


class TimeoutError(Error, builtins.TimeoutError):
    """GS_ERR_TIMEOUT: a wait ran past its deadline (GS_TIMEOUT_MS or the context's timeout)."""


class PeerLostError(Error):
    """GS_ERR_PEER_LOST: a rank exited, crashed or aborted its communicator."""


class MismatchError(Error):
    """GS_ERR_MISMATCH: the ranks made different calls (count, type, operator, root)."""


_CLASSES = {_ERR_TIMEOUT: TimeoutError, _ERR_PEER_LOST: PeerLostError, _ERR_MISMATCH: MismatchError}


def error(call, status):
    """The exception for status, with this thread's gs_last_error()."""
    c = lib()
    name = c.gs_status_name(status).decode()
    detail = c.gs_last_error().decode(errors="replace") or c.gs_strerror(status).decode()
    return _CLASSES.get(status, Error)(call, status, name, detail)


def check(call, status):
    """Raises the exception for a failed status; returns otherwise."""
    if status != OK:
        raise error(call, status)
