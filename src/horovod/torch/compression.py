"""Gradient compression for allreduce: ``Compression.none``, ``Compression.fp16`` and (ours) ``Compression.bf16``
and ``Compression.powersgd(...)`` (DDP's PowerSGD, low-rank with error feedback: horovod/torch/powersgd.py)."""
from __future__ import annotations

import torch

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
    def dtype_of(tensor: torch.Tensor) -> torch.dtype:
        return tensor.dtype

    @staticmethod
    def is_floating(dtype: torch.dtype) -> bool:
        return dtype.is_floating_point

    @staticmethod
    def cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return tensor.type(dtype)


class FP16Compressor(_CastCompressor):
    """Send floating-point tensors as float16 (half the bytes), restore the dtype after."""

    wire_dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """Send floating-point tensors as bfloat16: float32's range with half the bytes (ours, not upstream's)."""

    wire_dtype = torch.bfloat16


class Compression:
    """The compressors by name, as upstream exposes them."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor

    powersgd = staticmethod(powersgd)
