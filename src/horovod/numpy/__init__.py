"""``horovod.numpy``: Horovod's collective API on numpy arrays.

Modelled on ``horovod.torch``: ``allreduce``/``allreduce_async``/``allreduce_``, grouped forms, allgather,
broadcast, alltoall, reducescatter, join, barrier, integer handles with ``poll`` and ``synchronize``, and the
object helpers. It is the framework-agnostic face of the op layer that tests and the other bindings build on.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as _np

from horovod.common import types as _types
from horovod.common.types import Average, ReduceOp
from horovod.common.util import get_average_backwards_compatibility_fun
from horovod.core import api as _api
from horovod.core import ops as _ops
from horovod.core.api import *  # noqa: F403  (the op layer's public names)
from horovod.core.engine.handles import Handle
from horovod.core.handle_map import HandleMap
from horovod.core.process_sets import ProcessSet, global_process_set

__all__ = _api.__all__ + [
    "allreduce", "allreduce_async", "allreduce_", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_async", "grouped_allreduce_", "grouped_allreduce_async_",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast", "broadcast_async", "broadcast_", "broadcast_async_", "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async",
    "join", "barrier", "poll", "synchronize", "broadcast_object", "allgather_object",
]

_handle_op = get_average_backwards_compatibility_fun(_types)
_handles: HandleMap[Handle] = HandleMap()
_register = _handles.add


def _name(op: str, name: Optional[str], process_set: Optional[ProcessSet] = None) -> str:
    return _ops.tensor_name(op, name, process_set=process_set)


def poll(handle: int) -> bool:
    """True if the operation behind ``handle`` has finished."""
    return _handles.require(handle).poll()


def synchronize(handle: int) -> Any:
    """Wait for ``handle`` and return its result (raises HorovodInternalError on a failed collective)."""
    h = _handles.pop(handle)
    if h is None:
        return None
    return h.wait()


# ------------------------------------------------------------------ allreduce
def allreduce_async(tensor: _np.ndarray, average: Optional[bool] = None, name: Optional[str] = None,
                    op: Optional[ReduceOp] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start an allreduce; the result is a new array."""
    op = _handle_op(op, average)
    return _register(_ops.allreduce_async(tensor, None, _name("allreduce", name, process_set), op, prescale_factor,
                                          postscale_factor, process_set))


def allreduce(tensor: _np.ndarray, average: Optional[bool] = None, name: Optional[str] = None,
              op: Optional[ReduceOp] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> _np.ndarray:
    """Reduce ``tensor`` across ranks (Average by default) and return the result as a new array."""
    with _ops.blocking():
        return synchronize(allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor,
                                           process_set))


def allreduce_async_(tensor: _np.ndarray, average: Optional[bool] = None, name: Optional[str] = None,
                     op: Optional[ReduceOp] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start an in-place allreduce of ``tensor``."""
    op = _handle_op(op, average)
    return _register(_ops.allreduce_async(tensor, tensor, _name("allreduce", name, process_set), op, prescale_factor,
                                          postscale_factor, process_set))


def allreduce_(tensor: _np.ndarray, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[ReduceOp] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> _np.ndarray:
    """Reduce ``tensor`` across ranks in place and return it."""
    with _ops.blocking():
        return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                                            process_set))


def grouped_allreduce_async(tensors: Sequence[_np.ndarray], average: Optional[bool] = None,
                            name: Optional[str] = None, op: Optional[ReduceOp] = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start an allreduce of a list of arrays, negotiated and fused as one unit."""
    op = _handle_op(op, average)
    return _register(_ops.grouped_allreduce_async(tensors, None, _name("grouped_allreduce", name, process_set), op,
                                                  prescale_factor, postscale_factor, process_set))


def grouped_allreduce(tensors: Sequence[_np.ndarray], average: Optional[bool] = None, name: Optional[str] = None,
                      op: Optional[ReduceOp] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> List[_np.ndarray]:
    """Allreduce a list of arrays as one unit; returns new arrays."""
    with _ops.blocking():
        return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor,
                                                   process_set))


def grouped_allreduce_async_(tensors: Sequence[_np.ndarray], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[ReduceOp] = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> int:
    """Start an in-place grouped allreduce."""
    op = _handle_op(op, average)
    return _register(_ops.grouped_allreduce_async(tensors, tensors, _name("grouped_allreduce", name, process_set), op,
                                                  prescale_factor, postscale_factor, process_set))


def grouped_allreduce_(tensors: Sequence[_np.ndarray], average: Optional[bool] = None, name: Optional[str] = None,
                       op: Optional[ReduceOp] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> List[_np.ndarray]:
    """Allreduce a list of arrays in place, as one unit."""
    with _ops.blocking():
        return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                    postscale_factor, process_set))


