"""Callers that run the engine's loop themselves: a lone collective without two thread hand-offs per rank.

A collective that the engine thread runs crosses threads twice on every rank: the request goes from the user's
thread to the engine thread, and the completion back. Each crossing is a wake-up of a sleeping thread (20–27 µs
on a small VM) or, while both poll, two threads of one process taking turns on the GIL and on too few cores;
together they were a third of a 4 KB allreduce (docs/benchmarks.md, "Where a small allreduce's time goes").

So whichever thread holds the engine's *runner* lock runs the loop (:mod:`.loops`, one turn at a time): the
engine thread normally, which lets go of the lock only while it blocks in the kernel; and a user thread that
waits on a collective while the engine thread sleeps (:func:`drive`). The driving thread runs turns until its
own collective completed, spinning for ``HOROVOD_SPIN_MICROSECONDS`` after activity and then blocking in the
kernel as the engine thread would, and hands the loop back. Rank 0's submitting thread likewise takes its own
requests into the coordinator (:func:`intake`) instead of waking the engine thread, and runs a small collective
that became due at once (its peers already wait on it) right there. Collectives that are not waited on (a
backward pass's gradients) keep running on the engine thread, overlapped with the computation.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Optional

from horovod.core.engine import loops
from horovod.core.engine.handles import Handle
from horovod.core.engine.state import EngineState

if TYPE_CHECKING:
    from horovod.core.engine.engine import Engine

log = logging.getLogger("horovod.engine")

# Ready work up to this size that is due at once runs on rank 0's submitting thread; larger work goes to the
# engine thread, so that a gradient hook never blocks the backward pass for long.
CALLER_EMIT_MAX_BYTES = 256 << 10
# A rank with nothing in flight lets its engine thread sleep through its peers' messages for the cycle time (at
# least this long) after a caller drove: see loops._Loop.hand_back.
MIN_RELISTEN_SECONDS = 0.001


def drive(engine: Engine, handle: Handle, deadline: Optional[float]) -> None:
    """Run ``engine``'s loop on this thread until ``handle`` completes (or ``deadline``, a ``perf_counter``
    time, passes), if no other thread runs it now; otherwise, or when the engine stops, return at once and let
    the caller block on the handle."""
    if engine.state is not EngineState.RUNNING or engine.loop is None or not engine.runner.acquire(False):
        _wake_for_pending(engine)
        return
    loop = engine.loop
    engine.driving = True
    try:
        loop.take_over()
        engine.active()                 # poll a while before blocking, as the engine thread does after work
        sleep = engine.sleep_holding if deadline is None else _bounded(engine, deadline)
        while not handle.poll() and engine.state is EngineState.RUNNING:
            if deadline is not None and time.perf_counter() >= deadline:
                break
            if not loop.turn(sleep):
                break
    except Exception as exc:
        engine.fail_loop(exc)
    except BaseException as exc:        # KeyboardInterrupt, SystemExit: the loop may be mid-message
        engine.fail_loop(exc)
        raise
    finally:
        _hand_back(engine, loop)


def intake(engine: Engine) -> None:
    """Rank 0's submitting thread: take the queued requests into the coordinator, and run what that made due at
    once when it is small; the engine thread is woken only when work remains for it."""
    if engine.state is not EngineState.RUNNING or engine.loop is None or not engine.runner.acquire(False):
        _wake_for_pending(engine)
        return
    loop = engine.loop
    try:
        coord = engine.coordinator
        loops.take_local(engine)
        if coord.has_ready() and coord.ready_bytes <= CALLER_EMIT_MAX_BYTES and \
                coord.emit_due(time.monotonic(), engine.settings.bucket_bytes, engine.hold_s) == 0.0:
            loops.emit(engine)          # the data plane only: the control sockets stay the engine thread's
    except Exception as exc:
        engine.fail_loop(exc)
    except BaseException as exc:
        engine.fail_loop(exc)
        raise
    finally:
        _hand_back(engine, loop)


def _bounded(engine: Engine, deadline: float):
    def sleep(selector, timeout):
        left = max(0.0, deadline - time.perf_counter())
        return engine.sleep_holding(selector, left if timeout is None else min(timeout, left))
    return sleep


def _hand_back(engine: Engine, loop: loops._Loop) -> None:
    if engine.driving:
        engine.driving = False
        loop.hand_back(0.0 if engine.table else max(engine.cycle_s, MIN_RELISTEN_SECONDS))
        engine.last_activity = 0.0      # the engine thread need not poll after the caller's work
    engine.drives += 1
    engine.runner.release()
    _wake_for_pending(engine)


def _wake_for_pending(engine: Engine) -> None:
    """Wake the engine thread when something needs it before its next event: queued requests or wait notices
    (rank 0), lapsed waits, ready work held for fusion, or a stop."""
    coord = engine.coordinator
    with engine.lock:
        if engine.queue or engine.waits.notes or engine.waits.lapsed or engine.state is not EngineState.RUNNING \
                or (coord is not None and coord.has_ready()):
            engine.wake_if_sleeping()
