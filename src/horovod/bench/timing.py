"""The timing loop every peer is measured with: the same warm-up, barrier-aligned repeats and median for this
project, mpi4py and torch.distributed, so that their ratios compare like with like."""
from __future__ import annotations

import time
from typing import Callable, List, Tuple

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


def measure(run: Callable[[], None], barrier: Callable[[], None], n: int, repeats: int = REPEATS) -> float:
    """Median over ``repeats`` of the mean time per call over ``n`` calls (seconds), after a warm-up."""
    for _ in range(max(3, n // 10)):
        run()
    return median_per_call(run, barrier, n, repeats)


def median_per_call(run: Callable[[], None], barrier: Callable[[], None], n: int, repeats: int) -> float:
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
    return median_per_call(run, barrier, n, repeats), n
