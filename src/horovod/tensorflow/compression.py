"""Gradient compression for allreduce: ``Compression.none``, ``Compression.fp16`` and (ours) ``Compression.bf16``;
``Compression.powersgd(...)`` is DDP's PowerSGD for the tape and optimizers (horovod/tensorflow/powersgd.py)."""
from __future__ import annotations

import tensorflow as tf

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
    def dtype_of(tensor: tf.Tensor) -> tf.DType:
        return tensor.dtype

    @staticmethod
    def is_floating(dtype: tf.DType) -> bool:
        return dtype.is_floating

    @staticmethod
    def cast(tensor: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
        return tf.cast(tensor, dtype)


class FP16Compressor(_CastCompressor):
    """Send floating-point tensors as float16 (half the bytes), restore the dtype after."""

    wire_dtype = tf.float16


class BF16Compressor(_CastCompressor):
    """Send floating-point tensors as bfloat16: float32's range with half the bytes (ours, not upstream's)."""

    wire_dtype = tf.bfloat16


class Compression:
    """The compressors by name, as upstream exposes them."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor

    powersgd = staticmethod(powersgd)
