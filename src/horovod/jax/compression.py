"""Gradient compression for allreduce on JAX arrays: ``Compression.none``, ``Compression.fp16`` and (as in
``horovod.torch``) ``Compression.bf16``. The casts are JAX operations, so they work under ``jit`` and ``grad``.
``Compression.powersgd(...)`` is DDP's PowerSGD for ``DistributedOptimizer`` (horovod/jax/powersgd.py)."""
from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from horovod.common.compression import CastCompressor, Compressor, NoneCompressor, PowerSGDCompressor  # noqa: F401


class _CastCompressor(CastCompressor):
    """The cast hooks for JAX arrays."""

    @staticmethod
    def dtype_of(tensor: Any) -> Any:
        return jnp.dtype(tensor.dtype)

    @staticmethod
    def is_floating(dtype: Any) -> bool:
        return jnp.issubdtype(dtype, jnp.floating)

    @staticmethod
    def cast(tensor: Any, dtype: Any) -> Any:
        return tensor.astype(dtype)


class FP16Compressor(_CastCompressor):
    """Send floating-point arrays as float16 (half the bytes), restore the dtype after."""

    wire_dtype = jnp.dtype(jnp.float16)


class BF16Compressor(_CastCompressor):
    """Send floating-point arrays as bfloat16: float32's range with half the bytes."""

    wire_dtype = jnp.dtype(jnp.bfloat16)


class Compression:
    """The compressors by name, as upstream exposes them."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor

    @staticmethod
    def powersgd(matrix_approximation_rank: int = 1, start_powerSGD_iter: int = 1000,
                 min_compression_rate: float = 2, use_error_feedback: bool = True, warm_start: bool = True,
                 orthogonalization_epsilon: float = 0, random_seed: int = 0) -> PowerSGDCompressor:
        """PowerSGD (ours; DDP's ``powerSGD_hook``, the names and defaults of its ``PowerSGDState``), for
        ``DistributedOptimizer`` only: each matrix leaf that compresses at least ``min_compression_rate`` times
        is exchanged as two rank-``matrix_approximation_rank`` factors after ``start_powerSGD_iter`` plain
        updates, with error feedback and a warm-started Q kept in the optax state. See docs/compression.md."""
        return PowerSGDCompressor(matrix_approximation_rank, start_powerSGD_iter, min_compression_rate,
                                  use_error_feedback, warm_start, orthogonalization_epsilon, random_seed)
