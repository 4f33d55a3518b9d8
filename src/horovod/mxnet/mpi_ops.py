"""``horovod.mxnet`` collectives on NDArrays, with upstream's names, signatures and defaults.

Host NDArrays are exchanged zero-copy: the op layer works on numpy views of their own buffers
(``horovod.mxnet.tensors``), after MXNet's engine has finished producing them. Device arrays are staged through host
memory. Each call returns once the collective has completed, so its output is ready to read. ``priority`` is
accepted for compatibility: upstream used it to order operators on MXNet's engine; ours do not run on that engine.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import mxnet as mx
import numpy as np

from horovod.common import types as _types
from horovod.common.types import Average, ReduceOp
from horovod.common.util import get_average_backwards_compatibility_fun
from horovod.core import api, ops
from horovod.core.api import *  # noqa: F403  (the op layer's public names, as upstream's mpi_ops exports them)
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.mxnet import tensors as _t
from horovod.mxnet.errors import mxnet_errors

__all__ = api.__all__ + [
    "allreduce", "allreduce_", "grouped_allreduce", "grouped_allreduce_", "allgather", "grouped_allgather",
    "broadcast", "broadcast_", "alltoall", "reducescatter", "grouped_reducescatter", "join",
]

handle_average_backwards_compatibility = get_average_backwards_compatibility_fun(_types)


def _name(op: str, name: Optional[str], process_set: ProcessSet) -> str:
    return ops.tensor_name(op, name, process_set=process_set)


def _checked(tensors: Sequence[mx.nd.NDArray], allowed: frozenset, what: str) -> List[mx.nd.NDArray]:
    tensors = list(tensors)
    for tensor in tensors:
        _t.check_ndarray(tensor, allowed, what)
    return tensors


# ------------------------------------------------------------------ allreduce
def _allreduce(tensors: List[mx.nd.NDArray], in_place: bool, what: str, average: Optional[bool],
               name: Optional[str], op: Optional[ReduceOp], prescale_factor: float, postscale_factor: float,
               process_set: ProcessSet) -> List[mx.nd.NDArray]:
    """Allreduce ``tensors`` (one, or a group negotiated as one unit) into themselves or into new arrays."""
    op = handle_average_backwards_compatibility(op, average)
    with mxnet_errors():
        tensors = _checked(tensors, _t.REDUCE_DTYPES, what)
        if in_place:
            hosts = [_t.writable(t) for t in tensors]
            outputs = hosts
        else:
            hosts = [_t.readable(t) for t in tensors]
            outputs = [_t.empty_like(t) for t in tensors]
        inputs, results = [_t.numpy_view(h) for h in hosts], [_t.numpy_view(o) for o in outputs]
        full_name = _name(what.rstrip("_"), name, process_set)
        with ops.blocking():
            if what.startswith("grouped"):
                ops.grouped_allreduce_async(inputs, results, full_name, op, prescale_factor, postscale_factor,
                                            process_set).wait()
            else:
                ops.allreduce_async(inputs[0], results[0], full_name, op, prescale_factor, postscale_factor,
                                    process_set).wait()
    if in_place:
        return [_t.write_back(o, t) for o, t in zip(outputs, tensors)]
    return [_t.like(o, t) for o, t in zip(outputs, tensors)]


def allreduce(tensor: mx.nd.NDArray, average: Optional[bool] = None, name: Optional[str] = None, priority: int = 0,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set, op: Optional[ReduceOp] = None) -> mx.nd.NDArray:
    """Reduce ``tensor`` across ranks (Average by default) into a new NDArray on ``tensor``'s context."""
    what = "allreduce"
    return _allreduce([tensor], False, what, average, name, op, prescale_factor, postscale_factor, process_set)[0]


def allreduce_(tensor: mx.nd.NDArray, average: Optional[bool] = None, name: Optional[str] = None, priority: int = 0,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set, op: Optional[ReduceOp] = None) -> mx.nd.NDArray:
    """Reduce ``tensor`` across ranks in place and return it."""
    what = "allreduce_"
    return _allreduce([tensor], True, what, average, name, op, prescale_factor, postscale_factor, process_set)[0]


