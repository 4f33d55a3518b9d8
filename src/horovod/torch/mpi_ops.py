"""``horovod.torch`` collectives on torch tensors, with upstream's names, signatures and autograd rules.

CPU tensors are exchanged zero-copy: the op layer works on ``tensor.numpy()`` views of the tensors' own memory
(bfloat16 through an int16 view, since numpy has no native bfloat16). CUDA tensors are staged through host
memory. Every collective is asynchronous underneath: ``*_async`` returns an integer handle for ``poll`` and
``synchronize``; the plain forms wait.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Sequence

import ml_dtypes
import numpy as np
import torch

from horovod.common import types as _types
from horovod.common.exceptions import HorovodInternalError  # noqa: F401
from horovod.common.process_sets import (  # noqa: F401  (upstream's mpi_ops exposes all four)
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from horovod.common.types import Adasum, Average, Max, Min, Product, ReduceOp, Sum  # noqa: F401
from horovod.common.util import get_average_backwards_compatibility_fun
from horovod.core import basics, ops
from horovod.core.basics import (  # noqa: F401  (re-exported)
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    size,
)
from horovod.core.engine.handles import Handle
from horovod.torch.compression import Compression

handle_average_backwards_compatibility = get_average_backwards_compatibility_fun(_types)

# Dtypes each collective accepts (upstream's lists, plus bfloat16 everywhere and bool for data movement).
_REDUCE_DTYPES = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                  torch.float32, torch.float64}
_MOVE_DTYPES = _REDUCE_DTYPES | {torch.bool}


def init(*args, **kwargs) -> None:
    """Start Horovod (see ``horovod.core.basics.init``); also resets this binding's handle map."""
    _handles.clear()
    basics.init(*args, **kwargs)


def shutdown(*args, **kwargs) -> None:
    """Stop Horovod; pending handles fail with the shutdown error."""
    _handles.clear()
    basics.shutdown()


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start recording a timeline to ``file_path`` (needs HOROVOD_TIMELINE, e.g. DYNAMIC, at start)."""
    basics.start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop recording the timeline."""
    basics.stop_timeline()


# ---------------------------------------------------------------------------------------------- plumbing
class _Pending:
    """An op-layer handle plus how to turn its numpy results back into torch tensors."""

    __slots__ = ("handle", "finish", "keep")

    def __init__(self, handle: Handle, finish: Callable[[Any], Any], keep: Any) -> None:
        self.handle = handle
        self.finish = finish
        self.keep = keep            # inputs and outputs stay alive until synchronize


