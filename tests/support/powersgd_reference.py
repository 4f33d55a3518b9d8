"""A single-process reference of PowerSGD (Vogels et al. 2019, as DDP's ``powerSGD_hook`` runs it) for the tests
of ``Compression.powersgd`` (tests/unit/test_powersgd.py, tests/parallel/test_torch_powersgd.py).

It simulates ``n`` ranks in one process, in float64 numpy, sharing no code with horovod/torch/powersgd.py: each
rank's gradient ``G_i`` of a compressed parameter becomes ``M_i = G_i + e_i`` (``e_i`` that rank's error
feedback), ``P = sum_i M_i Q`` (the allreduce of P is a Sum), ``P`` is orthonormalised (here with numpy's QR: the
result ``P P^T M`` does not depend on the signs of its columns, so it equals Gram-Schmidt's up to rounding),
``Q = mean_i M_i^T P`` (Sum: the sum), the reduced gradient is ``P Q^T`` and ``e_i = M_i - P Q^T``. Gradients of
parameters that are not compressed, and every gradient before ``start`` steps, are plainly averaged (summed).

The first ``Q`` follows the documented rule, horovod.torch's by default (:func:`first_q`: standard-normal float32
values from a ``torch.Generator`` seeded with ``crc32(f"{seed}.{name}.{step}")``, shape (m, r)); horovod.jax's
tests pass theirs. It is orthonormalised; with warm start the previous step's ``Q`` is used instead
(orthonormalised again).
"""
from __future__ import annotations

import zlib
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np


def matrix_shape(shape: Sequence[int], rank: int, min_rate: float) -> Optional[Tuple[int, int, int]]:
    """(n, m, r) for a gradient of ``shape`` that is compressed, else None."""
    if len(shape) == 0:
        return None
    n = int(shape[0])
    m = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    r = min(n, m, rank)
    return (n, m, r) if (n + m) * r * min_rate < n * m else None


def orthonormal(a: np.ndarray) -> np.ndarray:
    q, _ = np.linalg.qr(a)
    return q


def first_q(name: str, step: int, m: int, r: int, seed: int = 0) -> np.ndarray:
    import torch

    generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}.{name}.{step}".encode()))
    return torch.randn(m, r, generator=generator, dtype=torch.float32).double().numpy()


class PowerSGDReference:
    """``n`` ranks' PowerSGD, one step at a time: :meth:`step` takes every rank's gradients and returns the
    reduced gradient every rank gets."""

    def __init__(self, shapes: Dict[str, Sequence[int]], ranks: int, rank: int = 1, start: int = 0,
                 min_rate: float = 2, error_feedback: bool = True, warm_start: bool = True, seed: int = 0,
                 average: bool = True, first_q: Callable[..., np.ndarray] = first_q) -> None:
        self.ranks, self.start, self.seed, self.average = ranks, start, seed, average
        self.first_q = first_q
        self.error_feedback, self.warm_start = error_feedback, warm_start
        self.matrices = {name: matrix_shape(shape, rank, min_rate) for name, shape in shapes.items()}
        self.errors: List[Dict[str, np.ndarray]] = [{} for _ in range(ranks)]
        self.q: Dict[str, np.ndarray] = {}
        self.steps = 0

    def compressed(self) -> List[str]:
        return sorted(name for name, mat in self.matrices.items() if mat is not None)

    def step(self, per_rank: Sequence[Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
        assert len(per_rank) == self.ranks
        scale = 1.0 / self.ranks if self.average else 1.0
        out = {}
        for name, mat in self.matrices.items():
            grads = [np.asarray(g[name], np.float64) for g in per_rank]
            if mat is None or self.steps < self.start:
                out[name] = sum(grads) * scale
                continue
            n, m, r = mat
            ms = [g.reshape(n, m) + (self.errors[i].get(name, 0.0) if self.error_feedback else 0.0)
                  for i, g in enumerate(grads)]
            q = self.q.get(name) if self.warm_start else None
            q = orthonormal(self.first_q(name, self.steps, m, r, self.seed) if q is None else q)
            p = orthonormal(sum(mi @ q for mi in ms))
            q = sum(mi.T @ p for mi in ms) * scale
            approx = p @ q.T
            if self.error_feedback:
                for i, mi in enumerate(ms):
                    self.errors[i][name] = mi - approx
            if self.warm_start:
                self.q[name] = q
            out[name] = approx.reshape(grads[0].shape)
        self.steps += 1
        return out
