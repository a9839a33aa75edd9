"""Finding and loading libgradsync.so, and the C API's prototypes (ctypes).

The library is loaded on first use, not at import, so `import gradsync`
works where only the torch.distributed backend is wanted. Where it is
looked for, first found wins:
  1. GS_LIBRARY, a path to the library (an error if it cannot be loaded);
  2. the path `cmake --install` recorded in _installed.py, else (a build tree's
     package) build/python/gradsync/../../src/libgradsync.so;
  3. the system's loader (libgradsync.so.0 on its search path).
"""
import ctypes
import os
import threading

_SONAME = "libgradsync.so.0"
_API_VERSION = (0, 2)  # the header these prototypes mirror

c_int, c_size_t, c_void_p, c_char_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
c_uint64, c_float = ctypes.c_uint64, ctypes.c_float


# gs_kv_store's callbacks
KV_SET = ctypes.CFUNCTYPE(c_int, c_void_p, c_char_p, c_void_p, c_size_t)
KV_GET = ctypes.CFUNCTYPE(c_int, c_void_p, c_char_p, c_void_p, c_size_t, ctypes.POINTER(c_size_t), c_int)
KV_ADD = ctypes.CFUNCTYPE(c_int, c_void_p, c_char_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64))


class KvStore(ctypes.Structure):
    _fields_ = [("arg", c_void_p), ("set", KV_SET), ("get", KV_GET), ("add", KV_ADD)]


class CtxParams(ctypes.Structure):
    """gs_ctx_params (versioned by its size and GS_CTX_PARAMS_VERSION)."""
    _fields_ = [("size", c_size_t), ("version", ctypes.c_uint), ("rank", c_int), ("world_size", c_int),
                ("local_rank", c_int), ("local_size", c_int), ("store_addr", c_char_p),
                ("store", ctypes.POINTER(KvStore)),
                ("route_hint", c_char_p), ("timeout_ms", c_int), ("job_token", c_char_p)]


class PsOptim(ctypes.Structure):
    _fields_ = [("kind", c_int), ("lr", c_float), ("momentum", c_float), ("beta1", c_float),
                ("beta2", c_float), ("eps", c_float), ("weight_decay", c_float)]


class PsParams(ctypes.Structure):
    """gs_ps_params; `_reserve` leaves room for fields a newer library adds at the end."""
    _fields_ = [("role", c_int), ("servers", c_int), ("transport", c_char_p), ("mode", c_int),
                ("staleness", c_int), ("agg", c_int), ("atomic_frac_bits", c_int), ("shard_bytes", c_size_t),
                ("optim", PsOptim), ("average", c_int), ("checkpoint", c_char_p), ("checkpoint_every", c_int),
                ("elastic", c_int), ("_reserve", ctypes.c_char * 256)]


class Tensor(ctypes.Structure):
    """gs_tensor: one tensor of a fused allreduce."""
    _fields_ = [("sendbuf", c_void_p), ("recvbuf", c_void_p), ("count", c_size_t)]


class P2pStatus(ctypes.Structure):
    _fields_ = [("source", c_int), ("tag", c_int), ("count", c_size_t)]


_P = c_void_p  # every opaque object: gs_ctx *, gs_comm *, gs_tp *, gs_req *, gs_ps *
_PP = ctypes.POINTER(c_void_p)
_BUF = c_void_p
_SIZES = ctypes.POINTER(c_size_t)  # a count or displacement array, one entry per rank
_ROOTED = [_P, _BUF, _BUF, c_size_t, c_int]  # comm, sendbuf, recvbuf, count, dtype

