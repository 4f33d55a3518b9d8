"""Small-op latency worker for ``benchmarks/small_op_breakdown.py``; run under ``horovodrun -np 2``.

Times a 4 KB float32 allreduce one call at a time (so the distribution is visible, not only a mean) through
three paths: the op layer as ``benchmarks/collectives.py`` calls it (``ops.allreduce_async(x, out).wait()``),
``horovod.numpy.allreduce`` (a new array per call) and ``horovod.torch.allreduce``. Then it stamps one op's
stages without touching the library: it wraps, in this process, the engine's and data plane's functions with
``time.perf_counter_ns()`` stamps (CLOCK_MONOTONIC, so the two ranks' stamps share one clock), and finally times
the pieces alone: the shm plane's allreduce and its socket barrier called directly while the engine idles.

Each rank writes ``<out>.<rank>.json``: latencies (ns) per path, the stamped events per op, and the pieces.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import selectors
import time
from typing import Callable, Dict, List

import numpy as np

import horovod.numpy as hvd
from horovod.core import basics, ops
from horovod.core.controller.coordinator import Coordinator
from horovod.core.engine.control import ControlChannel
from horovod.core.engine.engine import Engine
from horovod.core.engine.handles import Handle
from horovod.core.engine.waits import WaitNotices

ELEMENTS = 1024                  # 4 KB of float32
EVENTS: List[tuple] = []        # (tag, ns) in the order they happened, from any thread of this process
_ns = time.perf_counter_ns


def _stamp(tag: str) -> None:
    EVENTS.append((tag, _ns()))


def _around(owner, attr: str, before: str, after: str, when: Callable[..., bool] = lambda *a: True) -> Callable:
    """Replace ``owner.attr`` by a wrapper stamping ``before``/``after`` around calls for which ``when`` holds;
    returns the undo."""
    original = getattr(owner, attr)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if not when(*args, **kwargs):
            return original(*args, **kwargs)
        if before:
            EVENTS.append((before, _ns()))
        try:
            return original(*args, **kwargs)
        finally:
            if after:
                EVENTS.append((after, _ns()))

    setattr(owner, attr, wrapper)
    return lambda: setattr(owner, attr, original)


def _wrap_select() -> Callable:
    """Stamp the engine thread's blocking sleeps (select with a timeout) and its polls that find something."""
    cls = type(selectors.DefaultSelector())
    original = cls.select

    def select(self, timeout=None):
        if timeout is not None and timeout <= 0:
            events = original(self, timeout)
            if events:
                EVENTS.append(("poll_hit", _ns()))
            return events
        EVENTS.append(("block", _ns()))
        events = original(self, timeout)
        EVENTS.append(("unblock" if events else "timeout", _ns()))
        return events

    cls.select = select
    return lambda: setattr(cls, "select", original)


def instrument(engine: Engine) -> List[Callable]:
    """Wrap the seams of one op's path; returns the undos."""
    backend = engine.backend
    undos = [
        _around(Engine, "enqueue", "enqueue", "enqueued"),
        _around(ControlChannel, "send_to_coordinator", "send_R", "sent_R", lambda self, msg: msg[0] == "R"),
        _around(WaitNotices, "_send_wait", "send_W", "sent_W"),
        _around(WaitNotices, "notice", "notice", "", lambda self, handle, begins: begins),
        _around(ControlChannel, "broadcast", "send_L", "sent_L", lambda self, msg, *a, **k: msg[0] == "L"),
        _around(Engine, "apply", "apply", ""),
        _around(backend, "allreduce", "plane", "plane_done"),
        _around(backend.comm, "barrier", "barrier", "barrier_done"),
        _around(Handle, "set_result", "", "completed"),
        _wrap_select(),
    ]
    original_add = Coordinator.add_request

    def add_request(self, rank, request, *rest):
        if request[0] == "small.ar":        # not the peer's next, unstamped op arriving early
            EVENTS.append((f"request_{rank}", _ns()))
        return original_add(self, rank, request, *rest)

    Coordinator.add_request = add_request
    undos.append(lambda: setattr(Coordinator, "add_request", original_add))
    return undos


