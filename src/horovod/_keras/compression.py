"""Gradient compression for Keras on any backend (``keras.ops.cast``): ``none``, ``fp16`` and (ours) ``bf16``.

``horovod.keras.Compression`` is this class; ``horovod.tensorflow.keras.Compression`` is upstream's
``horovod.tensorflow.Compression``. Both have the same ``compress``/``decompress`` interface, and the Keras
optimizer accepts either.
"""
from __future__ import annotations

from typing import Any, Tuple

import keras


class Compressor:
    """Interface: ``compress`` before the wire, ``decompress`` after it."""

    @staticmethod
    def compress(tensor: Any) -> Tuple[Any, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Leave tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    wire_dtype = "float16"

    @classmethod
    def compress(cls, tensor):
        dtype = keras.backend.standardize_dtype(tensor.dtype)
        if "float" in dtype and dtype != cls.wire_dtype:
            return keras.ops.cast(tensor, cls.wire_dtype), dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return keras.ops.cast(tensor, ctx) if ctx is not None else tensor


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
