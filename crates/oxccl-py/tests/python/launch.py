"""Starts ranks as processes the way torchrun would (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT; Debian's torchrun fails at start on Python
3.11), each running one function of workers.py, and collects what each
returned (pickled into a file). A rank that fails fails the launch with its
output; nothing waits without a deadline."""

import os
import pickle
import random
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    """A free port below the kernel's ephemeral range: between this check
    and the store's bind no outgoing connection (of this test or another)
    can take it as its source port, as one could take an ephemeral one."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random(os.getpid() ^ int(time.time() * 1e6))
    for _ in range(200):
        port = rng.randrange(10000, max(low, 10001))
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(n, func, *args, timeout=180, env=None):
    """Runs ``workers.func(*args)`` on ranks 0..n-1; the list of their
    return values, by rank."""
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        procs = []
        for r in range(n):
            e = dict(os.environ)
            e.update({"RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(n),
                      "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo",
                      "OMP_NUM_THREADS": "1", "PYTHONPATH": HERE + os.pathsep + e.get("PYTHONPATH", "")})
            e.update(env or {})
            out = os.path.join(d, f"rank{r}.pkl")
            e["OXCCL_TEST_OUT"] = out
            code = (f"import pickle, workers; v = workers.{func}(*{args!r}); "
                    f"pickle.dump(v, open({out!r}, 'wb'))")
            procs.append(subprocess.Popen([sys.executable, "-c", code], env=e, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        wait_all(procs, f"{func}{args}", timeout)
        values = []
        for r in range(n):
            with open(os.path.join(d, f"rank{r}.pkl"), "rb") as f:
                values.append(pickle.load(f))
        return values


def script(n, path, timeout=180):
    """Runs the Python script ``path`` as ranks 0..n-1 with torchrun's
    variables; each rank's output (stdout and stderr), by rank."""
    port = free_port()
    procs = []
    for r in range(n):
        e = dict(os.environ)
        e.update({"RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(n),
                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
        procs.append(subprocess.Popen([sys.executable, path], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return wait_all(procs, path, timeout)


def wait_all(procs, what, timeout):
    """Waits for every rank's process (all are killed when one runs past
    ``timeout``); their outputs by rank, or an error naming the ranks that
    failed, with the end of their output."""
    outputs, failed = [], []
    for r, p in enumerate(procs):
        try:
            text, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            text, _ = p.communicate()
            failed.append(r)
        outputs.append(text)
        if p.returncode != 0:
            failed.append(r)
    if failed:
        logs = "\n".join(f"--- rank {r} ---\n{outputs[r][-3000:]}" for r in sorted(set(failed)))
        raise AssertionError(f"{what} failed on ranks {sorted(set(failed))}:\n{logs}")
    return outputs
