"""The public functions of the Keras modules, with upstream's signatures; ``horovod.tensorflow.keras`` and
``horovod.keras`` bind their own defaults (compression class, ``average``) around these."""
from __future__ import annotations

from typing import Any, Iterable, Optional

from horovod._keras import values
from horovod._keras.flavor import is_tf_keras
from horovod._keras.optimizer import create_distributed_optimizer
from horovod.common.types import Average, ReduceOp
from horovod.core.process_sets import ProcessSet, global_process_set


def distributed_optimizer(optimizer: Any, name: Optional[str] = None, device_dense: str = "",
                          device_sparse: str = "", compression: Any = None, sparse_as_dense: bool = False,
                          gradient_predivide_factor: float = 1.0, op: ReduceOp = Average,
                          backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False,
                          num_groups: int = 0, groups=None, process_set: ProcessSet = global_process_set,
                          scale_local_gradients: bool = True, local_layers: Optional[Iterable[Any]] = None) -> Any:
    """Wrap a Keras optimizer so that it averages (``op=Average``) or sums the gradients across ranks before
    applying them. A Keras 3 optimizer gets ``horovod._keras.optimizer``'s wrapper (any backend), a tf_keras
    (Keras 2) one ``horovod._keras.keras2.optimizer``'s. ``device_*`` are accepted for compatibility."""
    create = create_distributed_optimizer
    if is_tf_keras(optimizer):
        from horovod._keras.keras2.optimizer import create_distributed_optimizer as create
    return create(
        optimizer, local_layers=local_layers, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, groups=groups if groups is not None
        else (num_groups or None), process_set=process_set, scale_local_gradients=scale_local_gradients)


def partial_distributed_optimizer(optimizer: Any, name: Optional[str] = None, device_dense: str = "",
                                  device_sparse: str = "", compression: Any = None, sparse_as_dense: bool = False,
                                  gradient_predivide_factor: float = 1.0, op: ReduceOp = Average,
                                  backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False,
                                  groups=None, process_set: ProcessSet = global_process_set,
                                  local_layers: Optional[Iterable[Any]] = None,
                                  scale_local_gradients: bool = True) -> Any:
    """A ``DistributedOptimizer`` whose ``local_layers``' (Keras layers) gradients stay local to each rank."""
    return distributed_optimizer(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
                                 gradient_predivide_factor, op, backward_passes_per_step,
                                 average_aggregated_gradients, 0, groups, process_set, scale_local_gradients,
                                 local_layers)


broadcast_global_variables = values.broadcast_global_variables


def broadcast_variables(variables: Iterable[Any], root_rank: int,
                        process_set: ProcessSet = global_process_set) -> Any:
    """Overwrite Keras variables with ``root_rank``'s values (ours: the eager way to do what
    ``broadcast_global_variables`` did in TF1)."""
    return values.broadcast_variables(variables, root_rank, process_set=process_set)
