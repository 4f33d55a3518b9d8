"""``DistributedOptimizer`` for TF1-style optimizers (``tf.compat.v1.train.Optimizer``).

The wrapper is itself a ``tf.compat.v1.train.Optimizer``: ``compute_gradients`` asks the wrapped optimizer for the
gradients and allreduces them (one grouped allreduce per group, as ``DistributedGradientTape``), and
``apply_gradients`` is the wrapped optimizer's. ``minimize`` is the base class's, so it goes through both. With
``backward_passes_per_step > 1`` a :class:`LocalGradientAggregationHelper` accumulates the gradients and applies
them on every N-th step. A Keras optimizer is handed to ``horovod.tensorflow.keras.DistributedOptimizer``.
"""
from __future__ import annotations

import logging
from typing import Optional

import tensorflow as tf

from horovod.common.compression import PowerSGDCompressor, check_powersgd_op
from horovod.common.gradient_groups import check_predivide
from horovod.common.types import Adasum, Average, ReduceOp
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.tensorflow.adasum_optimizer import _DistributedAdasumOptimizer
from horovod.tensorflow.compression import Compression
from horovod.tensorflow.gradient_aggregation import LocalGradientAggregationHelper
from horovod.tensorflow.gradient_tape import _key, _make_allreduce_grads_fn, reduce_global_keep_local
from horovod.tensorflow.mpi_ops import rank
from horovod.tensorflow.powersgd import PowerSGDState

log = logging.getLogger(__name__)

_LegacyOptimizer = tf.compat.v1.train.Optimizer
# The end of the error every rank raises when a gradient is None on some ranks only (``none_gradients``).
_REMEDY = ("Make the loss depend on the same variables on every rank, or pass var_list= with only the variables "
           "it depends on, the same list on every rank.")


class _DistributedOptimizer(_LegacyOptimizer):
    """A ``tf.compat.v1.train.Optimizer`` that averages the gradients across ranks before applying them."""

    def __init__(self, optimizer: _LegacyOptimizer, name: Optional[str] = None, use_locking: bool = False,
                 compression=Compression.none, sparse_as_dense: bool = False, op: ReduceOp = Average,
                 gradient_predivide_factor: float = 1.0, backward_passes_per_step: int = 1,
                 average_aggregated_gradients: bool = False, groups=None,
                 process_set: ProcessSet = global_process_set, scale_local_gradients: bool = True) -> None:
        if name is None:
            name = f"Distributed{type(optimizer).__name__}"
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        # PowerSGD's state (horovod.tensorflow.powersgd) is this optimizer's own; not in its variables().
        self.powersgd_state = (PowerSGDState(compression, name) if isinstance(compression, PowerSGDCompressor)
                               else None)
        self._allreduce_grads = _make_allreduce_grads_fn(name, compression, sparse_as_dense, op,
                                                         gradient_predivide_factor, groups, process_set,
                                                         remedy=_REMEDY, powersgd_state=self.powersgd_state)
        self._local_vars: set = set()
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self._agg_helper: Optional[LocalGradientAggregationHelper] = None
        if backward_passes_per_step > 1:
            self._agg_helper = LocalGradientAggregationHelper(
                backward_passes_per_step=backward_passes_per_step, allreduce_func=self._allreduce_grads,
                sparse_as_dense=sparse_as_dense, average_aggregated_gradients=average_aggregated_gradients,
                rank=rank(), optimizer_type=LocalGradientAggregationHelper._OPTIMIZER_TYPE_LEGACY,
                process_set=process_set, scale_local_gradients=scale_local_gradients)

    def register_local_var(self, var) -> None:
        """Keep ``var``'s gradient out of the allreduce: it stays this rank's own (divided by the number of ranks
        when ``scale_local_gradients``)."""
        if self._agg_helper is not None:
            self._agg_helper.register_local_var(var)
        else:
            self._local_vars.add(_key(var))

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's ``(gradient, variable)`` pairs, with the gradients allreduced across ranks
        (with ``backward_passes_per_step > 1``: accumulated, and reduced on every N-th call)."""
        gradients = self._optimizer.compute_gradients(*args, **kwargs)
        if not gradients:
            return gradients
        grads, variables = zip(*gradients)
        if self._agg_helper is not None:
            reduced = self._agg_helper.compute_gradients(grads, variables)
        else:
            reduced = reduce_global_keep_local(self._allreduce_grads, grads, variables, self._local_vars,
                                               self.scale_local_gradients, self.process_set)
        return list(zip(reduced, variables))

    def apply_gradients(self, *args, **kwargs):
        """The wrapped optimizer's ``apply_gradients`` (with ``backward_passes_per_step > 1``: only on the steps
        that reduced the accumulated gradients; the global step still counts every step)."""
        if self._agg_helper is not None:
            return self._agg_helper.apply_gradients(lambda: self._optimizer.apply_gradients(*args, **kwargs),
                                                    self._optimizer, *args, **kwargs)
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        """The wrapped optimizer's slot variable."""
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        """The wrapped optimizer's slot names."""
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        """The wrapped optimizer's variables."""
        return self._optimizer.variables(*args, **kwargs)


