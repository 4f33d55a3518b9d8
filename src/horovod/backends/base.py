"""The data-plane interface every backend implements.

All methods work on flat, contiguous numpy arrays of one dtype and are called by the engine thread only, in the
same order on every rank of the group. Counts are in elements. Allreduce takes lists of arrays so that a
backend can move a fused batch without first copying it into a separate fusion buffer; the default
implementation here does use a reusable fusion buffer and calls :meth:`Backend.allreduce_buffer`.

Adasum is not part of the interface: :func:`horovod.backends.adasum.plane_adasum` runs it on any plane through
the primitives here, or through the plane's own ``adasum`` method where it has one (one rank, hierarchical).
"""
from __future__ import annotations

import abc
from typing import Dict, List, Sequence

import numpy as np

from horovod.backends.reduce import scale_inplace, scaled_copy
from horovod.common.timeline import activity
from horovod.common.types import ReduceOp


class Backend(abc.ABC):
    """A data plane over one group of ranks."""

    name = "base"
    # Bytes of the running collective this rank is through (best effort: the planes with a chunked pipeline set
    # it at each chunk; the engine zeroes it per batch). The data-plane watchdog reports it when a peer stalls.
    progress = 0

    def __init__(self, rank: int, size: int) -> None:
        self.rank = rank
        self.size = size
        self._scratch_buffers: Dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------ allreduce
    def allreduce(self, inputs: List[np.ndarray], outputs: List[np.ndarray], op: ReduceOp,
                  prescale: float = 1.0, postscale: float = 1.0) -> None:
        """Reduce each ``inputs[i]`` across ranks into ``outputs[i]`` (which may alias it), scaled as asked."""
        if len(inputs) == 1:
            buf = outputs[0]
            with activity(self.op_label("ALLREDUCE", buf.nbytes)):
                scaled_copy(buf, inputs[0], prescale)
                self.allreduce_buffer(buf, op)
                scale_inplace(buf, postscale)
            return
        buf = self.fusion_buffer(sum(a.size for a in inputs), inputs[0].dtype)
        offset = 0
        with activity("MEMCPY_IN_FUSION_BUFFER"):
            for a in inputs:
                scaled_copy(buf[offset:offset + a.size], a, prescale)
                offset += a.size
        with activity(self.op_label("ALLREDUCE", buf.nbytes)):
            self.allreduce_buffer(buf, op)
        offset = 0
        with activity("MEMCPY_OUT_FUSION_BUFFER"):
            for out in outputs:
                scaled_copy(out, buf[offset:offset + out.size], postscale)
                offset += out.size

    def op_label(self, op: str, nbytes: int) -> str:
        """The timeline's name for this data plane's ``op`` (e.g. ``SHM_ALLREDUCE``, ``MPI_BCAST``)."""
        return f"{self.name.upper()}_{op}"

    def fusion_buffer(self, count: int, dtype: np.dtype) -> np.ndarray:
        """A reusable scratch buffer of ``count`` elements (grown on demand, never shrunk)."""
        return self.scratch("fusion", count, dtype)

    def scratch(self, key: str, count: int, dtype: np.dtype) -> np.ndarray:
        """A reusable buffer of ``count`` elements named ``key`` (grown on demand, never shrunk)."""
        nbytes = count * np.dtype(dtype).itemsize
        buf = self._scratch_buffers.get(key)
        if buf is None or buf.nbytes < nbytes:
            grown = max(nbytes, 2 * buf.nbytes) if buf is not None else nbytes
            buf = self._scratch_buffers[key] = np.empty(grown, np.uint8)
        return buf[:nbytes].view(dtype)

    @abc.abstractmethod
    def allreduce_buffer(self, buf: np.ndarray, op: ReduceOp) -> None:
        """Reduce ``buf`` across ranks in place; every rank ends with bitwise-identical results."""

    # ------------------------------------------------------------- other collectives
    @abc.abstractmethod
    def allgatherv(self, inp: np.ndarray, out: np.ndarray, counts: Sequence[int]) -> None:
        """Concatenate every rank's ``inp`` (``counts[r]`` elements from rank r) into ``out``, in rank order."""

    @abc.abstractmethod
    def broadcast(self, buf: np.ndarray, root: int) -> None:
        """Copy ``root``'s ``buf`` into every rank's ``buf``."""

    @abc.abstractmethod
    def alltoallv(self, inp: np.ndarray, send_counts: Sequence[int], out: np.ndarray,
                  recv_counts: Sequence[int], max_count: int = 0) -> None:
        """Send ``send_counts[j]`` consecutive elements to rank j; receive ``recv_counts[i]`` from rank i.

        ``max_count`` is the largest count any pair of ranks exchanges (the same on every rank), for backends
        that move data in rounds.
        """

    @abc.abstractmethod
    def reducescatter(self, inp: np.ndarray, out: np.ndarray, counts: Sequence[int], op: ReduceOp) -> None:
        """Reduce ``inp`` across ranks and keep this rank's block (``counts[rank]`` elements) in ``out``."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Return once every rank of the group has called it."""

    def close(self) -> None:
        """Release sockets and shared memory."""
        return None
