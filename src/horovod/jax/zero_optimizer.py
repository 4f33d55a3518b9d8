"""``ZeroRedundancyOptimizer``: ZeRO stage 1 as an optax ``GradientTransformation``: each rank of a process set
keeps the wrapped transformation's state for only the parameter leaves it owns (about 1/n of it).

Each update reduce-scatters the gradients (one grouped reducescatter of one flat buffer per dtype, laid out by
owner: ``horovod.common.zero_layout``), so every rank receives the averaged gradients of its own leaves; the
wrapped transformation updates those leaves (the others are ``optax.MaskedNode``s, as under ``optax.masked``);
and one grouped allgather hands every rank the updates of all leaves. Eagerly or inside ``jax.jit`` (ordered
host callbacks). See docs/zero.md.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from horovod.common.gradient_groups import scale_factors
from horovod.common.types import Average, ReduceOp, Sum
from horovod.common.zero_layout import BucketLayout, Param, layout, plan
from horovod.core import ops
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.jax.mpi_ops import grouped_allgather, grouped_reducescatter

__all__ = ["ZeroRedundancyOptimizer", "ZeroRedundancyOptimizerState"]


class ZeroRedundancyOptimizerState(NamedTuple):
    """The wrapped transformation's state over this rank's leaves (every other leaf an ``optax.MaskedNode``),
    the locally accumulated gradients (an empty tuple when ``backward_passes_per_step`` is 1) and their count."""

    inner_state: Any
    accumulated: Any
    count: jax.Array


class _Shards:
    """Who owns which leaf for the process set's size, one flat buffer layout per dtype, and the functions that
    pack leaves into buffers and cut them out again (jitted, so that an eager update compiles them once)."""

    def __init__(self, shapes: List[Tuple[int, ...]], dtypes: List[Any], size: int, rank: int) -> None:
        self.size, self.rank, self.shapes = size, rank, shapes
        described = [Param(int(np.prod(shape)), d.itemsize, d) for shape, d in zip(shapes, dtypes)]
        made = plan(described, size, sys.maxsize)              # one bucket per dtype: one callback does all
        self.owners = made.owners
        numels = [d.numel for d in described]
        self.buckets: List[Tuple[Any, BucketLayout]] = [
            (described[members[0]].kind, layout(members, made.owners, numels, size)) for members in made.buckets]
        self.pack_grads = jax.jit(self._pack_grads)
        self.owned_grads = jax.jit(self._owned_grads)
        self.pack_updates = jax.jit(self._pack_updates)
        self.all_updates = jax.jit(self._all_updates)

    def mine(self, index: int) -> bool:
        return self.owners[index] == self.rank

    def _pack_grads(self, leaves: List[Any]) -> List[jax.Array]:
        """One buffer per bucket: rank r's leaves in segment r, each segment zero-padded."""
        buffers = []
        for dtype, lay in self.buckets:
            parts: List[Any] = []
            for members, used in zip(lay.per_rank, lay.used):
                parts.extend(jnp.ravel(leaves[i]).astype(dtype) for i in members)
                parts.append(jnp.zeros(lay.segment - used, dtype))
            buffers.append(jnp.concatenate(parts))
        return buffers

    def _owned_grads(self, segments: List[jax.Array]) -> Dict[int, jax.Array]:
        """This rank's reduced gradients, by leaf index, cut out of its segments."""
        return {i: self._cut(segment, lay.offsets[i], i, dtype)
                for (dtype, lay), segment in zip(self.buckets, segments) for i in lay.per_rank[self.rank]}

    def _pack_updates(self, updates: List[Any]) -> List[jax.Array]:
        """This rank's updates of each bucket, padded to the segment (every rank sends as many)."""
        sends = []
        for dtype, lay in self.buckets:
            parts = [jnp.ravel(updates[i]).astype(dtype) for i in lay.per_rank[self.rank]]
            parts.append(jnp.zeros(lay.segment - lay.used[self.rank], dtype))
            sends.append(jnp.concatenate(parts))
        return sends

    def _all_updates(self, leaves: List[Any], gathered: List[jax.Array]) -> List[Any]:
        """Every leaf's update, cut out of the gathered buffers (in the dtype of ``leaves``)."""
        out = list(leaves)
        for (_, lay), flat in zip(self.buckets, gathered):
            for r, members in enumerate(lay.per_rank):
                for i in members:
                    out[i] = self._cut(flat, lay.padded_start(i, r), i, leaves[i].dtype)
        return out

    def _cut(self, flat: jax.Array, start: int, index: int, dtype: Any) -> jax.Array:
        numel = int(np.prod(self.shapes[index]))
        return flat[start:start + numel].reshape(self.shapes[index]).astype(dtype)

    def masked(self, treedef: Any, leaves: List[Any]) -> Any:
        """The tree with this rank's leaves, every other one an ``optax.MaskedNode``."""
        return jax.tree_util.tree_unflatten(treedef, [x if self.mine(i) else optax.MaskedNode()
                                                      for i, x in enumerate(leaves)])


