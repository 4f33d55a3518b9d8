"""``DistributedOptimizer`` for Keras 3: the gradients are allreduced before the optimizer applies them.

As upstream, the wrapper is a dynamic subclass of the user's optimizer class, re-created from its config, so
``isinstance`` checks, learning-rate handling and serialization keep working (a saved model names the original
class, e.g. ``Adam``; ``hvd.load_model`` wraps it again). The hook is ``apply(grads, trainable_variables)``, which
Keras' trainers call on every backend (``apply_gradients`` and the JAX trainer's ``stateless_apply`` go
through it), so the same class works in ``model.fit`` and in a custom loop.

- ``op``: Average (default), Sum, or Adasum, which combines the gradients with Adasum (per tensor, unscaled;
  docs/adasum.md). Upstream's Keras wrappers refuse Adasum; its gradient-tape path computes exactly this.
- Dense gradients go out as grouped allreduces (one negotiated, fused unit each; one group unless ``groups``);
  ``tf.IndexedSlices`` become two allgathers unless ``sparse_as_dense``.
- ``backward_passes_per_step=N`` sums the gradients locally for N calls and allreduces and applies on the N-th
  (divided by N when ``average_aggregated_gradients``); the other calls only advance ``iterations``.
- Variables registered with ``register_local_var`` (or a ``PartialDistributedOptimizer``'s ``local_layers``)
  keep their local gradient, divided by the process-set size when ``scale_local_gradients``, so that it is on
  the same scale as the averaged ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, List, Optional, Set

import keras

from horovod._keras import backend_ops
from horovod.common import config
from horovod.common.compression import NoneCompressor, PowerSGDCompressor, check_powersgd_op
from horovod.common.gradient_groups import Groups, allreduce_in_groups, check_groups, scale_factors
from horovod.common.types import Adasum, Average, ReduceOp, Sum
from horovod.core.process_sets import ProcessSet, global_process_set

# The end of the error every rank raises when a gradient is None on some ranks only (``backend_ops.presence_check``).
KERAS_REMEDY = ("Make the loss depend on the same variables on every rank, or set trainable=False on the layer "
                "that is not used, on every rank.")


@dataclass
class _Settings:
    name: str
    compression: Any
    sparse_as_dense: bool
    op: ReduceOp
    prescale: float
    postscale: float
    backward_passes_per_step: int
    average_aggregated_gradients: bool
    groups: Groups
    process_set: ProcessSet
    scale_local_gradients: bool
    gradient_predivide_factor: float = 1.0
    local_ids: Set[int] = field(default_factory=set)
    powersgd: Any = None    # this optimizer's horovod.tensorflow.powersgd.PowerSGDState (TensorFlow backend)


def _check_op(op: ReduceOp, average_aggregated_gradients: bool) -> ReduceOp:
    """Average, Sum or Adasum (upstream's Keras wrappers refuse Adasum; here the gradients are combined with it,
    as upstream's DistributedGradientTape does)."""
    op = ReduceOp(op)
    if op not in (Average, Sum, Adasum):
        raise ValueError(f"op currently only supports Average, Sum and Adasum, got {op.name}.")
    if op == Adasum and average_aggregated_gradients:
        raise ValueError("Adasum does not support average_aggregated_gradients == True")
    return op


def _add_aggregation_state(optimizer: Any, variables: List[Any]) -> None:
    """The counter and the per-variable sums of ``backward_passes_per_step > 1``. Untracked
    (``object.__setattr__``): not part of ``optimizer.variables``, so checkpoints keep the wrapped optimizer's
    format and load with any ``backward_passes_per_step``."""
    counter = keras.Variable(0, dtype="int32", trainable=False, name="hvd_aggregation_counter")
    slots = [keras.Variable(keras.ops.zeros(v.shape, dtype=v.dtype), trainable=False,
                            name=f"hvd_aggregated_{i}") for i, v in enumerate(variables)]
    object.__setattr__(optimizer, "_hvd_counter", counter)
    object.__setattr__(optimizer, "_hvd_aggregated", tuple(slots))


def _reduce_gradients(s: _Settings, grads: List[Any], variables: Optional[List[Any]]) -> List[Any]:
    """The gradients as the optimizer applies them: allreduced in groups (dense), allgathered (sparse, unless
    ``sparse_as_dense``), or kept local (``local_ids``, scaled by the set size when ``scale_local_gradients``).
    First the ranks check that the same gradients are None everywhere (``backend_ops.presence_check``), in the
    first group's collective, or alone when this rank has no dense gradient."""
    if not s.process_set.included():
        return grads
    out = list(grads)
    world = s.process_set.size()
    dense, sparse, shared = [], [], []
    for i, g in enumerate(grads):
        if variables is not None and id(variables[i]) in s.local_ids:
            if g is not None:
                out[i] = g / world if s.scale_local_gradients and world > 1 else g
            continue
        shared.append(i)
        if g is None:
            continue
        if backend_ops.is_sparse(g) and not s.sparse_as_dense:
            sparse.append(i)
        else:
            out[i] = backend_ops.to_dense(g)
            dense.append(i)
    # As upstream's tf.cond(size > 1, ...): nothing to exchange. Not in an elastic job (as torch's optimizer): the
    # train function of model.fit, traced at size 1, keeps its graph after the job grows.
    if world == 1 and not config.get("HOROVOD_ELASTIC"):
        return out
    carrier = [backend_ops.presence_check([grads[i] for i in shared], None if variables is None else
                                          [variables[i] for i in shared], s.name, s.process_set, KERAS_REMEDY)]
    if not dense or s.powersgd is not None:
        backend_ops.check_alone(carrier.pop())
    if s.powersgd is not None:
        if sparse:
            from horovod.common.gradient_presence import label
            from horovod.tensorflow.powersgd import refuse_sparse

            i = sparse[0]
            raise refuse_sparse(label(None if variables is None else variables[i], i))
        if dense:
            _powersgd_reduce(s, out, dense, variables)
        return out
    allreduce_in_groups(out, dense, variables, s.groups, s.compression, lambda tensors, name: (
        backend_ops.grouped_allreduce(tensors, name, s.op, s.prescale, s.postscale, s.process_set,
                                      carrier.pop() if carrier else None)), s.name)
    for i in sparse:
        out[i] = backend_ops.sparse_allreduce(grads[i], f"{s.name}.sparse.{i}", s.op, s.process_set)
    return out


def _check_powersgd_backend(compression: Any) -> None:
    """PowerSGD's state and arithmetic are TensorFlow's (horovod.tensorflow.powersgd): refuse other backends."""
    if isinstance(compression, PowerSGDCompressor) and backend_ops.backend() != "tensorflow":
        raise ValueError(f"Compression.powersgd in horovod.keras works on the TensorFlow Keras backend only, not "
                         f"{backend_ops.backend()!r}: set KERAS_BACKEND=tensorflow, or use "
                         "horovod.torch.DistributedOptimizer or horovod.jax.DistributedOptimizer (both support "
                         "PowerSGD) in a custom training loop, or Compression.none, fp16 or bf16 here.")


def _powersgd_reduce(s: _Settings, out: List[Any], dense: List[int], variables: Optional[List[Any]]) -> None:
    """``out[i]`` for ``i`` in ``dense`` reduced by PowerSGD (horovod.tensorflow.powersgd; ``groups`` apply to
    the gradients it does not compress)."""
    from horovod.tensorflow.gradient_tape import _key

    dense_vars = None if variables is None else [variables[i] for i in dense]

    def grouped(tensors: List[Any], name: str) -> List[Any]:
        return backend_ops.grouped_allreduce(tensors, name, s.op, s.prescale, s.postscale, s.process_set)

    def summed(tensors: List[Any], name: str) -> List[Any]:
        return backend_ops.grouped_allreduce(tensors, name, Sum, 1.0, 1.0, s.process_set)

    def plain(tensors: List[Any], positions: List[int]) -> List[Any]:
        tensors = list(tensors)
        allreduce_in_groups(tensors, positions, dense_vars, s.groups, NoneCompressor, grouped, s.name)
        return tensors

    keys = [_key(v) for v in dense_vars] if dense_vars is not None else [
        (i, tuple(out[i].shape)) for i in dense]
    reduced = s.powersgd.reduce([out[i] for i in dense], keys, plain, grouped, summed, s.name)
    for i, r in zip(dense, reduced):
        out[i] = r


def _distributed_class(base: type, settings: _Settings) -> type:
    """A subclass of ``base`` whose ``apply`` reduces the gradients across ranks first."""

    class _DistributedOptimizer(base):
        _hvd_settings = settings

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            settings = type(self)._hvd_settings
            self._hvd = replace(settings, local_ids=set(settings.local_ids))
            if isinstance(settings.compression, PowerSGDCompressor):
                _check_powersgd_backend(settings.compression)
                from horovod.tensorflow.powersgd import PowerSGDState

                self._hvd.powersgd = PowerSGDState(settings.compression, settings.name)

        @property
        def powersgd_state(self) -> Any:
            """PowerSGD's state (``horovod.tensorflow.powersgd.PowerSGDState``: ``variables()``, ``reset()``),
            or None without ``Compression.powersgd``. Not among the optimizer's variables (see
            docs/compression.md)."""
            return self._hvd.powersgd

        def register_local_var(self, var: Any) -> None:
            """Keep ``var``'s gradient local to this rank (not allreduced)."""
            self._hvd.local_ids.add(id(var))

        def build(self, variables):
            super().build(variables)
            if self._hvd.backward_passes_per_step > 1:
                _add_aggregation_state(self, variables)

        def apply(self, grads, trainable_variables=None):
            grads = list(grads)
            if not grads:
                return super().apply(grads, trainable_variables)
            if trainable_variables is None:
                variables = list(self._trainable_variables) if self.built else None
            else:
                variables = list(trainable_variables)
            if self._hvd.backward_passes_per_step == 1:
                return super().apply(self._hvd_reduce(grads, variables), trainable_variables)
            return self._hvd_apply_aggregated(grads, variables)

        def _hvd_apply_aggregated(self, grads, variables):
            if variables is None:
                raise ValueError("The optimizer must be built (or given trainable_variables) before the first "
                                 "apply when backward_passes_per_step > 1.")
            if backend_ops.backend() == "jax":
                raise NotImplementedError("backward_passes_per_step > 1 is not supported on the JAX backend; "
                                          "use the optimizer's own gradient_accumulation_steps, which keeps "
                                          "the allreduce on every step.")
            if not self.built:
                with keras.name_scope(self.name, caller=self):
                    self.build(variables)
                self.built = True
            n = self._hvd.backward_passes_per_step
            slots = [self._hvd_aggregated[self._get_variable_index(v)] for v in variables]
            for g, slot in zip(grads, slots):
                if g is not None:
                    slot.assign_add(backend_ops.to_dense(g))
            self._hvd_counter.assign_add(1)
            present = [g is not None for g in grads]

            def update():
                scale = 1.0 / n if self._hvd.average_aggregated_gradients else 1.0
                summed = [keras.ops.convert_to_tensor(s) * scale if p else None for s, p in zip(slots, present)]
                super(_DistributedOptimizer, self).apply(self._hvd_reduce(summed, variables), variables)
                for slot in slots:
                    slot.assign(keras.ops.zeros_like(slot))
                self._hvd_counter.assign(0)

            def skip():
                self._iterations.assign_add(1)

            keras.ops.cond(keras.ops.greater_equal(self._hvd_counter, n), update, skip)

        def _hvd_reduce(self, grads: List[Any], variables: Optional[List[Any]]) -> List[Any]:
            return _reduce_gradients(self._hvd, grads, variables)

    _DistributedOptimizer.__name__ = base.__name__
    _DistributedOptimizer.__qualname__ = base.__qualname__
    _DistributedOptimizer.__module__ = base.__module__    # a saved model names the original class
    return _DistributedOptimizer


def settings_for(name: Optional[str] = None, compression: Any = None, sparse_as_dense: bool = False,
                 gradient_predivide_factor: float = 1.0, op: ReduceOp = Average, backward_passes_per_step: int = 1,
                 average_aggregated_gradients: bool = False, groups: Groups = None,
                 process_set: ProcessSet = global_process_set, scale_local_gradients: bool = True) -> _Settings:
    """Validated settings of a distributed optimizer, with upstream's defaults."""
    from horovod._keras.compression import Compression

    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    op = _check_op(op, average_aggregated_gradients)
    check_powersgd_op(compression, op)
    prescale, postscale = scale_factors(op, gradient_predivide_factor)
    return _Settings(name=name or "DistributedOptimizer", compression=compression or Compression.none,
                     sparse_as_dense=sparse_as_dense, op=op, prescale=prescale, postscale=postscale,
                     backward_passes_per_step=int(backward_passes_per_step),
                     average_aggregated_gradients=average_aggregated_gradients, groups=check_groups(groups),
                     process_set=process_set, scale_local_gradients=scale_local_gradients,
                     gradient_predivide_factor=gradient_predivide_factor)


def local_layer_list(local_layers: Any) -> List[Any]:
    """``local_layers`` as a list: upstream accepts one layer as well as a collection of them."""
    if local_layers is None:
        return []
    if hasattr(local_layers, "trainable_weights"):
        return [local_layers]
    return list(local_layers)


def distributed_optimizer_class(base: type, settings: _Settings) -> type:
    """The distributed subclass of an optimizer class (``load_model`` uses it for the classes a file names)."""
    if getattr(base, "_hvd_settings", None) is not None:
        raise ValueError("This optimizer is already a Horovod DistributedOptimizer; wrap the original once.")
    return _distributed_class(base, settings)


def create_distributed_optimizer(optimizer: Any, local_layers: Optional[Iterable[Any]] = None,
                                 **settings: Any) -> Any:
    """Wrap a Keras optimizer instance (see the module docstring); ``settings`` are ``settings_for``'s.
    Shared by horovod.keras and horovod.tensorflow.keras."""
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"DistributedOptimizer expects a Keras 3 optimizer (keras.optimizers.Optimizer) or a "
                         f"tf-keras (Keras 2) optimizer, got {type(optimizer).__name__}. For "
                         "tf.compat.v1.train optimizers use horovod.tensorflow.DistributedOptimizer.")
    settings["name"] = settings.get("name") or f"Distributed{type(optimizer).__name__}"
    _check_powersgd_backend(settings.get("compression"))
    resolved = settings_for(**settings)
    for layer in local_layer_list(local_layers):
        resolved.local_ids.update(id(v) for v in layer.trainable_weights)
    return distributed_optimizer_class(type(optimizer), resolved).from_config(optimizer.get_config())
