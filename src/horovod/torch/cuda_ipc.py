"""CUDA tensors on the GPU: the device plane's ops for torch (``horovod.backends.device_ipc``), and the binding's
choice between that plane and host staging.

Each rank exports a window of GPU memory it allocates itself (``cudaMalloc``, outside torch's caching allocator, so
that a CUDA IPC handle covers exactly the window); peers map it with ``cudaIpcOpenMemHandle`` and see it as a torch
tensor through ``__cuda_array_interface__``. Copies and reductions are torch's own kernels on the engine thread's
stream. Tensors made on another stream are waited for on the GPU (an event recorded at submission), not on the host.

The plane serves a job whose ranks all run on one host (several ranks on one GPU included, which NCCL refuses);
otherwise, with ``HOROVOD_CUDA_IPC=0``, or for Adasum, CUDA tensors are staged through host memory as before.
"""
from __future__ import annotations

import ctypes
import glob
import logging
import os
import sys
import threading
from typing import Dict, List, Optional

import torch

from horovod.backends import device_ipc
from horovod.common import config
from horovod.common.types import DataType, ReduceOp
from horovod.core import basics
from horovod.core.controller.messages import HOST

log = logging.getLogger(__name__)

_TORCH_OF = {DataType.UINT8: torch.uint8, DataType.INT8: torch.int8, DataType.INT16: torch.int16,
             DataType.INT32: torch.int32, DataType.INT64: torch.int64, DataType.FLOAT16: torch.float16,
             DataType.BFLOAT16: torch.bfloat16, DataType.FLOAT32: torch.float32, DataType.FLOAT64: torch.float64,
             DataType.BOOL: torch.bool}
_WIRE_OF = {v: k for k, v in _TORCH_OF.items()}
_ITEMSIZE = {k: torch.empty((), dtype=v).element_size() for k, v in _TORCH_OF.items()}
# The precision a scale factor is applied in (the host planes' rules, backends/reduce.py).
_SCALE_IN = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float32,
             torch.float64: torch.float64}
_IPC_LAZY_ENABLE_PEER_ACCESS = 1


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


def _loaded_cudart() -> str:
    """The path of the CUDA runtime library torch loaded (so that ours is the same instance, on torch's context),
    else one shipped in an ``nvidia`` wheel beside torch."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "libcudart" in path and path.startswith("/"):
                return path
    for entry in sys.path:
        found = sorted(glob.glob(os.path.join(entry, "nvidia", "*", "lib", "libcudart.so*")))
        if found:
            return found[-1]
    raise RuntimeError("the CUDA IPC plane needs the CUDA runtime library (libcudart) that torch loads, and none "
                       "is mapped in this process; set HOROVOD_CUDA_IPC=0 to stage CUDA tensors through host memory.")


class _Runtime:
    """The few CUDA runtime calls torch does not expose: raw allocations and IPC memory handles."""

    def __init__(self) -> None:
        torch.cuda.init()
        self.lib = ctypes.CDLL(_loaded_cudart())

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            self.lib.cudaGetErrorString.restype = ctypes.c_char_p
            text = self.lib.cudaGetErrorString(status).decode()
            raise RuntimeError(f"{what} failed: CUDA error {status} ({text})")

    def malloc(self, nbytes: int) -> int:
        ptr = ctypes.c_void_p()
        self._check(self.lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), "cudaMalloc")
        return ptr.value

    def free(self, ptr: int) -> None:
        self._check(self.lib.cudaFree(ctypes.c_void_p(ptr)), "cudaFree")

    def export(self, ptr: int) -> bytes:
        handle = _IpcHandle()
        self._check(self.lib.cudaIpcGetMemHandle(ctypes.byref(handle), ctypes.c_void_p(ptr)), "cudaIpcGetMemHandle")
        return ctypes.string_at(ctypes.addressof(handle), 64)     # all 64 bytes (.reserved stops at a zero)

    def open(self, handle: bytes) -> int:
        ptr = ctypes.c_void_p()
        raw = _IpcHandle()
        ctypes.memmove(ctypes.addressof(raw), handle, 64)
        self._check(self.lib.cudaIpcOpenMemHandle(ctypes.byref(ptr), raw, ctypes.c_uint(_IPC_LAZY_ENABLE_PEER_ACCESS)),
                    "cudaIpcOpenMemHandle")
        return ptr.value

    def close(self, ptr: int) -> None:
        self._check(self.lib.cudaIpcCloseMemHandle(ctypes.c_void_p(ptr)), "cudaIpcCloseMemHandle")


class _Memory:
    """Raw device memory seen by torch (``torch.as_tensor`` of this object is a zero-copy uint8 tensor)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.ptr = ptr
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None}


