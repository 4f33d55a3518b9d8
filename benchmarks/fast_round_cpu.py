"""The CPU a fast round costs each rank, without any waiting: both sides of a 2-rank round in one thread.

A blocking collective's time at small and middle sizes is its copies plus a fixed cost of Python bookkeeping
(docs/benchmarks.md, issue 31), which a job's timings mix with the waits for the peer and, where ranks share
cores, with the peer's own bookkeeping. Here each round is made as a call makes it (a request, an entry, a
handle), posted by both sides on one shared area, then resolved by both: every peer has posted already, so
nothing waits, and the time per side is the bookkeeping plus the copies. ``data`` is the copies alone, as the
plain-Python floor makes them (``benchmarks/workers/shm_floor.py``), for the difference. Keep to small sizes:
from about 256 KB one core holding both sides' buffers makes the rounds' copies slower than the floor's, which
a real job (one rank per core) does not show.

    python benchmarks/fast_round_cpu.py [--sizes 4K,64K] [--ops allreduce,broadcast,allgather,reducescatter]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, List

import numpy as np

from horovod.backends.shm import fast_area_bytes
from horovod.bench.report import parse_size
from horovod.common.types import ReduceOp, RequestType, data_type_of
from horovod.core.controller.messages import single_request
from horovod.core.engine import fast_rounds
from horovod.core.engine.entry import Entry
from horovod.core.engine.handles import Handle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.fast_rounds import RunningEngine

SIZE = 2
TYPES = {"allreduce": RequestType.ALLREDUCE, "broadcast": RequestType.BROADCAST,
         "allgather": RequestType.ALLGATHER, "reducescatter": RequestType.REDUCESCATTER}


def round_maker(op: str, nbytes: int) -> Callable[[], None]:
    """One 2-rank round of ``op`` on ``nbytes`` (an allgather's whole output), both sides in this thread."""
    area = np.zeros(fast_area_bytes(SIZE), np.uint8)
    sides = [fast_rounds.FastRounds(area, r, SIZE, list(range(SIZE)), None) for r in range(SIZE)]
    rtype, engine = TYPES[op], RunningEngine()   # never asked: nothing waits
    count = nbytes // 4 // (SIZE if op == "allgather" else 1)
    inputs = [np.ones(count, np.float32) for _ in range(SIZE)]
    outputs = [np.empty_like(x) if op in ("allreduce", "broadcast") else None for x in inputs]
    dtype = data_type_of(np.dtype(np.float32))

    def one() -> None:
        entries: List[Entry] = []
        for x, out in zip(inputs, outputs):
            request = single_request(f"cpu.{op}", rtype, dtype, x.shape, ReduceOp.SUM, root=0)
            entries.append(Entry(request, x, out, Handle(request.name)))
        rounds = []
        for side, entry in zip(sides, entries):
            key = side.key(entry.request, entry.tensor.nbytes)
            if key is None or not side.can_post_fast():
                raise SystemExit(f"{op} of {nbytes} bytes takes no fast round")
            rounds.append((side.post_fast(entry, key), key))
            side.ring()
        for side, entry, (k, key) in zip(sides, entries, rounds):
            if not side.resolve(k, key, entry, engine):
                raise SystemExit(f"the {op} round of {nbytes} bytes did not match")
            entry.handle.set_result(entry.index, entry.output)
            entry.handle.wait()
    return one


def data_maker(op: str, nbytes: int) -> Callable[[], None]:
    """What the plain-Python floor copies for the same round, both sides: like the rounds, each rank has its own
    input and output, and two slots, for even and odd rounds."""
    count = nbytes // 4
    part = count // SIZE
    buffers = [[np.zeros(count, np.float32) for _ in range(SIZE)] for _ in range(2)]
    xs = [np.ones(count, np.float32) for _ in range(SIZE)]
    outs = [np.empty(count, np.float32) for _ in range(SIZE)]
    pieces = [np.ones(part, np.float32) for _ in range(SIZE)]
    rounds = [0]

    def one() -> None:
        rounds[0] += 1
        slots = buffers[rounds[0] % 2]
        for r in range(SIZE):
            if op in ("allreduce", "reducescatter"):
                slots[r][:] = xs[r]
            elif op == "allgather":
                slots[r][:part] = pieces[r]
        if op == "broadcast":
            slots[0][:] = xs[0]
        for r in range(SIZE):
            out = outs[r]
            if op == "allreduce":
                np.add(slots[0], slots[1], out=out)
            elif op == "allgather":
                for s in range(SIZE):
                    out[s * part:(s + 1) * part] = slots[s][:part]
            elif op == "reducescatter":
                np.add(slots[0][r * part:(r + 1) * part], slots[1][r * part:(r + 1) * part], out=pieces[r])
            elif r != 0:
                out[:] = slots[0]
    return one


def per_call(run: Callable[[], None], calls: int) -> float:
    """Seconds per call, the best of five timings of ``calls`` calls after a warm-up."""
    for _ in range(max(50, calls // 20)):
        run()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4K,16K,64K")
    parser.add_argument("--ops", default="allreduce,broadcast,allgather,reducescatter")
    args = parser.parse_args()
    print("| op | size | round, per side (µs) | copies, per side (µs) | bookkeeping, per side (µs) |")
    print("|---|---|---|---|---|")
    for op in args.ops.split(","):
        for size in args.sizes.split(","):
            nbytes = parse_size(size)
            calls = 5000 if nbytes <= 64 << 10 else 1000
            whole = per_call(round_maker(op, nbytes), calls) / SIZE * 1e6
            data = per_call(data_maker(op, nbytes), calls) / SIZE * 1e6
            print(f"| {op} | {size} | {whole:.2f} | {data:.2f} | {whole - data:.2f} |", flush=True)


if __name__ == "__main__":
    main()
