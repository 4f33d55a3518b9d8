"""The engine thread's two loops: the coordinator's (rank 0) and the workers' (every other rank).

The coordinator takes requests (its own from the queue, the workers' from the control channel), emits response
lists when tensors are ready on every rank, and executes them itself; the workers forward their requests from the
submitting thread (see ``Engine.enqueue``) and execute the response lists they receive, in the same order.
"""
from __future__ import annotations

import logging
import selectors
import time
from typing import List, Optional, Protocol, Sequence, Tuple

from horovod.backends.comm import PeerLostError
from horovod.common.exceptions import SHUT_DOWN_MESSAGE, HorovodInternalError
from horovod.core.controller import Coordinator
from horovod.core.controller.messages import Request, Tag
from horovod.core.engine import carried
from horovod.core.engine.control import ControlChannel
from horovod.core.engine.entry import Entry
from horovod.core.engine.observer import EngineObserver, Hooks
from horovod.core.engine.settings import EngineSettings
from horovod.core.engine.waits import SEVERAL_THREADS, Note

log = logging.getLogger(__name__)
stall_log = logging.getLogger("horovod.stall")     # a named channel: see horovod.common.logging_setup

IDLE_WAKE_SECONDS = 1.0
SHUTDOWN_WAIT_SECONDS = 5.0
Park = Tuple[bool, str, float]      # a fast round's wait on rank 0: (parked, tensor name, seconds waited so far)
Events = List[Tuple[selectors.SelectorKey, int]]


class Looping(Protocol):
    """What the loops need of the engine (``engine.Engine`` is one)."""

    coordinator: Optional[Coordinator]  # rank 0's; None on the workers
    control: ControlChannel
    settings: EngineSettings
    hold_s: float                       # how long the coordinator may hold ready tensors to fill a bucket
    hooks: Hooks                        # the observers, per hook

    @property
    def stopping(self) -> bool:
        """True once a shutdown was asked for (or the engine stopped)."""

    def take_local(self) -> Tuple[List[Entry], List[Note], List[Park]]:
        """Rank 0's new entries, wait notices and fast-round parks, taken in one grab."""

    def expire_waits(self) -> Optional[float]:
        """Take back lapsed wait notices; seconds until the next lapse is due (None: none pending)."""

    def register_wake(self, selector: selectors.BaseSelector) -> None:
        """Have ``selector`` report the engine's wake-ups (as key data -1)."""

    def drain_wake(self) -> None:
        """Consume the pending wake-ups."""

    def sleep(self, selector: selectors.BaseSelector, timeout: Optional[float]) -> Events:
        """Wait for the next event, or less when there is local work."""

    def active(self) -> None:
        """An answer is due soon: poll a while before sleeping in the kernel."""

    def answered(self) -> None:
        """A response list ran: poll a while, unless a thread it woke needs the GIL (``Engine.answered``)."""

    def apply(self, items: List[list]) -> None:
        """Execute a response list (every rank, in the same order)."""

    def remove_observer(self, observer: EngineObserver) -> None:
        """Stop ``observer`` watching."""

    def fail_all(self, error: HorovodInternalError) -> None:
        """Stop for ``error``: every pending and later handle fails with it."""

    def incident(self, kind: str, message: str) -> None:
        """Tell the observers that the job is in trouble ("abort" or "report")."""


# --------------------------------------------------------------------------------------------- coordinator
def coordinator_loop(engine: Looping) -> None:
    """Rank 0's loop; returns after a shutdown, raises on a failure (the engine then aborts)."""
    with selectors.DefaultSelector() as selector:
        _coordinate(engine, selector)