# ------------------------------------------------------------------ allgather
def allgather_async(tensor: _np.ndarray, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start an allgather along dim 0."""
    return _register(_ops.allgather_async(tensor, _name("allgather", name, process_set), process_set=process_set))


def allgather(tensor: _np.ndarray, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> _np.ndarray:
    """Concatenate every rank's ``tensor`` along dim 0 (dim 0 may differ between ranks)."""
    with _ops.blocking():
        return synchronize(allgather_async(tensor, name, process_set))


def grouped_allgather_async(tensors: Sequence[_np.ndarray], name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start an allgather of each array of a list, as one unit."""
    return _register(_ops.grouped_allgather_async(tensors, _name("grouped_allgather", name, process_set),
                                                  process_set=process_set))


def grouped_allgather(tensors: Sequence[_np.ndarray], name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[_np.ndarray]:
    """Allgather each array of a list, as one unit."""
    return synchronize(grouped_allgather_async(tensors, name, process_set))


# ------------------------------------------------------------------ broadcast
def broadcast_async(tensor: _np.ndarray, root_rank: int, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start a broadcast from ``root_rank`` (a global rank) into a new array."""
    return _register(_ops.broadcast_async(tensor, root_rank, None, _name("broadcast", name, process_set), process_set))


def broadcast(tensor: _np.ndarray, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> _np.ndarray:
    """Return ``root_rank``'s ``tensor`` on every rank."""
    with _ops.blocking():
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_async_(tensor: _np.ndarray, root_rank: int, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start an in-place broadcast."""
    return _register(_ops.broadcast_async(tensor, root_rank, tensor, _name("broadcast", name, process_set), process_set))


def broadcast_(tensor: _np.ndarray, root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set) -> _np.ndarray:
    """Overwrite ``tensor`` with ``root_rank``'s values and return it."""
    with _ops.blocking():
        return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ------------------------------------------------------------------ alltoall
def alltoall_async(tensor: _np.ndarray, splits=None, name: Optional[str] = None,
                   process_set: ProcessSet = global_process_set) -> int:
    """Start an alltoall (see :func:`alltoall`)."""
    handle = _ops.alltoall_async(tensor, splits, _name("alltoall", name, process_set), process_set=process_set)
    if splits is None:
        handle._finish = lambda results: results[0][0]
    return _register(handle)


def alltoall(tensor: _np.ndarray, splits=None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set):
    """Scatter rows of ``tensor`` to the ranks and gather theirs.

    Returns the output alone when ``splits`` is None (equal split), else ``(output, received_splits)``.
    """
    return synchronize(alltoall_async(tensor, splits, name, process_set))


# ------------------------------------------------------------------ reducescatter
def reducescatter_async(tensor: _np.ndarray, name: Optional[str] = None, op: ReduceOp = Average,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Start a reducescatter."""
    return _register(_ops.reducescatter_async(tensor, _name("reducescatter", name, process_set), op, prescale_factor,
                                              postscale_factor, process_set=process_set))


def reducescatter(tensor: _np.ndarray, name: Optional[str] = None, op: ReduceOp = Average,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> _np.ndarray:
    """Reduce across ranks and return this rank's block of dim 0 (ranks < n % size get one extra row)."""
    with _ops.blocking():
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor))


def grouped_reducescatter_async(tensors: Sequence[_np.ndarray], name: Optional[str] = None, op: ReduceOp = Average,
                                process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    """Start a reducescatter of each array of a list, as one unit."""
    return _register(_ops.grouped_reducescatter_async(tensors, _name("grouped_reducescatter", name, process_set), op,
                                                      prescale_factor, postscale_factor, process_set=process_set))


def grouped_reducescatter(tensors: Sequence[_np.ndarray], name: Optional[str] = None, op: ReduceOp = Average,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[_np.ndarray]:
    """Reducescatter each array of a list, as one unit."""
    return synchronize(grouped_reducescatter_async(tensors, name, op, process_set, prescale_factor,
                                                   postscale_factor))


# ------------------------------------------------------------------ control
def join(process_set: ProcessSet = global_process_set) -> int:
    """Wait until every rank (of ``process_set``) has joined; returns the last rank to join, a global rank, the
    same on every rank.

    While joined, this rank contributes zeros to other ranks' allreduces (Average still divides by size).
    """
    return _ops.join_async(process_set).wait()


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank has reached the barrier."""
    _ops.barrier_async(process_set).wait()


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Send a picklable object from ``root_rank`` to every rank."""
    return _ops.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: Optional[str] = None, process_set: ProcessSet = global_process_set) -> List:
    """Gather one picklable object from every rank, as a list indexed by rank."""
    return _ops.allgather_object(obj, name, process_set)

from horovod.numpy import elastic  # noqa: E402,F401  (hvd.elastic.run, hvd.elastic.ObjectState)
