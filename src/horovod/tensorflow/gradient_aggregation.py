"""``LocalGradientAggregationHelper``: ``backward_passes_per_step`` for optimizers built as a graph.

Each call of ``compute_gradients`` adds this rank's gradients into local accumulators (non-trainable variables);
every ``backward_passes_per_step``-th call allreduces the accumulated sums (divided by
``backward_passes_per_step`` when ``average_aggregated_gradients``) and returns them. ``apply_gradients`` runs the
wrapped optimizer's update only on those calls; on the others it just advances the global step (and a Keras
optimizer's ``iterations``), so step counters keep counting backward passes, as upstream.

It is written with ``tf.cond`` on a step counter variable, so the same code runs in a TF1 graph (the accumulators
and the counter go to the ``LOCAL_VARIABLES`` collection, initialized by ``local_variables_initializer`` and by
``MonitoredTrainingSession``), inside ``tf.function`` and eagerly. Every rank runs the same number of steps, so
every rank takes the same branch and the allreduces line up.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.tensorflow.gradient_tape import _key, reduce_global_keep_local


def _dense(grad):
    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


def _tensor_after(op_or_value) -> tf.Tensor:
    """A boolean scalar that is computed after ``op_or_value`` (tf.cond branches must return tensors)."""
    deps = [] if op_or_value is None or tf.executing_eagerly() else [op_or_value]
    with tf.control_dependencies(deps):
        return tf.constant(True)


class LocalGradientAggregationHelper:
    """Accumulate gradients locally for ``backward_passes_per_step`` steps, then allreduce and apply them once.

    ``allreduce_func(grads, vars) -> grads`` reduces a list of dense gradients across ranks (the optimizer's own
    allreduce, with its compression, groups and op). ``rank`` and ``optimizer_type`` are upstream's arguments, kept
    for compatibility.
    """

    _OPTIMIZER_TYPE_KERAS = "optimizer_type_keras"
    _OPTIMIZER_TYPE_LEGACY = "optimizer_type_legacy"

    def __init__(self, backward_passes_per_step: int, allreduce_func: Callable[[List, Optional[List]], List],
                 sparse_as_dense: bool, average_aggregated_gradients: bool, rank: int, optimizer_type: str,
                 process_set: ProcessSet = global_process_set, scale_local_gradients: bool = True) -> None:
        if int(backward_passes_per_step) < 1:
            raise ValueError(f"backward_passes_per_step must be a positive integer, got {backward_passes_per_step}")
        if optimizer_type not in (self._OPTIMIZER_TYPE_KERAS, self._OPTIMIZER_TYPE_LEGACY):
            raise ValueError(f"optimizer_type must be {self._OPTIMIZER_TYPE_LEGACY!r} or "
                             f"{self._OPTIMIZER_TYPE_KERAS!r}, got {optimizer_type!r}")
        self.backward_passes_per_step = int(backward_passes_per_step)
        self._allreduce_grads = allreduce_func
        self.sparse_as_dense = sparse_as_dense
        self.average_aggregated_gradients = average_aggregated_gradients
        self.rank = rank
        self.optimizer_type = optimizer_type
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self.counter: Optional[tf.Variable] = None
        self.locally_aggregated_grads: List[Optional[tf.Variable]] = []
        self._local_vars: set = set()

    def register_local_var(self, var) -> None:
        """Keep ``var``'s gradient out of the allreduce (it is this rank's own, see ``horovod.tensorflow``)."""
        self._local_vars.add(_key(var))

    # ------------------------------------------------------------------ state
    def _variable(self, shape, dtype: tf.DType, name: str) -> tf.Variable:
        """A zero-filled non-trainable variable: a TF1 graph's local variable, or (eagerly and inside
        ``tf.function``, created once, outside the function) an ordinary one."""
        if tf.executing_eagerly() or getattr(tf.compat.v1.get_default_graph(), "building_function", False):
            with tf.init_scope():
                return tf.Variable(tf.zeros(shape, dtype), trainable=False, name=name)
        return tf.compat.v1.Variable(tf.zeros(shape, dtype), trainable=False, name=name, use_resource=True,
                                     collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])

    def _init_aggregation_vars(self, grads: Sequence) -> None:
        with tf.name_scope("aggregation_variables"):
            self.counter = self._variable([], tf.int32, "aggregation_counter")
            self.locally_aggregated_grads = [
                None if g is None else self._variable(g.shape, g.dtype, f"aggregated_grad_{i}")
                for i, g in enumerate(grads)]

    # ------------------------------------------------------------------ steps
    def compute_gradients(self, grads: Sequence, vars: Sequence) -> List:
        """Add ``grads`` to the accumulators; on every ``backward_passes_per_step``-th call return the reduced
        accumulated gradients (and reset the counter), otherwise this call's local gradients (not applied)."""
        grads = [_dense(g) for g in grads]
        vars = list(vars)
        if self.counter is None:
            for g in grads:
                if g is not None and not g.shape.is_fully_defined():
                    raise ValueError(f"backward_passes_per_step > 1 needs gradients of static shape; got {g.shape}. "
                                     "Give the model's variables fully defined shapes.")
            self._init_aggregation_vars(grads)
        if len(grads) != len(self.locally_aggregated_grads):
            raise ValueError(f"compute_gradients got {len(grads)} gradients, but the accumulators were made for "
                             f"{len(self.locally_aggregated_grads)}; use one DistributedOptimizer per variable list.")
        present = [i for i, g in enumerate(grads) if g is not None]
        accumulators = [self.locally_aggregated_grads[i] for i in present]

        def clear():
            return _tensor_after(tf.group(*[a.assign(tf.zeros_like(a)) for a in accumulators]))

        cleared = tf.cond(tf.equal(self.counter, 0), clear, lambda: tf.constant(False))
        with tf.control_dependencies([cleared]):
            added = [a.assign_add(grads[i], read_value=False) for a, i in zip(accumulators, present)]
        with tf.control_dependencies(added):
            counted = self.counter.assign_add(1, read_value=False)

        def reduce_accumulated():
            values = [None] * len(grads)
            for a, i in zip(accumulators, present):
                values[i] = a.read_value()
            reduced = reduce_global_keep_local(self._allreduce_grads, values, vars, self._local_vars,
                                               self.scale_local_gradients, self.process_set)
            with tf.control_dependencies([r for r in (reduced[i] for i in present) if r is not None]):
                reset = self.counter.assign(0, read_value=False)
            with tf.control_dependencies([reset]):
                divisor = self.backward_passes_per_step if self.average_aggregated_gradients else 1
                return [tf.identity(_dense(reduced[i])) / tf.cast(divisor, grads[i].dtype) for i in present]

        def keep_local():
            return [tf.identity(grads[i]) for i in present]

        with tf.control_dependencies([counted]):
            outs = tf.cond(tf.equal(self.counter, self.backward_passes_per_step), reduce_accumulated, keep_local)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        result: List = [None] * len(grads)
        for i, o in zip(present, outs):
            result[i] = o
        return result

    def apply_gradients(self, apply_grads_closure: Callable[[], object], optimizer, *args, **kwargs):
        """Run ``apply_grads_closure`` (the wrapped optimizer's ``apply_gradients``) on the steps that reduced the
        gradients; on the others advance ``optimizer.iterations`` (Keras) or the global step (TF1) instead."""
        grads_and_vars = list(args[0]) if args else list(kwargs.get("grads_and_vars", []))
        ready = [g for g, _ in grads_and_vars if g is not None]

        def skip():
            iterations = getattr(optimizer, "_iterations", None)
            if self.optimizer_type == self._OPTIMIZER_TYPE_KERAS and iterations is not None:
                return _tensor_after(iterations.assign_add(1, read_value=False))
            return tf.constant(False)

        def count_global_step():
            step = tf.compat.v1.train.get_global_step()
            if step is None:
                return tf.constant(False)
            return _tensor_after(step.assign_add(tf.constant(1, step.dtype), read_value=False))

        with tf.control_dependencies(ready):
            applied = tf.cond(tf.equal(self.counter, 0), lambda: _tensor_after(apply_grads_closure()), skip)
        with tf.control_dependencies([applied]):
            stepped = tf.cond(tf.equal(self.counter, 0), lambda: tf.constant(False), count_global_step)
        if tf.executing_eagerly() or getattr(tf.compat.v1.get_default_graph(), "building_function", False):
            return stepped
        return tf.group(stepped, name="aggregated_apply_gradients")   # a TF1 train op