# name: (restype, argtypes); every gs_status function returns c_int
_PROTOTYPES = {
    "gs_status_name": (c_char_p, [c_int]),
    "gs_strerror": (c_char_p, [c_int]),
    "gs_last_error": (c_char_p, []),
    "gs_version": (c_char_p, []),
    "gs_dtype_size": (c_size_t, [c_int]),
    "gs_ctx_create": (c_int, [_PP]),
    "gs_ctx_params_init": (None, [ctypes.POINTER(CtxParams)]),
    "gs_ctx_create_with": (c_int, [ctypes.POINTER(CtxParams), _PP]),
    "gs_ctx_destroy": (c_int, [_P]),
    "gs_ctx_rank": (c_int, [_P]),
    "gs_ctx_size": (c_int, [_P]),
    "gs_ctx_local_rank": (c_int, [_P]),
    "gs_ctx_local_size": (c_int, [_P]),
    "gs_ctx_host": (c_char_p, [_P]),
    "gs_ctx_param": (c_int, [_P, c_char_p, ctypes.c_char_p, c_size_t]),
    "gs_store_put": (c_int, [_P, c_char_p, c_char_p, c_size_t]),
    "gs_store_get": (c_int, [_P, c_char_p, c_void_p, c_size_t, ctypes.POINTER(c_size_t)]),
    "gs_store_allgather": (c_int, [_P, c_char_p, c_char_p, c_size_t, c_void_p]),
    "gs_store_barrier": (c_int, [_P, c_char_p]),
    "gs_tp_open": (c_int, [_P, c_char_p, _PP]),
    "gs_tp_close": (c_int, [_P]),
    "gs_tp_name": (c_char_p, [_P]),
    "gs_req_test": (c_int, [_P]),
    "gs_req_wait": (c_int, [_P]),
    "gs_comm_create": (c_int, [_P, _P, _PP]),
    "gs_comm_destroy": (c_int, [_P]),
    "gs_comm_abort": (c_int, [_P]),
    "gs_comm_rank": (c_int, [_P]),
    "gs_comm_size": (c_int, [_P]),
    "gs_comm_tp": (_P, [_P]),
    "gs_comm_split": (c_int, [_P, c_int, c_int, _PP]),
    "gs_comm_create_group": (c_int, [_P, ctypes.POINTER(c_int), c_int, _PP]),
    "gs_comm_shrink": (c_int, [_P, _PP]),
    "gs_allreduce": (c_int, _ROOTED + [c_int]),
    "gs_iallreduce": (c_int, _ROOTED + [c_int, _PP]),
    "gs_reduce": (c_int, _ROOTED + [c_int, c_int]),
    "gs_ireduce": (c_int, _ROOTED + [c_int, c_int, _PP]),
    "gs_broadcast": (c_int, _ROOTED + [c_int]),
    "gs_ibroadcast": (c_int, _ROOTED + [c_int, _PP]),
    "gs_allgather": (c_int, _ROOTED),
    "gs_iallgather": (c_int, _ROOTED + [_PP]),
    "gs_reduce_scatter": (c_int, _ROOTED + [c_int]),
    "gs_ireduce_scatter": (c_int, _ROOTED + [c_int, _PP]),
    "gs_gather": (c_int, _ROOTED + [c_int]),
    "gs_igather": (c_int, _ROOTED + [c_int, _PP]),
    "gs_scatter": (c_int, _ROOTED + [c_int]),
    "gs_iscatter": (c_int, _ROOTED + [c_int, _PP]),
    "gs_alltoall": (c_int, _ROOTED),
    "gs_ialltoall": (c_int, _ROOTED + [_PP]),
    "gs_allreduce_multi": (c_int, [_P, ctypes.POINTER(Tensor), c_size_t, c_int, c_int]),
    "gs_iallreduce_multi": (c_int, [_P, ctypes.POINTER(Tensor), c_size_t, c_int, c_int, _PP]),
    "gs_allgatherv": (c_int, [_P, _BUF, _BUF, _SIZES, _SIZES, c_int]),
    "gs_iallgatherv": (c_int, [_P, _BUF, _BUF, _SIZES, _SIZES, c_int, _PP]),
    "gs_reduce_scatter_v": (c_int, [_P, _BUF, _BUF, _SIZES, c_int, c_int]),
    "gs_ireduce_scatter_v": (c_int, [_P, _BUF, _BUF, _SIZES, c_int, c_int, _PP]),
    "gs_alltoallv": (c_int, [_P, _BUF, _SIZES, _SIZES, _BUF, _SIZES, _SIZES, c_int]),
    "gs_ialltoallv": (c_int, [_P, _BUF, _SIZES, _SIZES, _BUF, _SIZES, _SIZES, c_int, _PP]),
    "gs_barrier": (c_int, [_P]),
    "gs_ibarrier": (c_int, [_P, _PP]),
    "gs_send": (c_int, [_P, _BUF, c_size_t, c_int, c_int, c_int]),
    "gs_recv": (c_int, [_P, _BUF, c_size_t, c_int, c_int, c_int, ctypes.POINTER(P2pStatus)]),
    "gs_isend": (c_int, [_P, _BUF, c_size_t, c_int, c_int, c_int, _PP]),
    "gs_irecv": (c_int, [_P, _BUF, c_size_t, c_int, c_int, c_int, ctypes.POINTER(P2pStatus), _PP]),
    "gs_ps_params_init": (None, [_P, ctypes.POINTER(PsParams)]),
    "gs_ps_create": (c_int, [_P, ctypes.POINTER(PsParams), _PP]),
    "gs_ps_destroy": (c_int, [_P]),
    "gs_ps_is_server": (c_int, [_P]),
    "gs_ps_index": (c_int, [_P]),
    "gs_ps_num_workers": (c_int, [_P]),
    "gs_ps_num_servers": (c_int, [_P]),
    "gs_ps_register": (c_int, [_P, c_uint64, c_size_t, _BUF]),
    "gs_ps_push": (c_int, [_P, c_uint64, _BUF]),
    "gs_ps_pull": (c_int, [_P, c_uint64, _BUF]),
    "gs_ps_push_pull": (c_int, [_P, c_uint64, _BUF, _BUF]),
    "gs_ps_ipush": (c_int, [_P, c_uint64, _BUF, _PP]),
    "gs_ps_ipull": (c_int, [_P, c_uint64, _BUF, _PP]),
    "gs_ps_ipush_pull": (c_int, [_P, c_uint64, _BUF, _BUF, _PP]),
    "gs_ps_serve": (c_int, [_P]),
    "gs_ps_serve_start": (c_int, [_P]),
    "gs_ps_checkpoint": (c_int, [_P]),
    "gs_ps_recover": (c_int, [_P]),
}

