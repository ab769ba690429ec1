"""What each rank of a multi-process test runs (see launch.py); each
function returns what the test checks."""

import os
import pickle
import time

import numpy as np

import oxccl
from common import run_collective


def _out(value):
    """Writes this rank's result now (for a rank that then dies)."""
    with open(os.environ["OXCCL_TEST_OUT"], "wb") as f:
        pickle.dump(value, f)


def _vanish():
    """Ends this rank as a crash would, as its peers see it: no goodbye
    (its result, None, written first)."""
    _out(None)
    os._exit(0)


def pkg_collectives(kinds, dtypes):
    with oxccl.Communicator.from_env() as c:
        root = 1 % c.size
        return {(k, d): run_collective(c, k, 29, d, "sum", root) for k in kinds for d in dtypes}


def pkg_unique_id():
    # Rank 0 makes the id; the others read it from a file it writes.
    path = os.path.join(os.path.dirname(os.environ["OXCCL_TEST_OUT"]), "uid")
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank == 0:
        uid = oxccl.unique_id()
        with open(path + ".tmp", "w") as f:
            f.write(uid)
        os.rename(path + ".tmp", path)
    else:
        deadline = time.time() + 60
        while not os.path.exists(path):
            if time.time() > deadline:
                raise TimeoutError("rank 0 wrote no unique id")
            time.sleep(0.05)
        uid = open(path).read()
    with oxccl.Communicator.init(uid, n, rank, timeout=60) as c:
        x = np.full(4, c.rank + 1, dtype=np.float64)
        c.all_reduce(x)
        return c.rank, float(x[0])


def pkg_peer_dies():
    c = oxccl.Communicator.from_env()
    c.barrier()
    if c.rank == 1:
        time.sleep(0.5)
        _vanish()
    t = time.time()
    try:
        for _ in range(1000):
            c.all_reduce(np.ones(1 << 20, dtype=np.float32))
        return ("none", "the collectives went on without rank 1", time.time() - t)
    except oxccl.Error as e:
        return (type(e).__name__, str(e), time.time() - t)


def pkg_ctrl_c():
    """Rank 1 is Ctrl-C'd while its all_reduce waits for rank 2, which never
    calls: it raises KeyboardInterrupt at once; rank 0 (in the same call)
    hears that rank 1 aborted."""
    import signal
    import threading

    c = oxccl.Communicator.from_env()
    c.barrier()
    if c.rank == 2:
        time.sleep(3)
        return ("idle", "", 0.0)
    if c.rank == 1:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    t = time.time()
    try:
        c.all_reduce(np.ones(16, dtype=np.float32))
        return ("none", "the all_reduce ended without rank 2", time.time() - t)
    except KeyboardInterrupt:
        return ("KeyboardInterrupt", "", time.time() - t)
    except oxccl.Error as e:
        return (type(e).__name__, str(e), time.time() - t)


# --- torch.distributed -------------------------------------------------------


def _finish(dist):
    """Ends a training worker whose caller has dropped what held the process
    group (DDP's reducer, FSDP's state, the optimizer, the last loss): the
    group is collected now, while Python is whole. Left to the interpreter's
    exit, gloo's group is destroyed while Python is being torn down, and its
    worker threads abort the process now and then ("terminate called without
    an active exception", seen once on torch 2.15 in CI)."""
    import gc

    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    gc.collect()


def _torch_init(backend):
    import datetime

    import torch.distributed as dist

    import oxccl.torch  # noqa: F401  registers "oxccl"

    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=120))
    return dist


