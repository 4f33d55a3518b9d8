"""PowerSGD for ``horovod.jax``'s ``DistributedOptimizer`` (ours): the algorithm of ``horovod/torch/powersgd.py``
(DDP's ``powerSGD_hook``) on a gradient pytree, with its state in the optax state
(``DistributedOptimizerState.powersgd``), eagerly and inside ``jax.jit``.

Each leaf is viewed as an n x m matrix (``leaf.reshape(shape[0], -1)``) and compressed when
``(n + m) * r * min_compression_rate < n * m`` (``r = min(n, m, R)``). For the first ``start_powerSGD_iter``
updates the whole pytree goes as one grouped allreduce, as without PowerSGD. After that, per update: the leaves
that are not compressed as one grouped allreduce; then ``M += error``, ``P = M Q``, one grouped allreduce (Sum)
of every ``P``, Gram-Schmidt, ``Q = M^T P``, one grouped allreduce of every ``Q`` (the optimizer's op: Average
gives the mean), ``M ~ P Q^T``, ``error = M - P Q^T``. Under ``jit`` the choice is a ``lax.cond`` on the step
count, which is the same on every rank. The first ``Q`` of a leaf is ``jax.random.normal`` (float32, cast to
the leaf's dtype) from ``fold_in(PRNGKey(crc32(f"{random_seed}.{path}")), step)`` (``path`` is
``jax.tree_util.keystr`` of the leaf; the step is ``start_powerSGD_iter`` with warm start, every step without),
so every rank draws the same ``Q``. On a process set of one rank nothing is compressed.
"""
from __future__ import annotations

import functools
import math
import zlib
from typing import Any, List, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp

from horovod.common.compression import PowerSGDCompressor
from horovod.common.types import ReduceOp, Sum
from horovod.core import ops
from horovod.core.process_sets import ProcessSet
from horovod.jax.mpi_ops import grouped_allreduce


class PowerSGDState(NamedTuple):
    """Per leaf of the gradient pytree (flattened), ``Q`` (m x r) and this rank's error feedback (n x m), None
    for a leaf that is not compressed (and for the error without error feedback); ``step`` counts the updates
    that reduced gradients."""

    step: jax.Array
    q: Tuple[Optional[jax.Array], ...]
    error: Tuple[Optional[jax.Array], ...]


def _seed(settings: PowerSGDCompressor, path: str) -> int:
    return zlib.crc32(f"{settings.random_seed}.{path}".encode()) & 0x7FFFFFFF


# The arithmetic is compiled once per shape (eagerly, every operation would be dispatched, and compiled, alone).
@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _draw_q(seed: jax.Array, step: jax.Array, m: int, r: int, dtype: Any) -> jax.Array:
    key = jax.random.fold_in(jax.random.PRNGKey(seed), step)
    return jax.random.normal(key, (m, r), jnp.float32).astype(dtype)


def _matrix(shape) -> Tuple[int, int]:
    return int(shape[0]), math.prod(int(d) for d in shape[1:])


def init(settings: PowerSGDCompressor, params: Any) -> PowerSGDState:
    """The state for gradients shaped like ``params``: the first ``Q``s, zero error feedback."""
    qs: List[Optional[jax.Array]] = []
    errors: List[Optional[jax.Array]] = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        r = settings.approximation_rank(leaf.shape)
        if not r:
            qs.append(None)
            errors.append(None)
            continue
        n, m = _matrix(leaf.shape)
        qs.append(_draw_q(_seed(settings, jax.tree_util.keystr(path)), settings.start_powerSGD_iter, m, r,
                          jnp.dtype(leaf.dtype)))
        errors.append(jnp.zeros((n, m), leaf.dtype) if settings.use_error_feedback else None)
    return PowerSGDState(jnp.zeros((), jnp.int32), tuple(qs), tuple(errors))


def orthogonalize(matrix: jax.Array, epsilon: float = 0.0) -> jax.Array:
    """``matrix`` (n x r) with orthonormal columns, by DDP's Gram-Schmidt (a zero column stays zero when
    ``epsilon`` is 0; else each column is divided by its norm plus ``epsilon``)."""
    for i in range(matrix.shape[1]):
        col = matrix[:, i:i + 1]
        norm = jnp.linalg.norm(col)
        if epsilon == 0:
            col = col * jnp.where(norm > 0, 1.0 / jnp.where(norm > 0, norm, 1.0), 0.0)
        else:
            col = col / (norm + epsilon)
        matrix = matrix.at[:, i:i + 1].set(col)
        if i + 1 < matrix.shape[1]:
            rest = matrix[:, i + 1:]
            matrix = matrix.at[:, i + 1:].set(rest - col * jnp.sum(col * rest, axis=0, keepdims=True))
    return matrix


