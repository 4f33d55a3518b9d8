"""``import horovod.tensorflow.keras as hvd``: Horovod for ``tf.keras`` programs: Keras 3 on the TensorFlow
backend, or Keras 2 through tf-keras when ``TF_USE_LEGACY_KERAS=1`` makes ``tf.keras`` the ``tf_keras`` package.

``hvd.DistributedOptimizer`` works in ``model.fit`` and in custom loops; ``hvd.callbacks`` has the broadcast,
metric-average, learning-rate and checkpoint callbacks. Each call decides by the object it is given (a Keras 3 or a
tf_keras optimizer or model), so both kinds work in one process. See ``docs/keras.md``.
"""
from __future__ import annotations

from typing import Optional

from horovod._keras import api as _api
from horovod._keras import values as _values
from horovod.common.types import Average, ReduceOp
from horovod.core.api import *  # noqa: F403  (the op layer's public names)
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.keras import (  # noqa: F401  (the same functions: Horovod's Compression classes are interchangeable)
    PartialDistributedOptimizer,
    ZeroRedundancyOptimizer,
    allgather,
    broadcast,
    broadcast_global_variables,
    broadcast_variables,
    join,
    load_model,
    reducescatter,
)
from horovod.tensorflow import mpi_ops  # noqa: F401  (hvd.mpi_ops, as upstream's tests read it)
from horovod.tensorflow.compression import Compression
from horovod.tensorflow.keras import callbacks, elastic  # noqa: F401


def DistributedOptimizer(optimizer, name: Optional[str] = None, device_dense: str = "", device_sparse: str = "",
                         compression=Compression.none, sparse_as_dense: bool = False,
                         gradient_predivide_factor: float = 1.0, op: ReduceOp = Average,
                         backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False,
                         num_groups: int = 0, groups=None, process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True):
    """Wrap a Keras optimizer so that gradients are averaged (or summed, ``op=Sum``) across ranks before they
    are applied, in ``model.fit`` or a custom loop. ``backward_passes_per_step=N`` aggregates N local steps per
    allreduce. Only Average and Sum are allowed."""
    return _api.distributed_optimizer(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
                                      gradient_predivide_factor, op, backward_passes_per_step,
                                      average_aggregated_gradients, num_groups, groups, process_set,
                                      scale_local_gradients)


def allreduce(value, name: Optional[str] = None, average: Optional[bool] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op: Optional[ReduceOp] = None, compression=Compression.none):
    """Reduce a value (numpy array, number or tensor) across ranks, Average by default; returns a tensor."""
    return _values.allreduce(value, name, average, prescale_factor, postscale_factor, op, compression)