def grouped_allreduce(tensors: Sequence[mx.nd.NDArray], average: Optional[bool] = None, name: Optional[str] = None,
                      priority: int = 0, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set,
                      op: Optional[ReduceOp] = None) -> List[mx.nd.NDArray]:
    """Allreduce a list of NDArrays, negotiated and fused as one unit; returns new NDArrays."""
    return _allreduce(list(tensors), False, "grouped_allreduce", average, name, op, prescale_factor,
                      postscale_factor, process_set)


def grouped_allreduce_(tensors: Sequence[mx.nd.NDArray], average: Optional[bool] = None, name: Optional[str] = None,
                       priority: int = 0, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set,
                       op: Optional[ReduceOp] = None) -> List[mx.nd.NDArray]:
    """Allreduce a list of NDArrays in place, as one unit; returns them."""
    return _allreduce(list(tensors), True, "grouped_allreduce_", average, name, op, prescale_factor,
                      postscale_factor, process_set)


# ------------------------------------------------------------------ allgather
def grouped_allgather(tensors: Sequence[mx.nd.NDArray], name: Optional[str] = None, priority: int = 0,
                      process_set: ProcessSet = global_process_set) -> List[mx.nd.NDArray]:
    """Allgather each NDArray of a list along dim 0 (which may differ between ranks), as one unit."""
    with mxnet_errors():
        tensors = _checked(tensors, _t.MOVE_DTYPES, "allgather")
        made: List[Optional[mx.nd.NDArray]] = []
        allocators = [_t.ndarray_allocator(t.dtype, made, i) for i, t in enumerate(tensors)]
        ops.grouped_allgather_async([_t.numpy_view(_t.readable(t)) for t in tensors],
                                    _name("grouped_allgather", name, process_set), allocators,
                                    process_set=process_set).wait()
    return [_t.like(o, t) for o, t in zip(made, tensors)]


def allgather(tensor: mx.nd.NDArray, name: Optional[str] = None, priority: int = 0,
              process_set: ProcessSet = global_process_set) -> mx.nd.NDArray:
    """Concatenate every rank's ``tensor`` along dim 0 (dim 0 may differ between ranks)."""
    with mxnet_errors():
        _t.check_ndarray(tensor, _t.MOVE_DTYPES, "allgather")
        made: List[Optional[mx.nd.NDArray]] = []
        with ops.blocking():
            ops.allgather_async(_t.numpy_view(_t.readable(tensor)), _name("allgather", name, process_set),
                                _t.ndarray_allocator(tensor.dtype, made), process_set=process_set).wait()
    return _t.like(made[0], tensor)


# ------------------------------------------------------------------ broadcast
def broadcast(tensor: mx.nd.NDArray, root_rank: int, name: Optional[str] = None, priority: int = 0,
              process_set: ProcessSet = global_process_set) -> mx.nd.NDArray:
    """Return ``root_rank``'s ``tensor`` (``root_rank`` is a global rank) as a new NDArray on every rank."""
    with mxnet_errors():
        _t.check_ndarray(tensor, _t.MOVE_DTYPES, "broadcast")
        out = _t.empty_like(tensor)
        with ops.blocking():
            ops.broadcast_async(_t.numpy_view(_t.readable(tensor)), root_rank, _t.numpy_view(out),
                                _name("broadcast", name, process_set), process_set).wait()
    return _t.like(out, tensor)


def broadcast_(tensor: mx.nd.NDArray, root_rank: int, name: Optional[str] = None, priority: int = 0,
               process_set: ProcessSet = global_process_set) -> mx.nd.NDArray:
    """Overwrite ``tensor`` with ``root_rank``'s values and return it."""
    with mxnet_errors():
        _t.check_ndarray(tensor, _t.MOVE_DTYPES, "broadcast_")
        host = _t.writable(tensor)
        view = _t.numpy_view(host)
        with ops.blocking():
            ops.broadcast_async(view, root_rank, view, _name("broadcast", name, process_set), process_set).wait()
    return _t.write_back(host, tensor)