def ZeroRedundancyOptimizer(optimizer: optax.GradientTransformation, process_set: ProcessSet = global_process_set,
                            backward_passes_per_step: int = 1, op: ReduceOp = Average,
                            gradient_predivide_factor: float = 1.0,
                            name: Optional[str] = None) -> optax.GradientTransformationExtraArgs:
    """Shard ``optimizer``'s state by parameter leaf over the ranks of ``process_set``.

    The updates it returns are those ``hvd.DistributedOptimizer(optimizer)`` would return (apply them with
    ``optax.apply_updates`` on every rank). ``backward_passes_per_step``, ``op`` (Average or Sum) and
    ``gradient_predivide_factor`` are ``DistributedOptimizer``'s; ``name`` names the collectives (default
    ``ZeroRedundancyOptimizer``; give two optimizers that run at once different names). At one rank, and on a
    rank outside ``process_set``, it is ``optimizer`` itself, with no collectives. ``optimizer`` sees only this
    rank's leaves: a transformation that combines leaves (``clip_by_global_norm``) would see a partial tree.
    """
    if ReduceOp(op) not in (Average, Sum):
        raise ValueError(f"ZeroRedundancyOptimizer reduces with op=Average or op=Sum (a reducescatter), not "
                         f"op={ReduceOp(op).name.capitalize()}; use hvd.DistributedOptimizer for other ops.")
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    prescale, postscale = scale_factors(op, gradient_predivide_factor)
    passes = int(backward_passes_per_step)
    name = name or "ZeroRedundancyOptimizer"
    cache: Dict[Any, _Shards] = {}

    def shards_of(leaves: List[Any]) -> _Shards:
        member = bool(process_set.included())
        size = ops.set_size(process_set) if member else 1
        rank = (ops.set_rank(process_set) or 0) if member else 0
        shapes = [tuple(np.shape(x)) for x in leaves]
        dtypes = [jnp.result_type(x) for x in leaves]
        key = (tuple(shapes), tuple(dtypes), size, rank)
        if key not in cache:
            cache[key] = _Shards(shapes, dtypes, size, rank)
        return cache[key]

    def init(params):
        leaves, treedef = jax.tree_util.tree_flatten(params)
        accumulated = jax.tree_util.tree_map(jnp.zeros_like, params) if passes > 1 else ()
        return ZeroRedundancyOptimizerState(optimizer.init(shards_of(leaves).masked(treedef, leaves)), accumulated,
                                            jnp.zeros((), jnp.int32))

    def sharded_update(grads, inner_state, params, extra):
        leaves, treedef = jax.tree_util.tree_flatten(grads)
        shards = shards_of(leaves)
        if shards.size == 1:
            return optimizer.update(grads, inner_state, params, **extra)
        segments = grouped_reducescatter(shards.pack_grads(leaves), name=f"{name}.grads", op=op,
                                         process_set=process_set, prescale_factor=prescale,
                                         postscale_factor=postscale)
        owned = shards.owned_grads(segments)
        owned_grads = [owned.get(i) for i in range(len(leaves))]
        owned_params = None if params is None else shards.masked(treedef, jax.tree_util.tree_leaves(params))
        updates, inner_state = optimizer.update(shards.masked(treedef, owned_grads), inner_state, owned_params,
                                                **extra)
        update_leaves = jax.tree_util.tree_flatten(updates, is_leaf=lambda x: isinstance(x, optax.MaskedNode))[0]
        sends = shards.pack_updates([None if isinstance(u, optax.MaskedNode) else u for u in update_leaves])
        gathered = grouped_allgather(sends, name=f"{name}.updates", process_set=process_set)
        return jax.tree_util.tree_unflatten(treedef, shards.all_updates(leaves, gathered)), inner_state

    def update(grads, state, params=None, **extra):
        if passes == 1:
            updates, inner = sharded_update(grads, state.inner_state, params, extra)
            return updates, ZeroRedundancyOptimizerState(inner, state.accumulated, state.count)
        accumulated = jax.tree_util.tree_map(jnp.add, state.accumulated, grads)
        count = state.count + 1

        def apply(_):
            updates, inner = sharded_update(accumulated, state.inner_state, params, extra)
            return updates, ZeroRedundancyOptimizerState(inner, jax.tree_util.tree_map(jnp.zeros_like, accumulated),
                                                         jnp.zeros((), jnp.int32))

        def skip(_):
            return (jax.tree_util.tree_map(jnp.zeros_like, grads),
                    ZeroRedundancyOptimizerState(state.inner_state, accumulated, count))

        if isinstance(count, jax.core.Tracer):
            return jax.lax.cond(count >= passes, apply, skip, None)
        return apply(None) if int(count) >= passes else skip(None)

    return optax.GradientTransformationExtraArgs(init, update)