class _HandleMap:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: Dict[int, _Pending] = {}
        self._next = 0

    def add(self, pending: _Pending) -> int:
        with self._lock:
            hid = self._next
            self._next += 1
            self._items[hid] = pending
        return hid

    def get(self, hid: int) -> Optional[_Pending]:
        with self._lock:
            return self._items.get(hid)

    def pop(self, hid: int) -> Optional[_Pending]:
        with self._lock:
            return self._items.pop(hid, None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


_handles = _HandleMap()


def _check(tensor: torch.Tensor, allowed: set, what: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{what} expects a torch.Tensor, got {type(tensor).__name__}.")
    if tensor.dtype not in allowed:
        names = ", ".join(sorted(str(d).replace("torch.", "") for d in allowed))
        raise ValueError(f"Tensor type {tensor.dtype} is not supported by {what}. Supported types: {names}. "
                         "Cast the tensor (for example tensor.float()) before the collective.")
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous. Call tensor.contiguous() before the collective.")
    if tensor.is_sparse:
        raise ValueError(f"{what} does not take sparse tensors; use sparse_allreduce_async or densify it.")


def _np(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous CPU tensor's memory (no copy)."""
    t = tensor.detach() if tensor.requires_grad else tensor      # detach() is costly; gradients never need it
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _host(tensor: torch.Tensor) -> torch.Tensor:
    """CPU tensors as they are; device tensors staged into host memory."""
    return tensor if tensor.device.type == "cpu" else tensor.detach().to("cpu").contiguous()


def _allocator(dtype: torch.dtype, made: List[Optional[torch.Tensor]], index: int = 0):
    """An op-layer allocator that creates the output as a torch tensor (kept in ``made[index]``)."""
    while len(made) <= index:
        made.append(None)

    def allocate(shape: tuple, _np_dtype) -> np.ndarray:
        out = torch.empty(tuple(shape), dtype=dtype)
        made[index] = out
        return _np(out)

    return allocate


def _to_device(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return result if like.device.type == "cpu" else result.to(like.device)


def poll(handle: int) -> bool:
    """True once the collective behind ``handle`` has finished."""
    pending = _handles.get(handle)
    if pending is None:
        raise ValueError(f"Handle {handle} was not created or has been cleared.")
    return pending.handle.poll()


def synchronize(handle: int):
    """Wait for ``handle`` and return its output (HorovodInternalError if the collective failed)."""
    pending = _handles.pop(handle)
    if pending is None:
        return None
    return pending.finish(pending.handle.wait())


def _name(op: str, name: Optional[str]) -> str:
    return ops.tensor_name(op, name)


# ---------------------------------------------------------------------------------------------- allreduce
def _allreduce_async(tensor: torch.Tensor, output: torch.Tensor, name: Optional[str], op: ReduceOp,
                     prescale_factor: float, postscale_factor: float, process_set: ProcessSet) -> int:
    _check(tensor, _REDUCE_DTYPES, "allreduce")
    if op == Adasum:
        raise NotImplementedError("The Adasum reduction is not available in this release yet; use op=Average or Sum.")
    host_in = _host(tensor)
    host_out = host_in if output is tensor else _host(output)
    array_in = _np(host_in)
    array_out = array_in if host_out is host_in else _np(host_out)
    handle = ops.allreduce_async(array_in, array_out, _name("allreduce", name), op, prescale_factor,
                                 postscale_factor, process_set)

    def finish(_):
        if output.device.type != "cpu":
            output.copy_(host_out)
        return output

    return _handles.add(_Pending(handle, finish, (tensor, output, host_in, host_out)))


def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                    op: Optional[ReduceOp] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start an allreduce of ``tensor`` into a new tensor; returns a handle."""
    op = handle_average_backwards_compatibility(op, average)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                     op: Optional[ReduceOp] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start an in-place allreduce of ``tensor``; returns a handle."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[ReduceOp] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Allreduce ``tensor`` in place (Average by default) and return it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


class HorovodAllreduce(torch.autograd.Function):
    """Differentiable allreduce: the gradient is the allreduce of the gradient with the same op and factors."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.average, ctx.op = average, op
        ctx.prescale_factor, ctx.postscale_factor, ctx.process_set = prescale_factor, postscale_factor, process_set
        return synchronize(allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor, process_set))

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
    summed = HorovodAllreduce.apply(compressed, average, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(summed, ctx)


def _grouped_allreduce_async(tensors: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], name, op,
                             prescale_factor, postscale_factor, process_set) -> int:
    tensors, outputs = list(tensors), list(outputs)
    for t in tensors:
        _check(t, _REDUCE_DTYPES, "grouped_allreduce")
    host_in = [_host(t) for t in tensors]
    host_out = [hi if o is t else _host(o) for t, o, hi in zip(tensors, outputs, host_in)]
    handle = ops.grouped_allreduce_async([_np(t) for t in host_in], [_np(o) for o in host_out],
                                         _name("grouped_allreduce", name), op, prescale_factor, postscale_factor,
                                         process_set)

    def finish(_):
        for out, ho in zip(outputs, host_out):
            if out.device.type != "cpu":
                out.copy_(ho)
        return outputs

    return _handles.add(_Pending(handle, finish, (tensors, outputs, host_in, host_out)))


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                            name: Optional[str] = None, op: Optional[ReduceOp] = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start an allreduce of a list of tensors, negotiated and fused as one unit."""
    op = handle_average_backwards_compatibility(op, average)
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    return _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[ReduceOp] = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> int:
    """Start an in-place grouped allreduce."""
    op = handle_average_backwards_compatibility(op, average)
    return _grouped_allreduce_async(tensors, tensors, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None, name: Optional[str] = None,
                       op: Optional[ReduceOp] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """Allreduce a list of tensors in place, as one unit."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))


class HorovodGroupedAllreduce(torch.autograd.Function):
    """Differentiable grouped allreduce."""

    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.args = (average, op, prescale_factor, postscale_factor, process_set)
        return tuple(synchronize(grouped_allreduce_async(list(tensors), average, name, op, prescale_factor,
                                                         postscale_factor, process_set)))

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
    outs = HorovodGroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor, process_set,
                                         *[c[0] for c in compressed])
    return [compression.decompress(o, c[1]) for o, c in zip(outs, compressed)]


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op: ReduceOp,
                           process_set: ProcessSet = global_process_set) -> Callable[[], torch.Tensor]:
    """Allreduce a sparse COO tensor as two allgathers (indices and values); returns a callable giving the result.

    The result holds every rank's entries (duplicate indices are summed when it is coalesced or used); Average
    divides the values by the number of ranks. Only Sum and Average are defined for this scheme.
    """
    op = ReduceOp(op)
    if op not in (Sum, Average):
        raise NotImplementedError(f"sparse_allreduce_async supports op=Average and op=Sum, not "
                                  f"op={op.name.capitalize()}; use sparse_as_dense=True for other reductions.")
    t = tensor.coalesce()
    h_idx = allgather_async(t.indices().t().contiguous(), name=f"{name}.indices", process_set=process_set)
    h_val = allgather_async(t.values().contiguous(), name=f"{name}.values", process_set=process_set)

    def result() -> torch.Tensor:
        values = synchronize(h_val)
        indices = synchronize(h_idx)
        if op == Average:
            values = values / process_set_size(process_set)
        return torch.sparse_coo_tensor(indices.t(), values, size=t.size(), check_invariants=False)

    return result


def process_set_size(process_set: ProcessSet) -> int:
    return size() if process_set is None or process_set.process_set_id in (0, None) else process_set.size()


# ---------------------------------------------------------------------------------------------- allgather
def allgather_async(tensor: torch.Tensor, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start an allgather along dim 0 (dim 0 may differ between ranks)."""
    _check(tensor, _MOVE_DTYPES, "allgather")
    host = _host(tensor)
    made: List[torch.Tensor] = []
    handle = ops.allgather_async(_np(host), _name("allgather", name), _allocator(tensor.dtype, made), process_set)
    return _handles.add(_Pending(handle, lambda _: _to_device(made[0], tensor), (tensor, host, made)))


class HorovodAllgather(torch.autograd.Function):
    """Differentiable allgather: the gradient is averaged across ranks, then this rank's rows are taken."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim = tensor.shape[0]
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        reduced = allreduce(grad_output.contiguous(), op=Average, process_set=ctx.process_set)
        dims = synchronize(allgather_async(torch.tensor([ctx.dim], dtype=torch.int64), process_set=ctx.process_set))
        offset = int(dims[: rank()].sum()) if rank() > 0 else 0
        return reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dim 0; differentiable."""
    return HorovodAllgather.apply(tensor, name, process_set)


def _grouped_allocating(tensors: Sequence[torch.Tensor], allowed: set, what: str,
                        start: Callable[[List[np.ndarray], List[Callable]], Handle]) -> int:
    """A grouped op whose outputs are sized by negotiation: one new torch output per tensor, in order."""
    tensors = list(tensors)
    for t in tensors:
        _check(t, allowed, what)
    hosts = [_host(t) for t in tensors]
    made: List[Optional[torch.Tensor]] = []
    allocators = [_allocator(t.dtype, made, i) for i, t in enumerate(tensors)]
    handle = start([_np(h) for h in hosts], allocators)
    return _handles.add(_Pending(handle, lambda _: [_to_device(m, t) for m, t in zip(made, tensors)],
                                 (tensors, hosts, made)))


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start an allgather of each tensor of a list, as one unit."""
    return _grouped_allocating(tensors, _MOVE_DTYPES, "grouped_allgather", lambda arrays, allocators:
                               ops.grouped_allgather_async(arrays, _name("grouped_allgather", name), allocators,
                                                           process_set))


class HorovodGroupedAllgather(torch.autograd.Function):
    """Differentiable grouped allgather: per tensor, allgather's rule (the gradient averaged, this rank's rows)."""

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dims = [t.shape[0] for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        reduced = grouped_allreduce([g.contiguous() for g in grads], op=Average, process_set=ctx.process_set)
        dims = synchronize(grouped_allgather_async([torch.tensor([d], dtype=torch.int64) for d in ctx.dims],
                                                   process_set=ctx.process_set))
        me = rank()
        offsets = [int(d[:me].sum()) for d in dims]
        return (None, None, *[r.narrow(0, offset, dim) for r, offset, dim in zip(reduced, offsets, ctx.dims)])


def grouped_allgather(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """Allgather each tensor of a list, as one unit; differentiable (each gradient as allgather's)."""
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


# ---------------------------------------------------------------------------------------------- broadcast
def _broadcast_async(tensor, output, root_rank, name, process_set) -> int:
    _check(tensor, _MOVE_DTYPES, "broadcast")
    host_in = _host(tensor)
    host_out = host_in if output is tensor else _host(output)
    handle = ops.broadcast_async(_np(host_in), root_rank, _np(host_out), _name("broadcast", name), process_set)

    def finish(_):
        if output.device.type != "cpu":
            output.copy_(host_out)
        return output

    return _handles.add(_Pending(handle, finish, (tensor, output, host_in, host_out)))


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start a broadcast of ``root_rank``'s tensor (a global rank) into a new tensor."""
    return _broadcast_async(tensor, torch.empty_like(tensor, memory_format=torch.contiguous_format), root_rank,
                            name, process_set)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start an in-place broadcast."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s values and return it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class HorovodBroadcast(torch.autograd.Function):
    """Differentiable broadcast: the gradient is averaged across ranks and kept only on the root."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        reduced = allreduce(grad_output.contiguous(), op=Average, process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Return ``root_rank``'s ``tensor`` on every rank; differentiable."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


# ---------------------------------------------------------------------------------------------- alltoall
def alltoall_async(tensor: torch.Tensor, splits=None, name: Optional[str] = None,
                   process_set: ProcessSet = global_process_set) -> int:
    """Start an alltoall; ``synchronize`` returns ``(output, received_splits)``, with splits or without (upstream)."""
    _check(tensor, _MOVE_DTYPES, "alltoall")
    host = _host(tensor)
    split_list = None
    if splits is not None:
        split_list = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    made: List[torch.Tensor] = []
    handle = ops.alltoall_async(_np(host), split_list, _name("alltoall", name), _allocator(tensor.dtype, made),
                                process_set)

    def finish(result):
        _, received = result
        return _to_device(made[0], tensor), torch.from_numpy(np.asarray(received, np.int32))

    return _handles.add(_Pending(handle, finish, (tensor, host, made)))


class HorovodAlltoall(torch.autograd.Function):
    """Differentiable alltoall: the gradient goes back with the received splits."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.process_set = process_set
        out, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad_output, _grad_received):
        grad, _ = synchronize(alltoall_async(grad_output.contiguous(), ctx.received, process_set=ctx.process_set))
        return grad, None, None, None


def alltoall(tensor: torch.Tensor, splits=None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set):
    """Scatter rows of ``tensor`` to every rank and gather theirs; differentiable.

    Returns the output when ``splits`` is None (dim 0 split equally), else ``(output, received_splits)``.
    """
    out, received = HorovodAlltoall.apply(tensor, splits, name, process_set)
    return out if splits is None else (out, received)


# ---------------------------------------------------------------------------------------------- reducescatter
def _check_reducescatter_op(op: ReduceOp) -> ReduceOp:
    """Sum or Average; anything else is upstream's RuntimeError ("Reducescatter currently only supports ...")."""
    op = ReduceOp(op)
    if op not in (Sum, Average):
        raise RuntimeError(f"reducescatter supports op=Sum and op=Average, not op={op.name.capitalize()}; "
                           "use an allreduce for other reductions.")
    return op


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


def reducescatter_async(tensor: torch.Tensor, name: Optional[str] = None, op: ReduceOp = Average,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Start a reducescatter (Sum or Average); ranks < n % size get one extra row."""
    _check(tensor, _REDUCE_DTYPES, "reducescatter")               # as upstream: the tensor first, then the op
    op = _check_reducescatter_op(op)
    host = _host(tensor)
    made: List[torch.Tensor] = []
    handle = ops.reducescatter_async(_np(host), _name("reducescatter", name), op, prescale_factor, postscale_factor,
                                     _allocator(tensor.dtype, made), process_set)
    return _handles.add(_Pending(handle, lambda _: _to_device(made[0], tensor), (tensor, host, made)))


class HorovodReducescatter(torch.autograd.Function):
    """Differentiable reducescatter with upstream's backward: the gradient scaled (see
    ``_reducescatter_grad_scale``), then allgathered."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor))

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
    out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None, op: ReduceOp = Average,
                                process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    """Start a reducescatter of each tensor of a list, as one unit."""
    def start(arrays, allocators):            # runs after the tensors are checked (upstream's order of errors)
        checked = _check_reducescatter_op(op)
        return ops.grouped_reducescatter_async(arrays, _name("grouped_reducescatter", name), checked,
                                               prescale_factor, postscale_factor, allocators, process_set)

    return _grouped_allocating(tensors, _REDUCE_DTYPES, "grouped_reducescatter", start)


class HorovodGroupedReducescatter(torch.autograd.Function):
    """Differentiable grouped reducescatter: per tensor, reducescatter's backward, as one grouped allgather."""

    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return tuple(synchronize(grouped_reducescatter_async(list(tensors), name, op, process_set, prescale_factor,
                                                             postscale_factor)))

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
    outs = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor,
                                             *[c[0] for c in compressed])
    return [compression.decompress(o, c[1]) for o, c in zip(outs, compressed)]


# ---------------------------------------------------------------------------------------------- control
def join(device: int = -1) -> int:
    """Wait until every rank has joined; returns the last rank to join (the same on every rank).

    While joined, this rank contributes zeros to the other ranks' allreduces.
    """
    return ops.join_async().wait()


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank has reached the barrier."""
    ops.barrier_async(process_set).wait()
