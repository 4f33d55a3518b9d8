"""``horovod.jax``: Horovod for JAX (beyond upstream, which never had a JAX binding).

The program shape is upstream's: ``hvd.init()``, shard the data by ``hvd.rank()``, wrap the optax optimizer in
``hvd.DistributedOptimizer``, ``hvd.broadcast_parameters(params, root_rank=0)`` once, print on rank 0. Every
collective takes and returns ``jax.Array``s, eagerly and inside ``jax.jit`` (as ordered host callbacks, so every
rank issues them in one order), and ``jax.grad`` goes through them with ``horovod.torch``'s gradient rules.
See docs/jax.md.
"""
from __future__ import annotations

from horovod.core import api as _api
from horovod.core.api import *  # noqa: F403  (the op layer's public names)
from horovod.jax import _framework  # noqa: F401  (first: a missing JAX is named with its extra)
from horovod.jax.compression import Compression
from horovod.jax.functions import (
    allgather_object,
    broadcast_object,
    broadcast_parameters,
    broadcast_variables,
)
from horovod.jax.mpi_ops import (
    allgather,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    join,
    reducescatter,
)
from horovod.jax.optimizer import DistributedOptimizer, DistributedOptimizerState, allreduce_gradients
from horovod.jax.zero_optimizer import ZeroRedundancyOptimizer, ZeroRedundancyOptimizerState

__all__ = _api.__all__ + [
    "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "alltoall",
    "reducescatter", "grouped_reducescatter", "barrier", "join", "broadcast_object", "allgather_object",
    "broadcast_variables", "broadcast_parameters", "DistributedOptimizer", "DistributedOptimizerState",
    "allreduce_gradients", "Compression", "ZeroRedundancyOptimizer", "ZeroRedundancyOptimizerState",
]
