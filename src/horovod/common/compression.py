"""The compression schemes shared by the framework bindings. A cast compressor sends floating-point tensors as a
narrower wire dtype and restores them after the allreduce; each binding supplies three framework hooks.
PowerSGD's settings (:class:`PowerSGDCompressor`) are framework-free too; its algorithm is each binding's
(``horovod/torch/powersgd.py``, ``horovod/jax/powersgd.py``,
``horovod/tensorflow/powersgd.py``)."""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence, Tuple

from horovod.common.types import Adasum, ReduceOp


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
    def compress(tensor: Any) -> Tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class CastCompressor(Compressor):
    """Send floating-point tensors as ``wire_dtype`` and restore their dtype after. A binding subclasses it with
    ``dtype_of``, ``is_floating`` and ``cast`` for its tensors, then once per ``wire_dtype``."""

    wire_dtype: Any = None

    @staticmethod
    def dtype_of(tensor: Any) -> Any:
        raise NotImplementedError

    @staticmethod
    def is_floating(dtype: Any) -> bool:
        raise NotImplementedError

    @staticmethod
    def cast(tensor: Any, dtype: Any) -> Any:
        raise NotImplementedError

    @classmethod
    def compress(cls, tensor: Any) -> Tuple[Any, Any]:
        dtype = cls.dtype_of(tensor)
        if cls.is_floating(dtype) and dtype != cls.wire_dtype:
            return cls.cast(tensor, cls.wire_dtype), dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor: Any, ctx: Any) -> Any:
        return cls.cast(tensor, ctx) if ctx is not None else tensor


@dataclasses.dataclass(frozen=True)
class PowerSGDCompressor(Compressor):
    """PowerSGD's settings (``Compression.powersgd(...)``), with the names and defaults of DDP's
    ``PowerSGDState``. ``start_powerSGD_iter`` may be 0 or 1 here (DDP needs 2 because it rebuilds its buckets
    after the first step; there are no buckets to rebuild here).

    PowerSGD keeps state from step to step, so it works in a ``DistributedOptimizer`` only, which runs it on the
    gradients it compresses and allreduces the others as they are; ``compress`` refuses a single tensor.
    """

    matrix_approximation_rank: int = 1
    start_powerSGD_iter: int = 1000
    min_compression_rate: float = 2
    use_error_feedback: bool = True
    warm_start: bool = True
    orthogonalization_epsilon: float = 0
    random_seed: int = 0

    def __post_init__(self) -> None:
        rank = self.matrix_approximation_rank
        if int(rank) != rank or rank < 1:
            raise ValueError(f"matrix_approximation_rank must be an integer >= 1, got {rank!r} (1 to 4 is usual; "
                             "DDP's advice: start at 1 and double it until the accuracy is good enough)")
        if int(self.start_powerSGD_iter) != self.start_powerSGD_iter or self.start_powerSGD_iter < 0:
            raise ValueError(f"start_powerSGD_iter must be an integer >= 0, got {self.start_powerSGD_iter!r}")
        if self.orthogonalization_epsilon < 0:
            raise ValueError(f"orthogonalization_epsilon must be >= 0, got {self.orthogonalization_epsilon!r}")

    def compress(self, tensor: Any) -> Tuple[Any, Any]:
        raise ValueError("Compression.powersgd keeps state from step to step (error feedback, warm-start Q), so "
                         "it works in hvd.DistributedOptimizer only: pass it there, or use Compression.none, fp16 "
                         "or bf16 for a single allreduce")

    def decompress(self, tensor: Any, ctx: Any) -> Any:
        return self.compress(tensor)

    def approximation_rank(self, shape: Sequence[int]) -> int:
        """The rank ``r`` a gradient of ``shape`` is compressed to, or 0 when it is allreduced as it is (DDP's
        ``_should_compress``: ``(n + m) * r * min_compression_rate < n * m`` for its n x m matrix view
        ``grad.view(shape[0], -1)``)."""
        if len(shape) == 0:
            return 0
        n = int(shape[0])
        m = 1
        for d in shape[1:]:
            m *= int(d)
        r = min(n, m, int(self.matrix_approximation_rank))
        return r if r > 0 and (n + m) * r * self.min_compression_rate < n * m else 0


def powersgd(matrix_approximation_rank: int = 1, start_powerSGD_iter: int = 1000, min_compression_rate: float = 2,
             use_error_feedback: bool = True, warm_start: bool = True, orthogonalization_epsilon: float = 0,
             random_seed: int = 0) -> PowerSGDCompressor:
    """``Compression.powersgd(...)`` of every binding: PowerSGD (ours; DDP's ``powerSGD_hook`` with the names and
    defaults of its ``PowerSGDState``). Each matrix gradient (``shape[0]`` x the rest: a convolution kernel as
    out-channels x the rest) that compresses at least ``min_compression_rate`` times is exchanged as two
    rank-``matrix_approximation_rank`` factors, after ``start_powerSGD_iter`` plain steps, with error feedback
    and a warm-started Q. It keeps state from step to step, so it works where a gradient reducer keeps it: the
    ``DistributedOptimizer`` of torch, JAX, TensorFlow and Keras (on the TensorFlow backend) and horovod.tensorflow's
    ``DistributedGradientTape``, with op Average or Sum. See docs/compression.md."""
    return PowerSGDCompressor(matrix_approximation_rank, start_powerSGD_iter, min_compression_rate,
                              use_error_feedback, warm_start, orthogonalization_epsilon, random_seed)


def check_powersgd_op(compression: object, op: ReduceOp) -> None:
    """PowerSGD approximates a sum or mean of gradients: refuse ``op=Adasum`` with it, saying what to do."""
    if isinstance(compression, PowerSGDCompressor) and op == Adasum:
        raise ValueError("Compression.powersgd cannot be combined with op=hvd.Adasum: Adasum combines whole "
                         "weight deltas, PowerSGD approximates the average gradient. Use op=hvd.Average (or "
                         "hvd.Sum) with PowerSGD, or Adasum with Compression.none, fp16 or bf16.")
