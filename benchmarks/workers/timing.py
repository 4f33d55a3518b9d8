"""Shared timing loop for the collective benchmarks: every peer is measured the same way.

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
from typing import Callable, Dict, List, Optional, Tuple

SIZES = [4, 64, 1024, 4096, 16 * 1024, 64 * 1024, 256 * 1024, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
OPS = ["allreduce", "allgather", "broadcast"]
STEP_SHAPES: List[tuple] = []
OP_BUDGET_S = float(os.environ.get("BENCH_OP_BUDGET_S") or 0)
STEP_ITERS = int(os.environ.get("BENCH_STEP_ITERS") or 10)
REPEATS = 3

# A broadcast from rank 0 of a short list of ints, in the peer's own library: every rank gets rank 0's list.
Agree = Callable[[List[int]], List[int]]


def iterations(nbytes: int) -> int:
    """Enough repetitions for a stable figure without making the run long."""
    if nbytes <= 64 * 1024:
        return 2000
    if nbytes <= 1 << 20:
        return 300
    if nbytes <= 16 << 20:
        return 30
    return 6


def measure(run: Callable[[], None], barrier: Callable[[], None], n: int, repeats: int = 3) -> float:
    """Median over ``repeats`` of the mean time per call over ``n`` calls (seconds), after a warm-up."""
    for _ in range(max(3, n // 10)):
        run()
    return _median_per_call(run, barrier, n, repeats)


def _median_per_call(run: Callable[[], None], barrier: Callable[[], None], n: int, repeats: int) -> float:
    """Median over ``repeats`` barrier-aligned timings of ``n`` calls, as seconds per call."""
    samples = []
    for _ in range(repeats):
        barrier()
        start = time.perf_counter()
        for _ in range(n):
            run()
        samples.append((time.perf_counter() - start) / n)
    samples.sort()
    return samples[len(samples) // 2]


def plan_calls(once: float, n_max: int, budget_s: float, repeats: int = REPEATS) -> Tuple[int, int]:
    """(calls per repeat, repeats) that fit ``budget_s`` when one call takes ``once`` seconds."""
    if once * repeats >= budget_s:
        return 1, max(1, min(repeats, int(budget_s / max(once, 1e-9))))
    return max(1, min(n_max, int(budget_s / (repeats * max(once, 1e-9))))), repeats


def measure_within(run: Callable[[], None], barrier: Callable[[], None], n_max: int, budget_s: float,
                   agree: Agree) -> Tuple[float, int]:
    """Like ``measure``, with as many calls as fit ``budget_s``; returns (seconds per call, calls per repeat).

    After one untimed call (allocations, connections), batches of 1, 2, 4, ... calls are timed (they are the
    warm-up) until they have taken a quarter of the budget together (or one call alone a third of it: a large
    op), or a batch reaches a tenth of ``n_max``; rank 0's time of the last batch, agreed by every rank, sets
    the calls per repeat (``plan_calls``), so that every rank makes as many. Slow first calls (connections
    set up lazily, a rank descheduled) thus do not decide the count."""
    run()
    batch, spent = 1, 0.0
    while True:
        barrier()
        start = time.perf_counter()
        for _ in range(batch):
            run()
        elapsed = agree([int((time.perf_counter() - start) * 1e9)])[0] / 1e9
        spent += elapsed
        if (batch == 1 and elapsed >= budget_s / 3) or spent >= budget_s / 4 or batch * 2 > max(1, n_max // 10):
            break
        batch *= 2
    n, repeats = plan_calls(elapsed / batch, n_max, budget_s)
    return _median_per_call(run, barrier, n, repeats), n


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
