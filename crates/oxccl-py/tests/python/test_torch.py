"""PyTorch's own code on the "oxccl" backend: torch.distributed's calls
with the semantics PyTorch documents, DistributedDataParallel and
ZeroRedundancyOptimizer giving the parameters Gloo gives, and the bytes
they move."""

import datetime
import os
import unittest

import numpy as np

import launch
from common import needs_torch, torch


@needs_torch
class Semantics(unittest.TestCase):
    def test_calls_on_2_and_4_processes(self):
        for n in (2, 4):
            with self.subTest(n=n):
                for r, out in enumerate(launch.run(n, "torch_semantics")):
                    self.check(n, r, out)

    def check(self, n, r, out):
        tot = n * (n + 1) / 2
        for key, v in out.items():
            if isinstance(key, tuple) and key[0] == "all_reduce":
                self.assertEqual(v, [tot] * 5, key)
        self.assertEqual(out[("op", "max")], [n] * 3)
        self.assertEqual(out[("op", "min")], [1] * 3)
        self.assertEqual(out[("op", "prod")], [float(np.prod(range(1, n + 1)))] * 3)
        self.assertEqual(out[("op", "avg")], [tot / n] * 3)
        self.assertIn("BAND", out["band"])
        self.assertEqual(out["async"], (n * (n - 1) / 2, True))
        self.assertEqual(out["future"], [float(n)] * 4)
        self.assertEqual(out["all_gather"], [[float(p)] * 2 for p in range(n)])
        self.assertEqual(out["all_gather_into_tensor"], [float(p) for p in range(n) for _ in range(2)])
        self.assertEqual(out["reduce_scatter"], [float(sum(q + r for q in range(n)))] * 2)
        self.assertEqual(out["reduce_scatter_tensor"], [float((3 * r + i) * tot) for i in range(3)])
        self.assertEqual(out["broadcast"], [float(n - 1)] * 4)
        if r == 0:
            self.assertEqual(out["reduce"], [tot] * 4)
            self.assertEqual(out["gather"], [[float(p)] * 2 for p in range(n)])
        self.assertEqual(out["all_to_all_single"], [float(10 * p + r) for p in range(n)])
        self.assertEqual(out["all_to_all_uneven"], [float(10 * p + r) for p in range(n) for _ in range(r + 1)])
        self.assertEqual(out["all_to_all"], [float(10 * p + r) for p in range(n)])
        self.assertEqual(out["scatter"], [float(r)] * 2)
        self.assertEqual(out["sendrecv"], [float((r - 1) % n)] * 3)
        if r % 2 == 0:
            self.assertEqual(out["new_group"], [float(len(range(0, n, 2)))] * 2)
        self.assertEqual(out["backend"], "oxccl")


@needs_torch
class Training(unittest.TestCase):
    def compare(self, n, zero, exact):
        ox = launch.run(n, "ddp_train", "oxccl", 8, zero)
        gl = launch.run(n, "ddp_train", "gloo", 8, zero)
        for r in range(n):
            for a, b in zip(ox[r]["params"], gl[r]["params"]):
                if exact:
                    np.testing.assert_array_equal(a, b, err_msg=f"rank {r}")
                else:
                    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=f"rank {r}")
            np.testing.assert_allclose(ox[r]["losses"], gl[r]["losses"], rtol=1e-6)
        # Every rank ends with the same parameters.
        for r in range(1, n):
            for a, b in zip(ox[0]["params"], ox[r]["params"]):
                np.testing.assert_array_equal(a, b)
        return ox

    def test_ddp_2_processes_bitwise_equal_to_gloo(self):
        # Two ranks: a + b is b + a, so any reduction order gives the same bits.
        self.compare(2, zero=False, exact=True)

    def test_ddp_4_processes_equal_to_gloo(self):
        self.compare(4, zero=False, exact=False)

    def test_zero_redundancy_optimizer(self):
        self.compare(2, zero=True, exact=True)
        self.compare(4, zero=True, exact=False)

    def test_ddp_moves_a_ring_all_reduce_of_its_gradients(self):
        n = 4
        res = launch.run(n, "ddp_train", "oxccl", 6, env={"OXCCL_ALGO": "ring"})
        p, steps = res[0]["nparams"], res[0]["measured_steps"]
        want = steps * 2 * (n - 1) / n * 4 * p  # bytes each rank moves in a ring all-reduce
        for r in range(n):
            self.assertAlmostEqual(res[r]["moved"] / want, 1.0, delta=0.01, msg=f"rank {r}: {res[r]['moved']}")

    def test_fsdp_moves_one_and_a_half_times_ddp(self):
        n = 2
        f = launch.run(n, "fsdp_train", "oxccl", 4, env={"OXCCL_ALGO": "ring"})
        if "unsupported" in f[0]:
            self.skipTest(f[0]["unsupported"])
        d = launch.run(n, "ddp_train", "oxccl", 6, env={"OXCCL_ALGO": "ring"})
        per_step_ddp = d[0]["moved"] / d[0]["measured_steps"]
        self.assertAlmostEqual(f[0]["moved"] / 4 / per_step_ddp, 1.5, delta=0.05)


