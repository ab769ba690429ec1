"""The ``"oxccl"`` backend of torch.distributed.

``import oxccl.torch`` registers it; then, under torchrun (or with
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set)::

    import torch.distributed as dist, oxccl.torch
    dist.init_process_group("oxccl")
    model = torch.nn.parallel.DistributedDataParallel(model)

``dist.new_group(ranks, backend="oxccl")`` works too. Rank 0 of each group
makes the group's unique id and passes it through the group's store.

Operations run in the order they are called, on one thread per process
group that releases the GIL while oxccl works, so ``async_op=True`` (and
DDP's bucketed all-reduces) overlap with the caller's computation; each
returns a ``Work`` made from a ``torch.futures.Future`` whose value is the
list of output tensors. CUDA tensors go through oxccl's device path on the
caller's current stream.
"""

import atexit
import queue
import threading

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

import oxccl
from oxccl.errors import InvalidArgument, InvalidUsage

_RED = dist.ReduceOp.RedOpType
_OPS = {_RED.SUM: "sum", _RED.PRODUCT: "prod", _RED.MIN: "min", _RED.MAX: "max", _RED.AVG: "avg"}


def _op(opts):
    """The reduction of ``opts`` as oxccl's keyword arguments: ``op`` and,
    for PREMUL_SUM, ``scalar`` (the factor, a number or a one-element
    tensor, as ``torch.distributed._make_nccl_premul_sum`` makes it)."""
    red = getattr(opts, "reduceOp", None)
    if red is None:
        return {"op": "sum"}
    kind = getattr(red, "op", red)
    if kind in _OPS:
        return {"op": _OPS[kind]}
    if kind == _RED.PREMUL_SUM:
        factor = getattr(red, "factor", None)
        if factor is None:
            raise InvalidArgument("oxccl backend: PREMUL_SUM: this PyTorch does not show the factor to a Python "
                                  "backend; multiply the tensor and use SUM (oxccl's own all_reduce takes "
                                  "op='premul_sum')")
        if isinstance(factor, torch.Tensor):
            if factor.numel() != 1:
                raise InvalidArgument(f"oxccl backend: PREMUL_SUM's factor has {factor.numel()} elements, not 1")
            factor = factor.item()
        return {"op": "premul_sum", "scalar": float(factor)}
    raise InvalidArgument(f"oxccl backend: reduce op {kind} is not one oxccl has (SUM, PRODUCT, MIN, MAX, AVG, "
                          "PREMUL_SUM)")


_C10D = torch._C._distributed_c10d
# PyTorch 2.x hands a process group's calls to a Python subclass of its
# Backend (the "single" forms, coalescing, and the group's name and
# devices kept by the ProcessGroup torch makes around it); 1.13 takes a
# subclass of ProcessGroup itself.
_TWO = hasattr(getattr(_C10D, "Backend", None), "all_gather_single")
_Base = _C10D.Backend if _TWO else dist.ProcessGroup


class _Outcome:
    """What an operation ends with, seen two ways. ``done``: a Python
    future completed with ``(value, exception)`` (never with
    ``set_exception``: that keeps the error in the Python object alone,
    and C++, which DDP's reducer and PyTorch's own Work read, would see a
    success whose value is the exception). ``future``: the future PyTorch
    gets, chained on it, which fails in C++ when the operation did, so
    ``wait()``, ``value()`` and every ``then`` on it raise."""

    def __init__(self):
        self.done = torch.futures.Future()
        self.future = self.done.then(_settle)

    def finish(self, value, exc=None):
        self.done.set_result((value, exc))

    def wait(self):
        """Waits until the operation has ended and ``future`` says so
        (its callbacks have run); the operation's exception, or None."""
        try:
            self.future.wait()
        except Exception:  # the operation's exception, as C++ words it
            pass
        return self.done.value()[1]

    def ended(self):
        return self.future.done()


def _settle(done):
    value, exc = done.value()
    if exc is not None:
        raise exc
    return value


