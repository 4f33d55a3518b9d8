"""How ``horovod.mxnet`` hands NDArrays to the op layer: dtype checks, zero-copy numpy views of host NDArrays,
MXNet engine synchronisation, host staging of device arrays, and allocators that create outputs as NDArrays.

MXNet runs operators asynchronously on its own engine threads. Before Horovod reads an NDArray's buffer, the
operator that produces it must have finished (``wait_to_read``); before Horovod writes into an existing NDArray
(the in-place forms), every pending reader and writer of it must have finished (``MXNDArrayWaitToWrite``). The
collectives here return only once the engine has completed them, so the user never sees an output before it is
written.
"""
from __future__ import annotations

import ctypes
from typing import List, Optional

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, check_call

# Upstream's dtypes (the seven numeric types MXNet's Horovod op accepts); bool moves data but does not reduce.
REDUCE_DTYPES = frozenset(np.dtype(d) for d in ("uint8", "int8", "int32", "int64", "float16", "float32", "float64"))
MOVE_DTYPES = REDUCE_DTYPES | {np.dtype(bool)}
_HOST_DEVICES = ("cpu", "cpu_pinned", "cpu_shared")


def check_ndarray(tensor: mx.nd.NDArray, allowed: frozenset, what: str) -> None:
    """Raise ValueError unless ``tensor`` is a dense NDArray of an ``allowed`` dtype."""
    if not isinstance(tensor, mx.nd.NDArray):
        raise ValueError(f"{what} expects an mxnet NDArray, got {type(tensor).__name__}; wrap it with mx.nd.array.")
    if tensor.stype != "default":
        raise ValueError(f"{what} does not take {tensor.stype} NDArrays; convert it with tostype('default').")
    dtype = np.dtype(tensor.dtype)
    if dtype not in allowed:
        names = ", ".join(sorted(d.name for d in allowed))
        shown = "bfloat16" if dtype.names == ("bfloat16",) else dtype.name
        raise ValueError(f"Tensor type {shown} is not supported by {what}. Supported types: {names}. Cast the "
                         "tensor (for example tensor.astype('float32')) before the collective.")


def is_host(tensor: mx.nd.NDArray) -> bool:
    """True when ``tensor`` lives in host memory, whose buffer the op layer can use in place."""
    return tensor.context.device_type in _HOST_DEVICES


def data_pointer(tensor: mx.nd.NDArray) -> int:
    """The address of a host NDArray's buffer (MXNet allocates a delayed allocation here)."""
    ptr = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(tensor.handle, ctypes.byref(ptr)))
    return ptr.value or 0


def numpy_view(tensor: mx.nd.NDArray) -> np.ndarray:
    """A numpy array over a host NDArray's own memory (no copy); it keeps ``tensor`` alive."""
    dtype = np.dtype(tensor.dtype)
    nbytes = tensor.size * dtype.itemsize
    if nbytes == 0:
        return np.empty(tensor.shape, dtype)
    buffer = (ctypes.c_char * nbytes).from_address(data_pointer(tensor))
    buffer._owner = tensor          # the NDArray outlives every view of its memory
    return np.frombuffer(buffer, dtype=dtype).reshape(tensor.shape)


def wait_to_write(tensor: mx.nd.NDArray) -> None:
    """Block until every operator MXNet's engine has pending on ``tensor`` (readers and writers) finished."""
    check_call(_LIB.MXNDArrayWaitToWrite(tensor.handle))


def readable(tensor: mx.nd.NDArray) -> mx.nd.NDArray:
    """``tensor`` in host memory with its producer finished: itself, or a host copy of a device array."""
    if is_host(tensor):
        tensor.wait_to_read()
        return tensor
    staged = tensor.as_in_context(mx.cpu())
    staged.wait_to_read()
    return staged


def writable(tensor: mx.nd.NDArray) -> mx.nd.NDArray:
    """The host array an in-place collective works on: ``tensor`` once nothing else uses it, or a host copy."""
    if is_host(tensor):
        wait_to_write(tensor)
        return tensor
    return readable(tensor)


def write_back(result: mx.nd.NDArray, tensor: mx.nd.NDArray) -> mx.nd.NDArray:
    """Finish an in-place collective: copy a staged result into the device ``tensor``; return ``tensor``."""
    if result is not tensor:
        result.copyto(tensor)
        tensor.wait_to_read()
    return tensor


def like(result: mx.nd.NDArray, tensor: mx.nd.NDArray) -> mx.nd.NDArray:
    """A host ``result`` on ``tensor``'s context."""
    if is_host(tensor):
        return result
    out = result.as_in_context(tensor.context)
    out.wait_to_read()
    return out


def empty_like(tensor: mx.nd.NDArray) -> mx.nd.NDArray:
    """A new host NDArray of ``tensor``'s shape and dtype."""
    return mx.nd.empty(tensor.shape, ctx=mx.cpu(), dtype=tensor.dtype)


def ndarray_allocator(dtype, made: List[Optional[mx.nd.NDArray]], index: int = 0):
    """An op-layer allocator that creates a negotiated output as a host NDArray (kept in ``made[index]``)."""
    while len(made) <= index:
        made.append(None)

    def allocate(shape: tuple, _np_dtype) -> np.ndarray:
        out = mx.nd.empty(tuple(shape), ctx=mx.cpu(), dtype=dtype)
        made[index] = out
        return numpy_view(out)

    return allocate
