"""``DistributedOptimizer``: an optax ``GradientTransformation`` that averages the gradients across ranks
before the wrapped transformation sees them.

The whole gradient pytree goes as ONE grouped allreduce per step (negotiated and fused as one unit), eagerly or
inside a jitted train step (an ordered host callback there). ``backward_passes_per_step=N`` accumulates N
gradients locally (summed, as ``horovod.torch`` does) and allreduces and applies them on every N-th update;
the other updates are zero and leave the wrapped state alone. With ``compression=Compression.powersgd(...)``
the matrices go through PowerSGD instead (horovod/jax/powersgd.py), its state in ``DistributedOptimizerState``.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from horovod.common.compression import PowerSGDCompressor, check_powersgd_op
from horovod.common.gradient_groups import check_predivide, scale_factors
from horovod.common.types import Average, ReduceOp
from horovod.core import ops
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.jax import powersgd
from horovod.jax.compression import Compression
from horovod.jax.mpi_ops import grouped_allreduce

__all__ = ["DistributedOptimizer", "DistributedOptimizerState", "allreduce_gradients"]


class DistributedOptimizerState(NamedTuple):
    """The wrapped transformation's state, the locally accumulated gradients (an empty tuple when
    ``backward_passes_per_step`` is 1), how many have been accumulated, and PowerSGD's state
    (``horovod.jax.powersgd.PowerSGDState``; an empty tuple without PowerSGD)."""

    inner_state: Any
    accumulated: Any
    count: jax.Array
    powersgd: Any = ()


def allreduce_gradients(grads: Any, op: ReduceOp = Average, compression=Compression.none,
                        gradient_predivide_factor: float = 1.0, process_set: ProcessSet = global_process_set,
                        name: Optional[str] = None) -> Any:
    """Reduce a gradient pytree across ranks with one grouped allreduce (Average by default, with
    ``gradient_predivide_factor`` split before and after the sum). At one rank it returns ``grads`` as they are
    (an average over one rank)."""
    leaves, treedef = jax.tree_util.tree_flatten(grads)
    if not leaves or ops.set_size(process_set) == 1:
        return grads
    prescale, postscale = scale_factors(op, gradient_predivide_factor)
    reduced = grouped_allreduce(leaves, name=name, compression=compression, op=op, prescale_factor=prescale,
                                postscale_factor=postscale, process_set=process_set)
    return jax.tree_util.tree_unflatten(treedef, reduced)


def DistributedOptimizer(optimizer: optax.GradientTransformation, compression=Compression.none,
                         backward_passes_per_step: int = 1, op: ReduceOp = Average,
                         gradient_predivide_factor: float = 1.0, process_set: ProcessSet = global_process_set,
                         name: Optional[str] = None) -> optax.GradientTransformation:
    """Wrap an optax transformation so that gradients are averaged across ranks before every update.

    Arguments follow ``horovod.torch.DistributedOptimizer``: ``compression`` (``Compression.none``, ``.fp16``,
    ``.bf16``, or ``Compression.powersgd(...)``: docs/compression.md), ``backward_passes_per_step`` (local
    accumulation), ``op`` (Average by default; Sum, Adasum ...), ``gradient_predivide_factor`` (Average only)
    and ``process_set``. ``name`` names the grouped allreduce
    (default ``DistributedOptimizer``; give two optimizers that run at once different names).
    """
    check_predivide(op, gradient_predivide_factor)
    check_powersgd_op(compression, op)
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    passes = int(backward_passes_per_step)
    name = name or "DistributedOptimizer"

    lowrank = isinstance(compression, PowerSGDCompressor)

    def reduce(grads, lowrank_state):
        """(the reduced gradients, PowerSGD's next state)."""
        if lowrank:
            return powersgd.reduce(compression, grads, lowrank_state, op,
                                   *scale_factors(op, gradient_predivide_factor), process_set, name)
        return allreduce_gradients(grads, op, compression, gradient_predivide_factor, process_set, name), ()

    def init(params):
        accumulated = jax.tree_util.tree_map(jnp.zeros_like, params) if passes > 1 else ()
        return DistributedOptimizerState(optimizer.init(params), accumulated, jnp.zeros((), jnp.int32),
                                         powersgd.init(compression, params) if lowrank else ())

    def update(grads, state, params=None, **extra):
        if passes == 1:
            reduced, lowrank_state = reduce(grads, state.powersgd)
            updates, inner = optimizer.update(reduced, state.inner_state, params, **extra)
            return updates, DistributedOptimizerState(inner, state.accumulated, state.count, lowrank_state)
        accumulated = jax.tree_util.tree_map(jnp.add, state.accumulated, grads)
        count = state.count + 1

        def apply(_):
            reduced, lowrank_state = reduce(accumulated, state.powersgd)
            updates, inner = optimizer.update(reduced, state.inner_state, params, **extra)
            return updates, DistributedOptimizerState(inner, jax.tree_util.tree_map(jnp.zeros_like, accumulated),
                                                      jnp.zeros((), jnp.int32), lowrank_state)

        def skip(_):
            return (jax.tree_util.tree_map(jnp.zeros_like, grads),
                    DistributedOptimizerState(state.inner_state, accumulated, count, state.powersgd))

        if isinstance(count, jax.core.Tracer):
            return jax.lax.cond(count >= passes, apply, skip, None)
        return apply(None) if int(count) >= passes else skip(None)

    return optax.GradientTransformationExtraArgs(init, update)
