"""``import horovod.keras as hvd``: Horovod for standalone Keras 3, on the TensorFlow, PyTorch or JAX backend
(``KERAS_BACKEND``); TensorFlow is not needed for the latter two. The surface is upstream's ``horovod.keras``;
see ``docs/keras.md`` for what works on which backend.

Given a tf_keras (Keras 2) optimizer or model, as a program has under ``TF_USE_LEGACY_KERAS=1`` through
``tf.keras``, the same functions and callbacks take the TensorFlow-only Keras 2 path (``horovod._keras.keras2``).
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from horovod._keras import api as _api
from horovod._keras import values as _values
from horovod._keras.compression import Compression
from horovod._keras.loading import load_model as _load_model
from horovod._keras.zero_optimizer import create_zero_optimizer as _create_zero_optimizer
from horovod.common.types import Average, ReduceOp
from horovod.core import ops as _ops
from horovod.core.api import *  # noqa: F403  (the op layer's public names)
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.keras import callbacks, elastic  # noqa: F401

broadcast_global_variables = _api.broadcast_global_variables
broadcast_variables = _api.broadcast_variables


def DistributedOptimizer(optimizer, name: Optional[str] = None, device_dense: str = "", device_sparse: str = "",
                         compression=Compression.none, sparse_as_dense: bool = False,
                         gradient_predivide_factor: float = 1.0, op: ReduceOp = Average, num_groups: int = 0,
                         groups=None, backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False,
                         process_set: ProcessSet = global_process_set, scale_local_gradients: bool = True):
    """Wrap a Keras optimizer so that gradients are averaged (or summed) across ranks before they are applied.

    Upstream's positional order; ``backward_passes_per_step`` and the arguments after it are
    ``horovod.tensorflow.keras``'s, accepted here by keyword too.
    """
    return _api.distributed_optimizer(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
                                      gradient_predivide_factor, op, backward_passes_per_step,
                                      average_aggregated_gradients, num_groups, groups, process_set,
                                      scale_local_gradients)


def PartialDistributedOptimizer(optimizer, name: Optional[str] = None, device_dense: str = "",
                                device_sparse: str = "", compression=Compression.none, sparse_as_dense: bool = False,
                                gradient_predivide_factor: float = 1.0, op: ReduceOp = Average,
                                backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False,
                                groups=None, process_set: ProcessSet = global_process_set,
                                local_layers: Optional[Iterable[Any]] = None, scale_local_gradients: bool = True):
    """A DistributedOptimizer that leaves the gradients of ``local_layers`` (Keras layers) local to each rank."""
    return _api.partial_distributed_optimizer(optimizer, name, device_dense, device_sparse, compression,
                                              sparse_as_dense, gradient_predivide_factor, op,
                                              backward_passes_per_step, average_aggregated_gradients, groups,
                                              process_set, local_layers, scale_local_gradients)


def ZeroRedundancyOptimizer(optimizer, process_set: ProcessSet = global_process_set, backward_passes_per_step: int = 1,
                            average_aggregated_gradients: bool = False, name: Optional[str] = None):
    """ZeRO-1: wrap a Keras 3 optimizer (TensorFlow backend) so that each rank of ``process_set`` keeps the state
    of only the variables it owns; the variables end as with ``DistributedOptimizer``. See docs/zero.md."""
    return _create_zero_optimizer(optimizer, process_set, backward_passes_per_step, average_aggregated_gradients,
                                  name)


def allreduce(value, name: Optional[str] = None, average: bool = True, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op: Optional[ReduceOp] = None, compression=Compression.none):
    """Reduce a value (numpy array, number or tensor) across ranks, averaged by default; returns a tensor."""
    return _values.allreduce(value, name, None if op is not None else average, prescale_factor, postscale_factor,
                             op, compression)


allgather = _values.allgather
broadcast = _values.broadcast
reducescatter = _values.reducescatter


def join(process_set: ProcessSet = global_process_set) -> int:
    """Mark this rank as done with its data (beyond upstream, whose Keras bindings have no join); returns the last
    rank (of ``process_set``) to join, a global rank, the same on every rank. Until every rank has joined, this
    rank contributes zeros to the others' allreduces, so ranks with uneven data can train to their own end, as
    with ``horovod.torch.join``."""
    return int(_ops.join_async(process_set).wait())


def load_model(filepath: str, custom_optimizers=None, custom_objects=None, compression=Compression.none,
               legacy_opts: bool = False):
    """Load a saved model and re-create its optimizer, with its state, as a DistributedOptimizer; a file that
    tf_keras wrote (``.h5``, ``.keras``, SavedModel) is loaded by tf_keras, any other by Keras 3."""
    return _load_model(filepath, custom_optimizers, custom_objects, compression, legacy_opts)
