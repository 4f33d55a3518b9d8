"""``horovod.torch``'s asynchronous collectives: each checks its tensors, hands numpy views of them (or of their
host copies) to the op layer and returns an integer handle; ``synchronize`` turns the result back into tensors.
The plain, differentiable forms are in ``horovod.torch.autograd_ops``."""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import numpy as np
import torch

from horovod.common import types as _types
from horovod.common.types import Average, ReduceOp, Sum
from horovod.common.util import get_average_backwards_compatibility_fun
from horovod.core import ops
from horovod.core.controller.messages import HOST
from horovod.core.engine.handles import Handle
from horovod.core.ops import set_rank as process_set_rank  # noqa: F401  (torch's names for them)
from horovod.core.ops import set_size as process_set_size
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.torch import cuda_ipc
from horovod.torch.handles import Pending, handle_map, synchronize
from horovod.torch.tensors import (
    MOVE_DTYPES,
    REDUCE_DTYPES,
    check_tensor,
    from_array,
    numpy_view,
    to_device_of,
    to_host,
    torch_allocator,
)

__all__ = ["allreduce_async", "allreduce_async_", "grouped_allreduce_async", "grouped_allreduce_async_",
           "sparse_allreduce_async", "allgather_async", "grouped_allgather_async", "broadcast_async",
           "broadcast_async_", "alltoall_async", "reducescatter_async", "grouped_reducescatter_async"]

handle_average_backwards_compatibility = get_average_backwards_compatibility_fun(_types)


def _name(op: str, name: Optional[str], process_set: Optional[ProcessSet] = None) -> str:
    return ops.tensor_name(op, name, process_set=process_set)


def _returns(output):
    """A finish for a result that is already in its torch tensor (a CPU output, or one on a device plane)."""
    return lambda _: output


def start_allreduce(tensor: torch.Tensor, output: Optional[torch.Tensor], name: Optional[str], op: ReduceOp,
                    prescale_factor: float, postscale_factor: float, process_set: ProcessSet) -> Pending:
    """Submit an allreduce of ``tensor`` into ``output`` (``tensor`` itself for the in-place forms; None: a new
    tensor, see :func:`_new_output`)."""
    check_tensor(tensor, REDUCE_DTYPES, "allreduce")
    return _start_into(tensor, output, op, lambda array, out, device: ops.allreduce_async(
        array, out, _name("allreduce", name, process_set), op, prescale_factor, postscale_factor, process_set,
        device=device))


def _start_into(tensor: torch.Tensor, output: Optional[torch.Tensor], op: Optional[ReduceOp],
                submit: Callable[[object, object, int], Handle]) -> Pending:
    """Submit a collective of ``tensor`` into ``output`` (``tensor`` itself in place; None: a new tensor) as
    ``submit(input, output, device)`` makes it (called once, after the device checks, so that an unnamed op is
    numbered only when it is submitted): a CPU tensor's new output from the op layer (``output`` None given to
    it), tensors of a device plane as they are, other device tensors staged through host memory (``op`` picks the
    plane, :func:`cuda_ipc.device_for`)."""
    if output is None and tensor.is_cpu:
        return Pending(submit(numpy_view(tensor), None, HOST), _new_output(tensor.dtype), (tensor,))
    if output is None:
        output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    device = cuda_ipc.device_for([tensor, output], op)
    if device:
        return Pending(submit(tensor, output, device), _returns(output), (tensor, output))
    host_in = to_host(tensor)
    host_out = host_in if output is tensor else to_host(output)
    array_in = numpy_view(host_in)
    array_out = array_in if host_out is host_in else numpy_view(host_out)
    handle = submit(array_in, array_out, HOST)
    if host_out is output:
        return Pending(handle, _returns(output), (tensor, output))
    return Pending(handle, _copied_back(host_out, output), (tensor, output, host_in, host_out))


