"""Parameter server (gs_ps): float32 tensors by key, pushed and pulled in
place in numpy arrays or torch CPU tensors."""
import ctypes

from ._buffer import DType, buffer, want_count
from ._lib import PsParams, lib
from .errors import check
from .request import Request

_ROLES = {"auto": 0, "worker": 1, "server": 2}
_MODES = {"sync": 0, "async": 1}
_AGGS = {"write": 0, "atomic": 1}
_OPTIMIZERS = {"sgd": 0, "momentum": 1, "adam": 2}


def _choice(table, what, value):
    if value not in table:
        raise ValueError("%s: %r, expected one of %s" % (what, value, ", ".join(table)))
    return table[value]


class ParameterServer:
    """S servers and W workers over every rank of a context (collective: every rank creates it).

    Each keyword overrides its default from the context's configuration (the GS_PS_*
    variables): role ("auto", "worker", "server"), servers, transport, mode ("sync",
    "async"), staleness, agg ("write", "atomic"), atomic_frac_bits, shard_bytes,
    optimizer ("sgd", "momentum", "adam") with lr, momentum, beta1, beta2, eps,
    weight_decay, average (True: the mean over workers), checkpoint (file prefix),
    checkpoint_every. A server calls serve() (or serve_start()); workers push and pull.
    destroy() is collective.
    """

    def __init__(self, ctx, role=None, servers=None, transport=None, mode=None, staleness=None, agg=None,
                 atomic_frac_bits=None, shard_bytes=None, optimizer=None, lr=None, momentum=None,
                 beta1=None, beta2=None, eps=None, weight_decay=None, average=None, checkpoint=None,
                 checkpoint_every=None):
        c = lib()
        p = PsParams()
        c.gs_ps_params_init(ctx._h(), ctypes.byref(p))
        ints = {"role": _choice(_ROLES, "role", role) if role is not None else None, "servers": servers,
                "mode": _choice(_MODES, "mode", mode) if mode is not None else None, "staleness": staleness,
                "agg": _choice(_AGGS, "agg", agg) if agg is not None else None,
                "atomic_frac_bits": atomic_frac_bits, "shard_bytes": shard_bytes,
                "average": None if average is None else int(bool(average)),
                "checkpoint_every": checkpoint_every}
        for field, value in ints.items():
            if value is not None:
                setattr(p, field, int(value))
        if optimizer is not None:
            p.optim.kind = _choice(_OPTIMIZERS, "optimizer", optimizer)
        for field, value in (("lr", lr), ("momentum", momentum), ("beta1", beta1), ("beta2", beta2),
                             ("eps", eps), ("weight_decay", weight_decay)):
            if value is not None:
                setattr(p.optim, field, float(value))
        self._strings = [None if v is None else v.encode() for v in (transport, checkpoint)]
        if transport is not None:
            p.transport = self._strings[0]
        if checkpoint is not None:
            p.checkpoint = self._strings[1]
        handle = ctypes.c_void_p()
        check("gs_ps_create", c.gs_ps_create(ctx._h(), ctypes.byref(p), ctypes.byref(handle)))
        self._ctx, self._handle = ctx, handle.value
        self._pending = set()
        self._counts = {}  # key -> count, as registered
        ctx._children.add(self)

    def _h(self):
        if self._handle is None:
            raise ValueError("gradsync.ParameterServer: used after destroy()")
        return self._handle

    @property
    def is_server(self):
        return bool(lib().gs_ps_is_server(self._h()))

    @property
    def index(self):
        """This rank's index among the workers (or the servers)."""
        return lib().gs_ps_index(self._h())

    @property
    def num_workers(self):
        return lib().gs_ps_num_workers(self._h())

    @property
    def num_servers(self):
        return lib().gs_ps_num_servers(self._h())

    def register(self, key, init=None, count=None):
        """Collective: every rank registers the same keys in the same order. init (float32, taken from
        the first worker) gives the starting parameters and the count; without it, count (zeros)."""
        b = None
        if init is not None:
            b = self._f32(init, "register: init")
            if count is not None:
                want_count(b, count, "register: init")
            count = b.count
        if count is None:
            raise ValueError("register: give init or count")
        check("gs_ps_register", lib().gs_ps_register(self._h(), int(key), int(count), b.ptr if b else None))
        self._counts[int(key)] = int(count)

    def _f32(self, obj, what, writable=False):
        b = buffer(obj, what, writable)
        if b.dtype != DType.F32:
            raise ValueError("%s: %s, the parameter server holds float32" % (what, b.dtype.name))
        return b

    def _key_buffer(self, key, obj, what, writable=False):
        if int(key) not in self._counts:
            raise ValueError("%s: key %d is not registered" % (what, key))
        b = self._f32(obj, what, writable)
        want_count(b, self._counts[int(key)], "%s (key %d)" % (what, key))
        return b

    def push(self, key, grad):
        g = self._key_buffer(key, grad, "push: grad")
        check("gs_ps_push", lib().gs_ps_push(self._h(), int(key), g.ptr))

    def pull(self, key, out):
        """Fills out with the key's parameters (including every push this worker completed)."""
        o = self._key_buffer(key, out, "pull: out", writable=True)
        check("gs_ps_pull", lib().gs_ps_pull(self._h(), int(key), o.ptr))
        return o.obj

    def push_pull(self, key, grad, out):
        g = self._key_buffer(key, grad, "push_pull: grad")
        o = self._key_buffer(key, out, "push_pull: out", writable=True)
        check("gs_ps_push_pull", lib().gs_ps_push_pull(self._h(), int(key), g.ptr, o.ptr))
        return o.obj

    def _start(self, call, args, buffers):
        req = ctypes.c_void_p()
        check(call, getattr(lib(), call)(self._h(), *args, ctypes.byref(req)))
        return Request(call, req.value, self, buffers)

    def ipush(self, key, grad):
        g = self._key_buffer(key, grad, "ipush: grad")
        return self._start("gs_ps_ipush", (int(key), g.ptr), (g,))

    def ipull(self, key, out):
        o = self._key_buffer(key, out, "ipull: out", writable=True)
        return self._start("gs_ps_ipull", (int(key), o.ptr), (o,))

    def ipush_pull(self, key, grad, out):
        g = self._key_buffer(key, grad, "ipush_pull: grad")
        o = self._key_buffer(key, out, "ipush_pull: out", writable=True)
        return self._start("gs_ps_ipush_pull", (int(key), g.ptr, o.ptr), (g, o))

    def serve(self):
        """Server: serves until every worker has called destroy()."""
        check("gs_ps_serve", lib().gs_ps_serve(self._h()))

    def serve_start(self):
        """Server: serve() in a thread of the library's, joined by destroy()."""
        check("gs_ps_serve_start", lib().gs_ps_serve_start(self._h()))

    def checkpoint(self):
        check("gs_ps_checkpoint", lib().gs_ps_checkpoint(self._h()))

    def recover(self):
        """Worker, after PeerLostError: waits for the lost server's restart and reconnects; then repeat
        the call that failed."""
        check("gs_ps_recover", lib().gs_ps_recover(self._h()))

    def destroy(self):
        """Collective: workers say goodbye; servers stop once every worker has."""
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        for req in list(self._pending):
            req._abandon("the parameter server was destroyed")
        self._ctx._children.discard(self)
        check("gs_ps_destroy", lib().gs_ps_destroy(handle))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.destroy()

    def __repr__(self):
        if self._handle is None:
            return "<gradsync.ParameterServer destroyed>"
        role = "server" if self.is_server else "worker"
        return "<gradsync.ParameterServer %s %d of %d workers>" % (role, self.index, self.num_workers)
