"""Training step times of the same model on oxccl and on Gloo, same run:

    PYTHONPATH=<oxccl installed or built> python3 bench_ddp.py [steps]

Prints the median step per backend and process count, and their ratio:
DDP on a small MLP (forward, backward with DDP's all-reduces, SGD), and
on PyTorch 2.x FSDP2 on a two-block transformer (``fully_shard`` per
block and at the root, Adam; fp32, then bf16 parameters with fp32
reduction)."""

import statistics
import sys

import torch

import launch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
runs = [("DDP", "ddp_train", ())]
if hasattr(torch.distributed, "device_mesh"):
    runs += [("FSDP2 fp32", "fsdp2_train", (False,)), ("FSDP2 bf16", "fsdp2_train", (True,))]
print(f"# torch {torch.__version__}, {steps} steps, median of steps 3.. over every rank", flush=True)
for what, func, args in runs:
    for n in (2, 4):
        med = {}
        for backend in ("gloo", "oxccl"):
            res = launch.run(n, func, backend, steps, *args)
            med[backend] = statistics.median(t for r in res for t in r["times"][2:])
        print(f"{what}, {n} processes: Gloo {med['gloo'] * 1e3:.3f} ms/step, oxccl {med['oxccl'] * 1e3:.3f} ms/step, "
              f"Gloo/oxccl {med['gloo'] / med['oxccl']:.2f}x", flush=True)
