"""``horovod.torch``'s blocking collectives: the in-place forms (``allreduce_``, ``broadcast_`` ...) and the
differentiable ones, autograd Functions with upstream's gradient rules (allreduce -> allreduce of the gradient;
allgather -> the gradient averaged, this rank's rows; broadcast -> averaged, zero off the root; alltoall -> back
with the received splits; reducescatter -> scaled, then allgathered).

A blocking call waits for its collective at once, so it takes the result straight from the submission
(``Pending.result``) instead of registering an integer handle; a differentiable call whose inputs autograd does
not record (grad mode off, or no input that requires grad) skips ``Function.apply``, which would return the same
tensors with no graph: on a 4 KB tensor those two were 20 of a call's 60 us (docs/benchmarks.md).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from horovod.common.types import Average, ReduceOp, Sum
from horovod.core import ops
from horovod.core.basics import rank
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.torch.async_ops import (
    grouped_allgather_async,
    handle_average_backwards_compatibility,
    process_set_rank,
    process_set_size,
    start_allgather,
    start_allreduce,
    start_alltoall,
    start_broadcast,
    start_grouped_allgather,
    start_grouped_allreduce,
    start_grouped_reducescatter,
    start_reducescatter,
)
from horovod.torch.compression import Compression
from horovod.torch.handles import synchronize

__all__ = ["allreduce", "allreduce_", "grouped_allreduce", "grouped_allreduce_", "allgather", "grouped_allgather",
           "broadcast", "broadcast_", "alltoall", "reducescatter", "grouped_reducescatter"]


def _graphed(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether autograd records a call on ``tensors``: grad mode is on and one of them requires grad (what is not
    a tensor goes on to the call's own check, which names it)."""
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors)


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[ReduceOp] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Allreduce ``tensor`` in place (Average by default) and return it."""
    op = handle_average_backwards_compatibility(op, average)
    with ops.blocking():
        return start_allreduce(tensor, tensor, name, op, prescale_factor, postscale_factor, process_set).result()


def _allreduce_now(tensor, average, name, op, prescale_factor, postscale_factor, process_set) -> torch.Tensor:
    """A blocking allreduce of ``tensor`` into a new tensor (``hvd.allreduce``'s forward)."""
    op = handle_average_backwards_compatibility(op, average)
    with ops.blocking():
        return start_allreduce(tensor, None, name, op, prescale_factor, postscale_factor, process_set).result()


class HorovodAllreduce(torch.autograd.Function):
    """Differentiable allreduce: the gradient is the allreduce of the gradient with the same op and factors."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.average, ctx.op = average, op
        ctx.prescale_factor, ctx.postscale_factor, ctx.process_set = prescale_factor, postscale_factor, process_set
        return _allreduce_now(tensor, average, name, op, prescale_factor, postscale_factor, process_set)

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output.contiguous(), average=ctx.average, op=ctx.op,
                         prescale_factor=ctx.prescale_factor, postscale_factor=ctx.postscale_factor,
                         process_set=ctx.process_set)
        return grad, None, None, None, None, None, None


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              compression=Compression.none, op: Optional[ReduceOp] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` across ranks (Average by default) into a new tensor; differentiable.

    ``compression`` (e.g. ``Compression.fp16``) shrinks what goes on the wire; the result has the input dtype.
    """
    compressed, ctx = compression.compress(tensor)
    args = (compressed, average, name, op, prescale_factor, postscale_factor, process_set)
    summed = HorovodAllreduce.apply(*args) if _graphed((compressed,)) else _allreduce_now(*args)
    return compression.decompress(summed, ctx)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None, name: Optional[str] = None,
                       op: Optional[ReduceOp] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """Allreduce a list of tensors in place, as one unit."""
    op = handle_average_backwards_compatibility(op, average)
    with ops.blocking():
        return start_grouped_allreduce(tensors, tensors, name, op, prescale_factor, postscale_factor,
                                       process_set).result()


def _grouped_allreduce_now(average, name, op, prescale_factor, postscale_factor, process_set,
                           *tensors) -> List[torch.Tensor]:
    """A grouped allreduce of ``tensors`` into new tensors (``hvd.grouped_allreduce``'s forward)."""
    op = handle_average_backwards_compatibility(op, average)
    with ops.blocking():
        return start_grouped_allreduce(tensors, None, name, op, prescale_factor, postscale_factor,
                                       process_set).result()


class HorovodGroupedAllreduce(torch.autograd.Function):
    """Differentiable grouped allreduce."""

    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.args = (average, op, prescale_factor, postscale_factor, process_set)
        return tuple(_grouped_allreduce_now(average, name, op, prescale_factor, postscale_factor, process_set,
                                            *tensors))

    @staticmethod
    def backward(ctx, *grads):
        average, op, pre, post, process_set = ctx.args
        reduced = grouped_allreduce([g.contiguous() for g in grads], average=average, op=op, prescale_factor=pre,
                                    postscale_factor=post, process_set=process_set)
        return (None, None, None, None, None, None, *reduced)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: Optional[bool] = None, name: Optional[str] = None,
                      compression=Compression.none, op: Optional[ReduceOp] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """Allreduce a list of tensors as one unit into new tensors; differentiable."""
    compressed = [compression.compress(t) for t in tensors]
    inputs = [c[0] for c in compressed]
    args = (average, name, op, prescale_factor, postscale_factor, process_set, *inputs)
    outs = HorovodGroupedAllreduce.apply(*args) if _graphed(inputs) else _grouped_allreduce_now(*args)
    return [compression.decompress(o, c[1]) for o, c in zip(outs, compressed)]


def _allgather_now(tensor, name, process_set) -> torch.Tensor:
    """A blocking allgather of ``tensor`` (``hvd.allgather``'s forward)."""
    with ops.blocking():
        return start_allgather(tensor, name, process_set).result()


class HorovodAllgather(torch.autograd.Function):
    """Differentiable allgather: the gradient is averaged across ranks, then this rank's rows are taken."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim = tensor.shape[0]
        ctx.process_set = process_set
        return _allgather_now(tensor, name, process_set)

    @staticmethod
    def backward(ctx, grad_output):
        reduced = allreduce(grad_output.contiguous(), op=Average, process_set=ctx.process_set)
        dims = _allgather_now(torch.tensor([ctx.dim], dtype=torch.int64), None, ctx.process_set)
        offset = int(dims[: process_set_rank(ctx.process_set)].sum())
        return reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dim 0; differentiable."""
    if _graphed((tensor,)):
        return HorovodAllgather.apply(tensor, name, process_set)
    return _allgather_now(tensor, name, process_set)


class HorovodGroupedAllgather(torch.autograd.Function):
    """Differentiable grouped allgather: per tensor, allgather's rule (the gradient averaged, this rank's rows)."""

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dims = [t.shape[0] for t in tensors]
        ctx.process_set = process_set
        return tuple(start_grouped_allgather(list(tensors), name, process_set).result())

    @staticmethod
    def backward(ctx, *grads):
        reduced = grouped_allreduce([g.contiguous() for g in grads], op=Average, process_set=ctx.process_set)
        dims = synchronize(grouped_allgather_async([torch.tensor([d], dtype=torch.int64) for d in ctx.dims],
                                                   process_set=ctx.process_set))
        me = process_set_rank(ctx.process_set)
        offsets = [int(d[:me].sum()) for d in dims]
        return (None, None, *[r.narrow(0, offset, dim) for r, offset, dim in zip(reduced, offsets, ctx.dims)])


def grouped_allgather(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """Allgather each tensor of a list, as one unit; differentiable (each gradient as allgather's)."""
    if _graphed(tensors):
        return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))
    return start_grouped_allgather(list(tensors), name, process_set).result()


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s values and return it."""
    with ops.blocking():
        return start_broadcast(tensor, tensor, root_rank, name, process_set).result()


def _broadcast_now(tensor, root_rank, name, process_set) -> torch.Tensor:
    """A blocking broadcast of ``root_rank``'s ``tensor`` into a new tensor (``hvd.broadcast``'s forward)."""
    with ops.blocking():
        return start_broadcast(tensor, None, root_rank, name, process_set).result()


class HorovodBroadcast(torch.autograd.Function):
    """Differentiable broadcast: the gradient is averaged across ranks and kept only on the root."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _broadcast_now(tensor, root_rank, name, process_set)

    @staticmethod
    def backward(ctx, grad_output):
        reduced = allreduce(grad_output.contiguous(), op=Average, process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Return ``root_rank``'s ``tensor`` on every rank; differentiable."""
    if _graphed((tensor,)):
        return HorovodBroadcast.apply(tensor, root_rank, name, process_set)
    return _broadcast_now(tensor, root_rank, name, process_set)


class HorovodAlltoall(torch.autograd.Function):
    """Differentiable alltoall: the gradient goes back with the received splits."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.process_set = process_set
        out, received = start_alltoall(tensor, splits, name, process_set).result()
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad_output, _grad_received):
        grad, _ = start_alltoall(grad_output.contiguous(), ctx.received, None, ctx.process_set).result()
        return grad, None, None, None


def alltoall(tensor: torch.Tensor, splits=None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set):
    """Scatter rows of ``tensor`` to every rank and gather theirs; differentiable.

    Returns the output when ``splits`` is None (dim 0 split equally), else ``(output, received_splits)``.
    """
    if _graphed((tensor,)):
        out, received = HorovodAlltoall.apply(tensor, splits, name, process_set)
    else:
        out, received = start_alltoall(tensor, splits, name, process_set).result()
    return out if splits is None else (out, received)


def _reducescatter_grad_scale(op: ReduceOp, process_set: ProcessSet, prescale_factor: float,
                              postscale_factor: float, grad: torch.Tensor) -> torch.Tensor:
    """Upstream's scaling of a reducescatter's incoming gradient before it is allgathered.

    Sum multiplies by the process set's size, then both ops by the prescale and the postscale factor (in this
    order, as upstream does), which makes the result ``size`` times the gradient of the summed per-rank losses.
    """
    if op == Sum:
        grad = grad * process_set_size(process_set)
    if prescale_factor != 1.0:
        grad = grad * prescale_factor
    if postscale_factor != 1.0:
        grad = grad * postscale_factor
    return grad


def _reducescatter_now(tensor, name, op, process_set, prescale_factor, postscale_factor) -> torch.Tensor:
    """A blocking reducescatter of ``tensor`` (``hvd.reducescatter``'s forward)."""
    with ops.blocking():
        return start_reducescatter(tensor, name, op, process_set, prescale_factor, postscale_factor).result()


class HorovodReducescatter(torch.autograd.Function):
    """Differentiable reducescatter with upstream's backward: the gradient scaled (see
    ``_reducescatter_grad_scale``), then allgathered."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return _reducescatter_now(tensor, name, op, process_set, prescale_factor, postscale_factor)

    @staticmethod
    def backward(ctx, grad_output):
        grad = _reducescatter_grad_scale(ctx.op, ctx.process_set, ctx.prescale_factor, ctx.postscale_factor,
                                         grad_output.contiguous())
        return allgather(grad, process_set=ctx.process_set), None, None, None, None, None


def reducescatter(tensor: torch.Tensor, name: Optional[str] = None, compression=Compression.none,
                  op: ReduceOp = Average, process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce across ranks and return this rank's block of dim 0; differentiable."""
    compressed, ctx = compression.compress(tensor)
    args = (compressed, name, op, process_set, prescale_factor, postscale_factor)
    out = HorovodReducescatter.apply(*args) if _graphed((compressed,)) else _reducescatter_now(*args)
    return compression.decompress(out, ctx)


class HorovodGroupedReducescatter(torch.autograd.Function):
    """Differentiable grouped reducescatter: per tensor, reducescatter's backward, as one grouped allgather."""

    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return tuple(start_grouped_reducescatter(list(tensors), name, op, process_set, prescale_factor,
                                                 postscale_factor).result())

    @staticmethod
    def backward(ctx, *grads):
        scaled = [_reducescatter_grad_scale(ctx.op, ctx.process_set, ctx.prescale_factor, ctx.postscale_factor,
                                            g.contiguous()) for g in grads]
        return (None, None, None, None, None, *grouped_allgather(scaled, process_set=ctx.process_set))


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                          compression=Compression.none, op: ReduceOp = Average,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[torch.Tensor]:
    """Reducescatter each tensor of a list, as one unit; differentiable."""
    compressed = [compression.compress(t) for t in tensors]
    inputs = [c[0] for c in compressed]
    if _graphed(inputs):
        outs = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor, *inputs)
    else:
        outs = start_grouped_reducescatter(inputs, name, op, process_set, prescale_factor, postscale_factor).result()
    return [compression.decompress(o, c[1]) for o, c in zip(outs, compressed)]
