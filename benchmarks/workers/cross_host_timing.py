"""Timing loop shared by the cross-host workers (this project's ranks and torch Gloo's), so both are measured alike."""
from __future__ import annotations

import json
import time
from typing import Callable, Dict, List, Tuple

BIG_BYTES = 64 << 20
SMALL_BYTES = 4 << 10


def per_call(run: Callable[[], None], barrier: Callable[[], None], warmup: int, iters: int) -> List[float]:
    """Seconds of each of ``iters`` calls, each started together after a barrier, after ``warmup`` calls."""
    for _ in range(warmup):
        run()
    samples = []
    for _ in range(iters):
        barrier()
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return samples


def per_batch(run: Callable[[], None], barrier: Callable[[], None], batches: int, calls: int) -> List[float]:
    """Mean seconds per call of each of ``batches`` batches of ``calls`` back-to-back calls, after a warm-up."""
    for _ in range(max(10, calls // 5)):
        run()
    samples = []
    for _ in range(batches):
        barrier()
        start = time.perf_counter()
        for _ in range(calls):
            run()
        samples.append((time.perf_counter() - start) / calls)
    return samples


def big_and_small(big: Callable[[], None], small: Callable[[], None], barrier: Callable[[], None],
                  args: Dict[str, int]) -> Tuple[List[float], List[float]]:
    """The 64 MB samples (none when ``iters`` is 0) and the 4 KB ones, in that order."""
    times_big = per_call(big, barrier, args["warmup"], args["iters"]) if args["iters"] else []
    return times_big, per_batch(small, barrier, args["small_batches"], args["small_calls"])


def report(peer: str, size: int, local_size: int, big: List[float], small: List[float]) -> None:
    """Print the one line the driver (benchmarks/cross_host.py) reads: ``RESULT {json}``."""
    print("RESULT " + json.dumps({"peer": peer, "size": size, "local_size": local_size, "big_bytes": BIG_BYTES,
                                  "big": big, "small_bytes": SMALL_BYTES, "small": small}), flush=True)


def parse_args(argv: List[str]) -> Dict[str, int]:
    """``warmup iters small_batches small_calls`` (all optional) as a dict."""
    names = ("warmup", "iters", "small_batches", "small_calls")
    defaults = (1, 5, 5, 200)
    return {n: int(argv[i]) if len(argv) > i else d for i, (n, d) in enumerate(zip(names, defaults))}
