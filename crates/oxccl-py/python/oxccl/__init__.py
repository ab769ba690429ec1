"""oxccl: collective communication for Python.

Every collective of NCCL (all-reduce, reduce-scatter, all-gather,
all-to-all, broadcast, reduce, gather, scatter), send/recv and groups, on
numpy arrays, torch tensors and any buffer, without copies, with the GIL
released while a call runs::

    import numpy as np, oxccl
    comm = oxccl.Communicator.from_env()          # torchrun, mpirun, srun, oxccl-run
    x = np.full(1024, comm.rank, dtype=np.float32)
    comm.all_reduce(x)                            # in place: x is the sum now

Ranks as threads of one process: ``oxccl.Communicator.init_threads(4)``.
Ranks anywhere: rank 0 makes ``oxccl.unique_id()`` and passes the text on;
every rank calls ``oxccl.Communicator.init(uid, nranks, rank)``.

``import oxccl.torch`` registers the ``"oxccl"`` torch.distributed
backend; ``oxccl.algo`` builds, verifies, simulates and runs collective
programs.
"""

import contextlib
import threading

from . import _oxccl
from ._buffers import SIZES, View, normalize_dtype, view
from .errors import (Error, InternalError, InvalidArgument, InvalidProgram, InvalidUsage, PeerError,
                     SystemFailure, Timeout, Unavailable)

__version__ = _oxccl.__version__

#: The reductions, by the names every call takes.
REDUCE_OPS = ("sum", "prod", "max", "min", "avg", "premul_sum")
#: The element types, by name.
DTYPES = tuple(SIZES)


def unique_id():
    """A new unique id as text (NCCL's ``ncclGetUniqueId``). Call it on one
    rank and pass the text to the others: this process then runs the
    rendezvous, so it must live until every rank has joined."""
    return _oxccl.unique_id()


# Reduction names as calls give them (``"sum"``, ``"SUM"``, a torch
# ``ReduceOp``) -> oxccl's, filled as they come.
_OP_NAMES = {}


def _op(op):
    try:
        return _OP_NAMES[op]
    except (KeyError, TypeError):
        pass
    if op is None:
        return "sum"
    name = str(getattr(op, "name", op)).lower().replace("_", "")
    names = {"sum": "sum", "prod": "prod", "product": "prod", "max": "max", "min": "min", "avg": "avg",
             "mean": "avg", "premulsum": "premul_sum", "mulsum": "premul_sum"}
    if name not in names:
        raise InvalidArgument(f"reduce op {op!r}: expected one of {', '.join(REDUCE_OPS)}")
    try:
        if len(_OP_NAMES) < 64:
            _OP_NAMES[op] = names[name]
    except TypeError:  # not hashable
        pass
    return names[name]


# (kind, dtype, op) names -> the native indices a call passes.
_CODES = {}


def _codes(kind, dtype, op):
    key = (kind, dtype, op)
    c = _CODES.get(key)
    if c is None:
        c = _CODES[key] = _oxccl.codes(kind, dtype, op)
    return c


# The collectives that reduce.
_REDUCING = ("all_reduce", "reduce", "reduce_scatter")


def _release(views):
    for v in views:
        v.release()


def _streams(views):
    """The distinct CUDA streams of the device buffers among ``views``, in
    order."""
    out = []
    for v in views:
        if v.device and v.stream not in out:
            out.append(v.stream)
    return out


def _ints(xs):
    return [int(x) for x in xs]


def _packed(counts):
    """Displacements of blocks of ``counts`` laid end to end."""
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += int(c)
    return out


def _opts(timeout=None, algo=None, transport=None, programs=None, encrypt=None, deterministic=None):
    d = {}
    if encrypt is not None:
        d["encrypt"] = bool(encrypt)
    if deterministic is not None:
        d["deterministic"] = bool(deterministic)
    if timeout is not None:
        d["timeout"] = float(getattr(timeout, "total_seconds", lambda: timeout)())
    if algo is not None:
        d["algo"] = str(algo)
    if transport is not None:
        d["transport"] = str(transport)
    if programs:
        d["programs"] = [p if isinstance(p, str) else p.to_json() for p in programs]
    return d


