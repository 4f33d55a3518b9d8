"""The executors of device collectives: what a rank does with a response whose buffers live on a device (CUDA).

They mirror the host executors (executors.py) on the process set's :class:`~horovod.backends.device_ipc.DevicePlane`:
a fused allreduce batch moves as one sequence; allgathers and reducescatters of a batch run one after the other
(device copies are cheap next to the barriers they would save). Outputs that negotiation sizes are made by the
entry's allocator (the binding's, on the input's device) or by the plane's ops.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np

from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import DataType, ReduceOp, RequestType
from horovod.core.controller.messages import TensorResponse
from horovod.core.engine.layouts import row, split_rows, summed


def _allocate(plane, entry, shape: tuple, dtype: DataType):
    if entry.allocate is not None:
        return entry.allocate(shape, None)
    return plane.ops.empty(shape, dtype)


def allreduce(ctx, plane, batch: List[TensorResponse], entries: List[Optional[object]]) -> None:
    first, ops = batch[0], plane.ops
    dtype = DataType(first.dtype)
    if first.reduce_op == ReduceOp.ADASUM:
        raise HorovodInternalError(f"Adasum of device tensors is not supported (tensor '{first.name}'); the "
                                   "bindings stage such tensors through host memory.")
    inputs, outputs = [], []
    for response, entry in zip(batch, entries):
        if entry is None:           # this rank joined: contribute zeros
            zeros = ops.zeros(response.numel(), dtype)
            inputs.append(zeros)
            outputs.append(zeros)
        else:
            inputs.append(ops.flat(entry.tensor))
            outputs.append(ops.flat(entry.output))
    op, postscale = summed(first.reduce_op, first.postscale, ctx.size)
    plane.allreduce(inputs, outputs, dtype, op, first.prescale, postscale)
    for entry in entries:
        if entry is not None:
            entry.handle.set_result(entry.index, entry.output)


def allgather(ctx, plane, batch: List[TensorResponse], entries: List[Optional[object]]) -> None:
    for response, entry in zip(batch, entries):
        dtype = DataType(response.dtype)
        per_row = row(response.shape)
        out = _allocate(plane, entry, (sum(response.extra), *response.shape), dtype)
        plane.allgatherv(plane.ops.flat(entry.tensor), plane.ops.flat(out), [d * per_row for d in response.extra],
                         dtype)
        entry.handle.set_result(entry.index, out)


def broadcast(ctx, plane, batch: List[TensorResponse], entries: List[Optional[object]]) -> None:
    first, entry = batch[0], entries[0]
    out, root = entry.output, ctx.ranks.index(first.root)
    if out is not entry.tensor and ctx.rank == root:
        plane.ops.scaled_copy(plane.ops.flat(out), plane.ops.flat(entry.tensor), 1.0)
    plane.broadcast(plane.ops.flat(out), root, DataType(first.dtype))
    entry.handle.set_result(entry.index, out)


def alltoall(ctx, plane, batch: List[TensorResponse], entries: List[Optional[object]]) -> None:
    first, entry = batch[0], entries[0]
    dtype, matrix, per_row = DataType(first.dtype), first.extra, row(first.shape)
    received = [matrix[src][ctx.rank] for src in range(ctx.size)]
    out = _allocate(plane, entry, (sum(received), *first.shape), dtype)
    plane.alltoallv(plane.ops.flat(entry.tensor), [s * per_row for s in matrix[ctx.rank]], plane.ops.flat(out),
                    [r * per_row for r in received], max(max(r) for r in matrix) * per_row, dtype)
    entry.handle.set_result(entry.index, (out, np.asarray(received, np.int32)))


def reducescatter(ctx, plane, batch: List[TensorResponse], entries: List[Optional[object]]) -> None:
    for response, entry in zip(batch, entries):
        dtype, shape = DataType(response.dtype), response.shape
        rows, per_row = split_rows(shape, ctx.size), row(shape[1:])
        out = _allocate(plane, entry, (rows[ctx.rank], *shape[1:]), dtype)
        op, postscale = summed(response.reduce_op, response.postscale, ctx.size)
        flat_out = plane.ops.flat(out)
        plane.reducescatter(plane.ops.flat(entry.tensor), flat_out, [r * per_row for r in rows], dtype, op,
                            response.prescale)
        if postscale != 1.0:
            plane.ops.scaled_copy(flat_out, flat_out, postscale)
        plane.ops.synchronize()
        entry.handle.set_result(entry.index, out)


EXECUTORS = {
    RequestType.ALLREDUCE: allreduce,
    RequestType.ALLGATHER: allgather,
    RequestType.BROADCAST: broadcast,
    RequestType.ALLTOALL: alltoall,
    RequestType.REDUCESCATTER: reducescatter,
}


def run_batch(ctx, batch: List[TensorResponse], entries: List[Optional[object]]) -> None:
    """Execute one device response batch on the process set's device plane (made here at its first use)."""
    executor = EXECUTORS.get(batch[0].rtype)
    if executor is None:
        raise HorovodInternalError(f"{RequestType(batch[0].rtype).name} has no device executor")
    executor(ctx, ctx.devices.get(batch[0].device), batch, entries)
