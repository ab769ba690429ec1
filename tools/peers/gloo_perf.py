#!/usr/bin/env python3
"""gloo_perf: Gloo collectives (torch.distributed's "gloo" backend) measured
the way nccl-tests measures NCCL's, so tools/compare-peers can put Gloo next
to oxccl-perf.

    python3 gloo_perf.py all_reduce -np 4 -b 8 -e 64M -f 4 -n 20 -w 5
    torchrun --nproc-per-node 4 gloo_perf.py all_reduce -b 8 -e 64M   # or any launcher
    NCCL_MULTI_RANK_GPU_ENABLE=1 python3 gloo_perf.py all_reduce -np 4 --backend nccl   # NCCL, GPU buffers

Without RANK/WORLD_SIZE in the environment it starts -np ranks of itself on
this machine (rendezvous on 127.0.0.1, GLOO_SOCKET_IFNAME=lo unless set);
with them, this process is one rank (MASTER_ADDR/MASTER_PORT name the store).

COLL: all_reduce all_gather reduce_scatter alltoall broadcast reduce gather
scatter sendrecv. Flags are nccl-tests': -b -e -i -f -n -w -d -o -r -c -a.
Sizes, counts, algbw/busbw and #wrong follow nccl-tests (see mpi_perf.c).
Gloo's own calls decide what in place means:
  - all_reduce, broadcast and reduce work in place only: their out-of-place
    run copies the input into the output first (the copy is timed);
  - all_gather in place gathers into views of one buffer, this rank's
    input being its own view; alltoall (all_to_all_single), gather, scatter
    and sendrecv have no in-place form here: those columns read N/A, as do
    sizes that leave an empty block per rank (Gloo fails on those);
  - a collective Gloo lacks (reduce_scatter before torch 2.x) prints
    "# unsupported: ..." and exits with status 3.
"""
import argparse
import datetime
import os
import signal
import socket
import subprocess
import sys
import time

COLLS = ["all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "reduce", "gather", "scatter",
         "sendrecv"]
SPLIT = {"all_gather", "reduce_scatter", "alltoall", "gather", "scatter"}
REDUCING = {"all_reduce", "reduce_scatter", "reduce"}
ROOTED = {"broadcast", "reduce", "gather", "scatter"}
DTYPES = {"float": ("float32", 4), "double": ("float64", 8), "int32": ("int32", 4), "int64": ("int64", 8),
          "int8": ("int8", 1), "uint8": ("uint8", 1)}
OPS = ["sum", "prod", "max", "min"]
UNSUPPORTED = 3


def busfactor(coll, n):
    if coll == "all_reduce":
        return 2.0 * (n - 1) / n
    if coll in SPLIT:
        return (n - 1) / n
    return 1.0


def parse_size(text):
    t = text.strip()
    mult = 1
    if t[-1:] in "bB":
        t = t[:-1]
    if t[-1:].upper() in ("K", "M", "G"):
        mult = 1 << {"K": 10, "M": 20, "G": 30}[t[-1].upper()]
        t = t[:-1]
    try:
        v = float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (a number with an optional K, M or G)")
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: sizes are not negative")
    return int(v * mult)


def fmt_num(v, width):
    """A number in `width` columns, with as many decimals as fit."""
    digits = 1
    p = 10.0
    while v >= p and digits < 30:
        digits += 1
        p *= 10
    if digits <= width - 3:
        return f"{v:{width}.2f}"
    if digits <= width - 2:
        return f"{v:{width}.1f}"
    if digits <= width:
        return f"{v:{width}.0f}"
    return f"{v:{width}.1e}"


def sweep(minb, maxb, step, factor):
    size = minb
    while size <= maxb:
        yield size
        if factor > 1:
            if size == 0:
                return
            size *= factor
        else:
            size += step


