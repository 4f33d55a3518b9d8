"""``import horovod.tensorflow as hvd``: Horovod's TensorFlow 2 API on this project's engine.

The collectives work eagerly, inside ``tf.function`` and in TF1 graphs (through an op of our own registered with
TensorFlow's C API), with upstream's signatures, gradients and error types; see ``docs/tensorflow.md`` and
``horovod.tensorflow.mpi_ops``. Training
helpers: ``DistributedGradientTape``/``PartialDistributedGradientTape`` (TF2), ``DistributedOptimizer`` (TF1
optimizers; Keras optimizers go to ``horovod.tensorflow.keras``), ``BroadcastGlobalVariablesHook`` and
``broadcast_global_variables`` (TF1), ``SyncBatchNormalization``.
"""
from __future__ import annotations

from typing import List, Optional

from horovod.common import config
from horovod.common.util import check_extension, gpu_available, split_list  # noqa: F401  (as upstream's)
from horovod.core.api import *  # noqa: F403  (the op layer's public names)
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.tensorflow import (
    _framework,  # noqa: F401  (first: a missing TensorFlow is named with its extra)
    errors,
)
from horovod.tensorflow._framework import tf
from horovod.tensorflow.compression import Compression
from horovod.tensorflow.functions import (  # noqa: F401
    allgather_object,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)
from horovod.tensorflow.gradient_aggregation import LocalGradientAggregationHelper  # noqa: F401
from horovod.tensorflow.gradient_tape import DistributedGradientTape, PartialDistributedGradientTape  # noqa: F401
from horovod.tensorflow.graph_hooks import BroadcastGlobalVariablesHook, broadcast_global_variables  # noqa: F401
from horovod.tensorflow.mpi_ops import (  # noqa: F401
    Adasum,
    Average,
    Sum,
    _allreduce,
    _grouped_allreduce,
    _grouped_reducescatter,
    _no_autograph,
    _reducescatter,
    _reducescatter_many,
    _set_size,
    allgather,
    alltoall,
    broadcast,
    broadcast_,
    check_num_rank_power_of_2,
    grouped_allgather,
    handle_average_backwards_compatibility,
    join,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size,
    size_op,
)
from horovod.tensorflow.optimizer import DistributedOptimizer  # noqa: F401
from horovod.tensorflow.sync_batch_norm import SyncBatchNormalization  # noqa: F401
from horovod.tensorflow.util import _cache, _executing_eagerly, _make_subgraph, refs_to_vars, vars_to_refs  # noqa: F401


def _check_sparse(op, prescale_factor, postscale_factor) -> None:
    if op == Adasum:
        raise errors.make(errors.UnimplementedError, (
            "The Adasum reduction does not currently support sparse tensors. As a "
            "workaround please pass sparse_as_dense=True to DistributedOptimizer"
        ))
    if op not in (Average, Sum):
        raise errors.make(errors.UnimplementedError, (
            "Only Sum and Average ops are supported with tf.IndexedSlices"
        ))
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise errors.make(errors.UnimplementedError, (
            "Pre/postscale_factor are not supported with tf.IndexedSlices"
        ))


def _set_size_as(process_set: ProcessSet, dtype) -> tf.Tensor:
    """The set's size as a ``dtype`` scalar, to average by. In a graph of an elastic job it is read when the graph
    runs (upstream's ``size_op`` rule): a traced tf.function outlives a change of the job's size."""
    if config.get("HOROVOD_ELASTIC") and not tf.executing_eagerly():
        return tf.cast(size_op(process_set.process_set_id or 0), dtype)
    return tf.cast(_set_size(process_set), dtype)


def _sparse_allreduce(tensor: tf.IndexedSlices, op, prescale_factor, postscale_factor, name, process_set,
                      ignore_name_scope) -> tf.IndexedSlices:
    """Upstream's rule for tf.IndexedSlices: allgather values and indices (Average divides the values)."""
    _check_sparse(op, prescale_factor, postscale_factor)
    values = allgather(tensor.values, name=f"{name}.values" if name else None,
                       ignore_name_scope=ignore_name_scope, process_set=process_set)
    indices = allgather(tensor.indices, name=f"{name}.indices" if name else None,
                        ignore_name_scope=ignore_name_scope, process_set=process_set)
    if op == Average:
        values = values / _set_size_as(process_set, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)