def _coordinate(engine: Looping, selector: selectors.BaseSelector) -> None:
    coord = engine.coordinator
    engine.register_wake(selector)
    for peer, sock in engine.control.socks.items():
        selector.register(sock, selectors.EVENT_READ, peer)
    shutdown_reason = None
    while True:
        lapse_due = _take_local(engine)
        if engine.stopping and shutdown_reason is None:
            shutdown_reason = "rank 0 called hvd.shutdown()"
        if shutdown_reason is not None:
            engine.control.broadcast([Tag.SHUTDOWN, shutdown_reason], best_effort=True)
            engine.fail_all(HorovodInternalError(f"{SHUT_DOWN_MESSAGE} (Reason: {shutdown_reason}.)"))
            return
        due = coord.emit_due(time.monotonic(), engine.settings.bucket_bytes, engine.hold_s)
        for other in (_inspect(engine), lapse_due):
            if other is not None:
                due = other if due is None else min(due, other)
        if due == 0.0:
            _emit(engine)
            continue
        timeout = IDLE_WAKE_SECONDS if due is None else due
        for key, _ in engine.sleep(selector, timeout):
            peer = key.data
            if peer == -1:
                engine.drain_wake()
                continue
            for msg in engine.control.receive(peer):
                if msg[0] == Tag.EXITING:
                    shutdown_reason = f"rank {engine.control.global_rank(peer)} called hvd.shutdown()"
                    selector.unregister(key.fileobj)
                    break
                _from_worker(engine, peer, msg)


def _take_local(engine: Looping) -> Optional[float]:
    """Take rank 0's own new requests and wait notices in one grab (a thread notices a wait only after it
    enqueued the tensors, so the request is always taken together with, or before, its notice); expire lapsed
    waits. Returns the seconds until the next lapse is due."""
    coord = engine.coordinator
    entries, notes, parks = engine.take_local()
    for parked, name, waited in parks:
        if parked:
            coord.park(0, name, waited)
        else:
            coord.unpark(0, name)
    for entry in entries:
        coord.add_request(0, entry.request, entry.tensor if entry.carried else None)
    if notes:
        for begins, names, several in notes:
            if begins:
                coord.mark_waiting(0, names, several)
            else:
                coord.unmark_waiting(0, names)
        engine.active()
    return engine.expire_waits()


def _from_worker(engine: Looping, peer: int, msg: list) -> None:
    """A worker's control message (other than its shutdown)."""
    coord = engine.coordinator
    kind = msg[0]
    if kind == Tag.REQUESTS:
        inputs = msg[3] if len(msg) > 3 else None      # a carried request's input (engine/carried.py)
        for i, fields in enumerate(msg[1]):
            coord.add_request(peer, Request._make(fields), inputs[i] if inputs is not None else None)
        if len(msg) > 2:            # a blocking call's requests, with the wait notice (waits.notice_with_requests)
            coord.mark_waiting(peer, [fields[0] for fields in msg[1]], bool(msg[2] & SEVERAL_THREADS))
            engine.active()
    elif kind == Tag.WAITING:
        coord.mark_waiting(peer, msg[1], len(msg) > 2 and bool(msg[2]))
        engine.active()
    elif kind == Tag.UNWAITING:
        coord.unmark_waiting(peer, msg[1])
    elif kind == Tag.PARKED:
        coord.park(peer, msg[1], msg[2])
    elif kind == Tag.UNPARKED:
        coord.unpark(peer, msg[1])
    elif kind == Tag.ABORT:
        raise HorovodInternalError(msg[1])


def _emit(engine: Looping) -> None:
    """Emit what is ready to every worker and execute it here; then let the observers propose new tunables."""
    hooks = engine.hooks
    for observer in hooks.cycle:
        observer.on_cycle()
    items = engine.coordinator.take_ready()
    if not items:
        return
    carried.finish_items(items, engine.control.ranks)
    engine.control.broadcast([Tag.RESPONSES, items])
    engine.apply(items)
    engine.answered()
    if hooks.propose:
        _tune(engine, hooks.propose)