def arg_parser():
    p = argparse.ArgumentParser(prog="gloo_perf", allow_abbrev=False,
                                description="Gloo collectives timed the nccl-tests way")
    p.add_argument("coll", metavar="COLL", help=" ".join(COLLS))
    p.add_argument("-np", dest="np", type=int, help="ranks to start on this machine (without a launcher)")
    p.add_argument("-b", "--minbytes", type=parse_size, default=32 << 20)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=32 << 20)
    p.add_argument("-i", "--stepbytes", type=parse_size, default=1 << 20)
    p.add_argument("-f", "--stepfactor", type=int, default=1)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("-c", "--check", type=int, default=1)
    p.add_argument("-a", "--average", type=int, default=1, choices=[0, 1, 2, 3])
    p.add_argument("-d", "--datatype", default="float", choices=list(DTYPES))
    p.add_argument("-o", "--op", default="sum", choices=OPS)
    p.add_argument("-r", "--root", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600, help="seconds before the local ranks are stopped")
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl", "oxccl"],
                   help="oxccl: oxccl's torch.distributed backend (pip install ./crates/oxccl-py); nccl: torch's "
                        "NCCL on GPU buffers (cuda:LOCAL_RANK mod the GPUs there are; several ranks "
                        "on one GPU need NCCL >= 2.30 and NCCL_MULTI_RANK_GPU_ENABLE=1)")
    return p


def check_args(p, a):
    name = a.coll[:-5] if a.coll.endswith("_perf") else a.coll
    if name not in COLLS:
        p.error(f"unknown collective {a.coll!r}: use one of {' '.join(COLLS)}")
    a.coll = name
    if a.minbytes > a.maxbytes:
        p.error(f"-b {a.minbytes} is above -e {a.maxbytes}")
    if a.iters < 1 or a.warmup_iters < 0:
        p.error("-n must be at least 1 and -w at least 0")
    if a.stepfactor < 1 or a.stepbytes < 1:
        p.error("-f and -i must be positive")


# ---------------------------------------------------------------- one rank