def _new_output(dtype: torch.dtype):
    """A finish that gives the op layer's new output array (from its pool at 1 MB and up: reused once dropped,
    where ``torch.empty_like`` maps fresh pages every call) as a torch tensor of ``dtype``, without a copy."""
    return lambda array: from_array(array, dtype)


def _copied_back(host: torch.Tensor, output: torch.Tensor):
    """A finish that copies a staged host result into the device tensor ``output``."""
    def finish(_):
        output.copy_(host)
        return output

    return finish


def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                    op: Optional[ReduceOp] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start an allreduce of ``tensor`` into a new tensor; returns a handle."""
    op = handle_average_backwards_compatibility(op, average)
    return handle_map.add(start_allreduce(tensor, None, name, op, prescale_factor, postscale_factor, process_set))


def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                     op: Optional[ReduceOp] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start an in-place allreduce of ``tensor``; returns a handle."""
    op = handle_average_backwards_compatibility(op, average)
    return handle_map.add(start_allreduce(tensor, tensor, name, op, prescale_factor, postscale_factor, process_set))


def start_grouped_allreduce(tensors: Sequence[torch.Tensor], outputs: Optional[Sequence[torch.Tensor]], name, op,
                            prescale_factor, postscale_factor, process_set) -> Pending:
    """Submit an allreduce of a list of tensors into ``outputs`` (``tensors`` for the in-place forms; None: new
    tensors, as :func:`_new_output` makes them), as one unit."""
    tensors = list(tensors)
    for t in tensors:
        check_tensor(t, REDUCE_DTYPES, "grouped_allreduce")
    if outputs is None and all(t.is_cpu for t in tensors):
        handle = ops.grouped_allreduce_async([numpy_view(t) for t in tensors], None,
                                             _name("grouped_allreduce", name, process_set), op, prescale_factor,
                                             postscale_factor, process_set)
        made = [_new_output(t.dtype) for t in tensors]
        return Pending(handle, lambda arrays: [new(a) for new, a in zip(made, arrays)], (tensors,))
    if outputs is None:
        outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    outputs = list(outputs)
    device = cuda_ipc.device_for(tensors + outputs, op)
    if device:
        handle = ops.grouped_allreduce_async(tensors, outputs, _name("grouped_allreduce", name, process_set), op,
                                             prescale_factor, postscale_factor, process_set, device=device)
        return Pending(handle, _returns(outputs), (tensors, outputs))
    host_in = [to_host(t) for t in tensors]
    host_out = [hi if o is t else to_host(o) for t, o, hi in zip(tensors, outputs, host_in)]
    arrays_in = [numpy_view(t) for t in host_in]
    arrays_out = [a if ho is hi else numpy_view(ho) for a, hi, ho in zip(arrays_in, host_in, host_out)]   # in place
    handle = ops.grouped_allreduce_async(arrays_in, arrays_out, _name("grouped_allreduce", name, process_set), op,
                                         prescale_factor, postscale_factor, process_set)

    def finish(_):
        for out, ho in zip(outputs, host_out):
            if ho is not out:
                out.copy_(ho)
        return outputs

    return Pending(handle, finish, (tensors, outputs, host_in, host_out))


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                            name: Optional[str] = None, op: Optional[ReduceOp] = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start an allreduce of a list of tensors, negotiated and fused as one unit."""
    op = handle_average_backwards_compatibility(op, average)
    return handle_map.add(start_grouped_allreduce(tensors, None, name, op, prescale_factor, postscale_factor,
                                                  process_set))


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[ReduceOp] = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> int:
    """Start an in-place grouped allreduce."""
    op = handle_average_backwards_compatibility(op, average)
    return handle_map.add(start_grouped_allreduce(tensors, tensors, name, op, prescale_factor, postscale_factor,
                                                  process_set))


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



def allgather_async(tensor: torch.Tensor, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start an allgather along dim 0 (dim 0 may differ between ranks)."""
    return handle_map.add(start_allgather(tensor, name, process_set))