def torch_semantics():
    """torch.distributed's calls as PyTorch documents them, on "oxccl"."""
    import torch

    dist = _torch_init("oxccl")
    r, n = dist.get_rank(), dist.get_world_size()
    out = {}
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.int8,
               torch.uint8):
        x = torch.full((5,), r + 1, dtype=dt)
        dist.all_reduce(x)
        out[("all_reduce", str(dt))] = x.tolist()
    for name, op in (("max", dist.ReduceOp.MAX), ("min", dist.ReduceOp.MIN), ("prod", dist.ReduceOp.PRODUCT),
                     ("avg", dist.ReduceOp.AVG)):
        x = torch.full((3,), float(r + 1))
        dist.all_reduce(x, op=op)
        out[("op", name)] = x.tolist()
    try:
        dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND)
        out["band"] = "no error"
    except Exception as e:
        out["band"] = str(e)
    # async_op: the work completes and the tensor holds the result.
    x = torch.full((1000,), float(r))
    w = dist.all_reduce(x, async_op=True)
    w.wait()
    # PyTorch 2.x hands back its own Work around the backend's, whose
    # is_completed() never asks a Python backend (it stays False; gloo's
    # is True); its future is the backend's, done after wait().
    import oxccl.torch

    two = oxccl.torch._TWO
    out["async"] = (x[0].item(), w.get_future().done() if two else w.is_completed())
    fut = dist.all_reduce(torch.ones(4), async_op=True).get_future()
    out["future"] = fut.wait()[0].tolist()
    # all_gather into a list, all_gather_into_tensor, reduce_scatter(_tensor).
    lst = [torch.zeros(2) for _ in range(n)]
    dist.all_gather(lst, torch.full((2,), float(r)))
    out["all_gather"] = [t.tolist() for t in lst]
    flat = torch.zeros(2 * n)
    dist.all_gather_into_tensor(flat, torch.full((2,), float(r)))
    out["all_gather_into_tensor"] = flat.tolist()
    o = torch.zeros(2)
    dist.reduce_scatter(o, [torch.full((2,), float(r + p)) for p in range(n)])
    out["reduce_scatter"] = o.tolist()
    o = torch.zeros(3)
    dist.reduce_scatter_tensor(o, torch.arange(3 * n, dtype=torch.float32) * (r + 1))
    out["reduce_scatter_tensor"] = o.tolist()
    b = torch.full((4,), float(r))
    dist.broadcast(b, src=n - 1)
    out["broadcast"] = b.tolist()
    x = torch.full((4,), float(r + 1))
    dist.reduce(x, dst=0)
    out["reduce"] = x.tolist()
    # all_to_all_single with equal and uneven splits; all_to_all of lists.
    o = torch.zeros(n)
    dist.all_to_all_single(o, torch.arange(n, dtype=torch.float32) + 10 * r)
    out["all_to_all_single"] = o.tolist()
    insplit = [p + 1 for p in range(n)]
    outsplit = [r + 1] * n
    inp = torch.cat([torch.full((p + 1, 2), float(10 * r + p)) for p in range(n)])
    o = torch.zeros(sum(outsplit), 2)
    dist.all_to_all_single(o, inp, outsplit, insplit)
    out["all_to_all_uneven"] = o[:, 0].tolist()
    outs = [torch.zeros(1) for _ in range(n)]
    dist.all_to_all(outs, [torch.full((1,), float(10 * r + p)) for p in range(n)])
    out["all_to_all"] = [t.item() for t in outs]
    g = [torch.zeros(2) for _ in range(n)] if r == 0 else None
    dist.gather(torch.full((2,), float(r)), g, dst=0)
    out["gather"] = None if g is None else [t.tolist() for t in g]
    s = torch.zeros(2)
    dist.scatter(s, [torch.full((2,), float(p)) for p in range(n)] if r == 0 else None, src=0)
    out["scatter"] = s.tolist()
    # send/recv around a ring in matched order.
    t = torch.full((3,), float(r))
    if r % 2 == 0:
        dist.send(t, (r + 1) % n)
        dist.recv(t, (r - 1) % n)
    else:
        got = torch.zeros(3)
        dist.recv(got, (r - 1) % n)
        dist.send(t, (r + 1) % n)
        t = got
    out["sendrecv"] = t.tolist()
    dist.barrier()
    # A subgroup of even ranks.
    sub = dist.new_group([p for p in range(n) if p % 2 == 0], backend="oxccl")
    if r % 2 == 0:
        x = torch.ones(2)
        dist.all_reduce(x, group=sub)
        out["new_group"] = x.tolist()
    out["backend"] = dist.get_backend()
    dist.barrier()  # rank 0 holds the store: nobody leaves before all are done with it
    dist.destroy_process_group()
    return out


def _model(torch, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 8))


def _batches(torch, rank, steps):
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)) for _ in range(steps)]