class _Recorder:
    """Stands in for a process group's communicator: records the device
    of every buffer a call is given."""

    def __init__(self):
        self.calls = []

    def gather(self, send, out, root):
        self.calls.append(("gather", root, send.device.type, out.device.type))

    def scatter(self, send, out, root):
        self.calls.append(("scatter", root, send.device.type, out.device.type))


@needs_torch
class Devices(unittest.TestCase):
    """The buffers the backend makes for a call are on the device of the
    caller's tensors, as oxccl needs (a CUDA input with a host output
    would mix memory kinds in one call). Shown without a GPU: on the
    "meta" device, through a communicator that records what it gets."""

    def setUp(self):
        import torch.distributed as dist
        import oxccl.torch

        self.dist, self.backend = dist, oxccl.torch
        self.pg = oxccl.torch.ProcessGroupOxccl(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30))
        self.comm, self.pg.comm = self.pg.comm, _Recorder()

    def tearDown(self):
        self.pg.comm = self.comm
        self.pg.shutdown()
        self.backend._LIVE.remove(self.pg)

    def test_gather_and_scatter_make_their_buffers_on_the_tensors_device(self):
        meta = lambda: torch.empty(3, device="meta")  # noqa: E731
        for root in (0, 1):  # this rank (of 1) is the root, then it is not
            g = self.dist.GatherOptions()
            g.rootRank = root
            self.pg.gather([[meta()]] if root == 0 else [], [meta()], g).wait()
            s = self.dist.ScatterOptions()
            s.rootRank = root
            self.pg.scatter([meta()], [[meta()]] if root == 0 else [], s).wait()
        self.assertEqual(self.pg.comm.calls, [
            ("gather", 0, "meta", "meta"), ("scatter", 0, "meta", "meta"),
            ("gather", 1, "meta", "meta"), ("scatter", 1, "meta", "meta"),
        ])


@needs_torch
class Example(unittest.TestCase):
    ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..")
    SCRIPT = os.path.join(ROOT, "crates", "oxccl-py", "examples", "ddp.py")

    def test_the_readmes_ddp_script_trains_on_2_processes(self):
        outs = launch.script(2, self.SCRIPT)
        for r, out in enumerate(outs):
            self.assertIn(f"rank {r}: loss", out)
            self.assertIn("same parameters on every rank: True", out)
        with open(self.SCRIPT) as f:
            script = f.read()
        with open(os.path.join(self.ROOT, "README.md")) as f:
            self.assertIn(script.strip(), f.read(), "README.md's DDP script differs from examples/ddp.py")


if __name__ == "__main__":
    unittest.main()


@needs_torch
class Torch2(unittest.TestCase):
    """What PyTorch 2.x's FSDP2, DTensor and DDP call on a backend (1.13,
    Debian's, has none of it: the test says so and the suite allows it
    there only; CI runs it on 2.15)."""

    def test_calls_of_pytorch_2_on_2_and_4_processes(self):
        if not hasattr(torch._C._distributed_c10d, "Backend") or not hasattr(torch.distributed, "device_mesh"):
            self.skipTest(f"torch {torch.__version__} is not 2.x")
        for n in (2, 4):
            with self.subTest(n=n):
                for r, out in enumerate(launch.run(n, "torch2_calls")):
                    self.check(n, r, out)

    def test_init_process_group_finds_the_backend_without_an_import(self):
        if not hasattr(torch._C._distributed_c10d, "Backend") or not hasattr(torch.distributed, "device_mesh"):
            self.skipTest(f"torch {torch.__version__} is not 2.x")
        for out in launch.run(2, "init_by_name"):
            self.assertEqual(out, {"imported_before": False, "sum": [2.0] * 3, "backend": "oxccl"})

    def check(self, n, r, out):
        self.assertTrue(out["group_name"])
        self.assertEqual(out["all_gather_into_tensor"], [float(k) for k in range(n) for _ in range(3)])
        self.assertEqual(out["reduce_scatter_tensor"], [float(n * (2 * r)), float(n * (2 * r + 1))])
        self.assertEqual(out["reduce_scatter_avg"], [float(2 * r), float(2 * r + 1)])
        self.assertEqual(out["all_gather_object"], [{"rank": k, "name": f"r{k}"} for k in range(n)])
        self.assertEqual(out["premul_host"], [0.5 * n * (n + 1) / 2] * 4)
        self.assertEqual(out["premul_tensor"], [2.0 * n * (n + 1) / 2] * 4)
        self.assertEqual(out["all_gather_coalesced"], [[float(k) for k in range(n) for _ in range(2)],
                                                       [float(k) for k in range(n)]])
        self.assertEqual(out["reduce_scatter_coalesced"], [[float(n)] * 2, [float(n)]])
        self.assertEqual(out["batch_isend_irecv"], [float((r - 1) % n)] * 2)
        self.assertEqual(out["all_to_all_splits"], [float(k) for k in range(n) for _ in range(r + 1)])
        self.assertEqual(out["dtensor_local_rows"], 8 // n)
        self.assertTrue(out["dtensor_redistribute_exact"])
        self.assertLess(out["dtensor_matmul_err"], 1e-5)
        self.assertEqual(out["reinit"], [float(n)] * 2)

