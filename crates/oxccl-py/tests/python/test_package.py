"""The package: every collective x type on numpy arrays, torch tensors and
buffer-protocol objects, ranks as threads and as processes; groups,
split, stats; errors that name what was wrong and change nothing."""

import array
import time
import unittest

import numpy as np

import launch
import oxccl
from common import expected, needs_torch, on_threads, run_collective, torch

KINDS = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "gather", "scatter"]
TYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16"]


def _error_of(f):
    try:
        f()
    except oxccl.Error as e:
        return str(e)
    return "no error"


def owns_output(kind, rank, root):
    return kind not in ("reduce", "gather") or rank == root


def _read_only(a):
    a.flags.writeable = False
    return a


class Threads(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.comms = {n: oxccl.Communicator.init_threads(n) for n in (3, 4)}

    @classmethod
    def tearDownClass(cls):
        for cs in cls.comms.values():
            for c in cs:
                c.close()

    def check(self, n, kind, dtype, op="sum", count=37, root=1, in_place=False, wrap=None):
        outs = on_threads(self.comms[n], lambda c: run_collective(c, kind, count, dtype, op, root, in_place, wrap))
        for r, got in enumerate(outs):
            if owns_output(kind, r, root):
                want = expected(kind, n, r, count, dtype, op, root)
                np.testing.assert_array_equal(got[:len(want)], want, err_msg=f"{kind} {dtype} {op} rank {r}/{n}")

    def test_every_collective_and_type(self):
        for kind in KINDS:
            for dtype in TYPES:
                with self.subTest(kind=kind, dtype=dtype):
                    self.check(3, kind, dtype)

    def test_reductions(self):
        for op in ["sum", "prod", "max", "min", "avg"]:
            for dtype in ["float32", "float64", "bfloat16", "float16", "int64"]:
                if op == "avg" and dtype == "int64":
                    continue
                for kind in ["all_reduce", "reduce_scatter", "reduce"]:
                    with self.subTest(op=op, dtype=dtype, kind=kind):
                        self.check(4, kind, dtype, op)

    def test_premul_sum(self):
        def body(c):
            x = np.full(5, 2.0, dtype=np.float32)
            c.all_reduce(x, op="premul_sum", scalar=c.rank + 1)
            return x

        for x in on_threads(self.comms[3], body):
            np.testing.assert_array_equal(x, np.full(5, 2.0 * (1 + 2 + 3)))

    def test_in_place(self):
        for kind in ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter"]:
            for dtype in ["float32", "int32"]:
                with self.subTest(kind=kind, dtype=dtype):
                    self.check(4, kind, dtype, in_place=True)

    def test_buffer_kinds(self):
        # array.array, bytearray, memoryview and bytes through the buffer protocol.
        def body(c):
            send = array.array("i", [c.rank + 1] * 6)
            out = bytearray(6 * 4)
            c.all_reduce(send, memoryview(out).cast("i"))
            c.broadcast(memoryview(out).cast("i"), root=0)
            got = list(memoryview(out).cast("i"))
            ro = bytes(array.array("i", [c.rank] * 2))  # read-only: fine to send
            g = array.array("i", [0] * 2 * c.size)
            c.all_gather(ro, g, dtype="int32")
            return got, list(g)

        for got, g in on_threads(self.comms[3], body):
            self.assertEqual(got, [6] * 6)
            self.assertEqual(g, [0, 0, 1, 1, 2, 2])

    @needs_torch
    def test_torch_tensors_every_type(self):
        tt = {"int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64,
              "float16": torch.float16, "float32": torch.float32, "float64": torch.float64,
              "bfloat16": torch.bfloat16}
        for dtype, t in tt.items():
            for kind in KINDS:
                with self.subTest(dtype=dtype, kind=kind):
                    def wrap(a, t=t, dtype=dtype):
                        # A tensor sharing the numpy array's memory, viewed as its type.
                        return torch.from_numpy(a.view(np.int16)).view(t) if dtype == "bfloat16" else torch.from_numpy(a)

                    self.check(3, kind, dtype, wrap=wrap)

    @needs_torch
    def test_torch_dlpack_and_numpy_interop(self):
        def body(c):
            x = torch.arange(8, dtype=torch.float32) + c.rank
            c.all_reduce(x)
            y = np.zeros(8, dtype=np.float32)
            c.all_reduce(_Dl(x), y)  # an object that offers only DLPack
            return x.numpy().copy(), y

        for x, y in on_threads(self.comms[3], body):
            np.testing.assert_array_equal(x, np.arange(8) * 3 + 3)
            np.testing.assert_array_equal(y, x * 3)

    def test_groups_send_recv_ring_and_all_to_allv(self):
        def body(c):
            n, r = c.size, c.rank
            send = np.full(1000, r, dtype=np.int64)
            got = np.zeros(1000, dtype=np.int64)
            with c.group():  # both directions at once cannot deadlock in a group
                c.send(send, (r + 1) % n)
                c.recv(got, (r - 1) % n)
            counts = [p + 1 for p in range(n)]          # r sends p+1 elements to p
            recv_counts = [r + 1] * n                   # and receives r+1 from each
            sv = np.concatenate([np.full(p + 1, 10 * r + p) for p in range(n)]).astype(np.float32)
            rv = np.zeros((r + 1) * n, dtype=np.float32)
            c.all_to_allv(sv, counts, rv, recv_counts)
            return got[0], rv

        for r, (g, rv) in enumerate(on_threads(self.comms[4], body)):
            self.assertEqual(g, (r - 1) % 4)
            np.testing.assert_array_equal(rv, np.repeat([10 * p + r for p in range(4)], r + 1))

    def test_split_stats_choice(self):
        def body(c):
            sub = c.split(c.rank % 2, key=-c.rank)
            x = np.ones(16, dtype=np.float32)
            sub.all_reduce(x)
            c.all_reduce(np.ones(1 << 16, dtype=np.float32))
            st = c.stats()
            sub_rank = sub.rank
            sub.close()
            return sub_rank, x[0], st, c.choice("all_reduce", 1 << 20)

        res = on_threads(self.comms[4], body)
        self.assertEqual([r[0] for r in res], [1, 1, 0, 0])  # key -rank: higher ranks first
        self.assertEqual([r[1] for r in res], [2.0] * 4)
        for r, (_, _, st, _) in enumerate(res):
            self.assertTrue(st and all(s["peer"] != r and 0 <= s["peer"] < 4 for s in st), st)
            self.assertGreaterEqual(sum(s["sent"] + s["put"] + s["got"] for s in st), 3 / 4 * 4 * (1 << 16), st)
        self.assertTrue(all(isinstance(r[3], str) and r[3] for r in res))

    def test_bad_input_is_an_error_naming_it_and_changes_nothing(self):
        c = self.comms[3][0]
        cases = [
            (lambda: c.all_reduce(np.ones(4, np.float32), np.ones(3, np.float32)), oxccl.InvalidArgument,
             "holds 3 elements"),
            (lambda: c.all_reduce(np.ones(4, np.float32), np.ones(4, np.int32)), oxccl.InvalidArgument, "int32"),
            (lambda: c.send(np.ones(4, np.float32), 7), oxccl.InvalidArgument, "peer 7"),
            (lambda: c.broadcast(np.ones(4, np.float32), root=5), oxccl.InvalidArgument, "root"),
            (lambda: c.all_reduce(np.ones((4, 4), np.float32)[:, 1]), oxccl.InvalidArgument, "contiguous"),
            (lambda: c.all_reduce(np.ones(4, np.float32), bytes(16)), oxccl.InvalidArgument, "writable"),
            (lambda: c.all_reduce(object()), oxccl.InvalidArgument, "not a buffer"),
            (lambda: c.all_reduce(np.ones(4, np.float32), op="bxor"), oxccl.InvalidArgument, "reduce op"),
            (lambda: c.reduce_scatter(np.ones(10, np.float32), np.ones(4, np.float32)), oxccl.InvalidArgument,
             "holds 10 elements"),
            (lambda: c.broadcast(np.ones(4, np.float32), root=-1), oxccl.InvalidArgument, "root -1"),
            (lambda: c.send(np.ones(4, np.float32), -2), oxccl.InvalidArgument, "peer -2"),
            (lambda: c.all_reduce(np.array([1, "a", None], dtype=object)), oxccl.InvalidArgument,
             "Python object elements"),
            (lambda: c.all_gather(np.array(["ab", "cd"]), np.empty(6, "<U2")), oxccl.InvalidArgument,
             "unicode string elements"),
            (lambda: c.all_reduce(np.ones(4, bool), op="avg"), oxccl.InvalidArgument, "avg of booleans"),
            (lambda: c.all_reduce(np.ones(4, np.float32), _read_only(np.ones(4, np.float32))), oxccl.InvalidArgument,
             "read-only"),
            (lambda: c._c.coll((0, 99, 0), None, (keep.ctypes.data, 16, False), 4, 1.0, 0, []),
             oxccl.InvalidArgument, "element type index 99"),
        ]
        keep = np.arange(4, dtype=np.float32)
        for fn, exc, text in cases:
            with self.subTest(text=text):
                with self.assertRaises(exc) as cm:
                    fn()
                self.assertIn(text, str(cm.exception))
                self.assertIsInstance(cm.exception, oxccl.Error)
        with self.assertRaises(oxccl.InvalidArgument) as cm:
            c.all_reduce(np.ones(4, np.float32), keep[:3])
        np.testing.assert_array_equal(keep, np.arange(4))
        self.assertIn("rank 0", str(cm.exception))

    def test_booleans_reduce_logically(self):
        # A sum of booleans is an or and a product an and (PyTorch's NCCL
        # backend's rule): never a 2 stored in a bool array.
        comms = self.comms[3]
        xs = [np.array([True, False, False, True]), np.array([True, True, False, False]),
              np.array([True, False, False, False])]
        ors = on_threads(comms, lambda c: c.all_reduce(xs[c.rank].copy()))
        ands = on_threads(comms, lambda c: c.all_reduce(xs[c.rank].copy(), op="prod"))
        for o, a in zip(ors, ands):
            self.assertEqual(o.dtype, np.bool_)
            np.testing.assert_array_equal(o.view(np.uint8), [1, 1, 0, 1])
            np.testing.assert_array_equal(a.view(np.uint8), [1, 0, 0, 0])

    def test_deterministic_mode_reduces_in_the_canonical_order(self):
        # Five ranks: ((x0 + x1) + (x2 + x3)) + x4 in float32, as numpy
        # computes it here, whatever the size and the FIFOs' chunking.
        rng = np.random.default_rng(5)
        n, count = 5, 300_001
        xs = [(rng.standard_normal(count) * 2.0 ** rng.integers(-12, 12, count)).astype(np.float32)
              for _ in range(n)]
        want = ((xs[0] + xs[1]) + (xs[2] + xs[3])) + xs[4]
        comms = oxccl.Communicator.init_threads(n, deterministic=True)
        try:
            for size in (1, 1000, count):
                outs = on_threads(comms, lambda c: c.all_reduce(xs[c.rank][:size].copy()))
                for x in outs:
                    np.testing.assert_array_equal(x, want[:size])
            # The inputs tell orders apart: rank order is other bits.
            self.assertFalse(np.array_equal((((xs[0] + xs[1]) + xs[2]) + xs[3]) + xs[4], want))
            # An algorithm the verifier does not prove canonical is refused.
            ring = oxccl.Communicator.init_threads(n, deterministic=True, algo="allreduce:ring")
            try:
                errs = on_threads(ring, lambda c: _error_of(lambda: c.all_reduce(xs[c.rank].copy())))
                for e in errs:
                    self.assertIn("OXCCL_DETERMINISTIC=1", e)
                    self.assertIn("ring", e)
            finally:
                for c in ring:
                    c.close()
        finally:
            for c in comms:
                c.close()

    def test_encrypted_tcp(self):
        comms = oxccl.Communicator.init_threads(2, transport="tcp", encrypt=True)
        try:
            outs = on_threads(comms, lambda c: c.all_reduce(np.full(100_000, c.rank + 1.0, dtype=np.float32)))
            for x in outs:
                np.testing.assert_array_equal(x, np.full(100_000, 3.0, dtype=np.float32))
            self.assertEqual(comms[0].transport_to(1), "tcp")
        finally:
            for c in comms:
                c.close()

    def test_a_group_may_mix_host_and_device_buffers(self):
        # One launch takes both (the C ABI's rule, and the core's): the group
        # reaches the native launch instead of being refused here. This
        # machine has no GPU, so the device part is refused there, before
        # anything runs: the host all-reduce leaves its buffer alone.
        (c,) = oxccl.Communicator.init_threads(1)
        try:
            x = np.ones(4, np.float32)
            with self.assertRaises(oxccl.Error) as cm:
                with c.group():
                    c.all_reduce(x, op="premul_sum", scalar=2.0)
                    c.all_reduce(_FakeCuda(4))
            msg = str(cm.exception)
            self.assertNotIn("mixes host and device", msg)
            self.assertTrue("CUDA unavailable" in msg or "device" in msg, msg)
            np.testing.assert_array_equal(x, np.ones(4, np.float32))
            # A collective's two buffers must be one kind.
            with self.assertRaises(oxccl.InvalidArgument) as cm:
                c.all_reduce(np.ones(4, np.float32), _FakeCuda(4))
            self.assertIn("one kind", str(cm.exception))
            c.all_reduce(x, op="premul_sum", scalar=2.0)  # still usable
            np.testing.assert_array_equal(x, np.full(4, 2.0, np.float32))
        finally:
            c.close()

    def test_closed_communicator(self):
        (c,) = oxccl.Communicator.init_threads(1)
        c.close()
        self.assertTrue(c.closed)
        with self.assertRaises(oxccl.InvalidUsage) as cm:
            c.all_reduce(np.ones(2, np.float32))
        self.assertIn("closed", str(cm.exception))
        c.close()  # twice: nothing


    def test_ctrl_c_interrupts_a_blocked_call(self):
        # Rank 0 waits for rank 1, which never calls: Ctrl-C raises
        # KeyboardInterrupt at once, not at the 60 s deadline, and leaves
        # the communicator aborted (rank 1 hears it).
        import os
        import signal
        import threading

        c0, c1 = oxccl.Communicator.init_threads(2, timeout=60)
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        t = time.time()
        with self.assertRaises(KeyboardInterrupt):
            c0.all_reduce(np.ones(8, np.float32))
        secs = time.time() - t
        self.assertLess(secs, 10, "interrupted only by the deadline")
        with self.assertRaises(oxccl.Error) as cm:
            c0.all_reduce(np.ones(8, np.float32))
        self.assertIn("abort", str(cm.exception))
        # Rank 1's first call may still end (rank 0's part of it was in
        # before the abort); its next one fails naming rank 0.
        with self.assertRaises(oxccl.Error) as cm:
            for _ in range(2):
                c1.all_reduce(np.ones(8, np.float32))
        self.assertIn("rank 0", str(cm.exception))
        c0.close()
        c1.close()
        print(f"Ctrl-C: KeyboardInterrupt {secs - 0.3:.3f} s after SIGINT", flush=True)


class _FakeCuda:
    """Device memory as the CUDA array interface describes it (CuPy,
    Numba); the address is no allocation of any GPU."""

    def __init__(self, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (0x7F0000100000, False),
                                         "version": 3, "stream": 7}


class _Dl:
    """An object that offers only DLPack."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None):
        return torch.utils.dlpack.to_dlpack(self.t)

    def __dlpack_device__(self):
        return (1, 0)


class Processes(unittest.TestCase):
    def test_every_collective_across_processes(self):
        for n in (2, 4):
            with self.subTest(n=n):
                results = launch.run(n, "pkg_collectives", KINDS, ["float32", "int64", "bfloat16"])
                for r, outs in enumerate(results):
                    for (kind, dtype), got in outs.items():
                        if owns_output(kind, r, 1 % n):
                            want = expected(kind, n, r, 29, dtype, "sum", 1 % n)
                            np.testing.assert_array_equal(got[:len(want)], want, err_msg=f"{kind} {dtype} rank {r}")

    def test_unique_id_init(self):
        # Rank 0 makes the id and hands it over through the environment.
        results = launch.run(3, "pkg_unique_id")
        self.assertEqual([r[0] for r in results], [0, 1, 2])
        self.assertEqual({r[1] for r in results}, {6.0})

    def test_ctrl_c_in_one_process_interrupts_it_and_fails_its_peers(self):
        results = launch.run(3, "pkg_ctrl_c", env={"OXCCL_TIMEOUT": "60"})
        kind, msg, secs = results[1]
        self.assertEqual(kind, "KeyboardInterrupt", msg)
        self.assertLess(secs, 10, "interrupted only by the deadline")
        kind, msg, secs = results[0]
        self.assertNotEqual(kind, "none", msg)
        self.assertIn("rank 1", msg)
        self.assertLess(secs, 20, msg)

    def test_dead_peer_is_an_error_naming_it_within_seconds(self):
        results = launch.run(3, "pkg_peer_dies", env={"OXCCL_TIMEOUT": "120"})
        for r in (0, 2):
            kind, msg, secs = results[r]
            self.assertEqual(kind, "PeerError", msg)
            self.assertIn("rank 1", msg)
            self.assertLess(secs, 20, msg)


if __name__ == "__main__":
    unittest.main()
