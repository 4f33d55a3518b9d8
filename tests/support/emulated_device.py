"""A device for the device plane's tests on machines without a GPU: "device arrays" are numpy arrays and each
rank's window is a POSIX shared-memory segment that the peers map by name, as CUDA IPC maps a peer's GPU memory by
its handle. Registered under its own device code, it runs the plane's schedules (chunks, slices, uneven counts) and
the engine's routing of device requests exactly as CUDA tensors take them."""
from __future__ import annotations

from multiprocessing import resource_tracker, shared_memory

import numpy as np

from horovod.backends import device_ipc
from horovod.backends.reduce import reduce_into, scaled_copy
from horovod.common.types import data_type_of, numpy_dtype

EMULATED = 7        # its device code (CUDA is device_ipc.CUDA)


class EmulatedOps(device_ipc.DeviceOps):
    """numpy arrays as device arrays; shared-memory segments as windows."""

    def data_type(self, array):
        return data_type_of(array.dtype)

    def flat(self, array):
        return array.reshape(-1)

    def count(self, array) -> int:
        return int(array.size)

    def export_window(self, nbytes: int):
        segment = shared_memory.SharedMemory(create=True, size=nbytes)
        return segment.name.encode(), [segment, np.ndarray((nbytes,), np.uint8, segment.buf)]

    def open_window(self, handle: bytes, nbytes: int):
        segment = shared_memory.SharedMemory(name=handle.decode())
        resource_tracker.unregister(segment._name, "shared_memory")     # its owner unlinks it
        return [segment, np.ndarray((nbytes,), np.uint8, segment.buf)]

    def close_window(self, window, own: bool) -> None:
        segment = window[0]
        window[1] = None
        segment.close()
        if own:
            segment.unlink()

    def view(self, window, dtype, start: int, count: int):
        itemsize = numpy_dtype(dtype).itemsize
        return window[1][start * itemsize:(start + count) * itemsize].view(numpy_dtype(dtype))

    def scaled_copy(self, dst, src, factor: float) -> None:
        scaled_copy(dst, src, factor)

    def reduce(self, dst, sources, op) -> None:
        if dst is not sources[0]:
            np.copyto(dst, sources[0])
        for source in sources[1:]:
            reduce_into(dst, source, op)

    def empty(self, shape: tuple, dtype):
        return np.empty(shape, numpy_dtype(dtype))

    def zeros(self, count: int, dtype):
        return np.zeros(count, numpy_dtype(dtype))

    def synchronize(self) -> None:
        return None


def register() -> None:
    """Make :data:`EMULATED` usable in this process (every rank of a job that uses it must call this)."""
    device_ipc.register(EMULATED, EmulatedOps)
