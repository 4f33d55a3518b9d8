"""Cross-memory attach: copy straight between this process's memory and a peer's, with one copy.

``process_vm_readv`` and ``process_vm_writev`` (Linux 3.2+) move bytes between two processes' address spaces
inside the kernel: no shared slot in between, so a collective that would copy into shared memory and out again
copies once. Open MPI's shared-memory transport uses the same calls for large messages ("CMA").

The kernel allows them when the caller may ptrace the peer: same user and, under Yama, ``ptrace_scope`` 0 (or
CAP_SYS_PTRACE); containers often refuse them (EPERM, or ENOSYS under seccomp), and ranks in different PID
namespaces cannot name each other. :func:`probe` therefore tries one real read and write, and the caller falls
back to its shared-memory path when they fail. ctypes releases the GIL for the duration of each call.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import threading
from typing import Optional

import numpy as np

from horovod.backends import huge_pages

STEP_BYTES = 8 << 20


def _load():
    """The libc entry points, or None where this libc lacks them. Their iovec arguments are passed as plain
    addresses (see :func:`_iovecs`): ctypes converts an int far faster than it builds and refers to Structures."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        calls = (libc.process_vm_readv, libc.process_vm_writev)
    except (OSError, AttributeError):
        return None
    for call in calls:
        call.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p,
                         ctypes.c_ulong, ctypes.c_ulong]
        call.restype = ctypes.c_ssize_t
    return calls


_CALLS = _load()
_LOCAL = threading.local()      # each thread's two iovecs (a fast round's caller and the engine thread copy at once)


class CrossMemoryError(OSError):
    """A cross-memory copy failed (the peer exited, or the kernel refused it)."""


def address(array: np.ndarray) -> int:
    """Where a C-contiguous array's first byte lies in this process.

    A writable array's address comes from a ctypes view of its buffer (a fifth of the cost of numpy's
    ``__array_interface__``, which builds a dict: a direct round asks for a few addresses per call); a read-only
    or empty one's from numpy."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError, BufferError):
        return array.__array_interface__["data"][0]


def _iovecs():
    """This thread's local and remote iovec (``iov_base``, ``iov_len`` each): the words to fill, and the
    address of the first (the second follows 16 bytes later)."""
    try:
        return _LOCAL.iovecs
    except AttributeError:
        backing = np.zeros(4, np.uint64)
        _LOCAL.iovecs = iovecs = (memoryview(backing).cast("B").cast("Q"), backing.ctypes.data, backing)
        return iovecs


def _move(call_index: int, pid: int, local: int, remote: int, nbytes: int) -> None:
    if _CALLS is None:
        raise CrossMemoryError(errno.ENOSYS, "process_vm_readv is not available in this C library")
    call = _CALLS[call_index]
    words, at, _ = _iovecs()
    done = 0
    while done < nbytes:
        step = min(STEP_BYTES, nbytes - done)
        words[0], words[1], words[2], words[3] = local + done, step, remote + done, step
        got = call(pid, at, 1, at + 16, 1, 0)
        if got <= 0:
            err = ctypes.get_errno() if got < 0 else errno.EFAULT
            raise CrossMemoryError(err, f"cross-memory copy of {step} bytes with process {pid} failed: "
                                        f"{os.strerror(err)}")
        done += got


def root_share(nbytes: int, size: int) -> int:
    """How a broadcast of ``nbytes`` among ``size`` ranks splits the copying evenly: the root writes this many
    leading bytes (about 1/size, in whole pages) into every peer, and each peer reads the rest from the root."""
    return nbytes // size // 4096 * 4096


def shared_address(array: np.ndarray, besides: int = 0) -> int:
    """:func:`address` of an array that peers are about to copy from or into, after asking for huge pages under
    it when it is large and seen again (:func:`horovod.backends.huge_pages.prefer`: the copies move 2 MB pages
    faster). ``besides``: the address of an array of the same op already asked for (an output that is the input
    counts once)."""
    where = address(array)
    if where != besides:
        huge_pages.prefer(array, where)
    return where


def read(pid: int, remote: int, dst: np.ndarray) -> None:
    """Fill the C-contiguous ``dst`` with ``dst.nbytes`` bytes from address ``remote`` of process ``pid``."""
    _move(0, pid, address(dst), remote, dst.nbytes)


def write(pid: int, remote: int, src: np.ndarray) -> None:
    """Copy the C-contiguous ``src`` to address ``remote`` of process ``pid``."""
    _move(1, pid, address(src), remote, src.nbytes)


def probe(pid: int, remote: int, expected: bytes) -> Optional[str]:
    """None when this process may read and write ``pid``'s memory, else why not.

    ``expected`` is what lies at ``remote`` in ``pid``: it is read, compared, and written back unchanged.
    """
    got = np.zeros(len(expected), np.uint8)
    try:
        _move(0, pid, address(got), remote, got.nbytes)
        if got.tobytes() != expected:
            return "process_vm_readv read the wrong bytes (the ranks are in different PID namespaces)"
        _move(1, pid, address(got), remote, got.nbytes)
    except CrossMemoryError as exc:
        return f"cross-memory copy refused: {os.strerror(exc.errno)}"
    return None