def time_calls(run: Callable[[], object], n: int, warmup: int) -> List[int]:
    """Nanoseconds of each of ``n`` back-to-back calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        run()
    out = []
    for _ in range(n):
        t0 = _ns()
        run()
        out.append(_ns() - t0)
    return out


def stamped_ops(x: np.ndarray, out: np.ndarray, n: int, warmup: int) -> List[tuple]:
    """``n`` ops through the op layer with every seam stamped: all events of this process, the user thread's
    ``call``/``return`` marking each op (the engine thread's events of op k may come before its ``call``)."""
    for _ in range(warmup):
        ops.allreduce_async(x, out, name="small.ar", op=hvd.Sum).wait()
    hvd.allreduce(np.zeros(1, np.float32), name="stamp.sync")
    EVENTS.clear()
    for _ in range(n):
        EVENTS.append(("call", _ns()))
        ops.allreduce_async(x, out, name="small.ar", op=hvd.Sum).wait()
        EVENTS.append(("return", _ns()))
    return list(EVENTS)             # at once: the peer's next request must not land in the last op's stamps


def raw_plane(engine: Engine, n: int) -> Dict[str, List[int]]:
    """The shm plane's 4 KB allreduce and its barrier called from this thread, no engine (the engine idles:
    nothing is in flight, and every rank makes the same calls in the same order)."""
    backend = engine.backend
    x = np.ones(ELEMENTS, np.float32)
    out = np.empty_like(x)
    from horovod.common.types import ReduceOp
    hvd.allreduce(np.zeros(1, np.float32), name="raw.sync")     # both ranks idle from here on
    time.sleep(0.05)
    plane = time_calls(lambda: backend.allreduce([x], [out], ReduceOp.SUM), n, 200)
    barrier = time_calls(backend.comm.barrier, n, 200)
    hvd.allreduce(np.zeros(1, np.float32), name="raw.done")
    return {"plane_allreduce": plane, "plane_barrier": barrier}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", help="path prefix; each rank writes <out>.<rank>.json")
    parser.add_argument("--iters", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--pin", choices=["none", "split", "same"], default="none",
                        help="split: rank r (all its threads) on core r; same: both ranks on core 0")
    parser.add_argument("--torch", action="store_true", help="also time horovod.torch.allreduce")
    args = parser.parse_args()
    local = int(os.environ.get("HOROVOD_LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")))
    if args.pin != "none":          # before init: the engine thread inherits the mask
        os.sched_setaffinity(0, {local % os.cpu_count()} if args.pin == "split" else {0})
    hvd.init()
    engine = basics.engine()
    x = np.ones(ELEMENTS, np.float32)
    out = np.empty_like(x)
    result: Dict = {"rank": hvd.rank(), "pin": args.pin, "latency": {}, "env": {
        k: v for k, v in os.environ.items() if k in ("HOROVOD_SPIN_MICROSECONDS", "HOROVOD_CYCLE_TIME")}}
    result["latency"]["ops"] = time_calls(
        lambda: ops.allreduce_async(x, out, name="small.ar", op=hvd.Sum).wait(), args.iters, args.warmup)
    result["latency"]["numpy"] = time_calls(
        lambda: hvd.allreduce(x, name="small.np", op=hvd.Sum), args.iters, args.warmup)
    if args.torch:
        import torch

        import horovod.torch as hvd_torch
        hvd_torch.init()
        t = torch.ones(ELEMENTS, dtype=torch.float32)
        result["latency"]["torch"] = time_calls(
            lambda: hvd_torch.allreduce(t, name="small.torch", op=hvd_torch.Sum), args.iters, args.warmup)
    result["latency"]["ops_again"] = time_calls(     # drift check: the first path once more
        lambda: ops.allreduce_async(x, out, name="small.ar", op=hvd.Sum).wait(), args.iters, args.warmup)
    undos = instrument(engine)
    try:
        result["stamped"] = stamped_ops(x, out, args.iters, args.warmup)
    finally:
        for undo in reversed(undos):
            undo()
    result["raw"] = raw_plane(engine, args.iters)
    with open(f"{args.out}.{hvd.rank()}.json", "w") as f:
        json.dump(result, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()
