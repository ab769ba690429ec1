#!/usr/bin/env python3
"""A real NCCL client on oxccl: PyTorch's "nccl" backend, with oxccl's
libnccl.so.2 loaded in place of NVIDIA's (LD_PRELOAD; its soname is
libnccl.so.2, so torch's own dependency resolves to it and NVIDIA's library
is never loaded).

    LD_PRELOAD=/path/to/oxccl/libnccl.so.2 python3 torch_nccl_client.py [-np 2]

Ranks are processes sharing GPU 0 (oxccl accepts several ranks per GPU;
NVIDIA's NCCL refuses them before 2.30). Each rank checks, on CUDA tensors:
all_reduce, broadcast, all_gather_into_tensor, reduce_scatter_tensor,
send/recv around a ring, then a few DistributedDataParallel steps whose
parameters must agree on every rank. One line per check; exit status 0 only
if every check passed and the NCCL torch used was oxccl's.
"""
import argparse
import os
import socket
import sys
import time


def loaded_nccl():
    """The libnccl this process mapped (path), from /proc/self/maps."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libnccl" in line and "/" in line}
    return sorted(paths)


def rank_main(rank, world, port, errors):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    t0 = time.perf_counter()
    dist.init_process_group("nccl", rank=rank, world_size=world)
    say = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
    failed = []

    def check(name, ok, detail=""):
        if not ok:
            failed.append(name)
            print(f"FAIL rank {rank}: {name} {detail}", flush=True)
        else:
            say(f"ok   {name} {detail}")

    # What torch's NCCL calls bind to: the first definition in the global
    # scope, where a preloaded library comes first. (torch may map NVIDIA's
    # libnccl too, by its full path: it is then never called.)
    import ctypes
    v = ctypes.c_int(0)
    ctypes.CDLL(None).ncclGetVersion(ctypes.byref(v))
    check("ncclGetVersion binds to oxccl's libnccl.so.2", v.value == 23203,
          f"(version code {v.value}; libnccl mapped: {loaded_nccl()}; torch built with NCCL {torch.cuda.nccl.version()})")

    n = 1 << 20
    x = torch.full((n,), float(rank + 1), device=dev)
    t = time.perf_counter()
    dist.all_reduce(x)
    torch.cuda.synchronize()
    first = time.perf_counter() - t
    check("all_reduce", bool((x == world * (world + 1) / 2).all()), f"(init {t - t0:.2f} s, first call {first * 1e3:.1f} ms)")

    b = torch.arange(1000, device=dev, dtype=torch.float64) * (rank == world - 1)
    dist.broadcast(b, src=world - 1)
    check("broadcast", bool((b == torch.arange(1000, device=dev, dtype=torch.float64)).all()))

    mine = torch.full((4096,), rank, device=dev, dtype=torch.int32)
    out = torch.empty(4096 * world, device=dev, dtype=torch.int32)
    dist.all_gather_into_tensor(out, mine)
    want = torch.arange(world, device=dev, dtype=torch.int32).repeat_interleave(4096)
    check("all_gather_into_tensor", bool((out == want).all()))

    inp = torch.arange(world * 513, device=dev, dtype=torch.bfloat16)
    rs = torch.empty(513, device=dev, dtype=torch.bfloat16)
    dist.reduce_scatter_tensor(rs, inp)
    want = (torch.arange(rank * 513, (rank + 1) * 513, device=dev, dtype=torch.bfloat16) * world)
    check("reduce_scatter_tensor (bf16)", bool((rs == want).all()))

    nxt, prv = (rank + 1) % world, (rank - 1) % world
    s = torch.full((77,), rank * 10 + 1, device=dev, dtype=torch.int64)
    r = torch.zeros(77, device=dev, dtype=torch.int64)
    ops = [dist.P2POp(dist.isend, s, nxt), dist.P2POp(dist.irecv, r, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    torch.cuda.synchronize()
    check("send/recv ring", bool((r == prv * 10 + 1).all()))

    torch.manual_seed(1234 + rank)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        loss = ddp(torch.randn(32, 64, device=dev)).square().mean()
        loss.backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(every, flat)
    check("DDP: 3 steps, parameters equal on every rank", all(bool(torch.equal(e, every[0])) for e in every))

    dist.destroy_process_group()
    if failed:
        errors.put((rank, failed))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-np", type=int, default=2)
    a = p.parse_args()
    if "libnccl.so.2" not in os.environ.get("LD_PRELOAD", ""):
        print("torch_nccl_client: set LD_PRELOAD to oxccl's libnccl.so.2", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    errors = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, a.np, port, errors)) for r in range(a.np)]
    for q in procs:
        q.start()
    deadline = time.time() + 240
    for q in procs:
        q.join(max(1, deadline - time.time()))
    hung = [i for i, q in enumerate(procs) if q.is_alive()]
    for q in procs:
        if q.is_alive():
            q.kill()
    bad = [q.exitcode for q in procs if q.exitcode != 0]
    fails = []
    while not errors.empty():
        fails.append(errors.get())
    if hung or bad or fails:
        print(f"torch_nccl_client: FAILED (hung ranks {hung}, exit codes {bad}, failed checks {fails})", flush=True)
        return 1
    print(f"torch_nccl_client: every check passed on {a.np} ranks", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
