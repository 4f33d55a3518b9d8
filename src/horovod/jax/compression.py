"""Gradient compression for allreduce on JAX arrays: ``Compression.none``, ``Compression.fp16`` and (as in
``horovod.torch``) ``Compression.bf16``. The casts are JAX operations, so they work under ``jit`` and ``grad``.
``Compression.powersgd(...)`` is DDP's PowerSGD for ``DistributedOptimizer`` (horovod/jax/powersgd.py)."""
from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from horovod.common.compression import (  # noqa: F401
    CastCompressor,
    Compressor,
    NoneCompressor,
    PowerSGDCompressor,
    powersgd,
)


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

    powersgd = staticmethod(powersgd)
