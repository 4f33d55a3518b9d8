"""The engine's two loops: the coordinator's (rank 0) and the workers' (every other rank).

The coordinator takes requests (its own from the queue, the workers' from the control channel), emits response
lists when tensors are ready on every rank, and executes them itself; the workers forward their requests from the
submitting thread (see ``Engine.enqueue``) and execute the response lists they receive, in the same order.

A loop runs one :meth:`turn` at a time, on whichever thread holds the engine's runner lock: the engine thread,
or a user thread that waits on a collective while the engine is idle (see :mod:`.driving`). Everything a turn
needs between calls lives on the loop object, so the two can hand the loop back and forth between turns. Each
loop has two selectors over the same sockets: the engine thread blocks on one, a driving caller polls the other,
and while a caller drives, the control sockets leave the engine thread's selector so that their messages do not
wake it for nothing.
"""
from __future__ import annotations

import logging
import selectors
import socket
import time
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence

from horovod.backends.comm import PeerLostError
from horovod.common import wire
from horovod.common.exceptions import SHUT_DOWN_MESSAGE, HorovodInternalError
from horovod.core.controller.messages import PARAMS
from horovod.core.engine.observer import EngineObserver
from horovod.core.engine.state import EngineState

if TYPE_CHECKING:
    from horovod.core.engine.engine import Engine

log = logging.getLogger("horovod.engine")
stall_log = logging.getLogger("horovod.stall")

IDLE_WAKE_SECONDS = 1.0
SHUTDOWN_WAIT_SECONDS = 5.0
Sleep = Callable[[selectors.BaseSelector, Optional[float]], list]


class _Loop:
    """What both loops share: the selectors over the control sockets and the engine's wake-up socket."""

    def __init__(self, engine: Engine, peers: Dict[int, socket.socket]) -> None:
        self.engine = engine
        self.peers = dict(peers)                    # peer -> control socket, while the peer is connected
        self.selector = selectors.DefaultSelector()         # the engine thread's
        self.caller_selector = selectors.DefaultSelector()  # a driving caller's
        self.listening = True                       # the engine thread's selector watches the control sockets
        self.relisten_at: Optional[float] = None    # when it will again, after a caller handed the loop back
        for selector in (self.selector, self.caller_selector):
            engine.register_wake(selector)
            for peer, sock in self.peers.items():
                selector.register(sock, selectors.EVENT_READ, peer)

    def take_over(self) -> None:
        """A caller starts driving: the engine thread's selector stops watching the control sockets."""
        if self.listening:
            self.listening = False
            for sock in self.peers.values():
                self.selector.unregister(sock)
        self.relisten_at = None

    def hand_back(self, grace: float) -> None:
        """The caller stops driving. The engine thread watches the control sockets again (messages that arrived
        meanwhile wake it at once) after ``grace`` seconds: a rank with nothing in flight has no message to
        expect that cannot wait that long, and a program that runs collectives back to back drives the next one
        itself, so its engine thread sleeps on instead of waking for the peers' next requests."""
        if grace > 0:
            self.relisten_at = time.perf_counter() + grace
        else:
            self._listen()

    def _listen(self) -> None:
        self.relisten_at = None
        if not self.listening:
            self.listening = True
            for peer, sock in self.peers.items():
                self.selector.register(sock, selectors.EVENT_READ, peer)

    def engine_sleep(self, selector: selectors.BaseSelector, timeout: Optional[float]) -> list:
        """The engine thread's ``sleep``: :meth:`Engine.sleep`, listening again once a hand-back's grace ended."""
        if self.relisten_at is not None:
            left = self.relisten_at - time.perf_counter()
            if left <= 0:
                self._listen()
            else:
                timeout = left if timeout is None else min(timeout, left)
        return self.engine.sleep(selector, timeout)

    def forget(self, peer: int) -> None:
        """Stop watching ``peer``'s socket (it shut down)."""
        sock = self.peers.pop(peer, None)
        if sock is None:
            return
        for selector in (self.selector, self.caller_selector):
            try:
                selector.unregister(sock)
            except (KeyError, ValueError):
                pass                                # not registered there while the engine thread does not listen

    def close(self) -> None:
        self.selector.close()
        self.caller_selector.close()

    def turn(self, sleep: Sleep) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError


