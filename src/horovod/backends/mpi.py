"""The MPI data plane: collectives on an mpi4py communicator (Open MPI, MPICH, Intel MPI...).

The engine thread calls this on a communicator that :mod:`horovod.common.mpi_context` duplicated for Horovod
alone, so the user's own mpi4py traffic (on COMM_WORLD or their communicators) can never match Horovod's. That
needs ``MPI_THREAD_MULTIPLE``; without it the MPI data plane is not chosen (see ``factory``).

Every call passes numpy buffers to MPI directly, with no staging copy: allreduce of a single tensor goes from
the input to the output buffer (or in place), and fused batches use the base class's reusable fusion buffer.
MPI has no reduction for float16 or bfloat16, so those are widened to float32 around the call. Bool tensors
reduce as unsigned bytes with MAX (logical or: Sum, Max) or MIN (logical and: Min, Product), which is what
numpy's kernels give the other data planes.
"""
from __future__ import annotations

import os
import socket
from typing import List, Sequence, Tuple

import ml_dtypes
import numpy as np

from horovod.backends import peer_waits
from horovod.backends.base import Backend
from horovod.backends.blocks import offsets
from horovod.backends.reduce import scale_inplace, scaled_copy
from horovod.common.timeline import activity
from horovod.common.types import ReduceOp

_WIDEN = {np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)}


