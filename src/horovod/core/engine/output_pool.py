"""Memory for the new arrays that collectives return, reused once the program has dropped them.

A collective that returns a new array (``hvd.allreduce(x)`` in ``horovod.numpy``, every allgather) used to get it
from ``np.empty``. For large arrays glibc maps fresh pages on every call and unmaps them when the array dies, so
each call paid a page fault per 4 KB page: at 64 MB, a third of the allreduce's time.

Here large outputs are views of pooled backing buffers. A backing buffer is free again when nothing but the pool
refers to it: every numpy view of it (and every view of a view) holds a reference to it as its ``base``, and so
does anything that keeps such an array alive (a torch tensor made with ``from_numpy``, a memoryview), so its
reference count says exactly whether the program can still reach the memory. When the pool needs a new buffer
it first forgets idle ones, oldest first, so that the idle buffers and the new one fit in
``HOROVOD_OUTPUT_POOL_BYTES`` (0 disables the pool); arrays below ``MIN_POOLED_BYTES`` come from ``np.empty`` as
before, where the allocator's own free lists already reuse memory.

Pooled outputs start on a 64-byte boundary (``ALIGNMENT``). glibc's large blocks start 16 bytes past a page, and
XLA takes a host buffer without a copy only when it is 64-byte aligned, so ``horovod.jax`` hands a result to JAX
through DLPack without copying it only from aligned memory (a copy cost 0.5 ms per 4 MB there).
"""
from __future__ import annotations

import math
import sys
import threading
from typing import Dict, List, Optional, Tuple

import numpy as np

MIN_POOLED_BYTES = 1 << 20
ALIGNMENT = 64          # bytes; what XLA needs to use a host buffer in place (and a cache line)
_IDLE_REFCOUNT = 3      # the pool's list, one local variable, and getrefcount's argument


class OutputPool:
    """Backing buffers for large outputs; ``empty(shape, dtype)`` is ``np.empty`` with reuse."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self._lock = threading.Lock()
        self._buffers: List[np.ndarray] = []      # most recently handed out last
        self._starts: Dict[int, int] = {}         # id of a buffer in _buffers -> its aligned start (in bytes)

    def empty(self, shape: Tuple[int, ...], dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < MIN_POOLED_BYTES or self.capacity <= 0 or dtype.hasobject:
            return np.empty(shape, dtype)
        with self._lock:
            backing = self._take(nbytes)
            if backing is None:
                backing = np.empty(nbytes + ALIGNMENT, np.uint8)
                self._make_room(nbytes)
                self._starts[id(backing)] = -backing.ctypes.data % ALIGNMENT    # (ctypes.data: 2 us a call)
            self._buffers.append(backing)
            start = self._starts[id(backing)]
            return backing[start:start + nbytes].view(dtype).reshape(shape)

    def _take(self, nbytes: int) -> Optional[np.ndarray]:
        """An idle buffer that holds ``nbytes`` at an aligned start and less than twice that (the smallest such),
        removed from the list."""
        best = None
        for index in range(len(self._buffers)):     # not enumerate(): its cached tuple holds a reference
            backing = self._buffers[index]
            usable = _usable(backing)
            if nbytes <= usable < 2 * nbytes and sys.getrefcount(backing) <= _IDLE_REFCOUNT:
                if best is None or backing.nbytes < self._buffers[best].nbytes:
                    best = index
        return None if best is None else self._buffers.pop(best)

    def _make_room(self, incoming: int) -> None:
        """Forget idle buffers, oldest first, until the idle ones and ``incoming`` fit in the capacity."""
        idle = [b for b in self._buffers if sys.getrefcount(b) <= _IDLE_REFCOUNT]
        total = sum(_usable(b) for b in idle) + incoming
        dropped = set()
        for backing in idle:
            if total <= self.capacity:
                break
            total -= _usable(backing)
            dropped.add(id(backing))
        self._buffers = [b for b in self._buffers if id(b) not in dropped]
        for key in dropped:
            del self._starts[key]

    def idle_bytes(self) -> int:
        """Bytes held by buffers that no array refers to (for tests and diagnostics)."""
        with self._lock:
            return sum(_usable(b) for b in self._buffers if sys.getrefcount(b) <= _IDLE_REFCOUNT)


def _usable(backing: np.ndarray) -> int:
    """The bytes a backing buffer holds from its aligned start (what the capacity counts)."""
    return backing.nbytes - ALIGNMENT


_pool: Optional[OutputPool] = None


def pool() -> OutputPool:
    """The process's pool, sized by ``HOROVOD_OUTPUT_POOL_BYTES`` when first used."""
    global _pool
    if _pool is None:
        from horovod.common import config

        _pool = OutputPool(config.get("HOROVOD_OUTPUT_POOL_BYTES"))
    return _pool


def empty(shape: Tuple[int, ...], dtype) -> np.ndarray:
    """A new array for a collective's result (see the module's docstring)."""
    return (_pool or pool()).empty(tuple(shape), dtype)


def empty_like(array: np.ndarray) -> np.ndarray:
    return empty(array.shape, array.dtype)