# --------------------------------------------------------------------------------------------- coordinator
class CoordinatorLoop(_Loop):
    """Rank 0's loop."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine, engine.control.socks)
        self.shutdown_reason: Optional[str] = None

    def turn(self, sleep: Sleep) -> bool:
        """Take new requests, emit what is due, then wait for the next event with ``sleep``; False once the loop
        ended (after a shutdown). Raises on a failure (the engine then aborts)."""
        engine = self.engine
        if engine.state is EngineState.STOPPED:
            return False
        coord = engine.coordinator
        lapse_due = take_local(engine)
        if engine.stopping and self.shutdown_reason is None:
            self.shutdown_reason = "rank 0 called hvd.shutdown()"
        if self.shutdown_reason is not None:
            engine.control.broadcast(["S", self.shutdown_reason], best_effort=True)
            engine.fail_all(HorovodInternalError(f"{SHUT_DOWN_MESSAGE} (Reason: {self.shutdown_reason}.)"))
            return False
        due = coord.emit_due(time.monotonic(), engine.settings.bucket_bytes, engine.hold_s)
        for other in (_inspect(engine), lapse_due):
            if other is not None:
                due = other if due is None else min(due, other)
        if due == 0.0:
            emit(engine)
            return True
        timeout = IDLE_WAKE_SECONDS if due is None else due
        for key, _ in sleep(self.caller_selector if engine.driving else self.selector, timeout):
            peer = key.data
            if peer == -1:
                engine.drain_wake()
                continue
            msg = engine.control.receive(peer, key.fileobj)
            if msg[0] == "X":
                self.shutdown_reason = f"rank {engine.control.global_rank(peer)} called hvd.shutdown()"
                self.forget(peer)
            else:
                _from_worker(engine, peer, msg)
        return True


def take_local(engine: Engine) -> Optional[float]:
    """Take rank 0's own new requests and wait notices in one grab (a thread notices a wait only after it
    enqueued the tensors, so the request is always taken together with, or before, its notice); expire lapsed
    waits. Returns the seconds until the next lapse is due."""
    coord = engine.coordinator
    with engine.lock:
        entries = engine.drain()
        notes = engine.waits.take_notes()
    for entry in entries:
        coord.add_request(0, entry.request)
    if notes:
        for begins, names, several in notes:
            if begins:
                coord.mark_waiting(0, names, several)
            else:
                coord.unmark_waiting(0, names)
        engine.active()
    return engine.waits.expire() if engine.waits.lapsed else None


def _from_worker(engine: Engine, peer: int, msg: list) -> None:
    """A worker's control message (other than its shutdown)."""
    coord = engine.coordinator
    kind = msg[0]
    if kind == "R":
        for request in msg[1]:
            coord.add_request(peer, request)
    elif kind == "W":
        coord.mark_waiting(peer, msg[1], len(msg) > 2 and bool(msg[2]))
        engine.active()
    elif kind == "U":
        coord.unmark_waiting(peer, msg[1])
    elif kind == "A":
        raise HorovodInternalError(msg[1])


def emit(engine: Engine) -> None:
    """Emit what is ready to every worker and execute it here; then let the observers propose new tunables."""
    hooks = engine.hooks
    for observer in hooks.cycle:
        observer.on_cycle()
    items = engine.coordinator.take_ready()
    if not items:
        return
    engine.control.broadcast(["L", items])
    engine.apply(items)
    engine.active()
    if hooks.propose:
        _tune(engine, hooks.propose)


