"""One executor per collective: what a rank does with a response the coordinator emitted.

Each executor takes the engine's view (``rank``, ``size``, ``backend``), the batch of responses (several only for
fused allreduces and barriers) and this rank's entries for them (None where this rank joined instead of
submitting), runs the data plane, and completes the entries' handles.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Protocol

import numpy as np

from horovod.backends.adasum import plane_adasum
from horovod.backends.base import Backend
from horovod.backends.reduce import scale_inplace, scaled_copy
from horovod.common.exceptions import HorovodInternalError
from horovod.common.timeline import activity
from horovod.common.types import ReduceOp, RequestType, numpy_dtype
from horovod.core.controller.messages import TensorResponse
from horovod.core.engine import device_executors, output_pool
from horovod.core.engine.device_planes import DevicePlanes
from horovod.core.engine.layouts import row as _row
from horovod.core.engine.layouts import split_rows as _split_rows
from horovod.core.engine.layouts import summed


class Executing(Protocol):
    """What an executor needs of the engine."""

    rank: int               # this rank's position in the process set
    size: int
    ranks: List[int]        # the set's global ranks, by position
    backend: Backend
    devices: DevicePlanes   # the planes of device buffers (device_planes.py)


_default_allocate = output_pool.empty     # (shape, dtype) -> a new array from the op layer's pool


def allocate_output(entry, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """An output for ``entry``: from its allocator (a framework's tensor) or the op layer's pool."""
    return (entry.allocate or _default_allocate)(shape, dtype)


def allreduce(ctx: Executing, batch: List[TensorResponse], entries: List[Optional[object]]) -> None:
    first = batch[0]
    dtype = numpy_dtype(first.dtype)
    inputs, outputs = [], []
    for response, entry in zip(batch, entries):
        if entry is None:           # this rank joined: contribute zeros
            zeros = np.zeros(response.numel(), dtype)
            inputs.append(zeros)
            outputs.append(zeros)
        else:
            inputs.append(entry.tensor.reshape(-1))
            outputs.append(entry.output.reshape(-1))
    if first.reduce_op == ReduceOp.ADASUM:         # scale-invariant: no Average rewrite (docs/adasum.md)
        with activity(ctx.backend.op_label("ADASUM", sum(a.nbytes for a in inputs))):
            plane_adasum(ctx.backend, inputs, outputs, first.prescale, first.postscale)
    else:
        op, postscale = summed(first.reduce_op, first.postscale, ctx.size)
        ctx.backend.allreduce(inputs, outputs, op, first.prescale, postscale)
    for entry in entries:
        if entry is not None:
            entry.handle.set_result(entry.index, entry.output)


def allgather(ctx: Executing, batch: List[TensorResponse], entries: List[Optional[object]]) -> None:
    if len(batch) > 1:
        _fused_allgather(ctx, batch, entries)
        return
    first, entry = batch[0], entries[0]
    row = _row(first.shape)
    counts = [d * row for d in first.extra]
    out = allocate_output(entry, (sum(first.extra), *first.shape), numpy_dtype(first.dtype))
    with activity(ctx.backend.op_label("ALLGATHER", out.nbytes)):
        ctx.backend.allgatherv(entry.tensor.reshape(-1), out.reshape(-1), counts)
    entry.handle.set_result(entry.index, out)


def _fused_allgather(ctx: Executing, batch: List[TensorResponse], entries: List[Optional[object]]) -> None:
    """Several allgathers as one: each rank sends its inputs back to back, and every output is cut out of the
    gathered buffer, rank by rank (upstream's layout: rank r's block holds its rows of every tensor, in order)."""
    dtype = numpy_dtype(batch[0].dtype)
    rows = [_row(response.shape) for response in batch]
    # elements[t][r]: what rank r contributes to tensor t
    elements = [[d * row for d in response.extra] for response, row in zip(batch, rows)]
    counts = [sum(per_rank[r] for per_rank in elements) for r in range(ctx.size)]
    send = output_pool.empty((counts[ctx.rank],), dtype)
    with activity("MEMCPY_IN_FUSION_BUFFER"):
        start = 0
        for entry, per_rank in zip(entries, elements):
            send[start:start + per_rank[ctx.rank]] = entry.tensor.reshape(-1)
            start += per_rank[ctx.rank]
    gathered = output_pool.empty((sum(counts),), dtype)
    with activity(ctx.backend.op_label("ALLGATHER", gathered.nbytes)):
        ctx.backend.allgatherv(send, gathered, counts)
    outputs = [allocate_output(entry, (sum(response.extra), *response.shape), dtype)
               for response, entry in zip(batch, entries)]
    with activity("MEMCPY_OUT_FUSION_BUFFER"):
        block = 0                                   # where rank r's block starts in the gathered buffer
        written = [0] * len(batch)                  # how much of each output is filled
        for r in range(ctx.size):
            offset = block
            for t, out in enumerate(outputs):
                n = elements[t][r]
                out.reshape(-1)[written[t]:written[t] + n] = gathered[offset:offset + n]
                written[t] += n
                offset += n
            block += counts[r]
    for entry, out in zip(entries, outputs):
        entry.handle.set_result(entry.index, out)


def broadcast(ctx: Executing, batch: List[TensorResponse], entries: List[Optional[object]]) -> None:
    first, entry = batch[0], entries[0]
    out = entry.output
    root = ctx.ranks.index(first.root)          # the root is a global rank; the data plane counts in the set
    if out is not entry.tensor and ctx.rank == root:
        np.copyto(out, entry.tensor)
    with activity(ctx.backend.op_label("BCAST", out.nbytes)):
        ctx.backend.broadcast(out.reshape(-1), root)
    entry.handle.set_result(entry.index, out)


def alltoall(ctx: Executing, batch: List[TensorResponse], entries: List[Optional[object]]) -> None:
    first, entry = batch[0], entries[0]
    dtype = numpy_dtype(first.dtype)
    matrix = first.extra
    row = _row(first.shape)
    received = [matrix[src][ctx.rank] for src in range(ctx.size)]
    out = allocate_output(entry, (sum(received), *first.shape), dtype)
    max_count = max(max(r) for r in matrix) * row
    with activity(ctx.backend.op_label("ALLTOALL", max_count * ctx.size * dtype.itemsize)):
        ctx.backend.alltoallv(entry.tensor.reshape(-1), [s * row for s in matrix[ctx.rank]], out.reshape(-1),
                              [r * row for r in received], max_count=max_count)
    entry.handle.set_result(entry.index, (out, np.asarray(received, np.int32)))


def reducescatter(ctx: Executing, batch: List[TensorResponse], entries: List[Optional[object]]) -> None:
    if len(batch) > 1:
        _fused_reducescatter(ctx, batch, entries)
        return
    first, entry = batch[0], entries[0]
    shape, size = first.shape, ctx.size
    rows = _split_rows(shape, size)
    row = _row(shape[1:])
    out = allocate_output(entry, (rows[ctx.rank], *shape[1:]), numpy_dtype(first.dtype))
    inp = entry.tensor.reshape(-1)
    if first.prescale != 1.0:
        scaled = np.empty_like(inp)
        scaled_copy(scaled, inp, first.prescale)
        inp = scaled
    op, postscale = summed(first.reduce_op, first.postscale, size)
    with activity(ctx.backend.op_label("REDUCESCATTER", inp.nbytes)):
        ctx.backend.reducescatter(inp, out.reshape(-1), [r * row for r in rows], op)
    scale_inplace(out, postscale)
    entry.handle.set_result(entry.index, out)


def _fused_reducescatter(ctx: Executing, batch: List[TensorResponse], entries: List[Optional[object]]) -> None:
    """Several reducescatters (same dtype, op and scales) as one: the fused buffer holds, for each rank in turn,
    that rank's rows of every tensor, so one reducescatter leaves each rank its rows of all of them."""
    first, size = batch[0], ctx.size
    dtype = numpy_dtype(first.dtype)
    layouts = [(_split_rows(response.shape, size), _row(response.shape[1:])) for response in batch]
    counts = [sum(rows[r] * row for rows, row in layouts) for r in range(size)]
    send = output_pool.empty((sum(counts),), dtype)
    with activity("MEMCPY_IN_FUSION_BUFFER"):
        position, taken = 0, [0] * len(batch)
        for r in range(size):
            for t, (entry, (rows, row)) in enumerate(zip(entries, layouts)):
                n = rows[r] * row
                scaled_copy(send[position:position + n], entry.tensor.reshape(-1)[taken[t]:taken[t] + n],
                            first.prescale)
                taken[t] += n
                position += n
    received = output_pool.empty((counts[ctx.rank],), dtype)
    op, postscale = summed(first.reduce_op, first.postscale, size)
    with activity(ctx.backend.op_label("REDUCESCATTER", send.nbytes)):
        ctx.backend.reducescatter(send, received, counts, op)
    with activity("MEMCPY_OUT_FUSION_BUFFER"):
        position = 0
        for response, entry, (rows, row) in zip(batch, entries, layouts):
            out = allocate_output(entry, (rows[ctx.rank], *response.shape[1:]), dtype)
            n = rows[ctx.rank] * row
            out.reshape(-1)[:] = received[position:position + n]
            position += n
            scale_inplace(out, postscale)
            entry.handle.set_result(entry.index, out)


def barrier(ctx: Executing, batch: List[TensorResponse], entries: List[Optional[object]]) -> None:
    for entry in entries:
        if entry is not None:
            entry.handle.set_result(entry.index, None)


Executor = Callable[[Executing, List[TensorResponse], List[Optional[object]]], None]

EXECUTORS: Dict[int, Executor] = {
    RequestType.ALLREDUCE: allreduce,
    RequestType.ALLGATHER: allgather,
    RequestType.BROADCAST: broadcast,
    RequestType.ALLTOALL: alltoall,
    RequestType.REDUCESCATTER: reducescatter,
    RequestType.BARRIER: barrier,
}


def run_batch(ctx: Executing, batch: List[TensorResponse], entries: List[Optional[object]]) -> None:
    """Execute one response batch with the executor of its collective (on the device plane for device buffers)."""
    if batch[0].device:
        device_executors.run_batch(ctx, batch, entries)
        return
    rtype = batch[0].rtype
    executor = EXECUTORS.get(rtype)
    if executor is None:
        raise HorovodInternalError(f"unsupported response type {rtype}")
    executor(ctx, batch, entries)
