"""What the tests share: ranks as threads, the inputs every rank makes, and
what each collective must give, computed with numpy."""

import os
import threading
import unittest

import numpy as np

import oxccl

REQUIRE_TORCH = os.environ.get("OXCCL_REQUIRE_TORCH", "") not in ("", "0")

try:
    import torch
except ImportError:  # torch is optional for the package, not for CI
    torch = None


def needs_torch(test):
    """Skips without torch, unless CI said it must be there."""
    if torch is None and not REQUIRE_TORCH:
        return unittest.skip("torch is not installed")(test)
    return test


def on_threads(comms, fn, timeout=60):
    """``fn(comm)`` on one thread per rank; their results by rank. An
    exception on any rank is raised here (the first by rank)."""
    results, errors = [None] * len(comms), [None] * len(comms)

    def body(c):
        try:
            results[c.rank] = fn(c)
        except BaseException as e:  # reported below
            errors[c.rank] = e

    ts = [threading.Thread(target=body, args=(c,)) for c in comms]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
        if t.is_alive():
            raise AssertionError(f"a rank did not finish within {timeout} s")
    for e in errors:
        if e is not None:
            raise e
    return results


def make_input(rank, n, dtype):
    """Rank ``rank``'s input: small integers, exact in every type and
    under every reduction of up to 8 ranks (products stay below 2^8)."""
    i = np.arange(n)
    vals = (rank + 1 + i % 3) % 4 + 1 if dtype not in ("int8", "uint8") else (rank + i) % 2 + 1
    return vals.astype(np.float64)


def reduce_ref(arrays, op):
    a = np.stack(arrays)
    return {"sum": a.sum(0), "prod": a.prod(0), "max": a.max(0), "min": a.min(0),
            "avg": a.sum(0) / len(arrays)}[op]


NP_TYPES = {"int8": np.int8, "uint8": np.uint8, "int32": np.int32, "uint32": np.uint32, "int64": np.int64,
            "uint64": np.uint64, "float16": np.float16, "float32": np.float32, "float64": np.float64}


def as_np(values, dtype):
    """``values`` as a numpy array of ``dtype`` (bfloat16: its bits in a
    uint16 array, the upper halves of float32s)."""
    if dtype == "bfloat16":
        return (np.asarray(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.asarray(values).astype(NP_TYPES[dtype])


def from_np(arr, dtype):
    """Back to float64 values."""
    if dtype == "bfloat16":
        return (arr.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return arr.astype(np.float64)


def expected(kind, n, rank, count, dtype, op="sum", root=0):
    """What ``rank``'s output of ``kind`` holds, with every rank's input
    from :func:`make_input` (count as each call takes it)."""
    if kind == "all_reduce":
        return reduce_ref([make_input(r, count, dtype) for r in range(n)], op)
    if kind == "reduce_scatter":
        full = reduce_ref([make_input(r, n * count, dtype) for r in range(n)], op)
        return full[rank * count:(rank + 1) * count]
    if kind == "all_gather":
        return np.concatenate([make_input(r, count, dtype) for r in range(n)])
    if kind == "all_to_all":
        return np.concatenate([make_input(r, n * count, dtype)[rank * count:(rank + 1) * count] for r in range(n)])
    if kind == "broadcast":
        return make_input(root, count, dtype)
    if kind == "reduce":
        return reduce_ref([make_input(r, count, dtype) for r in range(n)], op)
    if kind == "gather":
        return np.concatenate([make_input(r, count, dtype) for r in range(n)])
    if kind == "scatter":
        return make_input(root, n * count, dtype)[rank * count:(rank + 1) * count]
    raise ValueError(kind)


def run_collective(c, kind, count, dtype, op="sum", root=0, in_place=False, wrap=None):
    """Runs ``kind`` on ``c`` with numpy buffers (``wrap`` turns them into
    another kind of object first); this rank's output as float64 values."""
    n, r = c.size, c.rank
    wrap = wrap or (lambda a: a)
    sizes = {"all_reduce": (count, count), "reduce_scatter": (n * count, count), "all_gather": (count, n * count),
             "all_to_all": (n * count, n * count), "broadcast": (count, count), "reduce": (count, count),
             "gather": (count, n * count), "scatter": (n * count, count)}
    ni, no = sizes[kind]
    send = as_np(make_input(r, ni, dtype), dtype)
    kw = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
    if in_place:
        if kind in ("all_reduce", "broadcast", "reduce"):
            buf = wrap(send)
            getattr(c, kind)(buf, **kw, **({"op": op} if kind != "broadcast" else {}),
                             **({"root": root} if kind != "all_reduce" else {}))
            return from_np(np.asarray(send), dtype)
        if kind == "all_gather":
            out = as_np(np.zeros(no), dtype)
            out[r * count:(r + 1) * count] = send
            c.all_gather(wrap(out[r * count:(r + 1) * count]), wrap(out), **kw)
            return from_np(out, dtype)
        if kind == "reduce_scatter":
            c.reduce_scatter(wrap(send), wrap(send[r * count:(r + 1) * count]), op=op, **kw)
            return from_np(send[r * count:(r + 1) * count], dtype)
        raise ValueError(kind)
    out = as_np(np.zeros(no), dtype)
    args = {"all_reduce": {"op": op}, "reduce_scatter": {"op": op}, "reduce": {"op": op, "root": root},
            "broadcast": {"root": root}, "gather": {"root": root}, "scatter": {"root": root}}.get(kind, {})
    if kind == "broadcast":
        c.broadcast(wrap(send), out=wrap(out), **args, **kw)
    else:
        getattr(c, kind)(wrap(send), wrap(out), **args, **kw)
    return from_np(out, dtype)
