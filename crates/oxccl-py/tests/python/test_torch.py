"""PyTorch's own code on the "oxccl" backend: torch.distributed's calls
with the semantics PyTorch documents, DistributedDataParallel and
ZeroRedundancyOptimizer giving the parameters Gloo gives, and the bytes
they move."""

import unittest

import numpy as np

import launch
from common import needs_torch


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


if __name__ == "__main__":
    unittest.main()
