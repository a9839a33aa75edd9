"""Request: a started non-blocking operation (gs_req), for collectives,
point-to-point and the parameter server alike."""
from ._lib import lib
from .errors import INPROGRESS, OK, error


class Request:
    """test() polls, wait() blocks; either raises gradsync.Error if the operation failed.

    The request holds its buffers until it completes, and its owner (the
    communicator or parameter server) holds the request, so dropping it
    early frees nothing the operation still uses.
    """

    def __init__(self, call, handle, owner, buffers, on_done=None):
        self._call, self._handle, self._owner = call, handle, owner
        self._buffers = buffers
        self._on_done = on_done
        self._error = None
        self.result = None  # what the operation gives back (a receive: its RecvStatus)
        owner._pending.add(self)

    @property
    def done(self):
        return self._handle is None

    def test(self):
        """True once the operation completed (False while it runs); raises if it failed."""
        if self._handle is not None:
            st = lib().gs_req_test(self._handle)
            if st == INPROGRESS:
                return False
            self._finish(st)
        if self._error is not None:
            raise self._error
        return True

    def wait(self):
        """Waits (within the deadline) until the operation completed; returns its result, raises if it
        failed."""
        if self._handle is not None:
            self._finish(lib().gs_req_wait(self._handle))
        if self._error is not None:
            raise self._error
        return self.result

    def _finish(self, st):
        self._handle = None
        if st == OK:
            if self._on_done is not None:
                self.result = self._on_done()
        else:
            self._error = error("%s (request)" % self._call, st)
        self._release()

    def _abandon(self, why):
        """The owner went (destroyed or aborted): the C request is gone with it."""
        if self._handle is not None:
            self._handle = None
            self._error = ValueError("%s: request abandoned: %s" % (self._call, why))
            self._release()

    def _release(self):
        self._buffers = None
        self._on_done = None
        self._owner._pending.discard(self)

    def __repr__(self):
        state = "running" if self._handle is not None else ("failed" if self._error else "done")
        return "<gradsync.Request %s %s>" % (self._call, state)
