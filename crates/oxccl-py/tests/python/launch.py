"""Starts ranks as processes the way torchrun would (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT; Debian's torchrun fails at start on Python
3.11), each running one function of workers.py, and collects what each
returned (pickled into a file). A rank that fails fails the launch with its
output; nothing waits without a deadline.

The ranks of ``run`` are forked from one server process that has imported
numpy and torch (multiprocessing's forkserver): a rank starts in
milliseconds instead of importing torch again (about 2 s of CPU for torch
2.x here, and the suite starts some 200 ranks). Each is still a process of
its own with torchrun's variables, importing workers (and oxccl) itself;
the server imports neither oxccl nor anything that would (the entry-point
test checks that oxccl.torch is not imported before init). ``script`` runs
a script in a fresh interpreter, as a user would."""

import multiprocessing
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


def _torchrun_env(r, n, port):
    """torchrun's variables for rank ``r`` of ``n`` (one OpenMP thread
    each: the ranks share this machine's cores)."""
    return {"RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(n),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}


def _fail(what, failed, section):
    """The error naming the ranks in ``failed``; ``section(r)`` is rank
    ``r``'s part of the message (a heading and the end of its output)."""
    ranks = sorted(set(failed))
    text = "\n".join(section(r) for r in ranks)
    raise AssertionError(f"{what} failed on ranks {ranks}:\n{text}")


def _torch_importable():
    try:
        import importlib.util

        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


_SERVER = None


def _server():
    """The forkserver context, its server started at first use with numpy
    (and torch, where there is one) imported."""
    global _SERVER
    if _SERVER is None:
        ctx = multiprocessing.get_context("forkserver")
        # torch's thread pools start at first use, in the rank, which then
        # has OMP_NUM_THREADS=1; nothing in the server runs an operation.
        ctx.set_forkserver_preload(["numpy"] + (["torch", "torch.distributed"] if _torch_importable() else []))
        _SERVER = ctx
    return _SERVER


def _rank_main(func, args, env, out, log):
    """A rank: its output to ``log`` (native code's too), torchrun's
    variables in its environment (oxccl reads them at init), then
    ``workers.func(*args)`` pickled into ``out``."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.environ.update(env)
    sys.path.insert(0, HERE)
    import workers

    value = getattr(workers, func)(*args)
    with open(out, "wb") as f:
        pickle.dump(value, f)


def run(n, func, *args, timeout=180, env=None):
    """Runs ``workers.func(*args)`` on ranks 0..n-1; the list of their
    return values, by rank."""
    port = free_port()
    ctx = _server()
    with tempfile.TemporaryDirectory() as d:
        procs, logs = [], []
        for r in range(n):
            e = _torchrun_env(r, n, port)
            e["GLOO_SOCKET_IFNAME"] = "lo"
            e.update(env or {})
            out = os.path.join(d, f"rank{r}.pkl")
            e["OXCCL_TEST_OUT"] = out
            logs.append(os.path.join(d, f"rank{r}.log"))
            p = ctx.Process(target=_rank_main, args=(func, args, e, out, logs[r]), name=f"rank {r}")
            p.start()
            procs.append(p)
        wait_forked(procs, logs, f"{func}{args}", timeout)
        values = []
        for r in range(n):
            with open(os.path.join(d, f"rank{r}.pkl"), "rb") as f:
                values.append(pickle.load(f))
        return values


def wait_forked(procs, logs, what, timeout):
    """``wait_all`` for the ranks of ``run``: all are killed when one runs
    past ``timeout``; an error naming the ranks that failed, with the end
    of their output."""
    deadline = time.time() + timeout
    failed = []
    for r, p in enumerate(procs):
        p.join(max(0.0, deadline - time.time()))
        if p.is_alive():
            for q in procs:
                q.kill()
            p.join()
            failed.append(r)
    for p in procs:
        p.join()
    failed += [r for r, p in enumerate(procs) if p.exitcode != 0]
    if failed:
        def tail(r):
            try:
                with open(logs[r], errors="replace") as f:
                    return f.read()[-3000:]
            except OSError as e:
                return f"(no output: {e})"
        _fail(what, failed, lambda r: f"--- rank {r} (exit {procs[r].exitcode}) ---\n{tail(r)}")


def script(n, path, timeout=180):
    """Runs the Python script ``path`` as ranks 0..n-1 with torchrun's
    variables; each rank's output (stdout and stderr), by rank."""
    port = free_port()
    procs = []
    for r in range(n):
        e = dict(os.environ)
        e.update(_torchrun_env(r, n, port))
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
        _fail(what, failed, lambda r: f"--- rank {r} ---\n{outputs[r][-3000:]}")
    return outputs
