"""Handles: what an asynchronous collective returns, completed by the engine thread.

A handle is a lock that starts acquired; the engine releases it when every part of the operation finished.
Waiting therefore blocks in the kernel with the GIL released, and a completion costs one lock release (about
half the cost of a ``threading.Event``).

A wait that has to block tells the engine through ``on_wait(handle, True)``, and ``on_wait(handle, False)`` when
it stops blocking without the handle having completed (a timed wait that ran out, or an interrupt). A completed
handle needs no notice: the coordinator knows when it emitted the handle's tensors. The engine uses the notices
to emit the tensors at once, and to recognize a deadlock (every rank blocked on a tensor the others never send).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, List, Optional

from horovod.common.exceptions import HorovodInternalError

_thread = threading.local()


@contextlib.contextmanager
def several_threads() -> Iterator[None]:
    """Mark the waits of this thread, inside the block, as made by a program that submits collectives from several
    threads (a TF1 graph runs independent collectives on as many threads): another thread of this rank may still
    submit what the other ranks wait for, so the deadlock detector reports such a state but does not end the job.
    """
    previous = getattr(_thread, "several", False)
    _thread.several = True
    try:
        yield
    finally:
        _thread.several = previous


def waits_from_several_threads() -> bool:
    """True inside :func:`several_threads` on this thread."""
    return getattr(_thread, "several", False)


class Handle:
    """Completion of one collective (or of a group of them: ``parts`` > 1)."""

    __slots__ = ("name", "_lock", "_results", "_remaining", "_error", "_finish", "names", "on_wait", "waiters",
                 "noticed")

    def __init__(self, name: str, parts: int = 1, finish: Optional[Callable[[List[Any]], Any]] = None) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._lock.acquire()
        self._results: List[Any] = [None] * parts
        self._remaining = parts
        self._error: Optional[BaseException] = None
        self._finish = finish
        self.names: List[str] = []        # the tensor names this handle completes (set by the engine)
        self.on_wait: Optional[Callable[[Handle, bool], None]] = None   # tells the engine a wait starts/stops
        # Kept by the engine, under its lock: threads blocked in wait(), and whether the coordinator was told
        # that this rank waits on the handle.
        self.waiters = 0
        self.noticed = False

    def set_result(self, index: int, value: Any) -> None:
        """Called by the engine thread when part ``index`` finished."""
        if self._remaining <= 0:
            return
        self._results[index] = value
        self._part_done()

    def set_error(self, error: BaseException) -> None:
        """One part failed. The handle fails with the first error, once every part has finished: the engine
        completes every part of a handle (the coordinator emits a group's parts in one response list, and an abort
        fails everything left), and a program that resubmits under the same names after the error must not find
        a part still in flight."""
        if self._remaining <= 0:
            return
        if self._error is None:
            self._error = error
        self._part_done()

    def _part_done(self) -> None:
        self._remaining -= 1
        if self._remaining == 0:
            self._lock.release()

    def poll(self) -> bool:
        """True once the operation finished (successfully or not)."""
        return not self._lock.locked()

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Block until done; return the result, or raise the operation's error."""
        lock = self._lock
        if not lock.acquire(False):
            notice = self.on_wait if timeout is None or timeout > 0 else None    # a zero timeout only polls
            if notice is not None:
                notice(self, True)
            done = False
            try:
                done = lock.acquire(timeout=-1 if timeout is None else timeout)
            finally:
                if not done and notice is not None:
                    notice(self, False)
            if not done:
                raise TimeoutError(f"operation {self.name!r} did not finish within {timeout}s")
        lock.release()
        if self._error is not None:
            error = self._error
            if isinstance(error, HorovodInternalError):
                raise HorovodInternalError(str(error)) from error
            raise error
        if self._finish is not None:
            return self._finish(self._results)
        return self._results[0] if len(self._results) == 1 else self._results
