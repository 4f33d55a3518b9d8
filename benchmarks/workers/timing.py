"""The repo benchmarks' sweep over sizes and ops, on the timing loop of ``horovod.bench.timing`` (the same one
``python -m horovod.bench`` uses): every peer is measured the same way.

Two environment knobs shorten a sweep for a run on a time budget (``benchmarks/device_scaling.py``); unset, the
counts are the fixed ones below:

- ``BENCH_OP_BUDGET_S``: seconds per op and size. Rank 0 times a short warm-up, and every rank then makes as
  many calls as fit in the budget (at most ``iterations(nbytes)`` per repeat, fewer repeats when one call alone
  overruns it), agreed through the peer's own broadcast (``measure_within``).
- ``BENCH_STEP_ITERS``: calls per repeat of the ResNet-18-sized step (default 10; 0 skips the step).
"""
from __future__ import annotations

import json
import os
import time
from typing import Callable, Dict, List, Optional

from horovod.bench.timing import Agree, iterations, measure, measure_within

SIZES = [4, 64, 1024, 4096, 16 * 1024, 64 * 1024, 256 * 1024, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
OPS = ["allreduce", "allgather", "broadcast", "reducescatter"]
STEP_SHAPES: List[tuple] = []
OP_BUDGET_S = float(os.environ.get("BENCH_OP_BUDGET_S") or 0)
STEP_ITERS = int(os.environ.get("BENCH_STEP_ITERS") or 10)


def sweep(peer: str, sizes, make_runs: Callable[[int], Dict[str, Callable[[], None]]],
          barrier: Callable[[], None], rank: int, size: int, agree: Optional[Agree] = None) -> Dict:
    """Time every op at every size with the same loop for every peer; rank 0 prints a line per size.
    With ``BENCH_OP_BUDGET_S`` set and ``agree`` given, each op and size gets that budget (``measure_within``),
    and the calls per repeat go to ``rows["calls"]``."""
    rows: Dict = {"peer": peer, "size": size, "results": {}, "sweep_s": {}}
    for nbytes in sizes:
        started = time.perf_counter()
        runs = make_runs(nbytes)
        for op in OPS:
            if OP_BUDGET_S > 0 and agree is not None:
                t, calls = measure_within(runs[op], barrier, iterations(nbytes), OP_BUDGET_S, agree)
                rows.setdefault("calls", {}).setdefault(op, {})[str(nbytes)] = calls
            else:
                t = measure(runs[op], barrier, iterations(nbytes))
            rows["results"].setdefault(op, {})[str(nbytes)] = t
        rows["sweep_s"][str(nbytes)] = round(time.perf_counter() - started, 3)     # this size's wall time
        if rank == 0:
            print(f"{peer:<10} {nbytes:>10d} B  " + "  ".join(
                f"{op} {rows['results'][op][str(nbytes)] * 1e6:9.1f} us" for op in OPS), flush=True)
    return rows


def resnet18_shapes() -> List[tuple]:
    """ResNet-18's trainable parameter shapes without the three downsample branches: 53 tensors, 46 MB."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for planes in (64, 128, 256, 512):
        for block in range(2):
            cin = inplanes if block == 0 else planes
            shapes += [(planes, cin, 3, 3), (planes,), (planes,), (planes, planes, 3, 3), (planes,), (planes,)]
        inplanes = planes
    shapes += [(1000, 512), (1000,)]
    return shapes


def time_step(step: Callable[[], None], barrier: Callable[[], None], agree: Optional[Agree] = None) -> Optional[float]:
    """Seconds per ResNet-18-sized step (``BENCH_STEP_ITERS`` calls per repeat, 5 repeats; with
    ``BENCH_OP_BUDGET_S`` and ``agree``, at most that many in three times the budget), or None when skipped."""
    if STEP_ITERS <= 0:
        return None
    if OP_BUDGET_S > 0 and agree is not None:
        return measure_within(step, barrier, STEP_ITERS, 3 * OP_BUDGET_S, agree)[0]
    return measure(step, barrier, STEP_ITERS, repeats=5)


def write(path: str, rows: Dict) -> None:
    with open(path, "w") as f:
        json.dump(rows, f)


def finish_job(out: str, rows: Dict, rank: int, shutdown: Optional[Callable[[], None]] = None) -> None:
    """The end of a worker: rank 0 writes ``rows`` to ``out``, then every rank calls ``shutdown`` (Horovod's,
    in a job under horovodrun)."""
    if rank == 0:
        write(out, rows)
    if shutdown is not None:
        shutdown()
