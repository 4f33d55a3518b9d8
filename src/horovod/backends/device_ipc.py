"""The device data plane: ranks on one host exchange device buffers through windows each rank exports to the others
(CUDA IPC memory handles on a GPU), reduce with the device's own kernels, and never stage data through host memory.

Every rank owns one window of ``window_bytes`` in its device memory and maps every peer's window into its address
space once, at the first device collective of its process set. A collective moves through the windows in chunks;
host-side barriers on the set's host plane (the shm doorbells) order the steps, after each rank has waited for its
own device work (``DeviceOps.synchronize``), so a peer reads a window only once its owner's copies are complete.

Allreduce of a chunk is a reduce-scatter then an allgather through the windows: each rank copies its part in,
reduces its slice of the chunk from every window into its own, and copies every rank's reduced slice out (each
element is reduced by one rank, so every rank ends with the same bits): two barriers per chunk. The other
collectives take one (copy in, barrier, copy out). Each window has two halves that successive chunks (and
collectives) alternate between, so no barrier is needed before a half is written again: a rank writes a half only
after the barrier of the chunk in between, which every peer passes only once its reads of that half are done.

The plane knows nothing of frameworks: :class:`DeviceOps` is what it needs of device arrays, and each binding that
has device tensors registers an implementation for its device code (``horovod.torch.cuda_ipc`` for CUDA; the
suite's CPU emulation, whose windows are shared-memory segments, tests these schedules on machines without a GPU).
"""
from __future__ import annotations

import abc
import logging
from typing import Any, Callable, Dict, List, Sequence

import numpy as np

from horovod.backends.base import Backend
from horovod.common.timeline import activity
from horovod.common.types import DataType, ReduceOp, numpy_dtype

log = logging.getLogger(__name__)

CUDA = 1            # the device code (Request.device) of CUDA tensors
HANDLE_BYTES = 256  # an exported window handle, padded (a CUDA IPC handle is 64 bytes)


class DeviceOps(abc.ABC):
    """What the device plane needs of one kind of device array. Arrays are flat and contiguous; ``dtype`` is the
    wire :class:`DataType`. Copies and reductions may run asynchronously until :meth:`synchronize`."""

    @abc.abstractmethod
    def data_type(self, array: Any) -> DataType:
        """The wire dtype of ``array`` (ValueError if unsupported)."""

    @abc.abstractmethod
    def flat(self, array: Any) -> Any:
        """A one-dimensional view of a contiguous ``array``."""

    @abc.abstractmethod
    def count(self, array: Any) -> int:
        """The number of elements of ``array``."""

    @abc.abstractmethod
    def export_window(self, nbytes: int) -> tuple:
        """Allocate this rank's window; returns ``(handle bytes, window)``."""

    @abc.abstractmethod
    def open_window(self, handle: bytes, nbytes: int) -> Any:
        """Map a peer's window from the handle it exported."""

    @abc.abstractmethod
    def close_window(self, window: Any, own: bool) -> None:
        """Unmap a peer's window, or free this rank's own."""

    @abc.abstractmethod
    def view(self, window: Any, dtype: DataType, start: int, count: int) -> Any:
        """Elements ``[start, start + count)`` of ``window`` read as ``dtype``."""

    @abc.abstractmethod
    def scaled_copy(self, dst: Any, src: Any, factor: float) -> None:
        """``dst = src * factor`` (with the host planes' rules for integers and half precision)."""

    @abc.abstractmethod
    def reduce(self, dst: Any, sources: Sequence[Any], op: ReduceOp) -> None:
        """``dst = sources[0] (op) sources[1] (op) ...``; ``dst`` may be ``sources[0]``."""

    @abc.abstractmethod
    def empty(self, shape: tuple, dtype: DataType) -> Any:
        """A new device array."""

    @abc.abstractmethod
    def zeros(self, count: int, dtype: DataType) -> Any:
        """A new flat device array of zeros (what a joined rank contributes)."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Wait until this rank's device work so far is complete (before a barrier lets peers read)."""


_REGISTRY: Dict[int, Callable[[], DeviceOps]] = {}
_MADE: Dict[int, DeviceOps] = {}     # device code -> its ops, built once (the op layer asks at every request)


def register(device: int, factory: Callable[[], DeviceOps]) -> None:
    """Make device code ``device`` usable: ``factory()`` builds its ops, once, when first asked for (a binding
    calls this)."""
    _REGISTRY[int(device)] = factory
    _MADE.pop(int(device), None)


def ops_for(device: int) -> DeviceOps:
    """The ops registered for ``device``; RuntimeError (naming what to import) when none is."""
    ops = _MADE.get(device)
    if ops is None:
        factory = _REGISTRY.get(int(device))
        if factory is None:
            raise RuntimeError(f"no device plane is registered for device code {device}: a rank received a device "
                               "collective without the binding that provides it (import horovod.torch on every "
                               "rank).")
        ops = _MADE[int(device)] = factory()
    return ops