def ddp_train(backend, steps, zero=False, hook=None, bucket_mb=None):
    """A small MLP trained by PyTorch's DistributedDataParallel (and, with
    ``zero``, its ZeroRedundancyOptimizer; with ``hook`` "bf16" or "fp16",
    PyTorch's compression hook on its gradients; with ``bucket_mb``, DDP's
    buckets of that many MiB) on ``backend``: the final
    parameters, the losses, the step times and oxccl's byte counts."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist = _torch_init(backend)
    r = dist.get_rank()
    torch.set_num_threads(1)
    model = DDP(_model(torch)) if bucket_mb is None else DDP(_model(torch), bucket_cap_mb=bucket_mb)
    if hook is not None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(None, {"bf16": default_hooks.bf16_compress_hook,
                                        "fp16": default_hooks.fp16_compress_hook}[hook])
    if zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses, times = [], []
    before = 0
    for i, (x, y) in enumerate(_batches(torch, r, steps)):
        if i == 2 and backend == "oxccl":  # after DDP's first-steps bucket rebuild
            before = _moved(dist)
        t = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
        losses.append(loss.item())
    moved = (_moved(dist) - before) if backend == "oxccl" else 0
    params = [p.detach().clone().numpy() for p in model.parameters()]
    nparams = sum(p.numel() for p in model.parameters())
    del model, opt, loss
    _finish(dist)
    return {"params": params, "losses": losses, "times": times, "moved": moved, "nparams": nparams,
            "measured_steps": steps - 2}


def _moved(dist):
    import oxccl.torch

    return oxccl.torch.communicator().bytes_moved()


def fsdp_train(backend, steps):
    """PyTorch's FSDP2 (``fully_shard`` on each layer and the root,
    resharding after forward) where it runs on a Python backend (2.x);
    else the reason it does not."""
    import torch

    import oxccl.torch

    try:
        from torch.distributed.fsdp import fully_shard
    except Exception as e:  # 1.13: its FSDP fails to import on Python 3.11; 2.4: fully_shard lives elsewhere
        return {"unsupported": f"torch {torch.__version__}: no FSDP2 here: {type(e).__name__}: {e}"}
    if not oxccl.torch._TWO:
        return {"unsupported": f"torch {torch.__version__}: no FSDP2 here: it needs a Backend, which this torch does not "
                               "let Python write"}
    from torch.distributed.device_mesh import init_device_mesh

    dist = _torch_init(backend)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = _model(torch)
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    before = _moved(dist) if backend == "oxccl" else 0
    for x, y in _batches(torch, dist.get_rank(), steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    moved = (_moved(dist) - before) if backend == "oxccl" else 0
    del model, opt, loss
    _finish(dist)
    return {"moved": moved}


def torch2_calls():
    """The calls PyTorch 2.x's parallelism code makes on a backend, on
    "oxccl": the flat ("single") forms, their coalesced forms, PREMUL_SUM
    with host and tensor factors, batched point-to-point, object
    collectives, the group's name, and DTensor over a CPU device mesh."""
    import torch

    dist = _torch_init("oxccl")
    r, n = dist.get_rank(), dist.get_world_size()
    out = {"group_name": dist.distributed_c10d._get_default_group().group_name}
    t = torch.zeros(3 * n)
    dist.all_gather_into_tensor(t, torch.full((3,), float(r)))
    out["all_gather_into_tensor"] = t.tolist()
    t = torch.zeros(2)
    dist.reduce_scatter_tensor(t, torch.arange(2.0 * n))
    out["reduce_scatter_tensor"] = t.tolist()
    t = torch.zeros(2)
    dist.reduce_scatter_tensor(t, torch.arange(2.0 * n), op=dist.ReduceOp.AVG)
    out["reduce_scatter_avg"] = t.tolist()
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": r, "name": f"r{r}"})
    out["all_gather_object"] = objs
    x = torch.full((4,), float(r + 1))
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5))
    out["premul_host"] = x.tolist()
    x = torch.full((4,), float(r + 1))
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(torch.tensor([2.0])))
    out["premul_tensor"] = x.tolist()
    outs = [torch.zeros(2 * n), torch.zeros(n)]
    with dist._coalescing_manager(async_ops=False):
        dist.all_gather_into_tensor(outs[0], torch.full((2,), float(r)))
        dist.all_gather_into_tensor(outs[1], torch.full((1,), float(r)))
    out["all_gather_coalesced"] = [o.tolist() for o in outs]
    outs = [torch.zeros(2), torch.zeros(1)]
    with dist._coalescing_manager(async_ops=False):
        dist.reduce_scatter_tensor(outs[0], torch.ones(2 * n))
        dist.reduce_scatter_tensor(outs[1], torch.ones(n))
    out["reduce_scatter_coalesced"] = [o.tolist() for o in outs]
    got = torch.zeros(2)
    ops = [dist.P2POp(dist.isend, torch.full((2,), float(r)), (r + 1) % n), dist.P2POp(dist.irecv, got, (r - 1) % n)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    out["batch_isend_irecv"] = got.tolist()
    sizes = [k + 1 for k in range(n)]  # rank r sends k + 1 rows to rank k
    inp = torch.full((sum(sizes),), float(r))
    o = torch.zeros(n * (r + 1))
    dist.all_to_all_single(o, inp, output_split_sizes=[r + 1] * n, input_split_sizes=sizes)
    out["all_to_all_splits"] = o.tolist()
    dist.barrier(device_ids=None)
    # With device ids (NCCL's way to pick the barrier's GPU): the same barrier,
    # timed from after a 0.3 s sleep of rank 0's, which every rank waits out.
    if r == 0:
        time.sleep(0.3)
    t = time.perf_counter()
    dist.barrier(device_ids=[0])
    out["barrier_device_ids_waited"] = time.perf_counter() - t
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (n,))
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(8, 6, generator=g), torch.randn(6, 4, generator=g)
    da = distribute_tensor(a, mesh, [Shard(0)])
    out["dtensor_local_rows"] = da.to_local().shape[0]
    full = da.redistribute(mesh, [Replicate()]).to_local()
    out["dtensor_redistribute_exact"] = bool(torch.equal(full, a))
    prod = (da @ distribute_tensor(b, mesh, [Replicate()])).full_tensor()
    out["dtensor_matmul_err"] = float((prod - a @ b).abs().max())
    dist.destroy_process_group()
    # A second init in the same process works after destroy.
    dist = _torch_init("oxccl")
    y = torch.ones(2)
    dist.all_reduce(y)
    out["reinit"] = y.tolist()
    dist.destroy_process_group()
    return out


