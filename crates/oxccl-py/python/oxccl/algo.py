"""Collective programs in Python: build one (by hand, or from a built-in
algorithm's), verify it, price it with the simulator, run it on real ranks.

    from oxccl import algo
    p = algo.Program("pairs", "all_reduce", nranks=2, count=4)
    p.step(0, "send", peer=1, src="input[2..4]")
    p.step(0, "recv_reduce", peer=1, src="input[0..2]", dst="output[0..2]")
    ...
    report = p.verify()                       # or oxccl.InvalidProgram naming rank, channel, step
    sim = p.simulate(nodes=1, ranks_per_node=2, intra_bw="100GB/s", intra_lat="2us")
    comms = oxccl.Communicator.init_threads(2, programs=[p], algo="pairs")

Steps are the IR's (see oxccl-algo's ``ir`` module): ``send recv
recv_reduce recv_reduce_send recv_copy_send recv_reduce_copy_send copy
reduce put get get_reduce signal wait``, with slices written
``"input[a..b]"``, ``"output[a..b]"``, ``"scratch[a..b]"`` in elements.
"""

import json

from . import _oxccl


class Program:
    """One program: what every rank does, channel by channel, step by step."""

    def __init__(self, name, kind, nranks, count, dtype="float32", root=0, in_place=False):
        self.data = {"name": name, "in_place": bool(in_place),
                     "collective": {"kind": kind, "nranks": int(nranks), "count": int(count), "root": int(root),
                                    "dtype": dtype},
                     "ranks": [{"scratch": 0, "channels": [[]]} for _ in range(int(nranks))]}

    @classmethod
    def from_json(cls, text):
        p = cls.__new__(cls)
        p.data = json.loads(text)
        return p

    @classmethod
    def builtin(cls, algo, kind, nranks, count, dtype="float32", root=0):
        """A built-in algorithm's program (``ring``, ``tree``, ...), to read
        or to start from."""
        return cls.from_json(_oxccl.build(algo, kind, int(nranks), int(count), dtype, int(root)))

    @property
    def name(self):
        return self.data["name"]

    def step(self, rank, op, channel=0, **fields):
        """Appends step ``op`` (with its fields: ``peer``, ``src``, ``dst``,
        ``send``, ``recv``, ``srcs``, ``acc``) to ``rank``'s ``channel``."""
        chans = self.data["ranks"][rank]["channels"]
        while len(chans) <= channel:
            chans.append([])
        chans[channel].append({"op": op, **fields})
        return self

    def scratch(self, rank, elems):
        """Declares ``elems`` elements of scratch on ``rank``."""
        r = self.data["ranks"][rank]
        r["scratch"] = max(r.get("scratch", 0), int(elems))
        return self

    def to_json(self):
        return json.dumps(self.data)

    def verify(self, slots=2, in_place=False):
        """The verifier's report (bytes each rank sends and receives,
        messages, steps), or :class:`oxccl.InvalidProgram`."""
        return _oxccl.verify(self.to_json(), slots, in_place)

    def simulate(self, nodes, ranks_per_node, intra_bw, intra_lat, inter_bw=None, inter_lat=None, reduce_bw=None,
                 copy_bw=None):
        """The simulator's prediction on ``nodes`` x ``ranks_per_node``
        ranks (bandwidths in bytes/s or text like ``"25GB/s"``, latencies
        in seconds or ``"2us"``): time, each rank's finish, bytes within
        and between nodes, algbw."""
        return _oxccl.simulate(self.to_json(), int(nodes), int(ranks_per_node), intra_bw, intra_lat,
                               inter_bw if inter_bw is not None else intra_bw,
                               inter_lat if inter_lat is not None else intra_lat, reduce_bw, copy_bw)

    def register(self):
        """Verifies and registers it in this process; the name ``algo=``
        selects (communicators take ``programs=[p]`` and do this)."""
        return _oxccl.register(self.to_json())

    def listing(self):
        return _oxccl.listing(self.to_json())

    def __repr__(self):
        c = self.data["collective"]
        return f"<oxccl.algo.Program {self.name!r}: {c['kind']} of {c['count']} on {c['nranks']} ranks>"


__all__ = ["Program"]
