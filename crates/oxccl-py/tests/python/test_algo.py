"""oxccl.algo: a hand-written program verified, simulated and run; a broken
one refused with the rank and step; a built-in one read back."""

import unittest

import numpy as np

import oxccl
from common import on_threads
from oxccl import algo


def pairs(name="py-pairs"):
    """All-reduce of 4 elements on 2 ranks: each reduces one half, then they
    swap halves."""
    p = algo.Program(name, "all_reduce", nranks=2, count=4)
    for r, (mine, theirs) in enumerate([("0..2", "2..4"), ("2..4", "0..2")]):
        peer = 1 - r
        p.step(r, "send", peer=peer, src=f"input[{theirs}]")
        p.step(r, "recv_reduce", peer=peer, src=f"input[{mine}]", dst=f"output[{mine}]")
        p.step(r, "send", peer=peer, src=f"output[{mine}]")
        p.step(r, "recv", peer=peer, dst=f"output[{theirs}]")
    return p


class Algo(unittest.TestCase):
    def test_verify_simulate_run(self):
        p = pairs()
        rep = p.verify()
        self.assertEqual(rep["sent_bytes"], [16, 16])  # 2 + 2 floats each way
        self.assertEqual(rep["messages"], 4)
        sim = p.simulate(nodes=1, ranks_per_node=2, intra_bw="1GB/s", intra_lat="1us")
        # Two messages of 8 bytes one after the other: 2 x (1 us + 8 ns).
        self.assertAlmostEqual(sim["time"], 2 * (1e-6 + 8 / 1e9), delta=1e-9)
        comms = oxccl.Communicator.init_threads(2, programs=[p], algo=p.name)
        try:
            def body(c):
                x = np.arange(4096, dtype=np.float32) * (c.rank + 1)
                y = np.zeros_like(x)
                c.all_reduce(x, y)
                return y, c.choice("all_reduce", 4096)

            for y, choice in on_threads(comms, body):
                np.testing.assert_array_equal(y, np.arange(4096) * 3)
                self.assertIn(p.name, choice)
        finally:
            for c in comms:
                c.close()

    def test_broken_program_names_rank_and_step(self):
        p = pairs("py-broken")
        p.data["ranks"][1]["channels"][0].pop()  # rank 1 never receives the other half
        with self.assertRaises(oxccl.InvalidProgram) as cm:
            p.verify()
        self.assertIn("rank", str(cm.exception))
        with self.assertRaises(oxccl.InvalidProgram):
            oxccl.Communicator.init_threads(2, programs=[p])

    def test_builtin_ring(self):
        ring = algo.Program.builtin("ring", "all_reduce", 4, 1024)
        rep = ring.verify()
        # A ring all-reduce sends 2 (n-1)/n of the buffer from every rank.
        self.assertEqual(rep["sent_bytes"], [2 * 3 * 1024 * 4 // 4] * 4)
        self.assertIn("send", ring.listing())


if __name__ == "__main__":
    unittest.main()
