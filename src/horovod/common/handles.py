"""Handles: what an asynchronous collective returns, completed by the engine thread.

A handle is a lock that starts acquired; the engine releases it when every part of the operation finished.
Waiting therefore blocks in the kernel with the GIL released, and a completion costs one lock release (about
half the cost of a ``threading.Event``).
"""
from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional

from horovod.common.exceptions import HorovodInternalError


class Handle:
    """Completion of one collective (or of a group of them: ``parts`` > 1)."""

    __slots__ = ("name", "_lock", "_results", "_remaining", "_error", "_finish", "names", "on_wait")

    def __init__(self, name: str, parts: int = 1, finish: Optional[Callable[[List[Any]], Any]] = None) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._lock.acquire()
        self._results: List[Any] = [None] * parts
        self._remaining = parts
        self._error: Optional[BaseException] = None
        self._finish = finish
        self.names: List[str] = []        # the tensor names this handle completes (set by the engine)
        self.on_wait: Optional[Callable[[Handle], None]] = None   # tells the engine someone waits

    def set_result(self, index: int, value: Any) -> None:
        """Called by the engine thread when part ``index`` finished."""
        if self._remaining <= 0:
            return
        self._results[index] = value
        self._remaining -= 1
        if self._remaining == 0:
            self._lock.release()

    def set_error(self, error: BaseException) -> None:
        """Fail the handle (first error wins)."""
        if self._remaining <= 0:
            return
        self._error = error
        self._remaining = 0
        self._lock.release()

    def poll(self) -> bool:
        """True once the operation finished (successfully or not)."""
        return not self._lock.locked()

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Block until done; return the result, or raise the operation's error."""
        if self.on_wait is not None and self._lock.locked():
            self.on_wait(self)
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            raise TimeoutError(f"operation {self.name!r} did not finish within {timeout}s")
        self._lock.release()
        if self._error is not None:
            error = self._error
            if isinstance(error, HorovodInternalError):
                raise HorovodInternalError(str(error)) from error
            raise error
        if self._finish is not None:
            return self._finish(self._results)
        return self._results[0] if len(self._results) == 1 else self._results
