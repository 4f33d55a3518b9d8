"""A/B of huge pages under the buffers of direct (cross-memory) collectives, inside one job: side A's torch
tensors stay in the 4 KB pages torch gives them (``horovod.backends.huge_pages`` switched off while A runs), side
B's own tensors are collapsed into huge pages the second time a direct copy publishes them (as
``HOROVOD_HUGE_PAGES=1`` does). The two sides alternate in lockstep on every rank, so that the VM's drift hits both
alike. Run it under ``horovodrun``; rank 0 prints, per op and size, the median time per call (ms) of each side
and B / A:

    horovodrun -np 2 python benchmarks/huge_pages_ab.py --sizes 16M,64M
    horovodrun -np 2 python benchmarks/huge_pages_ab.py --ops allreduce_async --sizes 4M,16M,64M

Ops: ``allreduce`` (blocking: a direct fast round), ``allreduce_async`` (``allreduce_async_`` then
``synchronize``: the shm data plane's direct allreduce of one tensor), ``broadcast`` and ``allgather``.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List

import torch

import horovod.torch as hvd
from horovod.backends import huge_pages

SWITCHES = 14            # 7 timed blocks per side
WARM_CALLS = 3           # after each switch, untimed (B's buffers are collapsed during the first block's warm-up)


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def make_op(op: str, nbytes: int, tag: str) -> Callable[[], None]:
    """One call of ``op`` on ``nbytes`` of float32 torch tensors of its own (name ``tag``)."""
    x = torch.ones(nbytes // 4)
    if op == "allreduce":
        return lambda: hvd.allreduce_(x, op=hvd.Max, name=f"{tag}.ar")
    if op == "allreduce_async":
        return lambda: hvd.synchronize(hvd.allreduce_async_(x, op=hvd.Max, name=f"{tag}.ara"))
    if op == "broadcast":
        return lambda: hvd.broadcast_(x, root_rank=0, name=f"{tag}.bc")
    if op == "allgather":
        part = torch.ones(nbytes // 4 // hvd.size())
        return lambda: hvd.allgather(part, name=f"{tag}.ag")
    raise SystemExit(f"--ops: unknown op {op!r}")


def measure(op: str, nbytes: int, calls: int) -> Dict[str, float]:
    """Median seconds per call of side A (small pages) and B (collapsed), alternated block by block."""
    sides = {"A": make_op(op, nbytes, "a"), "B": make_op(op, nbytes, "b")}
    # The previous op's tensors are gone and these may lie where they did: forget those ranges, or B's tensors
    # would pass for collapsed already (the module remembers a range, not the allocation that fills it).
    huge_pages._seen.clear()
    times: Dict[str, List[float]] = {"A": [], "B": []}
    for switch in range(SWITCHES):
        side = "AB"[switch % 2]
        huge_pages._enabled = side == "B"
        call = sides[side]
        for _ in range(WARM_CALLS):
            call()
        for _ in range(calls):
            began = time.perf_counter()
            call()
            times[side].append(time.perf_counter() - began)
    huge_pages._enabled = None
    return {side: statistics.median(t) for side, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default="allreduce,allreduce_async,broadcast,allgather")
    parser.add_argument("--sizes", default="16M,64M", help="bytes of each call's tensor (an allgather's output)")
    parser.add_argument("--calls", type=int, default=6, help="timed calls per block")
    args = parser.parse_args()
    hvd.init()
    for op in args.ops.split(","):
        for size in args.sizes.split(","):
            got = measure(op, parse_size(size), args.calls)
            if hvd.rank() == 0:
                print(f"{op:16s} {size:>5s}  A {got['A'] * 1e3:8.2f} ms  B {got['B'] * 1e3:8.2f} ms  "
                      f"B / A {got['B'] / got['A']:.3f}", flush=True)


if __name__ == "__main__":
    main()
