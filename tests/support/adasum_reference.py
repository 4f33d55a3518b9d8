"""A single-process reference of Adasum for the bindings' tests (tests/parallel/test_*_adasum.py).

It applies upstream's pairwise formula ``a (1 - a.b / 2|a|^2) + b (1 - a.b / 2|b|^2)`` (a coefficient stays 1
when its norm squared is below sqrt(DBL_MIN)) to whole float64 tensors, adjacent pairs first; at a size that is
not a power of two, rank ``r >= p`` (``p`` the largest power of two <= n) is first combined into leaf ``r - p``
(the fold documented in horovod/backends/adasum.py and docs/adasum.md). It shares no code with the data plane.
"""
from __future__ import annotations

import sys
from typing import Sequence

import numpy as np

TINY = sys.float_info.min ** 0.5


def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Adasum of two float64 tensors."""
    ab = float(np.vdot(a, b))
    aa, bb = float(np.vdot(a, a)), float(np.vdot(b, b))
    weight_a = 1.0 - ab / (2.0 * aa) if aa >= TINY else 1.0
    weight_b = 1.0 - ab / (2.0 * bb) if bb >= TINY else 1.0
    return weight_a * a + weight_b * b


def adasum(per_rank: Sequence[np.ndarray]) -> np.ndarray:
    """Adasum of one tensor's per-rank values (in rank order), computed in float64, rounded once to their dtype."""
    dtype = np.asarray(per_rank[0]).dtype
    nodes = [np.asarray(g, np.float64) for g in per_rank]
    p = 1 << (len(nodes).bit_length() - 1)
    for r in range(p, len(nodes)):
        nodes[r - p] = combine(nodes[r - p], nodes[r])
    nodes = nodes[:p]
    while len(nodes) > 1:
        nodes = [combine(nodes[i], nodes[i + 1]) for i in range(0, len(nodes), 2)]
    return nodes[0].astype(dtype)


def tolerance(dtype) -> dict:
    """Comparing a binding's result with :func:`adasum`: both round once from float64, up to a few ulps apart."""
    name = np.dtype(dtype).name
    return {"float16": dict(rtol=2e-3, atol=1e-3), "float32": dict(rtol=1e-5, atol=1e-6)}.get(
        name, dict(rtol=1e-12, atol=1e-12))
