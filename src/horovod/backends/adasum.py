"""Adasum, the scale-invariant pairwise reduction, on any data plane (only the Backend primitives are used).

Upstream (``horovod/common/ops/adasum/adasum.h``) combines two gradients ``a`` and ``b`` of one tensor as::

    a' = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

where a coefficient stays 1 when its norm squared is below ``sqrt(DBL_MIN)``, and combines the ranks as a
binary tree of adjacent pairs: (0,1), (2,3), ...; then (01) with (23); and so on. Every tree node is a linear
combination of the ranks' gradients, so the whole result is ``sum_i w_i g_i`` with weights that depend only on
the Gram matrix ``G[i][k] = <g_i, g_k>`` of the tensor. This module computes it that way:

1. an alltoallv gives each rank a segment of every rank's (fused) vector: an ``(n, m)`` block;
2. each rank computes, per tensor, the partial Gram matrix of its segment in float64 (chunks and BLAS);
3. one small float64 Sum allreduce of the partials (upper triangles) gives every rank each tensor's Gram matrix;
4. :func:`tree_weights` turns a Gram matrix into the tree's weights;
5. each rank forms its segment of ``sum_i w_i g_i`` in float64 and casts it once to the dtype; an allgatherv
   assembles the result.

It moves as much data as a ring allreduce, plus one allreduce of ``tensors * n(n+1)/2`` doubles. Intermediate
tree nodes are never rounded to the tensor's dtype, so it is more accurate than upstream's float16 path.
Sizes that are not a power of two (which upstream refuses) are folded: with ``p`` the largest power of two
``<= n``, rank ``r >= p`` is first combined into leaf ``r - p`` as ``Adasum(g_{r-p}, g_r)``, then the binary
tree runs over the ``p`` leaves. See docs/adasum.md.
"""
from __future__ import annotations

import math
import sys
from typing import Callable, List, Sequence, Tuple

import numpy as np

from horovod.backends.base import Backend
from horovod.backends.blocks import split_counts
from horovod.backends.reduce import scaled_copy
from horovod.common.types import ReduceOp

SQRT_DBL_MIN = math.sqrt(sys.float_info.min)       # upstream's sqrt_double_min
WIDE_ELEMENTS = 1 << 19                             # float64 elements converted at a time (4 MiB), all rows
GEMM_RANKS = 16                                     # above this many rows, one matmul per chunk for the Gram
ADASUM_DTYPES = frozenset({np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)})

Scratch = Callable[[str, int, np.dtype], np.ndarray]
Piece = Tuple[int, int, int]                        # (tensor index, start, stop) inside this rank's segment


def check_dtype(dtype: np.dtype) -> None:
    """Raise TypeError unless Adasum can reduce tensors of ``dtype`` (float16, float32, float64: upstream's)."""
    if np.dtype(dtype) not in ADASUM_DTYPES:
        raise TypeError(f"The Adasum reduction supports float16, float32 and float64 tensors only, not "
                        f"{np.dtype(dtype).name}; cast the tensor to a floating type or use op=Average or Sum.")