def init_by_name():
    """init_process_group("oxccl") in a process that never imports oxccl.torch:
    PyTorch 2.x finds the backend through the package's entry point."""
    import sys

    import torch
    import torch.distributed as dist

    imported_before = "oxccl.torch" in sys.modules
    dist.init_process_group("oxccl")
    x = torch.ones(3)
    dist.all_reduce(x)
    out = {"imported_before": imported_before, "sum": x.tolist(), "backend": str(dist.get_backend())}
    dist.destroy_process_group()
    return out


# --- FSDP2 on a small transformer ------------------------------------------

D_MODEL, SEQ, BATCH = 16, 6, 4


def _transformer(torch, seed=0):
    """A two-block pre-norm transformer (self-attention, then an MLP, each
    with its residual) on sequences of D_MODEL features; the same weights
    for every rank and the reference."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self, d, heads=2):
            super().__init__()
            self.heads = heads
            self.norm1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d)
            self.norm2, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
            x = x + self.proj(a)
            return x + self.down(F.gelu(self.up(self.norm2(x))))

    class Model(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.inp = nn.Linear(8, d)
            self.blocks = nn.ModuleList([Block(d), Block(d)])
            self.norm, self.out = nn.LayerNorm(d), nn.Linear(d, 8)

        def forward(self, x):
            x = self.inp(x)
            for blk in self.blocks:
                x = blk(x)
            return self.out(self.norm(x))

    torch.manual_seed(seed)
    return Model(D_MODEL)


def _sequences(torch, rank, steps):
    g = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(BATCH, SEQ, 8, generator=g), torch.randn(BATCH, SEQ, 8, generator=g)) for _ in range(steps)]


def fsdp2_train(backend, steps, mixed):
    """PyTorch's FSDP2 (``fully_shard`` on each block and the root, Adam) on
    ``backend``: the losses of this rank's batches, the final parameters
    (gathered whole), the step times; ``mixed``: bf16 parameters, fp32
    gradient reduction."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dist = _torch_init(backend)
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else \
        MixedPrecisionPolicy()
    model = _transformer(torch)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses, times, grads = [], [], None
    for x, y in _sequences(torch, dist.get_rank(), steps):
        t = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        opt.zero_grad()
        loss.backward()
        times.append(time.perf_counter() - t)
        if grads is None:  # the first step's averaged gradients, gathered whole (not timed)
            grads = {name: p.grad.full_tensor().float().numpy().copy() for name, p in model.named_parameters()}
        t = time.perf_counter()
        opt.step()
        times[-1] += time.perf_counter() - t
        losses.append(loss.item())
    params = {name: p.full_tensor().detach().numpy().copy() for name, p in model.named_parameters()}
    del model, opt, loss
    _finish(dist)
    return {"losses": losses, "params": params, "grads": grads, "times": times}


