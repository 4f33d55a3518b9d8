"""Gradient compression for allreduce: ``Compression.none``, ``Compression.fp16`` and (ours) ``Compression.bf16``
and ``Compression.powersgd(...)`` (DDP's PowerSGD, low-rank with error feedback: horovod/torch/powersgd.py)."""
from __future__ import annotations

import torch

from horovod.common.compression import CastCompressor, Compressor, NoneCompressor, PowerSGDCompressor  # noqa: F401


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

    @staticmethod
    def powersgd(matrix_approximation_rank: int = 1, start_powerSGD_iter: int = 1000,
                 min_compression_rate: float = 2, use_error_feedback: bool = True, warm_start: bool = True,
                 orthogonalization_epsilon: float = 0, random_seed: int = 0) -> PowerSGDCompressor:
        """PowerSGD (ours; DDP's ``powerSGD_hook`` with the names and defaults of its ``PowerSGDState``): each
        matrix gradient (convolution kernels as out-channels x the rest) that compresses at least
        ``min_compression_rate`` times is exchanged as two rank-``matrix_approximation_rank`` factors, after
        ``start_powerSGD_iter`` plain steps, with error feedback and a warm-started Q. Only for
        ``DistributedOptimizer`` with op Average or Sum (it keeps per-parameter state from step to step).
        See docs/compression.md."""
        return PowerSGDCompressor(matrix_approximation_rank, start_powerSGD_iter, min_compression_rate,
                                  use_error_feedback, warm_start, orthogonalization_epsilon, random_seed)
