"""Upstream's import path ``horovod.runner.util.streams``: :class:`Pipe`, a one-slot pipe between two threads.

Upstream's Spark and Ray helpers hand a ``Pipe`` to :func:`horovod.runner.common.util.safe_shell_exec.execute`
as its ``stdout``/``stderr`` and read the command's output from it in another thread. No code of ours needed it,
so this is a small implementation with upstream's semantics.
"""
from __future__ import annotations

import threading
from typing import AnyStr, Generic, Optional


class Pipe(Generic[AnyStr]):
    """A pipe that one thread writes and another reads, for strings or bytes.

    It holds only the last written chunk: ``write`` blocks until the previous chunk was read completely (or the
    pipe was closed, then RuntimeError). ``read(length)`` blocks until a chunk is there and returns at most
    ``length`` items of it (all that is left when ``length`` is not positive); it returns None once the pipe is
    closed and drained.
    """

    def __init__(self) -> None:
        self._buf: Optional[AnyStr] = None
        self._offs = 0
        self._cond = threading.Condition()
        self._closed = False

    def write(self, buf: AnyStr) -> None:
        """Hand ``buf`` to the reader; waits while the reader has not taken the previous chunk."""
        with self._cond:
            try:
                while self._buf is not None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    raise RuntimeError("Pipe is closed")
                self._buf, self._offs = buf, 0
            finally:
                self._cond.notify_all()

    def read(self, length: int = -1) -> Optional[AnyStr]:
        """The next at most ``length`` items of the current chunk; None when the pipe is closed and empty."""
        with self._cond:
            try:
                while self._buf is None and not self._closed:
                    self._cond.wait()
                if self._buf is None:
                    return None
                if 0 < length < len(self._buf) - self._offs:
                    end = self._offs + length
                    out = self._buf[self._offs:end]
                    self._offs = end
                else:
                    out = self._buf[self._offs:]
                    self._buf = None
                return out
            finally:
                self._cond.notify_all()

    def flush(self) -> None:
        """Nothing to do (the pipe does not buffer beyond its one chunk); here for the text-stream interface."""

    def close(self) -> None:
        """Close the pipe: writers get RuntimeError, readers get what is left, then None."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