def _is_keras_optimizer(optimizer) -> bool:
    """A Keras 3 optimizer, or a Keras 2 one from tf-keras (``tf.keras`` under ``TF_USE_LEGACY_KERAS=1``)."""
    import keras

    from horovod._keras.flavor import is_tf_keras

    return isinstance(optimizer, keras.optimizers.Optimizer) or is_tf_keras(optimizer)


def DistributedOptimizer(optimizer, name: Optional[str] = None, use_locking: bool = False, device_dense: str = "",
                         device_sparse: str = "", compression=Compression.none, sparse_as_dense: bool = False,
                         backward_passes_per_step: int = 1, op: ReduceOp = Average,
                         gradient_predivide_factor: float = 1.0, average_aggregated_gradients: bool = False,
                         num_groups: int = 0, groups=None, process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True):
    """Wrap ``optimizer`` so that the gradients it applies are averaged (``op``) across ranks.

    - A ``tf.compat.v1.train.Optimizer`` (TF1 graph mode, or eagerly with a callable loss) becomes a
      ``tf.compat.v1.train.Optimizer`` whose ``compute_gradients`` allreduces.
    - A Keras optimizer is handed to ``horovod.tensorflow.keras.DistributedOptimizer``.
    - ``op=hvd.Adasum`` with a TF1 optimizer gives upstream's delta optimizer (``adasum_optimizer``): each rank
      applies its own gradients and the weight deltas are combined with Adasum every
      ``backward_passes_per_step`` steps. A Keras optimizer combines its gradients with Adasum instead.

    ``backward_passes_per_step``: accumulate that many steps' gradients locally and allreduce and apply them on
    the last one (summed, or averaged with ``average_aggregated_gradients``). ``groups``: an int (that many
    grouped allreduces) or a list of lists of variables; ``num_groups`` is its deprecated int form.
    ``device_dense``/``device_sparse`` are accepted for compatibility (tensors go through host memory).
    """
    if num_groups and groups is None:
        groups = num_groups
    if groups is not None and not isinstance(groups, (int, list)):
        raise ValueError("groups should be an int or a list of lists of tf.Variable")
    if int(backward_passes_per_step) < 1:
        raise ValueError(f"backward_passes_per_step must be a positive integer, got {backward_passes_per_step}")
    check_predivide(op, gradient_predivide_factor)
    check_powersgd_op(compression, ReduceOp(op))
    if ReduceOp(op) == Adasum and average_aggregated_gradients:
        raise ValueError("Adasum does not support average_aggregated_gradients == True")
    if isinstance(optimizer, _LegacyOptimizer):
        if ReduceOp(op) == Adasum:
            return _DistributedAdasumOptimizer(optimizer, name=name, use_locking=use_locking, compression=compression,
                                               backward_passes_per_step=int(backward_passes_per_step),
                                               process_set=process_set)
        return _DistributedOptimizer(optimizer, name=name, use_locking=use_locking, compression=compression,
                                     sparse_as_dense=sparse_as_dense, op=op,
                                     gradient_predivide_factor=gradient_predivide_factor,
                                     backward_passes_per_step=int(backward_passes_per_step),
                                     average_aggregated_gradients=average_aggregated_gradients, groups=groups,
                                     process_set=process_set, scale_local_gradients=scale_local_gradients)
    if _is_keras_optimizer(optimizer):
        from horovod.tensorflow.keras import DistributedOptimizer as _KerasDistributedOptimizer

        log.debug("horovod.tensorflow.DistributedOptimizer: delegating %s to horovod.tensorflow.keras",
                  type(optimizer).__name__)
        return _KerasDistributedOptimizer(optimizer, name=name, device_dense=device_dense,
                                          device_sparse=device_sparse, compression=compression,
                                          sparse_as_dense=sparse_as_dense,
                                          gradient_predivide_factor=gradient_predivide_factor, op=op,
                                          backward_passes_per_step=backward_passes_per_step,
                                          average_aggregated_gradients=average_aggregated_gradients, groups=groups,
                                          process_set=process_set, scale_local_gradients=scale_local_gradients)
    raise ValueError(f"Provided optimizer doesn't inherit from either legacy TensorFlow or Keras optimizer: "
                     f"{optimizer!r}. Pass a tf.compat.v1.train.Optimizer (e.g. "
                     "tf.compat.v1.train.AdagradOptimizer) or a keras.optimizers.Optimizer.")
