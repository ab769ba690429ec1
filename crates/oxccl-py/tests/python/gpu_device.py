"""CUDA tensors through oxccl's device path, on a GPU (run by
tests/python_gpu.rs; not a test*.py file, so the CPU suite leaves it
alone): collectives, and one group that mixes device and host buffers.
Two ranks as threads share the GPU, each on a stream of its own."""

import unittest

import numpy as np
import torch

import oxccl
from common import on_threads


class Device(unittest.TestCase):
    def test_collectives_and_a_group_mixing_host_and_device_buffers(self):
        self.assertTrue(torch.cuda.is_available(), "no CUDA device for torch")
        comms = oxccl.Communicator.init_threads(2, timeout=20)

        def body(c):
            peer = 1 - c.rank
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                x = torch.full((1000,), float(c.rank + 1), device="cuda")
                c.all_reduce(x)
                hs = np.full(10, c.rank + 1, np.int64)
                hr = np.zeros(10, np.int64)
                dsend = torch.full((64,), c.rank + 100, dtype=torch.uint8, device="cuda")
                drecv = torch.zeros(64, dtype=torch.uint8, device="cuda")
                hsend = np.full(5, c.rank, np.uint8)
                hrecv = np.zeros(5, np.uint8)
                y = torch.full((256,), float(c.rank), device="cuda")
                with c.group():
                    c.send(dsend, peer)
                    c.all_reduce(hs, hr)
                    c.recv(drecv, peer)
                    c.all_reduce(y, op="max")
                    c.send(hsend, peer)
                    c.recv(hrecv, peer)
                # The host part has ended; the device part when the stream has run.
                host = (hr.copy(), hrecv.copy())
                stream.synchronize()
                return x.cpu().numpy(), y.cpu().numpy(), drecv.cpu().numpy(), host

        try:
            for r, (x, y, drecv, (hr, hrecv)) in enumerate(on_threads(comms, body)):
                np.testing.assert_array_equal(x, np.full(1000, 3.0, np.float32), err_msg=f"rank {r}")
                np.testing.assert_array_equal(y, np.full(256, 1.0, np.float32), err_msg=f"rank {r}")
                np.testing.assert_array_equal(drecv, np.full(64, (1 - r) + 100, np.uint8), err_msg=f"rank {r}")
                np.testing.assert_array_equal(hr, np.full(10, 3, np.int64), err_msg=f"rank {r}")
                np.testing.assert_array_equal(hrecv, np.full(5, 1 - r, np.uint8), err_msg=f"rank {r}")
        finally:
            for c in comms:
                c.close()


if __name__ == "__main__":
    unittest.main()
