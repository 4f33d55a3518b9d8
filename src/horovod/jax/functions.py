"""Broadcast of parameter and optimizer-state pytrees, and the object helpers.

JAX arrays are immutable, so ``broadcast_variables`` returns the broadcast pytree instead of writing in place.
It works on any pytree (dicts, lists, optax states, Flax ``FrozenDict``s and ``TrainState``s): array leaves are
broadcast (all started, then all awaited, named by their tree path so that every rank pairs them alike),
other leaves (Python numbers, strings) travel as one pickled object.
"""
from __future__ import annotations

from typing import Any, List, Optional

import jax
import numpy as np

from horovod.core import ops
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.jax import host_ops
from horovod.jax.arrays import shapes_of
from horovod.jax.host_calls import call_on_host

__all__ = ["broadcast_variables", "broadcast_parameters", "broadcast_object", "allgather_object"]


def _is_array(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, jax.core.Tracer, np.ndarray))


def broadcast_variables(variables: Any, root_rank: int = 0, process_set: ProcessSet = global_process_set,
                        name: str = "broadcast_variables") -> Any:
    """Return ``variables`` (any pytree) with every leaf replaced by ``root_rank``'s; works under jit.

    Typical use, once after init: ``params = hvd.broadcast_variables(params, root_rank=0)`` and the same for the
    optax state, so that every rank starts from rank 0's values.
    """
    leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(variables)
    leaves = [leaf for _, leaf in leaves_with_paths]
    positions = [i for i, leaf in enumerate(leaves) if _is_array(leaf)]
    arrays = [jax.numpy.asarray(leaves[i]) for i in positions]
    names = [f"{name}.{jax.tree_util.keystr(leaves_with_paths[i][0])}" for i in positions]
    out = list(leaves)
    if arrays:
        fn = host_ops.broadcast_many(int(root_rank), names, process_set)
        for i, value in zip(positions, call_on_host(fn, arrays, shapes_of(arrays))):
            out[i] = value
    array_positions = set(positions)
    others = [i for i in range(len(leaves)) if i not in array_positions]
    if others:
        values = ops.broadcast_object([leaves[i] for i in others], int(root_rank), f"{name}.objects", process_set)
        for i, value in zip(others, values):
            out[i] = value
    return jax.tree_util.tree_unflatten(treedef, out)


def broadcast_parameters(params: Any, root_rank: int = 0, process_set: ProcessSet = global_process_set) -> Any:
    """Upstream's name for :func:`broadcast_variables`: returns ``params`` (any pytree) as ``root_rank`` has it."""
    return broadcast_variables(params, root_rank, process_set, name="broadcast_parameters")


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Send a picklable object from ``root_rank`` to every rank (cloudpickle between authenticated peers).
    JAX arrays inside it travel as their values. Not for use inside jit (it runs when traced)."""
    return ops.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: Optional[str] = None, process_set: ProcessSet = global_process_set) -> List:
    """Gather one picklable object from every rank, as a list indexed by rank. Not for use inside jit."""
    return ops.allgather_object(obj, name, process_set)
