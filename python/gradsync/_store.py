"""An external key-value store (gs_kv_store) from a Python object, e.g.
torch.distributed's TCPStore or FileStore: gradsync bootstraps through it
and opens no port of its own for that.

The object needs set(key, value) and get(key) -> bytes; wait([key], timedelta)
is used when it has one (torch's stores), add(key, delta) -> int when it has
one. gradsync calls them from the thread that calls gradsync."""
import ctypes
import datetime

from ._lib import KV_ADD, KV_GET, KV_SET, KvStore

_OK, _ERR_TIMEOUT, _ERR_IO = 0, -5, -15


class ExternalStore:
    """Holds the callbacks (alive as long as the context) and the first exception one raised."""

    def __init__(self, obj):
        for name in ("set", "get"):
            if not callable(getattr(obj, name, None)):
                raise ValueError("store: a %s has no %s(); give 'host:port' or a store with set and get"
                                 % (type(obj).__name__, name))
        self.obj = obj
        self.exception = None
        add = KV_ADD(self._add) if callable(getattr(obj, "add", None)) else KV_ADD()
        self.struct = KvStore(None, KV_SET(self._set), KV_GET(self._get), add)

    def _fail(self, e):
        if self.exception is None:
            self.exception = e
        text = str(e).lower()
        timeout = isinstance(e, TimeoutError) or "timeout" in text or "timed out" in text
        return _ERR_TIMEOUT if timeout else _ERR_IO

    def _set(self, arg, key, value, size):
        try:
            self.obj.set(key.decode(), ctypes.string_at(value, size))
            return _OK
        except Exception as e:  # an exception must not cross into C
            return self._fail(e)

    def _get(self, arg, key, buf, cap, size_p, timeout_ms):
        try:
            name = key.decode()
            if callable(getattr(self.obj, "wait", None)):
                self.obj.wait([name], datetime.timedelta(milliseconds=timeout_ms))
            value = bytes(self.obj.get(name))
            ctypes.memmove(buf, value, min(cap, len(value)))
            size_p[0] = len(value)
            return _OK
        except Exception as e:
            return self._fail(e)

    def _add(self, arg, key, delta, value_p):
        try:
            value_p[0] = int(self.obj.add(key.decode(), int(delta)))
            return _OK
        except Exception as e:
            return self._fail(e)
