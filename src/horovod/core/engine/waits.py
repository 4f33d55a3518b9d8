"""Wait notices: a rank tells the coordinator when a user thread blocks on a collective it has not run yet.

When a user thread blocks on a handle whose tensors this rank has not yet been told to run, the rank tells the
coordinator (``W``, on the control channel, so after the requests it sent). The coordinator then emits those
tensors at once, and knows that the rank waits. A wait that ends because the handle completed needs no message;
a timed wait that runs out is taken back (``U``) only when the handle is not waited on again within a short lapse
(``EngineSettings.wait_lapse_s``), so polling with short timed waits sends nothing per poll. From these notices
the coordinator's deadlock detector sees when every rank is blocked on a tensor the others never submit.
"""
from __future__ import annotations

import select
import threading
import time
from typing import Dict, List, Optional, Protocol, Tuple

from horovod.common import wire
from horovod.core.controller import Coordinator
from horovod.core.controller.messages import Tag
from horovod.core.engine.control import ControlChannel
from horovod.core.engine.handles import Handle, waits_from_several_threads

LAPSE_RETRY_SECONDS = 0.01
Note = Tuple[bool, List[str], bool]     # rank 0's notice: (begins, names, from a program submitting from threads)
WAITED, SEVERAL_THREADS = 1, 2          # flags of a worker's requests that carry its wait notice


class Noticing(Protocol):
    """What the wait notices need of the engine (``engine.Engine`` is one)."""

    coordinator: Optional[Coordinator]  # rank 0's: its notices go to it; None on a worker, which sends them
    control: ControlChannel             # a worker's channel to rank 0 (its send lock guards the handles' waits)
    lock: threading.Lock                # the engine lock: guards the handles' waits on rank 0

    def queued(self, handle: Handle) -> bool:
        """True while ``handle``'s tensors wait in this rank's table (not yet emitted by the coordinator)."""

    def wake(self) -> None:
        """Wake the engine thread."""

    def wake_if_sleeping(self) -> None:
        """Wake the engine thread if it sleeps in the kernel (engine lock held)."""


class WaitNotices:
    """The wait notices of one engine: sent by a worker, queued for the engine thread on rank 0."""

    def __init__(self, engine: Noticing, lapse_s: float) -> None:
        self.engine = engine
        self.lapse_s = lapse_s
        self.worker = engine.coordinator is None
        # rank 0's notices for its engine thread: (begins, names, from a program submitting from several threads)
        self.notes: List[Note] = []
        self.lock: threading.Lock = engine.control.send_lock if self.worker else engine.lock  # guards handles' waits
        self.lapsed: Dict[Handle, float] = {}     # handle -> when its last timed wait ran out

    def take_notes(self) -> List[Note]:
        """Rank 0's queued notices (call with the engine lock held)."""
        notes = self.notes
        if notes:
            self.notes = []
        return notes

    def notice(self, handle: Handle, begins: bool) -> None:
        """A user thread starts (``begins``) or stops blocking on ``handle`` without it having completed.

        The first wait on a handle whose tensors are still in this rank's table tells the coordinator (its
        tensors are then not held back to fill a fusion bucket, and the deadlock detector knows this rank waits).
        A wait that stops is taken back only if nobody waits again within the lapse (see :meth:`expire`).
        """
        with self.lock:
            if not begins:
                self._stopped_waiting(handle)
                return
            handle.waiters += 1
            if self.lapsed:
                self.lapsed.pop(handle, None)
            if handle.noticed or not self.engine.queued(handle):
                return
            handle.noticed = True
            if self.worker:
                self._send_wait(handle)
                return
            self.notes.append((True, list(handle.names), waits_from_several_threads()))
            self.engine.wake_if_sleeping()

    def notice_with_requests(self, handle: Handle) -> int:
        """A worker sends the requests of a blocking call (whose caller waits on ``handle`` at once) with the
        notice its wait would send next: the flags that go with them (``WAITED``, ``SEVERAL_THREADS``). The
        handle counts as noticed, so its wait sends nothing; the requests are not yet sent, so the notice cannot
        come too late."""
        handle.noticed = True
        return WAITED | (SEVERAL_THREADS if waits_from_several_threads() else 0)

    def _stopped_waiting(self, handle: Handle) -> None:
        handle.waiters -= 1
        if handle.waiters > 0 or not handle.noticed:
            return
        first = not self.lapsed
        self.lapsed[handle] = time.monotonic()
        if first:
            self.engine.wake()                  # the engine thread times the lapse

    def _send_wait(self, handle: Handle) -> None:
        # Under the send lock: the notice follows this rank's requests, and no request for a later tensor of the
        # same name can be sent between the table check and the notice.
        try:
            notice = [Tag.WAITING, list(handle.names)]
            if waits_from_several_threads():
                notice.append(True)     # see handles.several_threads
            wire.send_msg(self.engine.control.socks[0], notice)
        except OSError:
            pass                        # the engine thread reports the lost coordinator

    def expire(self) -> Optional[float]:
        """Take back the wait notices of handles whose timed wait ran out a lapse ago and that nobody waits on
        again; returns the seconds until the next lapse is due (None: none left). Engine thread.

        A worker's engine thread must never block on the control socket (the coordinator may be waiting for it
        in a collective while a flood of requests fills the socket): when a user thread holds the send lock, or
        the socket cannot take a message now, it tries again shortly.
        """
        worker = self.worker
        if not self.lock.acquire(blocking=not worker):
            return LAPSE_RETRY_SECONDS
        try:
            if worker and not select.select([], [self.engine.control.socks[0]], [], 0)[1]:
                return LAPSE_RETRY_SECONDS
            due, expired = self._expired(time.monotonic())
            if expired and worker:
                for names in expired:
                    try:
                        wire.send_msg(self.engine.control.socks[0], [Tag.UNWAITING, names])
                    except OSError as exc:
                        raise self.engine.control.lost(0, exc) from None
        finally:
            self.lock.release()
        if expired and not worker:
            for names in expired:
                self.engine.coordinator.unmark_waiting(0, names)
        return due

    def _expired(self, now: float) -> Tuple[Optional[float], List[List[str]]]:
        """The lapsed waits to take back now, and the seconds until the next one is due (lock held)."""
        due = None
        expired = []
        for handle, since in list(self.lapsed.items()):
            if handle.waiters > 0 or not handle.noticed:
                del self.lapsed[handle]
                continue
            left = since + self.lapse_s - now
            if left > 0:
                due = left if due is None else min(due, left)
                continue
            del self.lapsed[handle]
            handle.noticed = False
            if self.engine.queued(handle):
                expired.append(list(handle.names))
        return due, expired