# Compiled once per shape: eagerly, its column-by-column updates would each be dispatched (and compiled) alone.
@functools.partial(jax.jit, static_argnums=3)
def _first_round(leaf: jax.Array, error: Optional[jax.Array], q: jax.Array,
                 epsilon: float) -> Tuple[jax.Array, jax.Array, jax.Array]:
    """(M with the error feedback added, Q orthonormalised, P = M Q)."""
    matrix = leaf.reshape(leaf.shape[0], -1)
    if error is not None:
        matrix = matrix + error
    q = orthogonalize(q, epsilon)
    return matrix, q, matrix @ q


@functools.partial(jax.jit, static_argnums=2)
def _second_round(matrix: jax.Array, p: jax.Array, epsilon: float) -> Tuple[jax.Array, jax.Array]:
    """(P orthonormalised, Q = M^T P)."""
    p = orthogonalize(p, epsilon)
    return p, matrix.T @ p


@jax.jit
def _approximate(matrix: jax.Array, p: jax.Array, q: jax.Array) -> Tuple[jax.Array, jax.Array]:
    """(P Q^T, M - P Q^T)."""
    approximation = p @ q.T
    return approximation, matrix - approximation


def reduce(settings: PowerSGDCompressor, grads: Any, state: PowerSGDState, op: ReduceOp, prescale: float,
           postscale: float, process_set: ProcessSet, name: str) -> Tuple[Any, PowerSGDState]:
    """The reduced gradients (PowerSGD's approximation for the compressed leaves from ``start_powerSGD_iter``
    on) and the next state."""
    leaves, treedef = jax.tree_util.tree_flatten(grads)
    compressed = [i for i, q in enumerate(state.q) if q is not None]
    step = state.step + 1

    def plain(_):
        if ops.set_size(process_set) == 1:
            return list(leaves), state._replace(step=step)
        out = grouped_allreduce(leaves, name=name, op=op, prescale_factor=prescale, postscale_factor=postscale,
                                process_set=process_set)
        return list(out), state._replace(step=step)

    def powersgd(_):
        out = list(leaves)
        rest = [i for i in range(len(leaves)) if i not in compressed]
        if rest:
            reduced = grouped_allreduce([leaves[i] for i in rest], name=f"{name}.rest", op=op,
                                        prescale_factor=prescale, postscale_factor=postscale,
                                        process_set=process_set)
            for i, value in zip(rest, reduced):
                out[i] = value
        epsilon = float(settings.orthogonalization_epsilon)
        paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(grads)[0]]
        matrices, ps = [], []
        for i in compressed:
            q = state.q[i]
            if not settings.warm_start:
                q = _draw_q(_seed(settings, paths[i]), state.step, q.shape[0], q.shape[1], jnp.dtype(q.dtype))
            error = state.error[i] if settings.use_error_feedback else None
            matrix, _q, p = _first_round(leaves[i], error, q, epsilon)
            matrices.append(matrix)
            ps.append(p)
        ps = grouped_allreduce(ps, name=f"{name}.powersgd.p", op=Sum, process_set=process_set)
        ps, qs = zip(*[_second_round(matrix, p, epsilon) for matrix, p in zip(matrices, ps)])
        qs = grouped_allreduce(list(qs), name=f"{name}.powersgd.q", op=op, prescale_factor=prescale,
                               postscale_factor=postscale, process_set=process_set)
        new_q, new_error = list(state.q), list(state.error)
        for i, matrix, p, q in zip(compressed, matrices, ps, qs):
            approximation, error = _approximate(matrix, p, q)
            out[i] = approximation.reshape(leaves[i].shape)
            if settings.use_error_feedback:
                new_error[i] = error
            if settings.warm_start:
                new_q[i] = q
        return out, PowerSGDState(step, tuple(new_q), tuple(new_error))

    if not compressed or ops.set_size(process_set) == 1:
        out, state = plain(None)
    elif isinstance(state.step, jax.core.Tracer):
        out, state = jax.lax.cond(state.step >= settings.start_powerSGD_iter, powersgd, plain, None)
    else:
        out, state = (powersgd if int(state.step) >= settings.start_powerSGD_iter else plain)(None)
    return jax.tree_util.tree_unflatten(treedef, out), state
