"""``DistributedOptimizer(tf1_optimizer, op=hvd.Adasum)``: upstream's TF1 delta optimizer
(``_DistributedAdasumOptimizer`` in horovod/tensorflow/__init__.py).

Each rank applies the wrapped optimizer to its own gradients; on every ``backward_passes_per_step``-th step the
weight deltas since the last exchange are combined with Adasum and added to the weights they started from::

    start = var                           # first step only; afterwards start holds the last combined weights
    apply_gradients(grads)                # the wrapped optimizer, on this rank's gradients
    delta = var - start
    start += allreduce(delta, op=Adasum)  # on communication steps
    var = start

Upstream keeps ``start`` in a ``delta_start`` slot and counts steps in a ``step_count`` variable, and so does
this class. Upstream's ``apply_gradients`` hands the call to the wrapped optimizer, which bypasses its own
``_apply_dense`` overrides, so that the exchange never runs (the ranks drift apart); here ``apply_gradients``
runs the algorithm above. The deltas of one step go out as one grouped allreduce (Adasum is still computed per
tensor). Upstream refuses process sets; here the deltas are combined over ``process_set``, and a rank outside
it just applies its own gradients. It works in a TF1 graph, eagerly and inside ``tf.function``.
"""
from __future__ import annotations

from typing import List, Optional

import tensorflow as tf

from horovod.common.types import Adasum
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.tensorflow.compression import Compression
from horovod.tensorflow.gradient_aggregation import _tensor_after

_LegacyOptimizer = tf.compat.v1.train.Optimizer


class _DistributedAdasumOptimizer(_LegacyOptimizer):
    """A ``tf.compat.v1.train.Optimizer`` that steps locally and combines the weight deltas with Adasum."""

    def __init__(self, optimizer: _LegacyOptimizer, name: Optional[str] = None, use_locking: bool = False,
                 compression=Compression.none, backward_passes_per_step: int = 1,
                 process_set: ProcessSet = global_process_set) -> None:
        if name is None:
            name = f"DistributedDelta{type(optimizer).__name__}"
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._compression = compression
        self._backward_passes_per_step = int(backward_passes_per_step)
        self.process_set = process_set

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's gradients, unreduced (the deltas are exchanged, not the gradients)."""
        return self._optimizer.compute_gradients(*args, **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """The wrapped optimizer's update, then (on communication steps) the Adasum exchange of the deltas."""
        grads_and_vars = list(grads_and_vars)
        variables = [v for g, v in grads_and_vars if g is not None]
        if not variables or not self.process_set.included():
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        starts = [self._zeros_slot(v, "delta_start", self._name) for v in variables]
        step_count = self._step_count(variables[0])
        passes = self._backward_passes_per_step
        initialized = tf.cond(tf.equal(step_count, 0),
                              lambda: _tensor_after(tf.group(*[s.assign(v) for s, v in zip(starts, variables)])),
                              lambda: tf.constant(False))
        with tf.control_dependencies([initialized]):
            update = self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        with tf.control_dependencies([] if update is None else [update]):
            exchanged = tf.cond(tf.equal(step_count % passes, passes - 1),
                                lambda: self._exchange(variables, starts), lambda: tf.constant(False))
        with tf.control_dependencies([exchanged]):
            counted = step_count.assign_add(1)
        if tf.executing_eagerly():
            return None
        return tf.group(counted, name="adasum_apply_gradients")

    def _step_count(self, colocate_with: tf.Variable) -> tf.Variable:
        """Upstream's ``step_count``: steps applied so far (a non-slot variable of this optimizer)."""
        graph = None if tf.compat.v1.executing_eagerly_outside_functions() else colocate_with.graph
        counter = self._get_non_slot_variable("step_count", graph=graph)
        if counter is None:
            counter = self._create_non_slot_variable(tf.constant(0, tf.int64), "step_count", colocate_with)
        return counter

    def _exchange(self, variables: List[tf.Variable], starts: List[tf.Variable]) -> tf.Tensor:
        """start += Adasum(var - start); var = start."""
        from horovod.tensorflow import grouped_allreduce  # the public one (compression); imports this module

        deltas = [v.read_value() - s.read_value() for v, s in zip(variables, starts)]
        combined = grouped_allreduce(deltas, compression=self._compression, op=Adasum, name=f"{self._name}.delta",
                                     process_set=self.process_set, ignore_name_scope=True)
        assigns = [v.assign(s.assign_add(c, use_locking=self._use_locking), use_locking=self._use_locking)
                   for v, s, c in zip(variables, starts, combined)]
        return _tensor_after(tf.group(*assigns))

    def get_slot(self, var, name):
        """This optimizer's ``delta_start`` slot, or the wrapped optimizer's slot."""
        mine = super().get_slot(var, name)
        return mine if mine is not None else self._optimizer.get_slot(var, name)

    def get_slot_names(self):
        """``delta_start`` and the wrapped optimizer's slot names."""
        return super().get_slot_names() + self._optimizer.get_slot_names()

    def variables(self, *args, **kwargs):
        """The wrapped optimizer's variables (as upstream)."""
        return self._optimizer.variables(*args, **kwargs)
