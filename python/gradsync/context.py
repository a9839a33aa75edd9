"""Context: configuration, rank discovery and the bootstrap store (gs_ctx)."""
import ctypes
import datetime

from ._lib import CtxParams, lib
from ._store import ExternalStore
from .errors import check, error


def timeout_ms(timeout):
    """Seconds (a number) or a datetime.timedelta, as whole milliseconds."""
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    ms = int(round(float(timeout) * 1000))
    if ms <= 0:
        raise ValueError("timeout: %r, expected a positive number of seconds" % (timeout,))
    return ms


def _text(value):
    return None if value is None else str(value).encode()


class Context:
    """One process's membership of a job.

    Context() reads everything from the environment (GS_RANK/GS_WORLD_SIZE/GS_STORE,
    torchrun's, Open MPI's or Slurm's variables: gs_ctx_create). Any argument given
    overrides its variable (gs_ctx_create_with): rank and world_size, store
    ("host:port" of gradsync's own store, which rank 0 serves; or an object with set(key,
    value) and get(key), optionally wait and add, such as torch.distributed.TCPStore, to
    bootstrap through instead, opening no port for that), timeout (seconds or a
    timedelta: the deadline of every wait, GS_TIMEOUT_MS), local_rank and local_size,
    route_hint, job_token. Blocks until every rank has joined the store, or the deadline.
    Close it (close() or a with block) after the communicators and parameter servers made
    on it.
    """

    def __init__(self, rank=None, world_size=None, store=None, timeout=None, local_rank=None,
                 local_size=None, route_hint=None, job_token=None):
        c = lib()
        handle = ctypes.c_void_p()
        self._external = None  # the callbacks of an external store: alive as long as the context
        given = (rank, world_size, store, timeout, local_rank, local_size, route_hint, job_token)
        if all(v is None for v in given):
            check("gs_ctx_create", c.gs_ctx_create(ctypes.byref(handle)))
        else:
            p = CtxParams()
            c.gs_ctx_params_init(ctypes.byref(p))
            for field, value in (("rank", rank), ("world_size", world_size), ("local_rank", local_rank),
                                 ("local_size", local_size)):
                if value is not None:
                    setattr(p, field, int(value))
            if timeout is not None:
                p.timeout_ms = timeout_ms(timeout)
            if store is not None and not isinstance(store, str):
                self._external = ExternalStore(store)
                p.store = ctypes.pointer(self._external.struct)
            else:
                p.store_addr = _text(store)
            p.route_hint, p.job_token = _text(route_hint), _text(job_token)
            st = c.gs_ctx_create_with(ctypes.byref(p), ctypes.byref(handle))
            if st != 0 and self._external is not None and self._external.exception is not None:
                raise error("gs_ctx_create_with", st) from self._external.exception
            check("gs_ctx_create_with", st)
        self._handle = handle.value
        self._children = set()  # communicators and parameter servers not yet destroyed

    def _h(self):
        if self._handle is None:
            raise ValueError("gradsync.Context: used after close()")
        return self._handle

    @property
    def rank(self):
        return lib().gs_ctx_rank(self._h())

    @property
    def size(self):
        return lib().gs_ctx_size(self._h())

    @property
    def local_rank(self):
        """Rank among the ranks on this host (-1: unknown)."""
        return lib().gs_ctx_local_rank(self._h())

    @property
    def local_size(self):
        return lib().gs_ctx_local_size(self._h())

    @property
    def host(self):
        """This host's id: equal exactly for ranks that can share memory."""
        return lib().gs_ctx_host(self._h()).decode()

    def param(self, name):
        """The value in force of configuration parameter name ("GS_ALGO", ...), as gsinfo prints it."""
        buf = ctypes.create_string_buffer(1024)
        check("gs_ctx_param", lib().gs_ctx_param(self._h(), name.encode(), buf, len(buf)))
        return buf.value.decode()

    # ---- the bootstrap store: small blobs between the ranks (one thread at a time) ----

    def store_put(self, key, value):
        """Sets key (str) to value (bytes, at most 1 MiB), replacing an earlier value."""
        value = bytes(value)
        check("gs_store_put", lib().gs_store_put(self._h(), key.encode(), value, len(value)))

    def store_get(self, key):
        """Waits (within the deadline) until key exists; returns its value (bytes)."""
        cap, size = 4096, ctypes.c_size_t()
        while True:
            buf = ctypes.create_string_buffer(cap)
            check("gs_store_get", lib().gs_store_get(self._h(), key.encode(), buf, cap, ctypes.byref(size)))
            if size.value <= cap:
                return buf.raw[:size.value]
            cap = size.value

    def store_allgather(self, tag, blob):
        """Every rank gives a blob of the same length; returns them all (a list in rank order)."""
        blob = bytes(blob)
        out = ctypes.create_string_buffer(max(1, len(blob) * self.size))
        check("gs_store_allgather", lib().gs_store_allgather(self._h(), tag.encode(), blob, len(blob), out))
        return [out.raw[r * len(blob):(r + 1) * len(blob)] for r in range(self.size)]

    def store_barrier(self, tag):
        """Returns when every rank has entered the barrier with this tag."""
        check("gs_store_barrier", lib().gs_store_barrier(self._h(), tag.encode()))

    def close(self):
        """gs_ctx_destroy: rank 0 waits, within the deadline, until every rank has closed."""
        if self._handle is None:
            return
        if self._children:
            raise RuntimeError("gradsync.Context.close: destroy its %d communicator(s)/parameter server(s) "
                               "first" % len(self._children))
        handle, self._handle = self._handle, None
        check("gs_ctx_destroy", lib().gs_ctx_destroy(handle))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and self._children:
            return  # leaving on an error with communicators open: they and the context go with the process
        self.close()

    def __repr__(self):
        if self._handle is None:
            return "<gradsync.Context closed>"
        return "<gradsync.Context rank %d of %d>" % (self.rank, self.size)
