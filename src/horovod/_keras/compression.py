"""Gradient compression for Keras on any backend (``keras.ops.cast``): ``none``, ``fp16`` and (ours) ``bf16``;
``powersgd(...)`` on the TensorFlow backend only (``horovod/tensorflow/powersgd.py``).

``horovod.keras.Compression`` is this class; ``horovod.tensorflow.keras.Compression`` is upstream's
``horovod.tensorflow.Compression``. Both have the same ``compress``/``decompress`` interface, and the Keras
optimizer accepts either.
"""
from __future__ import annotations

import keras

from horovod.common.compression import CastCompressor, Compressor, NoneCompressor, PowerSGDCompressor  # noqa: F401


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

    @staticmethod
    def powersgd(matrix_approximation_rank: int = 1, start_powerSGD_iter: int = 1000,
                 min_compression_rate: float = 2, use_error_feedback: bool = True, warm_start: bool = True,
                 orthogonalization_epsilon: float = 0, random_seed: int = 0) -> PowerSGDCompressor:
        """PowerSGD (ours; DDP's ``powerSGD_hook`` with the names and defaults of its ``PowerSGDState``): each
        matrix gradient (``shape[0]`` x the rest) that compresses at least ``min_compression_rate`` times is
        exchanged as two rank-``matrix_approximation_rank`` factors, after ``start_powerSGD_iter`` plain steps,
        with error feedback and a warm-started Q. Only for ``DistributedOptimizer`` on the TensorFlow Keras
        backend, with op Average or Sum (it keeps state from step to step). See docs/compression.md."""
        return PowerSGDCompressor(matrix_approximation_rank, start_powerSGD_iter, min_compression_rate,
                                  use_error_feedback, warm_start, orthogonalization_epsilon, random_seed)