class Communicator:
    """One rank of a communicator. All ranks must issue collectives in the
    same order. Buffers are anything :func:`oxccl._buffers.view` takes;
    outputs are written in place and the output object is returned.

    Options of every constructor: ``timeout`` (seconds or a timedelta;
    ``OXCCL_TIMEOUT``, 300 s, by default), ``algo`` (an algorithm or a
    registered program's name), ``transport`` (``mem``, ``shm``, ``tcp``),
    ``programs`` (:class:`oxccl.algo.Program`\\ s or their JSON, verified
    and considered by the tuner), ``encrypt`` (``OXCCL_ENCRYPT``: the
    bootstrap and TCP traffic, every rank the same), ``deterministic``
    (``OXCCL_DETERMINISTIC``: floating-point all_reduce, reduce_scatter and
    reduce in the canonical order, the same bits at every size and
    algorithm; every rank the same).
    """

    def __init__(self, native):
        self._c = native
        self._local = threading.local()

    @classmethod
    def init(cls, unique_id, nranks, rank, **opts):
        """Rank ``rank`` of ``nranks`` joins the communicator of
        ``unique_id``; blocks until every rank has."""
        return cls(_oxccl._Comm.init(str(unique_id), int(nranks), int(rank), _opts(**opts)))

    @classmethod
    def from_env(cls):
        """The communicator the launcher describes: torchrun's ``RANK``,
        ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; mpirun, srun and
        oxccl-run's variables."""
        return cls(_oxccl._Comm.from_env())

    @classmethod
    def init_threads(cls, n, **opts):
        """``n`` ranks as threads of this process (NCCL's
        ``ncclCommInitAll``): run each in its own thread."""
        return [cls(c) for c in _oxccl._Comm.init_threads(int(n), _opts(**opts))]

    @property
    def rank(self):
        return self._c.rank

    @property
    def size(self):
        return self._c.size

    @property
    def unique_id(self):
        return self._c.uid

    def __repr__(self):
        return f"<oxccl.Communicator rank {self.rank} of {self.size}>"

    # --- launching -----------------------------------------------------

    def _launch(self, op, views):
        pending = getattr(self._local, "group", None)
        if pending is not None:
            pending.append((op, views))
            return
        try:
            self._c.launch([op], _streams(views))
        finally:
            _release(views)

    @contextlib.contextmanager
    def group(self):
        """Operations called inside run together at the end, as one group
        (NCCL's ``ncclGroupStart``/``End``): matched sends and receives
        cannot deadlock. Buffers must stay untouched until the block ends.

        A group may mix host and device buffers: its device operations are
        enqueued on their tensors' streams (collectives in order, then the
        sends and receives together; several streams wait for each other,
        as in NCCL), then its host operations run to their end. A send and
        the receive it matches are in the same kind of memory."""
        if getattr(self._local, "group", None) is not None:
            yield
            return
        pending = self._local.group = []
        try:
            yield
        except BaseException:
            self._local.group = None
            _release(v for _, vs in pending for v in vs)
            raise
        self._local.group = None
        try:
            if pending:
                self._c.launch([op for op, _ in pending], _streams(v for _, vs in pending for v in vs))
        finally:
            _release(v for _, vs in pending for v in vs)

    def _coll(self, kind, send, out, count_of, op="sum", root=0, dtype=None, scalar=None):
        sv = None if send is None else view(send, "the send buffer", dtype)
        try:
            ov = view(out, "the output buffer" if send is not None else "the buffer", dtype, writable=True)
        except BaseException:
            if sv is not None:
                sv.release()
            raise
        views = (ov,) if sv is None else (sv, ov)
        if sv is not None and sv.dtype != ov.dtype:
            _release(views)
            raise InvalidArgument(f"rank {self.rank}: {kind}: the send buffer holds {sv.dtype} but the output "
                                  f"buffer {ov.dtype}")
        count = count_of(sv, ov)
        op = _op(op)
        if (ov.boolean or (sv is not None and sv.boolean)) and kind in _REDUCING:
            # Booleans reduce logically, as PyTorch's NCCL backend does: a
            # sum is an or (max), a product an and (min).
            logical = {"sum": "max", "prod": "min", "max": "max", "min": "min"}
            if op not in logical:
                _release(views)
                raise InvalidArgument(f"rank {self.rank}: {kind}: {op} of booleans is not defined (sum and max "
                                      "are a logical or, prod and min a logical and)")
            op = logical[op]
        scalar = 1.0 if scalar is None else float(scalar)
        send_span = None if sv is None else sv.span
        if getattr(self._local, "group", None) is None:
            # Outside a group: straight to the native call, names as indices.
            streams = _streams(views) if ov.device or (sv is not None and sv.device) else []
            try:
                self._c.coll(_codes(kind, ov.dtype, op), send_span, ov.span, count, scalar, int(root), streams)
            finally:
                _release(views)
            return out
        self._launch(("coll", kind, send_span, ov.span, count, ov.dtype, op, scalar, int(root)), views)
        return out

    def _blocks(self, n, what):
        if n % self.size:
            raise InvalidArgument(f"rank {self.rank}: {what}: a buffer of {n} elements does not split into "
                                  f"{self.size} equal blocks")
        return n // self.size

    # --- collectives ---------------------------------------------------

    def all_reduce(self, send, out=None, op="sum", *, scalar=None, dtype=None):
        """The reduction (``op``) of every rank's ``send`` into ``out``, or
        into ``send`` when ``out`` is None. ``premul_sum`` multiplies this
        rank's input by ``scalar`` first."""
        if out is None:
            return self._coll("all_reduce", None, send, lambda s, o: o.count, op, dtype=dtype, scalar=scalar)
        return self._coll("all_reduce", send, out, lambda s, o: s.count, op, dtype=dtype, scalar=scalar)

    def reduce_scatter(self, send, out, op="sum", *, scalar=None, dtype=None):
        """Block ``rank`` of the reduction of every rank's ``send`` (``size``
        blocks of ``len(out)``) into ``out``. In place when ``out`` is this
        rank's block of ``send``."""
        return self._coll("reduce_scatter", send, out, lambda s, o: o.count, op, dtype=dtype, scalar=scalar)

    def all_gather(self, send, out, *, dtype=None):
        """Every rank's ``send``, in rank order, into ``out``. In place when
        ``send`` is this rank's block of ``out``."""
        return self._coll("all_gather", send, out, lambda s, o: s.count, dtype=dtype)

    def all_to_all(self, send, out, *, dtype=None):
        """Block ``j`` of ``send`` to rank ``j``; block ``j`` of ``out`` from
        rank ``j``."""
        return self._coll("all_to_all", send, out, lambda s, o: self._blocks(s.count, "all_to_all"), dtype=dtype)

    def broadcast(self, buf, root=0, out=None, *, dtype=None):
        """The root's ``buf`` into every rank's ``buf`` (or ``out``)."""
        if out is None:
            return self._coll("broadcast", None, buf, lambda s, o: o.count, root=root, dtype=dtype)
        return self._coll("broadcast", buf, out, lambda s, o: o.count, root=root, dtype=dtype)

    def reduce(self, send, out=None, op="sum", root=0, *, scalar=None, dtype=None):
        """The reduction of every rank's ``send`` into the root's ``out``
        (``send`` itself when ``out`` is None); other ranks' ``out`` is not
        written."""
        if out is None:
            return self._coll("reduce", None, send, lambda s, o: o.count, op, root, dtype, scalar)
        return self._coll("reduce", send, out, lambda s, o: s.count, op, root, dtype, scalar)

    def gather(self, send, out, root=0, *, dtype=None):
        """Every rank's ``send``, in rank order, into the root's ``out``."""
        return self._coll("gather", send, out, lambda s, o: s.count, root=root, dtype=dtype)

    def scatter(self, send, out, root=0, *, dtype=None):
        """Block ``r`` of the root's ``send`` into rank ``r``'s ``out``."""
        return self._coll("scatter", send, out, lambda s, o: o.count, root=root, dtype=dtype)

    def barrier(self):
        """Returns when every rank has called it."""
        b = bytearray(1)
        self.all_reduce(b, op="max", dtype="uint8")

    # --- point to point ------------------------------------------------

    def send(self, buf, peer, *, dtype=None):
        """Sends ``buf`` to ``peer`` (which calls :meth:`recv`)."""
        v = view(buf, "the send buffer", dtype)
        self._launch(("send", v.span, int(peer), v.dtype), [v])

    def recv(self, buf, peer, *, dtype=None):
        """Receives into ``buf`` from ``peer``."""
        v = view(buf, "the receive buffer", dtype, writable=True)
        self._launch(("recv", v.span, int(peer), v.dtype), [v])
        return buf

    def all_to_allv(self, send, send_counts, out, recv_counts, *, send_displs=None, recv_displs=None, dtype=None):
        """``send_counts[j]`` elements of ``send`` to rank ``j``;
        ``recv_counts[j]`` elements of ``out`` from rank ``j`` (packed in
        rank order unless displacements, in elements, say otherwise). In a
        group, its sends and receives join the group's."""
        views = [view(send, "the send buffer", dtype)]
        try:
            views.append(view(out, "the output buffer", dtype, writable=True))
        except BaseException:
            _release(views)
            raise
        sv, ov = views
        if sv.dtype != ov.dtype:
            _release(views)
            raise InvalidArgument(f"rank {self.rank}: all_to_allv: the send buffer holds {sv.dtype} but the "
                                  f"output buffer {ov.dtype}")
        self._launch(("all_to_allv", sv.span, _ints(send_counts), _ints(send_displs or _packed(send_counts)), ov.span,
                      _ints(recv_counts), _ints(recv_displs or _packed(recv_counts)), sv.dtype), views)
        return out

    # --- the communicator ----------------------------------------------

    def split(self, color, key=0):
        """NCCL's ``ncclCommSplit``: ranks of one ``color`` form a new
        communicator, numbered by ``key`` then rank; ``color=None`` takes no
        part (and gets None)."""
        c = self._c.split(None if color is None else int(color), int(key))
        return None if c is None else Communicator(c)

    def shrink(self, exclude, after_failure=False):
        """This communicator without the ranks in ``exclude`` (NCCL's
        ``ncclCommShrink``); ``after_failure`` when they are dead."""
        return Communicator(self._c.shrink([int(r) for r in exclude], bool(after_failure)))

    def close(self):
        """Leaves the communicator, telling the peers (so they do not take
        this rank for dead), and frees it; later calls raise
        :class:`InvalidUsage`. Waits for calls in flight."""
        self._c.close()

    @property
    def closed(self):
        return self._c.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def abort(self):
        """Stops every operation of this rank: calls in flight fail here and
        on the other ranks."""
        self._c.abort()

    def async_error(self):
        """The error that poisoned this communicator, or None."""
        return self._c.async_error()

    def stats(self):
        """Bytes moved with each peer: a list of dicts of ``peer``,
        ``transport``, ``sent``, ``recv``, ``put``, ``got``."""
        return self._c.stats()

    def bytes_moved(self):
        """Bytes that crossed between this rank and its peers by this
        rank's doing: messages it sent, data it put into peers' memory and
        data it got from theirs (each byte is counted by one rank)."""
        return sum(s["sent"] + s["put"] + s["got"] for s in self.stats())

    def transport_to(self, peer):
        """The transport to ``peer`` once connected (``mem``, ``shm``, ``tcp``)."""
        return self._c.transport_to(int(peer))

    def choice(self, kind, count, dtype="float32", root=0):
        """What the tuner runs for this call: an algorithm or a program."""
        return self._c.choice(kind, int(count), normalize_dtype(dtype), int(root))


__all__ = [
    "Communicator", "unique_id", "View", "view", "DTYPES", "REDUCE_OPS", "Error", "InvalidArgument",
    "InvalidProgram", "InvalidUsage", "SystemFailure", "PeerError", "Timeout", "Unavailable", "InternalError",
]