def start_allgather(tensor: torch.Tensor, name: Optional[str], process_set: ProcessSet) -> Pending:
    """Submit an allgather of ``tensor`` along dim 0 into a new tensor."""
    check_tensor(tensor, MOVE_DTYPES, "allgather")
    made: List[torch.Tensor] = []
    device = cuda_ipc.device_for([tensor])
    if device:
        handle = ops.allgather_async(tensor, _name("allgather", name, process_set), cuda_ipc.allocator(tensor, made),
                                     process_set, device=device)
        return Pending(handle, lambda _: made[0], (tensor, made))
    host = to_host(tensor)
    handle = ops.allgather_async(numpy_view(host), _name("allgather", name, process_set),
                                 torch_allocator(tensor.dtype, made), process_set)
    return Pending(handle, lambda _: to_device_of(made[0], tensor), (tensor, host, made))


def start_grouped_allocating(tensors: Sequence[torch.Tensor], allowed: set, what: str,
                             start: Callable[..., Handle]) -> Pending:
    """A grouped op whose outputs are sized by negotiation: one new torch output per tensor, in order.
    ``start(arrays, allocators, device)`` submits it."""
    tensors = list(tensors)
    for t in tensors:
        check_tensor(t, allowed, what)
    device = cuda_ipc.device_for(tensors)
    if device:
        made_on_device: List[Optional[torch.Tensor]] = []
        handle = start(tensors, [cuda_ipc.allocator(t, made_on_device, i) for i, t in enumerate(tensors)], device)
        return Pending(handle, lambda _: list(made_on_device), (tensors, made_on_device))
    hosts = [to_host(t) for t in tensors]
    made: List[Optional[torch.Tensor]] = []
    allocators = [torch_allocator(t.dtype, made, i) for i, t in enumerate(tensors)]
    handle = start([numpy_view(h) for h in hosts], allocators, 0)
    return Pending(handle, lambda _: [to_device_of(m, t) for m, t in zip(made, tensors)], (tensors, hosts, made))


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start an allgather of each tensor of a list, as one unit."""
    return handle_map.add(start_grouped_allgather(tensors, name, process_set))


def start_grouped_allgather(tensors: Sequence[torch.Tensor], name: Optional[str], process_set: ProcessSet) -> Pending:
    """Submit an allgather of each tensor of a list, as one unit."""
    return start_grouped_allocating(tensors, MOVE_DTYPES, "grouped_allgather", lambda arrays, allocators, device:
                                    ops.grouped_allgather_async(arrays, _name("grouped_allgather", name, process_set),
                                                                allocators, process_set, device=device))


def start_broadcast(tensor: torch.Tensor, output: Optional[torch.Tensor], root_rank: int, name: Optional[str],
                    process_set: ProcessSet) -> Pending:
    """Submit a broadcast of ``root_rank``'s ``tensor`` into ``output`` (``tensor`` for the in-place form; None: a
    new tensor, see :func:`_new_output`)."""
    check_tensor(tensor, MOVE_DTYPES, "broadcast")
    return _start_into(tensor, output, None, lambda array, out, device: ops.broadcast_async(
        array, root_rank, out, _name("broadcast", name, process_set), process_set, device=device))


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start a broadcast of ``root_rank``'s tensor (a global rank) into a new tensor."""
    return handle_map.add(start_broadcast(tensor, None, root_rank, name, process_set))


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start an in-place broadcast."""
    return handle_map.add(start_broadcast(tensor, tensor, root_rank, name, process_set))


def alltoall_async(tensor: torch.Tensor, splits=None, name: Optional[str] = None,
                   process_set: ProcessSet = global_process_set) -> int:
    """Start an alltoall; ``synchronize`` returns ``(output, received_splits)``, with splits or without (upstream)."""
    return handle_map.add(start_alltoall(tensor, splits, name, process_set))


def start_alltoall(tensor: torch.Tensor, splits, name: Optional[str], process_set: ProcessSet) -> Pending:
    """Submit an alltoall; its result is ``(output, received_splits)``."""
    check_tensor(tensor, MOVE_DTYPES, "alltoall")
    split_list = None
    if splits is not None:
        split_list = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    made: List[torch.Tensor] = []
    device = cuda_ipc.device_for([tensor])
    if device:
        handle = ops.alltoall_async(tensor, split_list, _name("alltoall", name, process_set),
                                    cuda_ipc.allocator(tensor, made), process_set, device=device)
        return Pending(handle, lambda result: (made[0], torch.from_numpy(np.asarray(result[1], np.int32))),
                       (tensor, made))
    host = to_host(tensor)
    handle = ops.alltoall_async(numpy_view(host), split_list, _name("alltoall", name, process_set), torch_allocator(tensor.dtype, made),
                                process_set)

    def finish(result):
        _, received = result
        return to_device_of(made[0], tensor), torch.from_numpy(np.asarray(received, np.int32))

    return Pending(handle, finish, (tensor, host, made))


def _check_reducescatter_op(op: ReduceOp) -> ReduceOp:
    """Sum or Average; anything else is upstream's RuntimeError ("Reducescatter currently only supports ...")."""
    op = ReduceOp(op)
    if op not in (Sum, Average):
        raise RuntimeError(f"reducescatter supports op=Sum and op=Average, not op={op.name.capitalize()}; "
                           "use an allreduce for other reductions.")
    return op


