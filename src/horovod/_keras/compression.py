"""Gradient compression for Keras on any backend (``keras.ops.cast``): ``none``, ``fp16`` and (ours) ``bf16``;
``powersgd(...)`` on the TensorFlow backend only (``horovod/tensorflow/powersgd.py``).

``horovod.keras.Compression`` is this class; ``horovod.tensorflow.keras.Compression`` is upstream's
``horovod.tensorflow.Compression``. Both have the same ``compress``/``decompress`` interface, and the Keras
optimizer accepts either.
"""
from __future__ import annotations

import keras

from horovod.common.compression import (  # noqa: F401
    CastCompressor,
    Compressor,
    NoneCompressor,
    PowerSGDCompressor,
    powersgd,
)


class _CastCompressor(CastCompressor):
    """The cast hooks for this framework's tensors."""

    @staticmethod
    def dtype_of(tensor) -> str:
        return keras.backend.standardize_dtype(tensor.dtype)

    @staticmethod
    def is_floating(dtype: str) -> bool:
        return "float" in dtype

    @staticmethod
    def cast(tensor, dtype: str):
        return keras.ops.cast(tensor, dtype)


class FP16Compressor(_CastCompressor):
    """Send floating-point tensors as float16 (half the bytes), restore the dtype after."""

    wire_dtype = "float16"


class BF16Compressor(_CastCompressor):
    """Send floating-point tensors as bfloat16: float32's range with half the bytes (ours, not upstream's)."""

    wire_dtype = "bfloat16"


class Compression:
    """The compressors by name, as upstream exposes them."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor

    powersgd = staticmethod(powersgd)
