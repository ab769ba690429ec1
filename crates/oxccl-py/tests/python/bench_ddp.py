"""DDP step time of the same model on oxccl and on Gloo, same run:

    PYTHONPATH=<oxccl installed or built> python3 bench_ddp.py [steps]

Prints the median step (forward, backward with DDP's all-reduces, SGD) per
backend and process count, and their ratio."""

import statistics
import sys

import launch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
for n in (2, 4):
    med = {}
    for backend in ("gloo", "oxccl"):
        res = launch.run(n, "ddp_train", backend, steps)
        med[backend] = statistics.median(t for r in res for t in r["times"][2:])
    print(f"{n} processes, {res[0]['nparams']} parameters: Gloo {med['gloo'] * 1e3:.3f} ms/step, "
          f"oxccl {med['oxccl'] * 1e3:.3f} ms/step, Gloo/oxccl {med['gloo'] / med['oxccl']:.2f}x", flush=True)
