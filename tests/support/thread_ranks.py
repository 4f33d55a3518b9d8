"""Ranks as threads of one process, for tests of code that talks between ranks without an engine (the benchmarks'
plain-Python floors): one body per rank, all started at once, each rank's result or the first error raised."""
from __future__ import annotations

import threading
from typing import Callable, Dict, List, TypeVar

T = TypeVar("T")


def on_threads(size: int, body: Callable[[int], T], timeout: float) -> List[T]:
    """``body(rank)`` for every rank on a thread of its own; what each returned, in rank order. Fails with the
    ranks' errors, or when a rank has not finished within ``timeout`` seconds."""
    results: Dict[int, T] = {}
    errors: List[BaseException] = []

    def run(rank: int) -> None:
        try:
            results[rank] = body(rank)
        except BaseException as exc:        # reported by the calling thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not errors, errors
    assert len(results) == size, "a rank never finished"
    return [results[r] for r in range(size)]