class _FutureWork(getattr(dist, "_Work", object)):
    """PyTorch 2.x's Work over an operation's outcome: ``wait()`` returns
    once it is done (raising its exception as oxccl raised it),
    ``is_completed()`` says whether it is, and ``get_future()`` is the
    future DDP's communication hooks and FSDP2 chain on."""

    def __init__(self, outcome):
        super().__init__()
        self._outcome = outcome

    def wait(self, timeout=None):
        exc = self._outcome.wait()
        if exc is not None:
            raise exc
        return True

    def is_completed(self):
        return self._outcome.ended()

    def is_success(self):
        return self.is_completed() and self._outcome.wait() is None

    def exception(self):
        return self._outcome.wait() if self.is_completed() else None

    def get_future(self):
        return self._outcome.future


def _make_work(outcome):
    # 1.13's DDP stalls on a Work written in Python; its C++ Work over a
    # future does not raise the future's error from wait() (PyTorch's
    # FutureWrappingWork), but its future, which DDP reads, fails.
    return _FutureWork(outcome) if _TWO else _create_work_from_future(outcome.future)


class ProcessGroupOxccl(_Base):
    """A torch.distributed process group (a Backend of one on PyTorch 2.x) on
    one oxccl communicator."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        # A group made again on the same store (destroy_process_group, then
        # init_process_group) must not read the last one's id: each
        # generation of ranks has a key of its own (every rank of one
        # generation joins before any of the next can).
        generation = (store.add("oxccl/joined", 1) - 1) // size
        key = f"oxccl/unique_id/{generation}"
        if rank == 0:
            uid = oxccl.unique_id()
            store.set(key, uid)
        else:
            uid = store.get(key).decode()
        self.comm = oxccl.Communicator.init(uid, size, rank, timeout=timeout)
        self._jobs = queue.SimpleQueue()
        self._worker = threading.Thread(target=_work, args=(self._jobs,), name=f"oxccl-pg-rank{rank}", daemon=True)
        self._worker.start()
        _LIVE.append(self)

    def getBackendName(self):
        return "oxccl"

    # PyTorch 2.x asks a Backend these; unanswered, its trampoline asks
    # itself again (a RecursionError). Operations of a coalescing manager
    # run one by one (oxccl orders them the same on every rank), and its
    # flat all-gathers and reduce-scatters go as one group (below).
    @property
    def supports_coalescing(self):
        return False

    @property
    def supports_splitting(self):
        return False

    def __repr__(self):
        return f"<ProcessGroupOxccl rank {self.rank()} of {self.size()}>"

    # --- running -------------------------------------------------------

    def _submit(self, fn, outputs, tensors=()):
        """Queues ``fn`` (CUDA tensors: runs it now, enqueued on the current
        stream); a Work whose future's value is ``outputs``."""
        outcome = _Outcome()
        if any(t.is_cuda for t in tensors):
            _complete(fn, outcome, outputs)
        else:
            self._jobs.put((fn, outcome, outputs))
        return _make_work(outcome)

    def shutdown(self):
        """Runs the operations queued so far, then leaves the communicator
        (the peers see a goodbye, not a death). At exit this happens to
        every group still open."""
        if self._worker.is_alive():
            self._jobs.put(None)
            self._worker.join()
        self.comm.close()

    # --- collectives ---------------------------------------------------

    def _each(self, tensors, call):
        """``call(t)`` on every tensor, as one oxccl group; a Work."""
        c = self.comm

        def run():
            with c.group():
                for t in tensors:
                    call(t)

        return self._submit(run, list(tensors), tensors)

    def allreduce(self, tensors, opts=None):
        op = _op(opts)
        return self._each(tensors, lambda t: self.comm.all_reduce(t, **op))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        return self._each(tensors, lambda t: self.comm.broadcast(t, root))

    def reduce(self, tensors, opts=None):
        op, root = _op(opts), opts.rootRank if opts is not None else 0
        return self._each(tensors, lambda t: self.comm.reduce(t, root=root, **op))

    def _allgather_base(self, output, input, opts=None):
        return self._submit(lambda: self.comm.all_gather(input, output), [output], [output])

    def allgather(self, output_tensors, input_tensors, opts=None):
        c, n = self.comm, self.size()
        _check_lists("allgather", output_tensors, input_tensors, n)

        def run():
            flats = [torch.empty(n * t.numel(), dtype=t.dtype, device=t.device) for t in input_tensors]
            with c.group():
                for t, f in zip(input_tensors, flats):
                    c.all_gather(t.contiguous(), f)
            for outs, t, f in zip(output_tensors, input_tensors, flats):
                for r, o in enumerate(outs):
                    o.copy_(f[r * t.numel():(r + 1) * t.numel()].view_as(o))

        return self._submit(run, [o for outs in output_tensors for o in outs], input_tensors)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        return self.allgather(output_lists, input_tensors, opts)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _op(opts)
        return self._submit(lambda: self.comm.reduce_scatter(input, output, **op), [output], [output])

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op, c, n = _op(opts), self.comm, self.size()
        _check_lists("reduce_scatter", input_tensors, output_tensors, n)

        def run():
            flats = [torch.cat([i.reshape(-1) for i in ins]) for ins in input_tensors]
            with c.group():
                for o, f in zip(output_tensors, flats):
                    c.reduce_scatter(f, o, **op)

        return self._submit(run, list(output_tensors), output_tensors)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        c, n = self.comm, self.size()

        def counts(t, splits, what):
            row = t[0].numel() if t.dim() > 0 and t.shape[0] > 0 else 1
            if not splits:
                if t.dim() == 0 or t.shape[0] % n:
                    raise InvalidArgument(f"rank {self.rank()}: alltoall: the {what} tensor's first dimension "
                                          f"({t.shape[0] if t.dim() else 0}) does not split into {n} equal parts")
                return [t.numel() // n] * n
            return [int(s) * row for s in splits]

        def run():
            sc, rc = counts(input, input_split_sizes, "input"), counts(output, output_split_sizes, "output")
            if not input_split_sizes and not output_split_sizes:
                c.all_to_all(input, output)
            else:
                c.all_to_allv(input, sc, output, rc)

        return self._submit(run, [output], [output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        c, n, me = self.comm, self.size(), self.rank()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise InvalidArgument(f"rank {me}: alltoall: {len(input_tensors)} input and {len(output_tensors)} output "
                                  f"tensors for {n} ranks")

        def run():
            ins = [t.contiguous() for t in input_tensors]
            with c.group():
                for peer in range(n):
                    if peer != me:
                        c.send(ins[peer], peer)
                        c.recv(output_tensors[peer], peer)
            output_tensors[me].copy_(ins[me])

        return self._submit(run, list(output_tensors), output_tensors)

    def gather(self, output_tensors, input_tensors, opts=None):
        c, n, root = self.comm, self.size(), opts.rootRank if opts is not None else 0
        me = self.rank()

        def run():
            (t,) = input_tensors
            # On the input's device, as allgather's: a CUDA gather into a
            # host buffer would mix memory kinds in one call.
            if me == root:
                flat = torch.empty(n * t.numel(), dtype=t.dtype, device=t.device)
                c.gather(t.contiguous(), flat, root)
                for r, o in enumerate(output_tensors[0]):
                    o.copy_(flat[r * t.numel():(r + 1) * t.numel()].view_as(o))
            else:
                c.gather(t.contiguous(), torch.empty(0, dtype=t.dtype, device=t.device), root)

        outs = [o for outs in output_tensors for o in outs]
        return self._submit(run, outs, input_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        c, root, me = self.comm, opts.rootRank if opts is not None else 0, self.rank()

        def run():
            (o,) = output_tensors
            if me == root:
                flat = torch.cat([i.reshape(-1) for i in input_tensors[0]])
            else:
                flat = torch.empty(0, dtype=o.dtype, device=o.device)
            c.scatter(flat, o, root)

        return self._submit(run, list(output_tensors), output_tensors)

    def send(self, tensors, dst, tag=0):
        (t,) = tensors
        return self._submit(lambda: self.comm.send(t.contiguous(), dst), [t], tensors)

    def recv(self, tensors, src, tag=0):
        (t,) = tensors
        return self._submit(lambda: self.comm.recv(t, src), [t], tensors)

    def recv_anysource(self, tensors, tag=0):
        raise InvalidUsage(f"rank {self.rank()}: recv from any source: oxccl matches receives by peer; "
                           "name the source rank")

    def barrier(self, opts=None):
        return self._submit(self.comm.barrier, [])

    # --- PyTorch 2.x's names for the flat-tensor forms ------------------

    def all_gather_single(self, output, input, opts=None):
        return self._allgather_base(output, input, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        return self._reduce_scatter_base(output, input, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        """Several flat all-gathers as one oxccl group (FSDP2's)."""
        c = self.comm

        def run():
            with c.group():
                for o, i in zip(outputs, inputs):
                    c.all_gather(i, o)

        return self._submit(run, list(outputs), outputs)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        """Several flat reduce-scatters as one oxccl group."""
        c, op = self.comm, _op(opts)

        def run():
            with c.group():
                for o, i in zip(outputs, inputs):
                    c.reduce_scatter(i, o, **op)

        return self._submit(run, list(outputs), outputs)

    # --- oxccl's own ---------------------------------------------------

    def stats(self):
        """Bytes moved with each peer (oxccl's ``Communicator.stats``)."""
        return self.comm.stats()


def _work(jobs):
    """The worker of one process group: runs its operations in order and
    completes their futures (the exception of a failed one is the
    future's, raised by ``wait()``)."""
    while True:
        job = jobs.get()
        if job is None:
            return
        _complete(*job)


def _complete(fn, outcome, value):
    """Runs ``fn`` and finishes ``outcome``: with ``value``, or with the
    exception, which ``wait()`` raises."""
    try:
        fn()
    except BaseException as e:
        outcome.finish(None, e)
    else:
        outcome.finish(value)


# Strong references: PyTorch 1.13 has no hook for destroy_process_group,
# and a communicator left to the interpreter's teardown ends in C++'s
# static destructors (an abort, seen on 4-rank runs); every group is
# closed at exit instead, before the interpreter goes.
_LIVE = []


@atexit.register
def _close_all():
    for pg in list(_LIVE):
        try:
            pg.shutdown()
        except Exception:
            pass


def _check_lists(what, lists, tensors, n):
    if len(lists) != len(tensors) or any(len(ls) != n for ls in lists):
        raise InvalidArgument(f"{what}: expected {len(tensors)} lists of {n} tensors, got "
                              f"{[len(ls) for ls in lists]}")


def _create(store, rank, size, timeout):
    return ProcessGroupOxccl(store, rank, size, timeout)


def communicator(group=None):
    """The oxccl :class:`~oxccl.Communicator` under ``group`` (the default
    group when None), for oxccl's own calls and ``stats()``."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if _TWO and not isinstance(pg, ProcessGroupOxccl):
        # The ProcessGroup PyTorch 2.x made around the backend: oxccl's for
        # the CPU, or for CUDA only ("cpu:gloo,cuda:oxccl").
        for dev in ("cpu", "cuda"):
            try:
                b = pg._get_backend(torch.device(dev))
            except RuntimeError:
                continue
            if isinstance(b, ProcessGroupOxccl):
                pg = b
                break
    if not isinstance(pg, ProcessGroupOxccl):
        raise InvalidUsage(f"{pg!r} is not an oxccl process group")
    return pg.comm


def register():
    """Registers the ``"oxccl"`` backend (once; importing this module does).
    PyTorch 2.x calls it through the ``torch.distributed.backends`` entry
    point the package declares, so ``init_process_group("oxccl")`` works
    after ``pip install`` without importing anything."""
    if hasattr(dist.Backend, "OXCCL"):
        return
    if _TWO:
        dist.Backend.register_backend("oxccl", _create, devices=["cpu", "cuda"])
    else:
        dist.Backend.register_backend("oxccl", _create)


register()

__all__ = ["ProcessGroupOxccl", "communicator"]