def _tune(engine: Looping, observers: Sequence[EngineObserver]) -> None:
    """Feed the observers what just ran; new tunables they propose are applied by every rank next."""
    now = time.monotonic()
    for observer in observers:
        params = observer.propose(now)
        if params is not None:
            item = [Tag.PARAMS, params]
            engine.control.broadcast([Tag.RESPONSES, [item]])
            engine.apply([item])
        if observer.finished:
            engine.remove_observer(observer)
            observer.close()


def _inspect(engine: Looping) -> Optional[float]:
    """Let the observers look at tensors submitted by only part of the ranks (the stall inspector and deadlock
    detector do); seconds until one wants to look again. A shutdown by one raises, which ends the job on every
    rank."""
    observers, coord = engine.hooks.inspect, engine.coordinator
    if not observers or not coord.has_partial():
        return None
    now = time.monotonic()
    due = None

    def report(message: str) -> None:
        engine.control.broadcast([Tag.DEADLOCK, message], best_effort=True)     # every rank logs the report
        engine.incident("report", message)                              # ... and writes its flight record

    for observer in observers:
        wanted = observer.inspect(coord, now, report)
        if wanted is not None:
            due = wanted if due is None else min(due, wanted)
    return None if due is None else max(min(due, IDLE_WAKE_SECONDS), 1e-3)


# --------------------------------------------------------------------------------------------- workers
def worker_loop(engine: Looping) -> None:
    """A worker's loop; returns after a shutdown, raises on a failure (the engine then aborts)."""
    with selectors.DefaultSelector() as selector:
        _work(engine, selector)


def _work(engine: Looping, selector: selectors.BaseSelector) -> None:
    sock, reader = engine.control.socks[0], engine.control.readers[0]
    engine.register_wake(selector)
    selector.register(sock, selectors.EVENT_READ, 0)
    stop_sent_at = None
    while True:
        if engine.stopping and stop_sent_at is None:
            if not _send_stop(engine):
                return
            stop_sent_at = time.monotonic()
        timeout = IDLE_WAKE_SECONDS
        lapse_due = engine.expire_waits()
        if lapse_due is not None:
            timeout = min(timeout, lapse_due)
        if stop_sent_at is not None:
            timeout = SHUTDOWN_WAIT_SECONDS - (time.monotonic() - stop_sent_at)
            if timeout <= 0:
                engine.fail_all(HorovodInternalError(SHUT_DOWN_MESSAGE))
                return
        for key, _ in engine.sleep(selector, timeout) if not engine.stopping else selector.select(timeout):
            if key.data == -1:
                engine.drain_wake()
                continue
            try:
                messages = reader.read()
            except OSError as exc:
                if stop_sent_at is not None:
                    engine.fail_all(HorovodInternalError(SHUT_DOWN_MESSAGE))
                    return
                raise engine.control.lost(0, exc) from None
            for msg in messages:
                if not _from_coordinator(engine, msg):
                    return


def _send_stop(engine: Looping) -> bool:
    """Tell the coordinator this rank shuts down; False when it is already gone (the engine then stops)."""
    try:
        engine.control.send_to_coordinator([Tag.EXITING])
    except PeerLostError:
        # The coordinator already closed (it shut down first): nothing left to tell it.
        engine.fail_all(HorovodInternalError(SHUT_DOWN_MESSAGE))
        return False
    return True


def _from_coordinator(engine: Looping, msg: list) -> bool:
    """Act on one message from rank 0; False when it ends this engine (a shutdown)."""
    kind = msg[0]
    if kind == Tag.RESPONSES:
        engine.apply(msg[1])
        engine.answered()
    elif kind == Tag.SHUTDOWN:
        engine.fail_all(HorovodInternalError(f"{SHUT_DOWN_MESSAGE} (Reason: {msg[1]}.)"))
        return False
    elif kind == Tag.ABORT:
        raise HorovodInternalError(msg[1])
    elif kind == Tag.DEADLOCK:
        stall_log.error("%s", msg[1])
        engine.incident("report", msg[1])
    return True
