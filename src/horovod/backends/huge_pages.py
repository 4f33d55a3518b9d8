"""Huge pages for the long-lived buffers that cross-memory copies read and write.

``process_vm_readv``/``writev`` pin every page of both sides of a copy: on memory in 4 KB pages a direct
allreduce of 16 MB at 2 ranks took 1.19x the chunked path's time, on 2 MB pages 0.78x (docs/benchmarks.md, "The
direct paths gain most on huge pages"). numpy asks for transparent huge pages on its arrays from 4 MB; torch's
CPU allocator does not, and a training loop allreduces the same gradient buffers every step.

:func:`prefer` therefore asks the kernel to collapse a large buffer's whole 2 MB pages into huge pages
(``MADV_COLLAPSE``, Linux 6.1+: synchronous, the contents unchanged, independent of the system's THP setting)
the second time it sees the buffer's range, and again at the 4th, 8th, 16th... sighting: a buffer allocated for
one call costs nothing; asking again where the pages are huge already costs microseconds; a range that a new
buffer took over after an earlier one was collapsed (the module knows ranges, not allocations) is collapsed
again within as many calls as it has seen; and a program that allocates a fresh buffer at the same address
every call pays a collapse only at those powers of two. Where the kernel refuses (older kernels, memory that is
not anonymous, none to compact) nothing changes: the copies are as correct on 4 KB pages, only slower; refused
too often in a row, it stops asking. ``HOROVOD_HUGE_PAGES=0`` turns it off.
"""
from __future__ import annotations

import collections
import ctypes
import ctypes.util
import errno
import logging
import os
import threading
from typing import Optional, Tuple

import numpy as np

from horovod.common import config

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
FROM_BYTES = 4 << 20        # smaller buffers span at most one whole huge page: not worth a system call
MADV_COLLAPSE = 25
MAX_RANGES = 4096           # ranges remembered (oldest forgotten first)
MAX_REFUSALS = 8            # refusals in a row (no success between) after which it stops asking


def _madvise():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        call = libc.madvise
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    call.restype = ctypes.c_int
    return call


_MADVISE = _madvise()
_lock = threading.Lock()
_seen: collections.OrderedDict[Tuple[int, int], int] = collections.OrderedDict()   # (start, end) -> sightings
_refusals = 0                   # refusals since the last collapse
_enabled: Optional[bool] = None     # HOROVOD_HUGE_PAGES, read once


def enabled() -> bool:
    """Whether :func:`prefer` may ask the kernel for anything in this process."""
    global _enabled
    if _enabled is None:
        _enabled = _MADVISE is not None and bool(config.get("HOROVOD_HUGE_PAGES"))
    return _enabled and _refusals < MAX_REFUSALS


def whole_pages(address: int, nbytes: int) -> Optional[Tuple[int, int]]:
    """The 2 MB-aligned range of whole huge pages inside ``[address, address + nbytes)``, or None."""
    start = -(-address // HUGE_PAGE) * HUGE_PAGE
    end = (address + nbytes) // HUGE_PAGE * HUGE_PAGE
    return (start, end) if end > start else None


def prefer(array: np.ndarray, address: int) -> None:
    """Ask for huge pages under ``array`` (C-contiguous, first byte at ``address``) at the 2nd, 4th, 8th...
    time its range comes here: see the module's docstring. Cheap when there is nothing to do (a size check or a
    dict lookup)."""
    global _refusals
    if array.nbytes < FROM_BYTES or not enabled():
        return
    pages = whole_pages(address, array.nbytes)
    if pages is None:
        return
    with _lock:
        seen = _seen[pages] = _seen.get(pages, 0) + 1
        _seen.move_to_end(pages)
        while len(_seen) > MAX_RANGES:
            _seen.popitem(last=False)
    if seen < 2 or seen & (seen - 1):       # asked at the 2nd, 4th, 8th... sighting
        return
    start, end = pages
    if _MADVISE(start, end - start, MADV_COLLAPSE) == 0:
        _refusals = 0
        return
    code = ctypes.get_errno()
    # EPERM, ENOSYS: never here. EINVAL: a kernel without MADV_COLLAPSE, or memory that is not anonymous (a file
    # mapping); EAGAIN, ENOMEM: not now. Either way the range is asked again at its next power of two.
    _refusals = MAX_REFUSALS if code in (errno.EPERM, errno.ENOSYS) else _refusals + 1
    log.debug("huge pages: MADV_COLLAPSE of %d bytes refused (%s)%s", end - start, os.strerror(code),
              "; no more asked in this process" if _refusals >= MAX_REFUSALS else "")
