"""Communicator (gs_comm): collectives and point-to-point over numpy arrays
and torch CPU tensors, in place in their memory."""
import collections
import ctypes
import enum

from ._buffer import buffer, same_type, want_count
from ._lib import P2pStatus, Tensor, lib
from .errors import check, error
from .request import Request

ANY_SOURCE = -1  # GS_ANY_SOURCE
NO_COLOR = -1  # GS_COMM_NO_COLOR

RecvStatus = collections.namedtuple("RecvStatus", "source tag count")


class Op(enum.IntEnum):
    """gs_redop; the methods also take the names ("sum", "max", ...)."""
    SUM = 0
    AVG = 1
    MIN = 2
    MAX = 3
    PROD = 4
    BAND = 5
    BOR = 6
    BXOR = 7


def _op(op):
    if isinstance(op, str):
        try:
            return Op[op.upper()]
        except KeyError:
            names = ", ".join(o.name.lower() for o in Op)
            raise ValueError("op: %r, expected one of %s" % (op, names)) from None
    return Op(op)


def _out(handle_p):
    return ctypes.byref(handle_p)


class Comm:
    """A communicator over every rank of a context (collective: every rank creates it).

    transport: "shm", "tcp", "verbs" or None (GS_TRANSPORT); the communicator has its own
    transport instance, closed with it. Calls on one communicator must be made in the same
    order on every rank, from one thread at a time. Each collective has a non-blocking form
    (the name with an i in front) that returns a Request; the buffers must stay untouched
    until it completes. Destroy it (destroy(), or a with block) before its context.
    """

    def __init__(self, ctx, transport=None, _handle=None):
        self._ctx = ctx
        self._pending = set()  # requests not yet completed
        self._tp = None  # the transport opened for it (a name given), closed with it
        if _handle is None:
            _handle, self._tp = self._create(ctx, transport)
        self._handle = _handle
        ctx._children.add(self)

    @staticmethod
    def _create(ctx, transport):
        c = lib()
        tp, handle = ctypes.c_void_p(), ctypes.c_void_p()
        if transport is not None:
            check("gs_tp_open", c.gs_tp_open(ctx._h(), transport.encode(), _out(tp)))
        st = c.gs_comm_create(ctx._h(), tp, _out(handle))
        if st != 0:
            err = error("gs_comm_create", st)  # before the close below may set another error
            if tp.value:
                c.gs_tp_close(tp)
            raise err
        return handle.value, tp.value

    # ---- the object ----------------------------------------------------------------

    def _h(self):
        if self._handle is None:
            raise ValueError("gradsync.Comm: used after destroy() or abort()")
        return self._handle

    @property
    def rank(self):
        return lib().gs_comm_rank(self._h())

    @property
    def size(self):
        return lib().gs_comm_size(self._h())

    @property
    def transport(self):
        """The name of the transport it runs on ("shm", "tcp", "verbs")."""
        return lib().gs_tp_name(lib().gs_comm_tp(self._h())).decode()

    def split(self, color, key=0):
        """Collective: the ranks of each color >= 0 form a new communicator, ordered by key, then by rank
        here; a rank with color NO_COLOR gets None."""
        handle = ctypes.c_void_p()
        check("gs_comm_split", lib().gs_comm_split(self._h(), int(color), int(key), _out(handle)))
        return Comm(self._ctx, _handle=handle.value) if handle.value else None

    def create_group(self, ranks):
        """A communicator of these ranks (rank i of the new one is ranks[i] here), called by them only."""
        ranks = [int(r) for r in ranks]
        arr = (ctypes.c_int * len(ranks))(*ranks)
        handle = ctypes.c_void_p()
        check("gs_comm_create_group", lib().gs_comm_create_group(self._h(), arr, len(ranks), _out(handle)))
        return Comm(self._ctx, _handle=handle.value)

    def shrink(self):
        """After a lost rank, every survivor calls it: a communicator of the ranks alive, numbered densely
        in this one's order (docs/elastic.md). Abort this one afterwards."""
        handle = ctypes.c_void_p()
        check("gs_comm_shrink", lib().gs_comm_shrink(self._h(), _out(handle)))
        return Comm(self._ctx, _handle=handle.value)

    def destroy(self):
        """Collective: waits until every rank has called it (requests still running are abandoned)."""
        self._close("gs_comm_destroy", lib().gs_comm_destroy)

    def abort(self):
        """Not collective: frees the communicator at once; the other ranks' calls fail with
        GS_ERR_PEER_LOST naming this rank."""
        self._close("gs_comm_abort", lib().gs_comm_abort)

    def _close(self, call, fn):
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        for req in list(self._pending):
            req._abandon("the communicator was destroyed")
        self._ctx._children.discard(self)
        st = fn(handle)
        if self._tp:
            lib().gs_tp_close(self._tp)
            self._tp = None
        check(call, st)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.destroy()
        else:
            self.abort()  # a peer may be gone: do not wait for the others

    def __repr__(self):
        if self._handle is None:
            return "<gradsync.Comm destroyed>"
        return "<gradsync.Comm rank %d of %d over %s>" % (self.rank, self.size, self.transport)

    # ---- argument checks, then the call -----------------------------------------------

    def _run(self, name, nonblocking, args, buffers, on_done=None):
        """Calls gs_<name> (blocking) or gs_i<name> (returns its Request)."""
        c = lib()
        if not nonblocking:
            check("gs_" + name, getattr(c, "gs_" + name)(self._h(), *args))
            return None
        req = ctypes.c_void_p()
        call = "gs_i" + name
        check(call, getattr(c, call)(self._h(), *args, _out(req)))
        return Request(call, req.value, self, buffers, on_done)

    def _pair(self, send, recv, what, recv_per_send=1, send_per_recv=1):
        """send and recv as Buffers of one type (recv None: in place), their counts checked:
        recv.count = send.count * recv_per_send / send_per_recv."""
        if recv is None:
            s = r = buffer(send, what + ": buffer (in place)", writable=True)
        else:
            s, r = buffer(send, what + ": sendbuf"), buffer(recv, what + ": recvbuf", writable=True)
        same_type(s, r, what)
        if s.count * recv_per_send != r.count * send_per_recv:
            rule = ("%d ranks x sendbuf" % recv_per_send if recv_per_send > 1 else
                    "sendbuf / %d ranks" % send_per_recv if send_per_recv > 1 else "as many as sendbuf")
            raise ValueError("%s: sendbuf has %d elements, recvbuf %d: expected %s" %
                             (what, s.count, r.count, rule))
        return s, r

    def _blocks(self, buf, what):
        n = self.size
        if buf.count % n:
            raise ValueError("%s: %d elements, not a multiple of the %d ranks" % (what, buf.count, n))
        return buf.count // n

    # ---- collectives ----------------------------------------------------------------

    def allreduce(self, send, recv=None, op=Op.SUM, _nb=False):
        """recv[i] = send[i] reduced over the ranks (recv None: in place into send). Returns recv."""
        s, r = self._pair(send, recv, "allreduce")
        req = self._run("allreduce", _nb, (s.ptr, r.ptr, s.count, s.dtype, _op(op)), (s, r))
        return req if _nb else r.obj

    def reduce(self, send, recv=None, op=Op.SUM, root=0, _nb=False):
        """root's recv = send reduced over the ranks; on root recv None is in place, elsewhere recv
        is not used."""
        s = buffer(send, "reduce: sendbuf")
        if self.rank == root:
            s, r = self._pair(send, recv, "reduce")
        else:
            r = None if recv is None else buffer(recv, "reduce: recvbuf", writable=True)
        args = (s.ptr, r.ptr if r else None, s.count, s.dtype, _op(op), int(root))
        req = self._run("reduce", _nb, args, (s, r))
        return req if _nb else (r.obj if r else None)

    def broadcast(self, buf, root=0, _nb=False):
        """buf on every rank receives root's buf."""
        b = buffer(buf, "broadcast: buffer", writable=True)
        req = self._run("broadcast", _nb, (b.ptr, b.ptr, b.count, b.dtype, int(root)), (b,))
        return req if _nb else b.obj

    def allgather(self, send, recv, _nb=False):
        """recv (size * len(send) elements) receives every rank's send in rank order."""
        s, r = self._pair(send, recv, "allgather", recv_per_send=self.size)
        req = self._run("allgather", _nb, (s.ptr, r.ptr, s.count, s.dtype), (s, r))
        return req if _nb else r.obj

    def reduce_scatter(self, send, recv, op=Op.SUM, _nb=False):
        """send holds size blocks of len(recv) elements; rank r receives block r of the reduction."""
        s, r = self._pair(send, recv, "reduce_scatter", send_per_recv=self.size)
        req = self._run("reduce_scatter", _nb, (s.ptr, r.ptr, r.count, s.dtype, _op(op)), (s, r))
        return req if _nb else r.obj

    def gather(self, send, recv=None, root=0, _nb=False):
        """root's recv (size * len(send) elements) receives every rank's send in rank order; recv is
        not used elsewhere."""
        s = buffer(send, "gather: sendbuf")
        r = None
        if self.rank == root:
            if recv is None:
                raise ValueError("gather: the root needs a recvbuf of %d elements" % (self.size * s.count))
            s, r = self._pair(send, recv, "gather", recv_per_send=self.size)
        elif recv is not None:
            r = buffer(recv, "gather: recvbuf", writable=True)
        req = self._run("gather", _nb, (s.ptr, r.ptr if r else None, s.count, s.dtype, int(root)), (s, r))
        return req if _nb else (r.obj if r else None)

    def scatter(self, send, recv, root=0, _nb=False):
        """Rank r's recv receives block r of root's send (size * len(recv) elements); send is not used
        elsewhere."""
        r = buffer(recv, "scatter: recvbuf", writable=True)
        s = None
        if self.rank == root:
            if send is None:
                raise ValueError("scatter: the root needs a sendbuf of %d elements" % (self.size * r.count))
            s, r = self._pair(send, recv, "scatter", send_per_recv=self.size)
        elif send is not None:
            s = buffer(send, "scatter: sendbuf")
        req = self._run("scatter", _nb, (s.ptr if s else None, r.ptr, r.count, r.dtype, int(root)), (s, r))
        return req if _nb else r.obj

    def alltoall(self, send, recv=None, _nb=False):
        """Block q of rank r's send goes to block r of rank q's recv (recv None: in place)."""
        s, r = self._pair(send, recv, "alltoall")
        count = self._blocks(s, "alltoall: sendbuf")
        req = self._run("alltoall", _nb, (s.ptr, r.ptr, count, s.dtype), (s, r))
        return req if _nb else r.obj

    def allreduce_multi(self, bufs, op=Op.SUM, _nb=False):
        """Allreduces every buffer of the list in place, through one fused buffer (one collective, like
        a DDP bucket); all of one type, and every rank passes the same list of counts."""
        bs = [buffer(b, "allreduce_multi: buffer %d" % i, writable=True) for i, b in enumerate(bufs)]
        if not bs:
            raise ValueError("allreduce_multi: no buffers")
        for i, b in enumerate(bs):
            same_type(bs[0], b, "allreduce_multi: buffer %d" % i)
        arr = (Tensor * len(bs))(*[Tensor(b.ptr, b.ptr, b.count) for b in bs])
        req = self._run("allreduce_multi", _nb, (arr, len(bs), bs[0].dtype, _op(op)), (bs, arr))
        return req if _nb else [b.obj for b in bs]

    def _counts(self, counts, what):
        counts = [int(c) for c in counts]
        if len(counts) != self.size or min(counts, default=0) < 0:
            raise ValueError("%s: %d counts, expected %d (one per rank, none negative)" %
                             (what, len(counts), self.size))
        return counts

    def _displs(self, counts, displs, what):
        """displs as given (one per rank), or the blocks packed in rank order."""
        if displs is None:
            return _prefix(counts)
        return self._counts(displs, what + ": displacements")

    def allgatherv(self, send, recv, counts, displs=None, _nb=False):
        """Rank q's send (counts[q] elements) lands at recv[displs[q]:] on every rank (displs None:
        packed in rank order)."""
        counts = self._counts(counts, "allgatherv")
        s, r = buffer(send, "allgatherv: sendbuf"), buffer(recv, "allgatherv: recvbuf", writable=True)
        same_type(s, r, "allgatherv")
        want_count(s, counts[self.rank], "allgatherv: sendbuf")
        displs = self._displs(counts, displs, "allgatherv")
        _fits(r, counts, displs, "allgatherv: recvbuf")
        c, d = _sizes(counts), _sizes(displs)
        req = self._run("allgatherv", _nb, (s.ptr, r.ptr, c, d, s.dtype), (s, r, c, d))
        return req if _nb else r.obj

    def reduce_scatter_v(self, send, recv, counts, op=Op.SUM, _nb=False):
        """send holds sum(counts) elements; rank r receives block r (counts[r] elements) of the
        reduction."""
        counts = self._counts(counts, "reduce_scatter_v")
        s, r = buffer(send, "reduce_scatter_v: sendbuf"), buffer(recv, "reduce_scatter_v: recvbuf", True)
        same_type(s, r, "reduce_scatter_v")
        want_count(s, sum(counts), "reduce_scatter_v: sendbuf")
        want_count(r, counts[self.rank], "reduce_scatter_v: recvbuf")
        c = _sizes(counts)
        req = self._run("reduce_scatter_v", _nb, (s.ptr, r.ptr, c, s.dtype, _op(op)), (s, r, c))
        return req if _nb else r.obj

    def alltoallv(self, send, send_counts, recv, recv_counts, sdispls=None, rdispls=None, _nb=False):
        """send_counts[q] elements from send[sdispls[q]:] go to rank q, which puts them at its
        recv[rdispls[r]:] (recv_counts[r] elements: they must match). Displacements None: packed."""
        sc, rc = self._counts(send_counts, "alltoallv: send_counts"), self._counts(recv_counts, "alltoallv")
        s, r = buffer(send, "alltoallv: sendbuf"), buffer(recv, "alltoallv: recvbuf", writable=True)
        same_type(s, r, "alltoallv")
        sd, rd = self._displs(sc, sdispls, "alltoallv"), self._displs(rc, rdispls, "alltoallv")
        _fits(s, sc, sd, "alltoallv: sendbuf")
        _fits(r, rc, rd, "alltoallv: recvbuf")
        arrays = [_sizes(a) for a in (sc, sd, rc, rd)]
        args = (s.ptr, arrays[0], arrays[1], r.ptr, arrays[2], arrays[3], s.dtype)
        req = self._run("alltoallv", _nb, args, (s, r, arrays))
        return req if _nb else r.obj

    def barrier(self, _nb=False):
        """Returns once every rank has entered it."""
        return self._run("barrier", _nb, (), ())

    def iallreduce(self, send, recv=None, op=Op.SUM):
        return self.allreduce(send, recv, op, _nb=True)

    def ireduce(self, send, recv=None, op=Op.SUM, root=0):
        return self.reduce(send, recv, op, root, _nb=True)

    def ibroadcast(self, buf, root=0):
        return self.broadcast(buf, root, _nb=True)

    def iallgather(self, send, recv):
        return self.allgather(send, recv, _nb=True)

    def ireduce_scatter(self, send, recv, op=Op.SUM):
        return self.reduce_scatter(send, recv, op, _nb=True)

    def igather(self, send, recv=None, root=0):
        return self.gather(send, recv, root, _nb=True)

    def iscatter(self, send, recv, root=0):
        return self.scatter(send, recv, root, _nb=True)

    def ialltoall(self, send, recv=None):
        return self.alltoall(send, recv, _nb=True)

    def iallreduce_multi(self, bufs, op=Op.SUM):
        return self.allreduce_multi(bufs, op, _nb=True)

    def iallgatherv(self, send, recv, counts, displs=None):
        return self.allgatherv(send, recv, counts, displs, _nb=True)

    def ireduce_scatter_v(self, send, recv, counts, op=Op.SUM):
        return self.reduce_scatter_v(send, recv, counts, op, _nb=True)

    def ialltoallv(self, send, send_counts, recv, recv_counts, sdispls=None, rdispls=None):
        return self.alltoallv(send, send_counts, recv, recv_counts, sdispls, rdispls, _nb=True)

    def ibarrier(self):
        return self.barrier(_nb=True)

    # ---- point-to-point -------------------------------------------------------------

    def send(self, buf, peer, tag=0):
        """Returns when buf may be reused (small messages at once, large ones once peer took them)."""
        b = buffer(buf, "send: buffer")
        check("gs_send", lib().gs_send(self._h(), b.ptr, b.count, b.dtype, int(peer), int(tag)))

    def recv(self, buf, peer=ANY_SOURCE, tag=0):
        """Receives a message from peer (ANY_SOURCE: any rank) with tag into buf; returns its
        RecvStatus(source, tag, count)."""
        b = buffer(buf, "recv: buffer", writable=True)
        st = P2pStatus()
        check("gs_recv", lib().gs_recv(self._h(), b.ptr, b.count, b.dtype, int(peer), int(tag),
                                       ctypes.byref(st)))
        return RecvStatus(st.source, st.tag, st.count)

    def isend(self, buf, peer, tag=0):
        b = buffer(buf, "isend: buffer")
        req = ctypes.c_void_p()
        check("gs_isend", lib().gs_isend(self._h(), b.ptr, b.count, b.dtype, int(peer), int(tag), _out(req)))
        return Request("gs_isend", req.value, self, (b,))

    def irecv(self, buf, peer=ANY_SOURCE, tag=0):
        """A Request whose wait() returns the RecvStatus (also in .result)."""
        b = buffer(buf, "irecv: buffer", writable=True)
        st = P2pStatus()
        req = ctypes.c_void_p()
        check("gs_irecv", lib().gs_irecv(self._h(), b.ptr, b.count, b.dtype, int(peer), int(tag),
                                         ctypes.byref(st), _out(req)))
        return Request("gs_irecv", req.value, self, (b, st),
                       on_done=lambda: RecvStatus(st.source, st.tag, st.count))


def _prefix(counts):
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out


def _sizes(values):
    return (ctypes.c_size_t * len(values))(*values)


def _fits(buf, counts, displs, what):
    end = max((d + c for c, d in zip(counts, displs)), default=0)
    if end > buf.count:
        raise ValueError("%s: %d elements, the blocks reach to %d" % (what, buf.count, end))