def rank_main(a):
    import torch
    import torch.distributed as dist

    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if not (0 <= a.root < n):
        if rank == 0:
            print(f"gloo_perf: -r {a.root}: root must be 0..{n - 1}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    if a.backend == "nccl":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    if a.backend == "oxccl":
        import oxccl.torch  # noqa: F401  registers the backend

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    dist.init_process_group(a.backend, rank=rank, world_size=n, timeout=datetime.timedelta(seconds=120))
    backend_name = {"gloo": "Gloo", "nccl": "NCCL", "oxccl": "oxccl"}[a.backend]
    dtype = getattr(torch, DTYPES[a.datatype][0])
    tsize = DTYPES[a.datatype][1]
    op = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
          "min": dist.ReduceOp.MIN}[a.op]
    coll, root = a.coll, a.root
    nxt, prv = (rank + 1) % n, (rank - 1) % n

    def inputs(r, length, start=0):
        i = torch.arange(start, start + length, dtype=torch.int64)
        if a.op == "prod":
            v = torch.where((i + r) % 13 == 0, 2, 1)
        else:
            v = (r * 3 + i * 7) % 13
        return v

    def folded(length, start=0):
        acc = inputs(0, length, start)
        for r in range(1, n):
            v = inputs(r, length, start)
            acc = {"sum": lambda: acc + v, "prod": lambda: acc * v, "max": lambda: torch.maximum(acc, v),
                   "min": lambda: torch.minimum(acc, v)}[a.op]()
        return acc

    maxel = a.maxbytes // tsize + 1
    send_all = torch.zeros(maxel, dtype=dtype, device=dev)
    recv_all = torch.zeros(maxel, dtype=dtype, device=dev)

    def setup(count, in_place, at=0):
        """Buffers (at element offset `at`) and the call for one size; None
        when there is no such form."""
        whole = count * n if coll in SPLIT else count
        if whole == 0 and coll in SPLIT:
            return None  # Gloo fails on empty blocks
        send, recv = send_all[at:at + whole], recv_all[at:at + whole]
        if coll == "all_reduce":
            if in_place:
                return recv, lambda: dist.all_reduce(recv, op=op), recv
            return send, lambda: (recv.copy_(send), dist.all_reduce(recv, op=op)), recv
        if coll == "broadcast":
            if in_place:
                return recv, lambda: dist.broadcast(recv, src=root), recv
            return send, lambda: ((recv.copy_(send) if rank == root else None), dist.broadcast(recv, src=root)), recv
        if coll == "reduce":
            if in_place:
                return recv, lambda: dist.reduce(recv, dst=root, op=op), recv
            return send, lambda: (recv.copy_(send), dist.reduce(recv, dst=root, op=op)), recv
        if coll == "all_gather":
            outs = list(recv.split(count))
            src = outs[rank] if in_place else send[:count]
            return src, lambda: dist.all_gather(outs, src), recv
        if in_place:
            return None
        if coll == "reduce_scatter":
            ins = list(send.split(count))
            out = recv[:count]
            return send, lambda: dist.reduce_scatter(out, ins, op=op), out
        if coll == "alltoall":
            return send, lambda: dist.all_to_all_single(recv, send), recv
        if coll == "gather":
            outs = list(recv.split(count)) if rank == root else None
            return send[:count], lambda: dist.gather(send[:count], outs, dst=root), recv
        if coll == "scatter":
            ins = list(send.split(count)) if rank == root else None
            out = recv[:count]
            return send, lambda: dist.scatter(out, ins, src=root), out
        if coll == "sendrecv":
            def sr():
                reqs = [dist.isend(send[:count], nxt), dist.irecv(recv[:count], prv)]
                for q in reqs:
                    q.wait()
            return send[:count], sr, recv[:count]
        raise AssertionError(coll)

    def expected(count):
        """What this rank's output should hold, or None where nothing is defined."""
        if coll == "all_reduce":
            return folded(count)
        if coll in ("broadcast",):
            return inputs(root, count)
        if coll == "reduce":
            return folded(count) if rank == root else None
        if coll == "all_gather" or (coll == "gather" and rank == root):
            return torch.cat([inputs(r, count) for r in range(n)])
        if coll == "gather":
            return None
        if coll == "reduce_scatter":
            return folded(count, rank * count)
        if coll == "alltoall":
            return torch.cat([inputs(r, count, rank * count) for r in range(n)])
        if coll == "scatter":
            return inputs(root, count, rank * count)
        if coll == "sendrecv":
            return inputs(prv, count)
        raise AssertionError(coll)

    def fill(form, count):
        src = form[0]
        recv_all[:count * n + 1].zero_()
        src.copy_(inputs(rank, src.numel()).to(dtype).to(dev))
        # all_gather in place: src is this rank's view of recv, written above.

    def reduce_time(t):
        v = torch.tensor([t], dtype=torch.float64, device=dev)
        if a.average == 0:
            dist.broadcast(v, src=0)
            return v.item()
        dist.all_reduce(v, op={1: dist.ReduceOp.SUM, 2: dist.ReduceOp.MIN, 3: dist.ReduceOp.MAX}[a.average])
        return v.item() / (n if a.average == 1 else 1)

    # Is the collective there at all? One small call, the same on every rank.
    probe = setup(1, False)
    try:
        probe[1]()
    except RuntimeError as e:
        if "support" in str(e):
            if rank == 0:
                print(f"# unsupported: {coll} on {backend_name} (torch {torch.__version__}): {e}", flush=True)
            dist.destroy_process_group()
            return UNSUPPORTED
        raise

    if rank == 0:
        step = f"{a.stepfactor}(factor)" if a.stepfactor > 1 else f"{a.stepbytes}(bytes)"
        print(f"# gloo_perf {coll}: {backend_name} via torch {torch.__version__}")
        print(f"# nranks {n} minBytes {a.minbytes} maxBytes {a.maxbytes} step: {step} warmup iters: "
              f"{a.warmup_iters} iters: {a.iters} validation: {a.check} average: {a.average}")
        print("#")
        print(f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}           out-of-place                       in-place")
        print(f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  {'time':>7}  {'algbw':>6}  "
              f"{'busbw':>6}  {'#wrong':>6}  {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}")
        print(f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  {'(us)':>7}  {'(GB/s)':>6}  "
              f"{'(GB/s)':>6}  {'':>6}  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}", flush=True)

    bus_sum, bus_n, wrong_total = 0.0, 0, 0
    for size in sweep(a.minbytes, a.maxbytes, a.stepbytes, a.stepfactor):
        nel = size // tsize
        count = nel // n if coll in SPLIT else nel
        sendlen = count * n if coll in ("reduce_scatter", "alltoall", "scatter") else count
        recvlen = count * n if coll in ("all_gather", "alltoall", "gather") else count
        # Like nccl-tests (and oxccl-perf), iteration k works at offset
        # total * (k % steps) of buffers -e bytes long: a sweep up to -e cycles
        # through the same memory on every peer. The calls are built before
        # the clock starts.
        total = max(sendlen, recvlen)
        steps = max(1, (a.maxbytes // tsize) // total) if total else 1
        places = min(steps, max(a.warmup_iters, a.iters))
        cells = []
        for in_place in (False, True):
            form = setup(count, in_place)
            if form is None:
                cells.append(f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>6}")
                continue
            fill(form, count)
            calls = [form[1]] + [setup(count, in_place, k * total)[1] for k in range(1, places)]
            for k in range(a.warmup_iters):
                calls[k % places]()
            sync()
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            for k in range(a.iters):
                calls[k % places]()
            sync()
            t = reduce_time((time.perf_counter() - t0) / a.iters)
            wrong = "N/A"
            if a.check:
                fill(form, count)
                form[1]()
                want = expected(count)
                mine = 0 if want is None else int((form[2] != want.to(dtype).to(dev)).sum().item())
                w = torch.tensor([mine], dtype=torch.int64, device=dev)
                dist.all_reduce(w)
                wrong = int(w.item())
                wrong_total += wrong
            nbytes = count * tsize * (n if coll in SPLIT else 1)
            alg = nbytes / 1e9 / t if t > 0 else 0.0
            bus = alg * busfactor(coll, n)
            bus_sum += bus
            bus_n += 1
            cells.append(f"  {fmt_num(t * 1e6, 7)}  {fmt_num(alg, 6)}  {fmt_num(bus, 6)}  {wrong:>6}")
        if rank == 0:
            print(f"{max(sendlen, recvlen) * tsize:12d}  {count:12d}  {a.datatype:>8}  "
                  f"{a.op if coll in REDUCING else 'none':>6}  {root if coll in ROOTED else -1:6d}" + "".join(cells),
                  flush=True)
    if rank == 0:
        print(f"# {'Out of bounds values':<20} : {wrong_total} {'FAILED' if wrong_total else 'OK'}")
        print(f"# {'Avg bus bandwidth':<20} : {bus_sum / bus_n if bus_n else 0.0:g}\n#", flush=True)
    dist.destroy_process_group()
    return 1 if wrong_total else 0


# ---------------------------------------------------------- local launcher

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(a, argv):
    if not a.np or a.np < 1:
        print("gloo_perf: give -np N (ranks to start here), or run under a launcher that sets RANK and WORLD_SIZE",
              file=sys.stderr)
        return 2
    port = free_port()
    procs = []
    for r in range(a.np):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.np), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv, env=env,
                                      stdin=subprocess.DEVNULL, start_new_session=True))
    deadline = time.monotonic() + a.timeout
    status = 0

    def stop():
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    try:
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.returncode not in (None, 0)]
            if failed and not status:
                # The others get two seconds to end on their own (an
                # unsupported collective ends every rank with a message).
                status = failed[0].returncode
                deadline = min(deadline, time.monotonic() + 2)
            if time.monotonic() > deadline:
                if not status:
                    print(f"gloo_perf: ranks still running after --timeout {a.timeout:g} s; stopping them",
                          file=sys.stderr)
                    status = 124
                break
            time.sleep(0.02)
    except KeyboardInterrupt:
        status = 130
    stop()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    if status == 0:
        codes = [p.returncode for p in procs]
        status = next((c for c in codes if c), 0)
    if status < 0:
        status = 128 - status
    return status


def main(argv):
    p = arg_parser()
    a = p.parse_args(argv)
    check_args(p, a)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return rank_main(a)
    return launch(a, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
