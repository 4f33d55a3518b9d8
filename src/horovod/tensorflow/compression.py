"""Gradient compression for allreduce: ``Compression.none``, ``Compression.fp16`` and (ours) ``Compression.bf16``;
``Compression.powersgd(...)`` is DDP's PowerSGD for the tape and optimizers (horovod/tensorflow/powersgd.py)."""
from __future__ import annotations

import tensorflow as tf

from horovod.common.compression import CastCompressor, Compressor, NoneCompressor, PowerSGDCompressor  # noqa: F401


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

    @staticmethod
    def powersgd(matrix_approximation_rank: int = 1, start_powerSGD_iter: int = 1000,
                 min_compression_rate: float = 2, use_error_feedback: bool = True, warm_start: bool = True,
                 orthogonalization_epsilon: float = 0, random_seed: int = 0) -> PowerSGDCompressor:
        """PowerSGD (ours; DDP's ``powerSGD_hook`` with the names and defaults of its ``PowerSGDState``): each
        matrix gradient (``shape[0]`` x the rest) that compresses at least ``min_compression_rate`` times is
        exchanged as two rank-``matrix_approximation_rank`` factors, after ``start_powerSGD_iter`` plain steps,
        with error feedback and a warm-started Q. Only for ``DistributedGradientTape`` and ``DistributedOptimizer``
        (horovod.tensorflow, horovod.tensorflow.keras), with op Average or Sum (it keeps state from step
        to step). See docs/compression.md."""
        return PowerSGDCompressor(matrix_approximation_rank, start_powerSGD_iter, min_compression_rate,
                                  use_error_feedback, warm_start, orthogonalization_epsilon, random_seed)