# ------------------------------------------------------------------------------------------------ weights
def _pair(gram: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Coefficients of Adasum(u, v) where ``u = sum a_i g_i`` and ``v = sum b_i g_i`` (upstream's arithmetic)."""
    ga = np.einsum("...ij,...j->...i", gram, a)
    gb = np.einsum("...ij,...j->...i", gram, b)
    dot = np.einsum("...i,...i->...", b, ga)
    anorm = np.einsum("...i,...i->...", a, ga)
    bnorm = np.einsum("...i,...i->...", b, gb)
    acoeff = np.ones_like(dot)
    bcoeff = np.ones_like(dot)
    big_a, big_b = anorm >= SQRT_DBL_MIN, bnorm >= SQRT_DBL_MIN
    acoeff[big_a] = 1.0 - dot[big_a] / anorm[big_a] * 0.5
    bcoeff[big_b] = 1.0 - dot[big_b] / bnorm[big_b] * 0.5
    return acoeff[..., None] * a + bcoeff[..., None] * b


def tree_weights(gram: np.ndarray) -> np.ndarray:
    """The weights ``w`` with ``Adasum(g_0, ..., g_{n-1}) = sum_i w_i g_i``, from the Gram matrix alone.

    ``gram`` has shape ``(..., n, n)`` (one matrix per tensor); the result has shape ``(..., n)``. The tree is
    upstream's (adjacent pairs, level by level) for power-of-two ``n``, and the documented fold otherwise.
    """
    gram = np.asarray(gram, np.float64)
    n = gram.shape[-1]
    if n == 0 or gram.shape[-2] != n:
        raise ValueError(f"tree_weights needs square Gram matrices with at least one rank, got {gram.shape}")
    unit = np.broadcast_to(np.eye(n), gram.shape)
    p = 1 << (n.bit_length() - 1)
    nodes = [unit[..., i, :] for i in range(p)]
    for r in range(p, n):
        nodes[r - p] = _pair(gram, nodes[r - p], unit[..., r, :])
    while len(nodes) > 1:
        nodes = [_pair(gram, nodes[i], nodes[i + 1]) for i in range(0, len(nodes), 2)]
    return np.array(nodes[0], np.float64)


# ------------------------------------------------------------------------------------------------ kernels
def tensor_pieces(bounds: np.ndarray, lo: int, hi: int) -> List[Piece]:
    """Each tensor's part of the global range ``[lo, hi)``, as (tensor, start, stop) relative to ``lo``.

    ``bounds`` holds every tensor's global start and, last, the total (``len(tensors) + 1`` numbers).
    """
    pieces: List[Piece] = []
    k = max(int(np.searchsorted(bounds, lo, side="right")) - 1, 0)
    while k < len(bounds) - 1 and bounds[k] < hi:
        start, stop = max(int(bounds[k]), lo), min(int(bounds[k + 1]), hi)
        if stop > start:
            pieces.append((k, start - lo, stop - lo))
        k += 1
    return pieces


def chunk_columns(rows: int) -> int:
    """Columns converted to float64 at a time for ``rows`` ranks: 4 MiB in all, at least 4096 per row."""
    return max(4096, WIDE_ELEMENTS // max(rows, 1))


def _chunks(start: int, stop: int, step: int):
    for lo in range(start, stop, step):
        yield lo, min(lo + step, stop)


def _wide(block: np.ndarray, buf: np.ndarray) -> np.ndarray:
    """``block`` (n rows) as float64: itself for float64, else converted into ``buf``."""
    if block.dtype == np.float64:
        return block
    out = buf[:, :block.shape[1]]
    np.copyto(out, block)
    return out


def partial_gram(rows: np.ndarray, pieces: Sequence[Piece], tensors: int, buf: np.ndarray) -> np.ndarray:
    """Per tensor, ``<g_i, g_k>`` over the columns of ``rows`` (shape (n, m)) that belong to it, in float64."""
    n = rows.shape[0]
    gram = np.zeros((tensors, n, n))
    pairs = [(i, j) for i in range(n) for j in range(i, n)]
    for k, start, stop in pieces:
        acc = gram[k]
        for lo, hi in _chunks(start, stop, buf.shape[1]):
            block = _wide(rows[:, lo:hi], buf)
            if n > GEMM_RANKS:
                acc += block @ block.T
                continue
            for i, j in pairs:                      # BLAS dot beats a 2x2 gemm on long rows by 2x
                acc[i, j] += np.dot(block[i], block[j])
    if n <= GEMM_RANKS:
        upper = np.triu_indices(n, 1)
        gram[:, upper[1], upper[0]] = gram[:, upper[0], upper[1]]
    return gram


def combine(weights: np.ndarray, rows: np.ndarray, pieces: Sequence[Piece], out: np.ndarray,
            buf: np.ndarray, line: np.ndarray) -> None:
    """``out[cols] = weights[k] @ rows[:, cols]`` for each tensor k's columns, in float64, rounded once."""
    for k, start, stop in pieces:
        w = weights[k]
        for lo, hi in _chunks(start, stop, buf.shape[1]):
            block = _wide(rows[:, lo:hi], buf)
            if out.dtype == np.float64:
                np.dot(w, block, out=out[lo:hi])
            else:
                acc = line[:hi - lo]
                np.dot(w, block, out=acc)
                np.copyto(out[lo:hi], acc, casting="same_kind")


def _summed_gram(plane: Backend, gram: np.ndarray) -> np.ndarray:
    """Sum the Gram partials over ``plane``'s ranks, sending only the upper triangles."""
    n = gram.shape[-1]
    upper = np.triu_indices(n)
    packed = np.ascontiguousarray(gram[:, upper[0], upper[1]])
    plane.allreduce_buffer(packed.reshape(-1), ReduceOp.SUM)
    full = np.empty_like(gram)
    full[:, upper[0], upper[1]] = packed
    full[:, upper[1], upper[0]] = packed
    return full


# ------------------------------------------------------------------------------------------------ collective
def reduce_vector(data: Backend, gram_plane: Backend, vec: np.ndarray, out: np.ndarray, bounds: np.ndarray,
                  offset: int, scale: float, scratch: Scratch) -> None:
    """Adasum of ``vec`` across ``data``'s ranks into ``out`` (which may be ``vec``), times ``scale``.

    ``vec`` is elements ``[offset, offset + vec.size)`` of the fused vector whose tensors start at ``bounds``
    (with the total last). ``gram_plane`` sums the Gram partials; it is ``data`` itself, or a larger group
    whose other ranks reduce the other parts of the fused vector (the hierarchical variant), so that every
    tensor's dot products cover the whole tensor.
    """
    n, rank = data.size, data.rank
    counts = split_counts(vec.size, n)
    m = counts[rank]
    rows = scratch("adasum.rows", n * m, vec.dtype).reshape(n, m)
    data.alltoallv(vec, counts, rows.reshape(-1), [m] * n, max_count=max(counts))
    lo = offset + sum(counts[:rank])
    pieces = tensor_pieces(bounds, lo, lo + m)
    columns = chunk_columns(n)
    buf = scratch("adasum.wide", n * columns, np.dtype(np.float64)).reshape(n, columns)
    gram = _summed_gram(gram_plane, partial_gram(rows, pieces, len(bounds) - 1, buf))
    weights = tree_weights(gram) * scale
    mine = scratch("adasum.result", m, vec.dtype)
    combine(weights, rows, pieces, mine, buf, scratch("adasum.line", columns, np.dtype(np.float64)))
    data.allgatherv(mine, out, counts)


def tensor_bounds(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Where each of ``arrays`` starts in their concatenation, then the total."""
    return np.concatenate([[0], np.cumsum([a.size for a in arrays], dtype=np.int64)]).astype(np.int64)


def gather_input(backend: Backend, inputs: List[np.ndarray], prescale: float) -> np.ndarray:
    """The fused, prescaled vector: ``inputs[0]`` itself when there is nothing to fuse or scale."""
    if len(inputs) == 1 and prescale == 1.0:
        return inputs[0]
    buf = backend.fusion_buffer(sum(a.size for a in inputs), inputs[0].dtype)
    offset = 0
    for a in inputs:
        scaled_copy(buf[offset:offset + a.size], a, prescale)
        offset += a.size
    return buf


def scatter_output(fused: np.ndarray, outputs: List[np.ndarray]) -> None:
    """Copy the fused result into each output (nothing to do when it already is the only output)."""
    if len(outputs) == 1 and fused is outputs[0]:
        return
    offset = 0
    for out in outputs:
        np.copyto(out, fused[offset:offset + out.size])
        offset += out.size


def plane_adasum(plane: Backend, inputs: List[np.ndarray], outputs: List[np.ndarray], prescale: float = 1.0,
                 postscale: float = 1.0) -> None:
    """Adasum of each ``inputs[i]`` across ``plane``'s ranks into ``outputs[i]`` (float16/32/64; docs/adasum.md).

    A plane with an Adasum of its own defines an ``adasum`` method with these arguments, and that runs (one
    rank: a scaled copy; hierarchical: the flat algorithm, or Adasum across hosts of the host sums). On every
    other plane the Gram-matrix algorithm runs on the plane's alltoallv, allreduce and allgatherv
    (:func:`adasum_allreduce`). A rank that joined passes zeros, which leave the others' result unchanged.
    """
    own = getattr(plane, "adasum", None)
    if own is not None:
        own(inputs, outputs, prescale, postscale)
    else:
        adasum_allreduce(plane, inputs, outputs, prescale, postscale)


def adasum_allreduce(backend: Backend, inputs: List[np.ndarray], outputs: List[np.ndarray],
                     prescale: float = 1.0, postscale: float = 1.0) -> None:
    """Adasum of each ``inputs[i]`` across ``backend``'s ranks into ``outputs[i]`` (the flat algorithm)."""
    check_dtype(inputs[0].dtype)
    vec = gather_input(backend, inputs, prescale)
    out = outputs[0] if len(outputs) == 1 else vec      # a fused batch: the result replaces the input
    reduce_vector(backend, backend, vec, out, tensor_bounds(inputs), 0, postscale, backend.scratch)
    scatter_output(out, outputs)