def _even_split(count: int, size: int) -> List[int]:
    """``count`` elements in ``size`` slices, the first ``count % size`` one element longer."""
    return [count // size + (1 if r < count % size else 0) for r in range(size)]


def _offsets(counts: Sequence[int]) -> List[int]:
    return [int(x) for x in np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))]


class DevicePlane:
    """The device collectives of one process set whose ranks share a host, through exported windows."""

    name = "cuda_ipc"

    def __init__(self, rank: int, size: int, host: Backend, ops: DeviceOps, window_bytes: int) -> None:
        self.rank, self.size, self.host, self.ops = rank, size, host, ops
        self.window_bytes = int(window_bytes)
        self._half_bytes = self.window_bytes // 2 // 64 * 64      # each half 64-byte aligned
        self._base = 0                                             # the byte offset of the half in use
        if self._half_bytes < 64:
            raise ValueError(f"HOROVOD_CUDA_IPC_WINDOW_BYTES={window_bytes} is too small: give the device windows at "
                             "least 128 bytes (the default is 64 MiB).")
        handle, own = ops.export_window(self.window_bytes)
        if len(handle) > HANDLE_BYTES:
            raise RuntimeError(f"a device window handle of {len(handle)} bytes exceeds {HANDLE_BYTES}")
        mine = np.zeros(HANDLE_BYTES + 2, np.uint8)
        mine[:2] = np.frombuffer(len(handle).to_bytes(2, "little"), np.uint8)
        mine[2:2 + len(handle)] = np.frombuffer(handle, np.uint8)
        every = np.empty((size, HANDLE_BYTES + 2), np.uint8)
        host.allgatherv(mine, every.reshape(-1), [HANDLE_BYTES + 2] * size)
        self.windows: List[Any] = []
        try:
            for r in range(size):
                if r == rank:
                    self.windows.append(own)
                    continue
                n = int.from_bytes(every[r, :2].tobytes(), "little")
                self.windows.append(ops.open_window(every[r, 2:2 + n].tobytes(), self.window_bytes))
        except BaseException:
            self._close_windows(own)
            raise
        host.barrier()          # every rank has mapped every window before any is written
        log.debug("device plane ready: rank %d of %d, %d-byte windows", rank, size, self.window_bytes)

    def _close_windows(self, own: Any = None) -> None:
        for r, window in enumerate(self.windows):
            if r != self.rank:
                self.ops.close_window(window, own=False)
        if own is not None:
            self.ops.close_window(own, own=True)
        self.windows = []

    def close(self) -> None:
        """Unmap the peers' windows and free this rank's (called by the engine at shutdown)."""
        if self.windows:
            self._close_windows(self.windows[self.rank])

    def _step(self) -> None:
        """Wait for this rank's device work, then for every rank's."""
        self.ops.synchronize()
        self.host.barrier()

    def _chunk(self) -> None:
        """Move to the other half of the windows (every rank does so at the same point)."""
        self._base = self._half_bytes - self._base

    def _capacity(self, dtype: DataType) -> int:
        return self._half_bytes // numpy_dtype(dtype).itemsize

    def _win(self, r: int, dtype: DataType, start: int, count: int) -> Any:
        """Elements ``[start, start + count)`` of rank r's half in use, as ``dtype``."""
        return self.ops.view(self.windows[r], dtype, self._base // numpy_dtype(dtype).itemsize + start, count)

    # ------------------------------------------------------------------ collectives
    def allreduce(self, inputs: List[Any], outputs: List[Any], dtype: DataType, op: ReduceOp,
                  prescale: float, postscale: float) -> None:
        """Reduce each flat ``inputs[i]`` into ``outputs[i]`` (which may alias it), as one fused sequence."""
        starts = _offsets([self.ops.count(a) for a in inputs])
        total, capacity = starts[-1], self._capacity(dtype)
        with activity("CUDA_IPC_ALLREDUCE"):
            for chunk_start in range(0, total, capacity):
                self._chunk()
                count = min(capacity, total - chunk_start)
                self._segments(inputs, starts, chunk_start, count, lambda piece, w_off, n: self.ops.scaled_copy(
                    self._win(self.rank, dtype, w_off, n), piece, prescale))
                self._step()
                slices = _even_split(count, self.size)
                lo = sum(slices[:self.rank])
                if slices[self.rank]:
                    mine = self._win(self.rank, dtype, lo, slices[self.rank])
                    others = [self._win(r, dtype, lo, slices[self.rank]) for r in range(self.size) if r != self.rank]
                    self.ops.reduce(mine, [mine] + others, op)
                self._step()
                slice_lo = 0
                for r in range(self.size):
                    if slices[r]:
                        self._segments(outputs, starts, chunk_start + slice_lo, slices[r],
                                       lambda piece, w_off, n, r=r: self.ops.scaled_copy(
                                           piece, self._win(r, dtype, w_off, n), postscale),
                                       window_base=slice_lo)
                    slice_lo += slices[r]
            self.ops.synchronize()

    def _slice(self, array: Any, start: int, count: int) -> Any:
        return array[start:start + count]

    def _segments(self, arrays: List[Any], starts: List[int], begin: int, count: int, visit,
                  window_base: int = 0) -> None:
        """Call ``visit(piece_of_array, window_offset, n)`` for each part of the fused range ``[begin, begin+count)``
        that lies in ``arrays`` (laid end to end at ``starts``); window offsets count from the chunk's start."""
        end = begin + count
        for a, a_start, a_end in zip(arrays, starts, starts[1:]):
            lo, hi = max(a_start, begin), min(a_end, end)
            if lo < hi:
                visit(self._slice(a, lo - a_start, hi - lo), window_base + lo - begin, hi - lo)

    def allgatherv(self, inp: Any, out: Any, counts: Sequence[int], dtype: DataType) -> None:
        """Concatenate every rank's ``inp`` (``counts[r]`` elements from rank r) into ``out``, in rank order."""
        capacity, offsets = self._capacity(dtype), _offsets(counts)
        with activity("CUDA_IPC_ALLGATHER"):
            for k in range(0, max(counts, default=0), capacity):
                self._chunk()
                mine = min(capacity, counts[self.rank] - k)
                if mine > 0:
                    self.ops.scaled_copy(self._win(self.rank, dtype, 0, mine), self._slice(inp, k, mine), 1.0)
                self._step()
                for r in range(self.size):
                    n = min(capacity, counts[r] - k)
                    if n > 0:
                        self.ops.scaled_copy(self._slice(out, offsets[r] + k, n), self._win(r, dtype, 0, n), 1.0)
            self.ops.synchronize()

    def broadcast(self, buf: Any, root: int, dtype: DataType) -> None:
        """Copy ``root``'s ``buf`` into every rank's ``buf``."""
        capacity, total = self._capacity(dtype), self.ops.count(buf)
        with activity("CUDA_IPC_BCAST"):
            for k in range(0, total, capacity):
                self._chunk()
                n = min(capacity, total - k)
                if self.rank == root:
                    self.ops.scaled_copy(self._win(root, dtype, 0, n), self._slice(buf, k, n), 1.0)
                self._step()
                if self.rank != root:
                    self.ops.scaled_copy(self._slice(buf, k, n), self._win(root, dtype, 0, n), 1.0)
            self.ops.synchronize()

    def reducescatter(self, inp: Any, out: Any, counts: Sequence[int], dtype: DataType, op: ReduceOp,
                      prescale: float) -> None:
        """Reduce ``inp`` (scaled by ``prescale``) across ranks; keep this rank's block (``counts[rank]``) in ``out``."""
        capacity, offsets = self._capacity(dtype), _offsets(counts)
        total = offsets[-1]
        block_lo, block_hi = offsets[self.rank], offsets[self.rank + 1]
        with activity("CUDA_IPC_REDUCESCATTER"):
            for k in range(0, total, capacity):
                self._chunk()
                n = min(capacity, total - k)
                self.ops.scaled_copy(self._win(self.rank, dtype, 0, n), self._slice(inp, k, n), prescale)
                self._step()
                lo, hi = max(block_lo, k), min(block_hi, k + n)
                if lo < hi:
                    sources = [self._win(r, dtype, lo - k, hi - lo) for r in range(self.size)]
                    self.ops.reduce(self._slice(out, lo - block_lo, hi - lo), sources, op)
            self.ops.synchronize()

    def alltoallv(self, inp: Any, send_counts: Sequence[int], out: Any, recv_counts: Sequence[int],
                  max_count: int, dtype: DataType) -> None:
        """Send ``send_counts[j]`` consecutive elements to rank j; receive ``recv_counts[i]`` from rank i."""
        per_peer = self._capacity(dtype) // self.size
        if per_peer < 1:
            raise RuntimeError(f"the device window ({self.window_bytes} bytes) is too small for {self.size} ranks")
        send_at, recv_at = _offsets(send_counts), _offsets(recv_counts)
        with activity("CUDA_IPC_ALLTOALL"):
            for k in range(0, max_count, per_peer):
                self._chunk()
                for j in range(self.size):
                    n = min(per_peer, send_counts[j] - k)
                    if n > 0:
                        self.ops.scaled_copy(self._win(self.rank, dtype, j * per_peer, n),
                                             self._slice(inp, send_at[j] + k, n), 1.0)
                self._step()
                for i in range(self.size):
                    n = min(per_peer, recv_counts[i] - k)
                    if n > 0:
                        self.ops.scaled_copy(self._slice(out, recv_at[i] + k, n),
                                             self._win(i, dtype, self.rank * per_peer, n), 1.0)
            self.ops.synchronize()
