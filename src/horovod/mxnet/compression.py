"""Gradient compression for allreduce: ``Compression.none`` and ``Compression.fp16``, as upstream's MXNet binding."""
from __future__ import annotations

import mxnet as mx
import numpy as np

from horovod.common.compression import CastCompressor, Compressor, NoneCompressor  # noqa: F401


class _CastCompressor(CastCompressor):
    """The cast hooks for NDArrays."""

    @staticmethod
    def dtype_of(tensor: mx.nd.NDArray) -> np.dtype:
        return np.dtype(tensor.dtype)

    @staticmethod
    def is_floating(dtype: np.dtype) -> bool:
        return np.issubdtype(dtype, np.floating)

    @staticmethod
    def cast(tensor: mx.nd.NDArray, dtype) -> mx.nd.NDArray:
        return tensor.astype(dtype, copy=False)


class FP16Compressor(_CastCompressor):
    """Send floating-point NDArrays as float16 (half the bytes), restore the dtype after."""

    wire_dtype = np.dtype(np.float16)


class Compression:
    """The compressors by name, as upstream exposes them."""

    none = NoneCompressor
    fp16 = FP16Compressor