def reducescatter_async(tensor: torch.Tensor, name: Optional[str] = None, op: ReduceOp = Average,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Start a reducescatter (Sum or Average); ranks < n % size get one extra row."""
    return handle_map.add(start_reducescatter(tensor, name, op, process_set, prescale_factor, postscale_factor))


def start_reducescatter(tensor: torch.Tensor, name: Optional[str], op: ReduceOp, process_set: ProcessSet,
                        prescale_factor: float, postscale_factor: float) -> Pending:
    """Submit a reducescatter into a new tensor (this rank's rows)."""
    check_tensor(tensor, REDUCE_DTYPES, "reducescatter")               # as upstream: the tensor first, then the op
    op = _check_reducescatter_op(op)
    made: List[torch.Tensor] = []
    device = cuda_ipc.device_for([tensor])
    if device:
        handle = ops.reducescatter_async(tensor, _name("reducescatter", name, process_set), op, prescale_factor,
                                         postscale_factor, cuda_ipc.allocator(tensor, made), process_set,
                                         device=device)
        return Pending(handle, lambda _: made[0], (tensor, made))
    host = to_host(tensor)
    handle = ops.reducescatter_async(numpy_view(host), _name("reducescatter", name, process_set), op, prescale_factor, postscale_factor,
                                     torch_allocator(tensor.dtype, made), process_set)
    return Pending(handle, lambda _: to_device_of(made[0], tensor), (tensor, host, made))


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None, op: ReduceOp = Average,
                                process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    """Start a reducescatter of each tensor of a list, as one unit."""
    return handle_map.add(start_grouped_reducescatter(tensors, name, op, process_set, prescale_factor,
                                                      postscale_factor))


def start_grouped_reducescatter(tensors: Sequence[torch.Tensor], name: Optional[str], op: ReduceOp,
                                process_set: ProcessSet, prescale_factor: float, postscale_factor: float) -> Pending:
    """Submit a reducescatter of each tensor of a list, as one unit."""
    def start(arrays, allocators, device):    # runs after the tensors are checked (upstream's order of errors)
        checked = _check_reducescatter_op(op)
        return ops.grouped_reducescatter_async(arrays, _name("grouped_reducescatter", name, process_set), checked,
                                               prescale_factor, postscale_factor, allocators, process_set,
                                               device=device)

    return start_grouped_allocating(tensors, REDUCE_DTYPES, "grouped_reducescatter", start)