class TorchCudaOps(device_ipc.DeviceOps):
    """The device plane's ops on torch CUDA tensors, on the device the binding saw the rank's tensors on."""

    def __init__(self, device: int) -> None:
        self.device = torch.device("cuda", device)
        self._runtime: Optional[_Runtime] = None

    @property
    def runtime(self) -> _Runtime:
        """The CUDA runtime calls, loaded when a plane first exports a window (the op layer's dtype and output
        questions need none)."""
        if self._runtime is None:
            self._runtime = _Runtime()
        return self._runtime

    def data_type(self, array) -> DataType:
        return _WIRE_OF[array.dtype]

    def flat(self, array):
        _wait_ready(array)
        return array.view(-1)

    def count(self, array) -> int:
        return array.numel()

    def _tensor(self, memory: _Memory) -> torch.Tensor:
        tensor = torch.as_tensor(memory, device=self.device)
        if tensor.data_ptr() != memory.ptr:         # a copy would silently break the exchange
            raise RuntimeError("torch copied a CUDA window instead of viewing it; set HOROVOD_CUDA_IPC=0")
        return tensor

    def export_window(self, nbytes: int):
        # Called once per plane, on the engine thread of its process set, where every copy and reduction runs.
        torch.cuda.set_device(self.device)
        memory = _Memory(self.runtime.malloc(nbytes), nbytes)
        return self.runtime.export(memory.ptr), (memory, self._tensor(memory))

    def open_window(self, handle: bytes, nbytes: int):
        memory = _Memory(self.runtime.open(handle), nbytes)
        return memory, self._tensor(memory)

    def close_window(self, window, own: bool) -> None:
        memory, _ = window
        torch.cuda.synchronize(self.device)
        if own:
            self.runtime.free(memory.ptr)
        else:
            self.runtime.close(memory.ptr)

    def view(self, window, dtype: DataType, start: int, count: int):
        itemsize = _ITEMSIZE[dtype]
        return window[1][start * itemsize:(start + count) * itemsize].view(_TORCH_OF[dtype])

    def scaled_copy(self, dst, src, factor: float) -> None:
        if factor == 1.0:
            dst.copy_(src)
            return
        compute = _SCALE_IN.get(dst.dtype, torch.float64)
        if dst.dtype == torch.bool:
            raise ValueError("prescale_factor and postscale_factor are not supported for bool tensors")
        dst.copy_(src.to(compute) * factor)         # integers: scaled as doubles, truncated back (as on the host)

    def reduce(self, dst, sources, op: ReduceOp) -> None:
        if dst is not sources[0]:
            dst.copy_(sources[0])
        op = ReduceOp(op)
        boolean = dst.dtype == torch.bool
        for source in sources[1:]:
            if op == ReduceOp.SUM:
                torch.logical_or(dst, source, out=dst) if boolean else dst.add_(source)
            elif op == ReduceOp.MIN:
                torch.logical_and(dst, source, out=dst) if boolean else torch.minimum(dst, source, out=dst)
            elif op == ReduceOp.MAX:
                torch.logical_or(dst, source, out=dst) if boolean else torch.maximum(dst, source, out=dst)
            elif op == ReduceOp.PRODUCT:
                torch.logical_and(dst, source, out=dst) if boolean else dst.mul_(source)
            else:
                raise ValueError(f"reduce op {op.name} has no CUDA kernel here")

    def empty(self, shape: tuple, dtype: DataType):
        return torch.empty(shape, dtype=_TORCH_OF[DataType(dtype)], device=self.device)

    def zeros(self, count: int, dtype: DataType):
        return torch.zeros(count, dtype=_TORCH_OF[DataType(dtype)], device=self.device)

    def synchronize(self) -> None:
        torch.cuda.current_stream(self.device).synchronize()


# ---------------------------------------------------------------- the binding's side
_ready: Dict[int, torch.cuda.Event] = {}     # data_ptr -> the event recorded when the tensor was submitted
_ready_lock = threading.Lock()
_device: List[Optional[int]] = [None]        # the CUDA device of this rank's tensors (set at the first submission)


def _wait_ready(tensor) -> None:
    """Make the engine's stream wait (on the GPU) for the work that produced ``tensor`` on the caller's stream."""
    with _ready_lock:
        event = _ready.pop(tensor.data_ptr(), None)
    if event is not None:
        torch.cuda.current_stream(tensor.device).wait_event(event)


def _mark_ready(tensors) -> None:
    for t in tensors:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(t.device))
        with _ready_lock:
            _ready[t.data_ptr()] = event


def plane_available() -> bool:
    """Whether CUDA tensors go through the CUDA IPC plane in this job (the same answer on every rank)."""
    return bool(config.get("HOROVOD_CUDA_IPC")) and basics.local_size() == basics.size()


def device_for(tensors, op: Optional[ReduceOp] = None) -> int:
    """``device_ipc.CUDA`` when ``tensors`` (all CUDA) go through the CUDA IPC plane, else ``HOST`` (staged);
    for CUDA, records the events the engine's stream waits on before reading them."""
    tensors = list(tensors)
    if not tensors or not tensors[0].is_cuda or any(not t.is_cuda for t in tensors):   # CPU: one check
        return HOST
    if (op is not None and ReduceOp(op) == ReduceOp.ADASUM) or not plane_available():
        return HOST
    index = tensors[0].device.index
    if _device[0] is None:
        _device[0] = index
        device_ipc.register(device_ipc.CUDA, lambda: TorchCudaOps(_device[0]))
    elif any(t.device.index != _device[0] for t in tensors):
        raise ValueError(f"this rank's CUDA collectives use cuda:{_device[0]}, not cuda:{index}: keep each rank's "
                         "tensors on one GPU (torch.cuda.set_device(hvd.local_rank()) is the usual choice).")
    _mark_ready(tensors)
    return device_ipc.CUDA


def allocator(like: torch.Tensor, made: List[Optional[torch.Tensor]], index: int = 0):
    """An op-layer allocator that creates a negotiated output on ``like``'s GPU (kept in ``made[index]``)."""
    while len(made) <= index:
        made.append(None)

    def allocate(shape: tuple, _dtype) -> torch.Tensor:
        made[index] = out = torch.empty(tuple(shape), dtype=like.dtype, device=like.device)
        return out

    return allocate