class MPIBackend(Backend):
    """Collectives over one mpi4py intracommunicator."""

    name = "mpi"

    def __init__(self, comm) -> None:
        from mpi4py import MPI

        super().__init__(comm.Get_rank(), comm.Get_size())
        self.comm = _Watched(comm)
        self._MPI = MPI
        # Every rank's (host, pid): MPI does not say whom a stalled call waits for, so the watchdog looks at all.
        self.peers: List[Tuple[str, int]] = comm.allgather((socket.gethostname(), os.getpid()))
        self._ops = {ReduceOp.SUM: MPI.SUM, ReduceOp.MIN: MPI.MIN, ReduceOp.MAX: MPI.MAX,
                     ReduceOp.PRODUCT: MPI.PROD}
        self._bool_ops = {ReduceOp.SUM: MPI.MAX, ReduceOp.MAX: MPI.MAX, ReduceOp.MIN: MPI.MIN,
                          ReduceOp.PRODUCT: MPI.MIN}
        self._types = {np.dtype(t): m for t, m in (
            (np.int8, MPI.INT8_T), (np.uint8, MPI.UINT8_T), (np.int16, MPI.INT16_T), (np.uint16, MPI.UINT16_T),
            (np.int32, MPI.INT32_T), (np.int64, MPI.INT64_T), (np.float32, MPI.FLOAT),
            (np.float64, MPI.DOUBLE), (np.bool_, MPI.UINT8_T))}

    def _op(self, dtype: np.dtype, op: ReduceOp):
        table = self._bool_ops if dtype == np.bool_ else self._ops
        try:
            return table[ReduceOp(op)]
        except KeyError:
            raise ValueError(f"reduce op {ReduceOp(op).name} is not supported by the MPI data plane") from None

    def _spec(self, arr: np.ndarray):
        """``[buffer, count, MPI datatype]`` for a flat array (bool travels as uint8)."""
        buf = arr.view(np.uint8) if arr.dtype == np.bool_ else arr
        return [buf, arr.size, self._types[arr.dtype]]

    # ------------------------------------------------------------------ allreduce
    def allreduce(self, inputs: List[np.ndarray], outputs: List[np.ndarray], op: ReduceOp,
                  prescale: float = 1.0, postscale: float = 1.0) -> None:
        if len(inputs) == 1 and prescale == 1.0 and inputs[0].dtype not in _WIDEN:
            inp, out = inputs[0], outputs[0]
            mpi_op = self._op(inp.dtype, op)
            with activity("MPI_ALLREDUCE"):
                if inp is out or np.shares_memory(inp, out):
                    self.comm.Allreduce(self._MPI.IN_PLACE, self._spec(out), mpi_op)
                else:
                    self.comm.Allreduce(self._spec(inp), self._spec(out), mpi_op)
                scale_inplace(out, postscale)
            return
        super().allreduce(inputs, outputs, op, prescale, postscale)

    def allreduce_buffer(self, buf: np.ndarray, op: ReduceOp) -> None:
        if buf.dtype in _WIDEN:
            wide = buf.astype(np.float32)
            self.comm.Allreduce(self._MPI.IN_PLACE, self._spec(wide), self._op(wide.dtype, op))
            scaled_copy(buf, wide, 1.0)
            return
        self.comm.Allreduce(self._MPI.IN_PLACE, self._spec(buf), self._op(buf.dtype, op))

    # ------------------------------------------------------------- other collectives
    # Data that is only moved (not reduced) travels as bytes, which every dtype (bfloat16 included) supports.
    def allgatherv(self, inp: np.ndarray, out: np.ndarray, counts: Sequence[int]) -> None:
        item = out.dtype.itemsize
        byte_counts = [c * item for c in counts]
        self.comm.Allgatherv([_bytes(inp), len(inp) * item, self._MPI.BYTE],
                             [_bytes(out), byte_counts, offsets(byte_counts), self._MPI.BYTE])

    def broadcast(self, buf: np.ndarray, root: int) -> None:
        self.comm.Bcast([_bytes(buf), buf.nbytes, self._MPI.BYTE], root=root)

    def alltoallv(self, inp: np.ndarray, send_counts: Sequence[int], out: np.ndarray,
                  recv_counts: Sequence[int], max_count: int = 0) -> None:
        item = inp.dtype.itemsize
        send = [c * item for c in send_counts]
        recv = [c * item for c in recv_counts]
        self.comm.Alltoallv([_bytes(inp), send, offsets(send), self._MPI.BYTE],
                            [_bytes(out), recv, offsets(recv), self._MPI.BYTE])

    def reducescatter(self, inp: np.ndarray, out: np.ndarray, counts: Sequence[int], op: ReduceOp) -> None:
        if inp.dtype in _WIDEN:
            wide_out = np.empty(out.size, np.float32)
            self.comm.Reduce_scatter(self._spec(inp.astype(np.float32)), self._spec(wide_out), list(counts),
                                     self._op(np.dtype(np.float32), op))
            scaled_copy(out, wide_out, 1.0)
            return
        self.comm.Reduce_scatter(self._spec(inp), self._spec(out), list(counts), self._op(inp.dtype, op))

    def barrier(self) -> None:
        self.comm.Barrier()

    def close(self) -> None:
        """The communicator belongs to the MPI context, which frees it."""
        return None


class _Watched:
    """The communicator, with each blocking collective recorded on the data-plane watchdog's board while it runs
    (``horovod.backends.peer_waits``). The watchdog cannot cut an MPI call as it cuts a socket: to end a stall it
    aborts the job (``MPI_Abort``), which ``mpirun`` turns into the end of every rank."""

    _CALLS = ("Allreduce", "Allgatherv", "Bcast", "Alltoallv", "Reduce_scatter", "Barrier")

    def __init__(self, comm) -> None:
        self._comm = comm
        for name in self._CALLS:
            setattr(self, name, self._watched(name, getattr(comm, name)))

    def _watched(self, name: str, call):
        comm, label = self._comm, f"MPI_{name}"

        def abort() -> None:
            comm.Abort(1)

        def watched(*args, **kwargs):
            wait = peer_waits.begin(peer_waits.ANY_PEER, "", None, 0, label, abort)
            try:
                return call(*args, **kwargs)
            finally:
                peer_waits.end(wait)

        return watched

    def __getattr__(self, name: str):
        return getattr(self._comm, name)


def _bytes(arr: np.ndarray) -> np.ndarray:
    return arr.reshape(-1).view(np.uint8)
