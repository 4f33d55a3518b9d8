"""Enumerations shared by every layer: reduce ops, request types and data types.

The integer values match upstream Horovod's ``message.h`` so that logs, timelines and users' code that
compare against the constants keep working.
"""
from __future__ import annotations

import enum

import ml_dtypes
import numpy as np


class ReduceOp(enum.IntEnum):
    """Reduction applied by allreduce and reducescatter (upstream's ``ReduceOp`` values)."""

    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


# The module-level names every binding re-exports (``hvd.Average`` ...).
Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT


class RequestType(enum.IntEnum):
    """Kind of collective a request asks for (upstream's ``Request::RequestType``)."""

    ALLREDUCE = 0
    ALLGATHER = 1
    BROADCAST = 2
    JOIN = 3
    ADASUM = 4
    ALLTOALL = 5
    BARRIER = 6
    REDUCESCATTER = 7


class DataType(enum.IntEnum):
    """Element type of a tensor on the wire (upstream's values, plus bfloat16)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    INT32 = 4
    INT64 = 5
    FLOAT16 = 6
    FLOAT32 = 7
    FLOAT64 = 8
    BOOL = 9
    BFLOAT16 = 10


_NUMPY_OF = {
    DataType.UINT8: np.dtype(np.uint8),
    DataType.INT8: np.dtype(np.int8),
    DataType.UINT16: np.dtype(np.uint16),
    DataType.INT16: np.dtype(np.int16),
    DataType.INT32: np.dtype(np.int32),
    DataType.INT64: np.dtype(np.int64),
    DataType.FLOAT16: np.dtype(np.float16),
    DataType.FLOAT32: np.dtype(np.float32),
    DataType.FLOAT64: np.dtype(np.float64),
    DataType.BOOL: np.dtype(np.bool_),
    DataType.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
}
_DATATYPE_OF = {v: k for k, v in _NUMPY_OF.items()}


def numpy_dtype(dt: DataType) -> np.dtype:
    """The numpy dtype that carries ``dt``."""
    dtype = _NUMPY_OF.get(dt)       # an int finds its DataType's entry: an IntEnum hashes as its value
    return dtype if dtype is not None else _NUMPY_OF[DataType(dt)]


def data_type_of(dtype: np.dtype) -> DataType:
    """The wire DataType of a numpy dtype; ValueError names the supported ones otherwise."""
    try:
        return _DATATYPE_OF[np.dtype(dtype)]
    except (KeyError, TypeError):
        supported = ", ".join(sorted(str(d) for d in _DATATYPE_OF))
        raise ValueError(
            f"Tensor type {dtype} is not supported. Supported types: {supported}. "
            "Cast the tensor to one of them before the collective."
        ) from None