def _tune(engine: Engine, observers: Sequence[EngineObserver]) -> None:
    """Feed the observers what just ran; new tunables they propose are applied by every rank next."""
    now = time.monotonic()
    for observer in observers:
        params = observer.propose(now)
        if params is not None:
            item = [PARAMS, params]
            engine.control.broadcast(["L", [item]])
            engine.apply([item])
        if observer.finished:
            engine.remove_observer(observer)
            observer.close()


def _inspect(engine: Engine) -> Optional[float]:
    """Let the observers look at tensors submitted by only part of the ranks (the stall inspector and deadlock
    detector do); seconds until one wants to look again. A shutdown by one raises, which ends the job on every
    rank."""
    observers, coord = engine.hooks.inspect, engine.coordinator
    if not observers or not coord.has_partial():
        return None
    now = time.monotonic()
    due = None

    def report(message: str) -> None:
        engine.control.broadcast(["D", message], best_effort=True)     # every rank logs the report

    for observer in observers:
        wanted = observer.inspect(coord, now, report)
        if wanted is not None:
            due = wanted if due is None else min(due, wanted)
    return None if due is None else max(min(due, IDLE_WAKE_SECONDS), 1e-3)


# --------------------------------------------------------------------------------------------- workers
class WorkerLoop(_Loop):
    """Every other rank's loop."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine, {0: engine.control.socks[0]})
        self.sock = engine.control.socks[0]
        self.stop_sent_at: Optional[float] = None

    def turn(self, sleep: Sleep) -> bool:
        """Apply what the coordinator sent, or wait for it with ``sleep``; False once the loop ended (after a
        shutdown). Raises on a failure (the engine then aborts)."""
        engine = self.engine
        if engine.state is EngineState.STOPPED:
            return False
        if engine.stopping and self.stop_sent_at is None:
            if not _send_stop(engine):
                return False
            self.stop_sent_at = time.monotonic()
        timeout = IDLE_WAKE_SECONDS
        if engine.waits.lapsed:
            lapse_due = engine.waits.expire()
            if lapse_due is not None:
                timeout = min(timeout, lapse_due)
        if self.stop_sent_at is not None:
            timeout = SHUTDOWN_WAIT_SECONDS - (time.monotonic() - self.stop_sent_at)
            if timeout <= 0:
                engine.fail_all(HorovodInternalError(SHUT_DOWN_MESSAGE))
                return False
        selector = self.caller_selector if engine.driving else self.selector
        if engine.stopping:
            if not engine.driving:
                self._listen()                      # the coordinator's answer must wake the engine thread now
            events: List = selector.select(timeout)
        else:
            events = sleep(selector, timeout)
        for key, _ in events:
            if key.data == -1:
                engine.drain_wake()
                continue
            try:
                msg = wire.recv_msg(self.sock)
            except (OSError, wire.PeerClosedError) as exc:
                if self.stop_sent_at is not None:
                    engine.fail_all(HorovodInternalError(SHUT_DOWN_MESSAGE))
                    return False
                raise engine.control.lost(0, exc) from None
            if not _from_coordinator(engine, msg):
                return False
        return True


def _send_stop(engine: Engine) -> bool:
    """Tell the coordinator this rank shuts down; False when it is already gone (the engine then stops)."""
    try:
        engine.control.send_to_coordinator(["X"])
    except PeerLostError:
        # The coordinator already closed (it shut down first): nothing left to tell it.
        engine.fail_all(HorovodInternalError(SHUT_DOWN_MESSAGE))
        return False
    return True


def _from_coordinator(engine: Engine, msg: list) -> bool:
    """Act on one message from rank 0; False when it ends this engine (a shutdown)."""
    kind = msg[0]
    if kind == "L":
        engine.apply(msg[1])
        engine.active()
    elif kind == "S":
        engine.fail_all(HorovodInternalError(f"{SHUT_DOWN_MESSAGE} (Reason: {msg[1]}.)"))
        return False
    elif kind == "A":
        raise HorovodInternalError(msg[1])
    elif kind == "D":
        stall_log.error("%s", msg[1])
    return True