_lock = threading.Lock()
_lib = None


def _candidates():
    """(path, why) in the order they are tried."""
    env = os.environ.get("GS_LIBRARY")
    if env:
        return [(env, "GS_LIBRARY")]
    try:
        from . import _installed
        found = [(_installed.LIBRARY, "the install path (gradsync/_installed.py)")]
    except ImportError:  # not installed: a build tree's package
        here = os.path.dirname(os.path.abspath(__file__))
        found = [(os.path.join(here, "..", "..", "src", "libgradsync.so"), "the build tree")]
    return found + [(_SONAME, "the system's library path")]


def _open():
    tried = []
    for path, why in _candidates():
        if os.sep in path and not os.path.exists(path) and why != "GS_LIBRARY":
            tried.append("%s (%s): not there" % (path, why))
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s): %s" % (path, why, e))
    raise OSError("gradsync: cannot load libgradsync: tried " + "; ".join(tried) +
                  ". Set GS_LIBRARY to the library's path, or PYTHONPATH=BUILD/python from a build tree")


def _declare(lib):
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    version = lib.gs_version().decode()
    if tuple(int(x) for x in version.split(".")[:2]) != _API_VERSION:
        raise OSError("gradsync: libgradsync %s loaded (%s), but this package binds the %d.%d API" %
                      (version, lib._name, *_API_VERSION))


def lib():
    """The loaded library (loaded and declared on the first call)."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                handle = _open()
                _declare(handle)
                _lib = handle
    return _lib
