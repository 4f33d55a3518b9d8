"""Races between the data plane's one-barrier (small) and pipelined (large) paths.

Ranks submit a seeded random sequence of small and large collectives asynchronously (many in flight), and
then keep the GIL busy with rank-dependent pure-Python work while the engine executes them. Slow engines then
lag behind fast ones inside the data plane: the situation in which a fast rank could overwrite shared memory
that a slow rank is still reading. Every result is checked exactly.
"""
import time

import numpy as np

import horovod.numpy as hvd

SMALL, LARGE = 257, 1_100_003        # elements: one-barrier path vs. chunked pipeline (> 4 MiB of float32)


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def _submit(plan, rank, size, step):
    kind = int(plan.integers(0, 3))
    n = SMALL if plan.random() < 0.6 else LARGE
    if kind == 0:
        x = np.full(n, rank + step, np.float32)
        expected = np.float32(sum(r + step for r in range(size)))
        handle = hvd.allreduce_async(x, op=hvd.Sum, name=f"ar.{step}")
        return handle, lambda out: (out == expected).all()
    if kind == 1:
        root = int(plan.integers(0, size))
        x = np.full(n, rank * 10 + step, np.float64)
        handle = hvd.broadcast_async(x, root, name=f"bc.{step}")
        return handle, lambda out: (out == root * 10 + step).all()
    rows = max(1, n // 1000)
    x = np.full((rows + rank, 3), rank + step, np.int32)
    handle = hvd.allgather_async(x, name=f"ag.{step}")
    expected = np.concatenate([np.full((rows + r, 3), r + step, np.int32) for r in range(size)])
    return handle, lambda out: out.shape == expected.shape and (out == expected).all()


def test_async_small_and_large_sequence_under_gil_pressure():
    rank, size = hvd.rank(), hvd.size()
    plan = np.random.default_rng(7)                 # same sequence on every rank
    jitter = np.random.default_rng(100 + rank)      # different timing on every rank
    for rnd in range(6):
        pending = [_submit(plan, rank, size, rnd * 100 + i) for i in range(25)]
        _busy(0.02 + 0.05 * jitter.random())        # hold the GIL while the engine works
        for i, (handle, check) in enumerate(pending):
            if jitter.random() < 0.3:
                _busy(0.002 * jitter.random())
            out = hvd.synchronize(handle)
            assert check(out), f"round {rnd} op {i}: wrong result {np.asarray(out).ravel()[:4]}"