def _grouped_sparse_allreduce(slices: List[tf.IndexedSlices], op, prescale_factor, postscale_factor, name,
                              process_set, ignore_name_scope) -> List[tf.IndexedSlices]:
    """Several tf.IndexedSlices as two grouped allgathers (all values, then all indices), as upstream."""
    _check_sparse(op, prescale_factor, postscale_factor)
    values = grouped_allgather([t.values for t in slices], name=f"{name}.values" if name else None,
                               ignore_name_scope=ignore_name_scope, process_set=process_set)
    indices = grouped_allgather([t.indices for t in slices], name=f"{name}.indices" if name else None,
                                ignore_name_scope=ignore_name_scope, process_set=process_set)
    if op == Average:
        values = [v / _set_size_as(process_set, v.dtype) for v in values]
    return [tf.IndexedSlices(v, i, dense_shape=t.dense_shape) for v, i, t in zip(values, indices, slices)]


@_no_autograph
def allreduce(tensor, average: Optional[bool] = None, device_dense: str = "", device_sparse: str = "",
              compression=Compression.none, op=None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              name: Optional[str] = None, process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False):
    """Reduce ``tensor`` across ranks (Average by default); differentiable.

    A ``tf.IndexedSlices`` becomes two allgathers (values and indices), as upstream. ``compression`` (e.g.
    ``Compression.fp16``) shrinks what goes on the wire; the result has the input dtype. ``device_*`` are
    accepted for compatibility (tensors are exchanged through host memory).
    """
    op = handle_average_backwards_compatibility(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        return _sparse_allreduce(tensor, op, prescale_factor, postscale_factor, name, process_set,
                                 ignore_name_scope)
    tensor = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    reduced = _allreduce(compressed, name=name, op=op, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
                         process_set=process_set)
    return compression.decompress(reduced, ctx)


@_no_autograph
def grouped_allreduce(tensors, average: Optional[bool] = None, device_dense: str = "", device_sparse: str = "",
                      compression=Compression.none, op=None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set,
                      ignore_name_scope: bool = False, name: Optional[str] = None) -> List:
    """Allreduce a list of tensors negotiated and fused as one unit; differentiable.

    tf.IndexedSlices members are reduced as upstream: one grouped allgather of their values, one of their indices.
    """
    if not tensors:
        return tensors
    op = handle_average_backwards_compatibility(op, average)
    tensors = list(tensors)
    out: List = [None] * len(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    if sparse:
        reduced = _grouped_sparse_allreduce([tensors[i] for i in sparse], op, prescale_factor, postscale_factor,
                                            name, process_set, ignore_name_scope)
        for i, r in zip(sparse, reduced):
            out[i] = r
    compressed = [compression.compress(tf.convert_to_tensor(tensors[i])) for i in dense]
    reduced = _grouped_allreduce([c for c, _ in compressed], name=name, op=op, prescale_factor=prescale_factor,
                                 postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
                                 process_set=process_set)
    for i, r, (_, ctx) in zip(dense, reduced, compressed):
        out[i] = compression.decompress(r, ctx)
    return out


@_no_autograph
def reducescatter(tensor, device_dense: str = "", compression=Compression.none, op=Average,
                  name: Optional[str] = None, process_set: ProcessSet = global_process_set,
                  ignore_name_scope: bool = False, prescale_factor: float = 1.0, postscale_factor: float = 1.0):
    """Reduce across ranks (Sum or Average) and return this rank's block of dim 0 (ranks < n % size get one
    more row); differentiable."""
    compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
    out = _reducescatter_many([compressed], name, op, prescale_factor, postscale_factor, ignore_name_scope,
                              process_set, grouped=False)[0]
    return compression.decompress(out, ctx)


@_no_autograph
def grouped_reducescatter(tensors, device_dense: str = "", compression=Compression.none, op=Average,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0, name: Optional[str] = None,
                          ignore_name_scope: bool = False) -> List:
    """Reducescatter each tensor of a list, negotiated as one unit; differentiable."""
    compressed = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
    outs = _reducescatter_many([c for c, _ in compressed], name, op, prescale_factor, postscale_factor,
                               ignore_name_scope, process_set, grouped=True)
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, compressed)]
from horovod.tensorflow import elastic  # noqa: E402,F401  (hvd.elastic.run and the states, as upstream)