# ------------------------------------------------------------------ alltoall
def alltoall(tensor: mx.nd.NDArray, splits=None, name: Optional[str] = None, priority: int = 0,
             process_set: ProcessSet = global_process_set):
    """Send ``splits[j]`` rows of ``tensor`` to rank j (equal parts when ``splits`` is None) and gather theirs.

    Returns the output alone when ``splits`` is None, else ``(output, received_splits)``, the latter an int32
    NDArray of the rows received from each rank, as upstream.
    """
    with mxnet_errors():
        _t.check_ndarray(tensor, _t.MOVE_DTYPES, "alltoall")
        if isinstance(splits, mx.nd.NDArray):
            if np.dtype(splits.dtype) != np.int32:       # upstream's kernel takes int32 splits only
                raise ValueError(f"alltoall splits must be an int32 NDArray, not {np.dtype(splits.dtype).name}; "
                                 "cast them with splits.astype('int32').")
            splits = splits.asnumpy()
        made: List[Optional[mx.nd.NDArray]] = []
        _, received = ops.alltoall_async(_t.numpy_view(_t.readable(tensor)), splits,
                                         _name("alltoall", name, process_set), _t.ndarray_allocator(tensor.dtype, made),
                                         process_set=process_set).wait()
    output = _t.like(made[0], tensor)
    if splits is None:
        return output
    return output, mx.nd.array(np.asarray(received), dtype="int32")


# ------------------------------------------------------------------ reducescatter
def grouped_reducescatter(tensors: Sequence[mx.nd.NDArray], op: ReduceOp = Average, name: Optional[str] = None,
                          priority: int = 0, process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> List[mx.nd.NDArray]:
    """Reduce each NDArray of a list across ranks and keep this rank's block of dim 0, as one unit."""
    with mxnet_errors():
        tensors = _checked(tensors, _t.REDUCE_DTYPES, "reducescatter")
        made: List[Optional[mx.nd.NDArray]] = []
        allocators = [_t.ndarray_allocator(t.dtype, made, i) for i, t in enumerate(tensors)]
        ops.grouped_reducescatter_async([_t.numpy_view(_t.readable(t)) for t in tensors],
                                        _name("grouped_reducescatter", name, process_set), op, prescale_factor,
                                        postscale_factor, allocators, process_set=process_set).wait()
    return [_t.like(o, t) for o, t in zip(made, tensors)]


def reducescatter(tensor: mx.nd.NDArray, op: ReduceOp = Average, name: Optional[str] = None, priority: int = 0,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> mx.nd.NDArray:
    """Reduce across ranks and return this rank's block of dim 0 (ranks < n % size get one extra row)."""
    with mxnet_errors():
        _t.check_ndarray(tensor, _t.REDUCE_DTYPES, "reducescatter")
        made: List[Optional[mx.nd.NDArray]] = []
        with ops.blocking():
            ops.reducescatter_async(_t.numpy_view(_t.readable(tensor)), _name("reducescatter", name, process_set),
                                    op, prescale_factor, postscale_factor, _t.ndarray_allocator(tensor.dtype, made),
                                    process_set=process_set).wait()
    return _t.like(made[0], tensor)


# ------------------------------------------------------------------ join
def join(process_set: ProcessSet = global_process_set) -> int:
    """Mark this rank as done with its data (beyond upstream, whose MXNet binding has no join); returns the last
    rank (of ``process_set``) to join, a global rank, the same on every rank. Until every rank has joined, this
    rank contributes zeros to the others' allreduces (and so to ``DistributedTrainer``'s gradients)."""
    with mxnet_errors():
        return int(ops.join_async(process_set).wait())
