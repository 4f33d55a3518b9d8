"""A doorbell in shared memory: processes on one host sleep until another one rings, through a Linux futex.

A futex wait blocks in the kernel (with the GIL released, as every ctypes call does) until the 32-bit word it
names changes and somebody wakes it. Ringing changes the word, then wakes every sleeper: a waiter that read the
word before a ring either sees it changed (the kernel returns at once) or is queued before the wake, so no ring is
lost. Waking costs one system call and no file descriptor, and a sleeper wakes in a few microseconds, several
times faster than a socket hand-off between processes (docs/benchmarks.md, issue 15).

Where the futex system call cannot be reached (not Linux, an unknown architecture), :func:`available` is False
and nothing here may be used.
"""
from __future__ import annotations

import ctypes
import errno
import platform
import sys
from typing import Optional

import numpy as np

# The futex system call's number by architecture (asm/unistd.h); FUTEX_WAIT and FUTEX_WAKE on shared memory (no
# FUTEX_PRIVATE_FLAG, so the kernel keys the word by its physical page and processes can share it).
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "ppc64le": 221, "s390x": 238}
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_WAKE_ALL = 0x7FFFFFFF


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load():
    number = _SYS_FUTEX.get(platform.machine()) if sys.platform.startswith("linux") else None
    if number is None:
        return None, None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.syscall
    except (OSError, AttributeError):
        return None, None
    call.restype = ctypes.c_long
    call.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                     ctypes.c_void_p, ctypes.c_int]
    return number, call


_NUMBER, _SYSCALL = _load()


def available() -> bool:
    """True where doorbells work (Linux on a known architecture)."""
    return _SYSCALL is not None


class Doorbell:
    """A 32-bit word of a shared mapping that processes ring and sleep on.

    ``word`` is a one-element uint32 view into memory shared by the processes (``MAP_SHARED``), 4-byte aligned.
    """

    def __init__(self, word: np.ndarray) -> None:
        if not available():
            raise RuntimeError("doorbells need the Linux futex system call")
        if word.dtype != np.uint32 or word.size != 1 or word.ctypes.data % 4:
            raise ValueError("a doorbell needs one aligned uint32 word of shared memory")
        self._word = word
        self._view = memoryview(word).cast("B").cast("I")     # Python ints, cheaper than numpy's scalars
        self._address = word.ctypes.data

    def value(self) -> int:
        """The bell's count now: read it before checking the condition you wait for, then :meth:`sleep` on it."""
        return self._view[0]

    def ring(self) -> None:
        """Change the word and wake every process sleeping on it."""
        self.bump()
        self.wake()

    def bump(self) -> None:
        """Change the word without waking anyone: for a caller that knows, by other means, that nobody sleeps
        (it must then make the change visible before it looks, see fast_rounds.py's ``ring``)."""
        view = self._view
        view[0] = (view[0] + 1) & 0xFFFFFFFF

    def wake(self) -> None:
        """Wake every process sleeping on the word (one system call, about 1.5 µs even when none sleeps)."""
        _SYSCALL(_NUMBER, self._address, _FUTEX_WAKE, _WAKE_ALL, None, None, 0)

    def sleep(self, seen: int, timeout: Optional[float]) -> None:
        """Sleep until the bell rings after ``seen`` was read, ``timeout`` seconds pass, or a signal arrives.

        Returns at once when the word already differs from ``seen``. Callers re-check their condition after every
        return: wake-ups may be spurious.
        """
        spec = None
        if timeout is not None:
            whole = int(timeout)
            spec = ctypes.byref(_Timespec(whole, int((timeout - whole) * 1e9)))
        if seen >= 1 << 31:                 # the kernel compares the word as a signed int
            seen -= 1 << 32
        if _SYSCALL(_NUMBER, self._address, _FUTEX_WAIT, seen, spec, None, 0) == -1:
            code = ctypes.get_errno()
            if code not in (errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR):
                raise OSError(code, f"futex wait failed: {errno.errorcode.get(code, code)}")