def fsdp2_reference(n, steps):
    """What FSDP2 on ``n`` ranks computes, in one process without
    torch.distributed: the same model and Adam on every rank's batches at
    once, the loss the mean of the ranks' losses (each rank's gradient is
    averaged over the ranks); the ranks' losses by step, the first step's
    gradients, and the initial and final parameters."""
    import torch

    model = _transformer(torch)
    initial = {name: p.detach().numpy().copy() for name, p in model.named_parameters()}
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    data = [_sequences(torch, r, steps) for r in range(n)]
    losses, grads = [], None
    for i in range(steps):
        each = [torch.nn.functional.mse_loss(model(data[r][i][0]), data[r][i][1]) for r in range(n)]
        opt.zero_grad()
        torch.stack(each).mean().backward()
        if grads is None:
            grads = {name: p.grad.numpy().copy() for name, p in model.named_parameters()}
        opt.step()
        losses.append([v.item() for v in each])
    params = {name: p.detach().numpy().copy() for name, p in model.named_parameters()}
    return {"losses": losses, "params": params, "grads": grads, "initial": initial}


def ddp_peer_dies(victim, at):
    """DDP training in which rank ``victim`` vanishes (no goodbye) before
    step ``at``: what each other rank's step raised, and how long after
    the step began."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist = _torch_init("oxccl")
    r = dist.get_rank()
    model = DDP(_model(torch))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for i, (x, y) in enumerate(_batches(torch, r, at + 3)):
        if i == at and r == victim:
            _vanish()
        t = time.perf_counter()
        try:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        except Exception as e:
            return {"step": i, "error": f"{type(e).__name__}: {e}", "after": time.perf_counter() - t}
    return {"step": None, "error": None, "after": None}


def mixed_backends(spec):
    """``init_process_group(spec)`` with a "device:backend,..." string:
    which backend PyTorch hands each device, and a CPU all_reduce (with
    the bytes oxccl moved for it, when oxccl has the CPU)."""
    import torch

    import oxccl.torch

    dist = _torch_init(spec)
    pg = dist.distributed_c10d._get_default_group()
    out = {"backend": dist.get_backend()}
    for dev in ("cpu", "cuda"):
        try:
            out[dev] = type(pg._get_backend(torch.device(dev))).__name__
        except RuntimeError as e:
            out[dev] = f"error: {e}"
    before = oxccl.torch.communicator().bytes_moved() if out["cpu"] == "ProcessGroupOxccl" else None
    x = torch.ones(1000)
    dist.all_reduce(x)
    out["sum"] = x[0].item()
    if before is not None:
        out["moved"] = oxccl.torch.communicator().bytes_moved() - before
    dist.barrier()
    dist.destroy_process_group()
    return out


def torch_peer_dies():
    """Rank 1 vanishes (no goodbye); each other rank's calls after it, in
    every form a caller waits in: what each raised (None: nothing)."""
    import torch

    dist = _torch_init("oxccl")
    dist.barrier()
    if dist.get_rank() == 1:
        _vanish()
    forms = {
        "call": lambda x: dist.all_reduce(x),
        "wait": lambda x: dist.all_reduce(x, async_op=True).wait(),
        "future": lambda x: dist.all_reduce(x, async_op=True).get_future().wait(),
        "then": lambda x: dist.all_reduce(x, async_op=True).get_future().then(lambda f: f.value()[0] * 2).wait(),
    }
    out = {}
    for name, form in forms.items():
        try:
            form(torch.ones(1 << 16))
            out[name] = None
        except Exception as e:
            out[name] = f"{type(e).__name__}: {e}"
    return out
