"""``DistributedOptimizer`` for Keras 2 (tf_keras) optimizers: the legacy ones (``tf.keras.optimizers.legacy.*``,
``OptimizerV2``) and tf_keras's own v2 ones (``tf.keras.optimizers.Adam`` ... in tf_keras 2.11+).

As upstream (``horovod/_keras/__init__.py``), the wrapper is a dynamic subclass of the optimizer's class, made
from its config, named like it, in the module ``horovod._keras`` (a saved model names ``SGD``; ``hvd.load_model``
wraps it again, plain tf_keras loads tf_keras's ``SGD``).

Where the gradients are reduced: in ``apply_gradients``, which ``minimize`` (so ``model.fit``) and custom loops
both call; in ``get_gradients``, which graph-mode (TF1) Keras calls before ``apply_gradients``; and in upstream's
``_compute_gradients``, which legacy optimizers' ``minimize`` and upstream's programs call. Gradients that one of
the latter two already reduced are not reduced again. Upstream reduced in ``compute_gradients`` and
``get_gradients`` only, so a custom loop's ``apply_gradients`` of plain ``tape.gradient`` results was not
averaged there; here it is, as in the Keras 3 binding.

- Dense gradients: ``horovod.tensorflow``'s grouped allreduce (eagerly, in ``tf.function`` and in TF1 graphs),
  with the optimizer's compression, ``groups``, ``op`` and ``gradient_predivide_factor``; ``tf.IndexedSlices``:
  allgathers unless ``sparse_as_dense``.
- ``backward_passes_per_step=N``: ``horovod.tensorflow``'s ``LocalGradientAggregationHelper`` adds N calls'
  gradients into local accumulators, allreduces on the N-th (divided by N with ``average_aggregated_gradients``)
  and applies then; the other calls only advance ``iterations``.
- ``register_local_var(var)`` (keyed by ``var.ref()``): that gradient stays local, divided by the size when
  ``scale_local_gradients``.
"""
from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence

import tensorflow as tf

from horovod._keras.flavor import tf_keras
from horovod._keras.keras2 import session
from horovod._keras.optimizer import KERAS_REMEDY, _Settings, local_layer_list, settings_for
from horovod.common.compression import PowerSGDCompressor
from horovod.tensorflow.compression import Compression as _TFCompression
from horovod.tensorflow.gradient_aggregation import LocalGradientAggregationHelper
from horovod.tensorflow.gradient_tape import _key, _make_allreduce_grads_fn, reduce_global_keep_local
from horovod.tensorflow.mpi_ops import rank
from horovod.tensorflow.powersgd import PowerSGDState

_TF_COMPRESSORS = {"float16": _TFCompression.fp16, "bfloat16": _TFCompression.bf16}


def is_optimizer(obj: Any) -> bool:
    """True for a tf_keras optimizer: legacy (``OptimizerV2``) or tf_keras's v2 ``Optimizer``."""
    module = tf_keras()
    return isinstance(obj, (module.optimizers.Optimizer, module.optimizers.legacy.Optimizer))


def _is_legacy(cls: type) -> bool:
    return issubclass(cls, tf_keras().optimizers.legacy.Optimizer)


def tf_compression(compression: Any) -> Any:
    """The TensorFlow compressor for ``compression``: ``horovod.keras.Compression.fp16`` (Keras ops) becomes
    ``horovod.tensorflow.Compression.fp16``; TF compressors and custom ones are used as they are."""
    if compression is None:
        return _TFCompression.none
    wire = getattr(compression, "wire_dtype", None)
    if isinstance(wire, str):
        if wire not in _TF_COMPRESSORS:
            raise ValueError(f"No TensorFlow compressor sends {wire}; use horovod.tensorflow.Compression.")
        return _TF_COMPRESSORS[wire]
    return compression


class CallableList(list):
    """tf_keras's v2 optimizers have a ``variables`` property, its legacy ones a ``variables()`` method; upstream
    made the property's list callable so that code written for either works (``opt.variables()``)."""

    def __call__(self):
        return self


class _State:
    """One optimizer's Horovod state. A plain object, so that tf_keras's (auto-tracking) optimizers do not track
    it and checkpoints keep the wrapped optimizer's layout."""

    def __init__(self, settings: _Settings):
        self.settings = settings
        self.local_keys: set = set()
        # PowerSGD's state (horovod.tensorflow.powersgd), this optimizer's own; not in its variables.
        self.powersgd_state = (PowerSGDState(settings.compression, settings.name)
                               if isinstance(settings.compression, PowerSGDCompressor) else None)
        self.allreduce_grads = _make_allreduce_grads_fn(
            settings.name, tf_compression(settings.compression), settings.sparse_as_dense, settings.op,
            settings.gradient_predivide_factor, settings.groups, settings.process_set, remedy=KERAS_REMEDY,
            powersgd_state=self.powersgd_state)
        self.helper: Optional[LocalGradientAggregationHelper] = None
        if settings.backward_passes_per_step > 1:
            self.helper = LocalGradientAggregationHelper(
                settings.backward_passes_per_step, self.allreduce_grads, settings.sparse_as_dense,
                settings.average_aggregated_gradients, rank(), LocalGradientAggregationHelper._OPTIMIZER_TYPE_KERAS,
                process_set=settings.process_set, scale_local_gradients=settings.scale_local_gradients)
        self.helper_initialized = False
        # The tensors the last get_gradients returned (by id, with references so the ids stay theirs).
        self.reduced: dict = {}

    def register_local_var(self, var: Any) -> None:
        self.local_keys.add(_key(var))
        if self.helper is not None:
            self.helper.register_local_var(var)

    def reduce(self, grads: Sequence[Any], variables: Sequence[Any]) -> List[Any]:
        """The gradients to apply (with ``backward_passes_per_step``: this pass's contribution, see the helper)."""
        if self.helper is not None:
            reduced = self.helper.compute_gradients(list(grads), list(variables))
            self._initialize_helper_in_session()
            return reduced
        if not self.settings.process_set.included():
            return list(grads)
        return reduce_global_keep_local(self.allreduce_grads, grads, variables, self.local_keys,
                                        self.settings.scale_local_gradients, self.settings.process_set)

    def _initialize_helper_in_session(self) -> None:
        """Graph-mode Keras initializes only global variables; the helper's accumulators are local ones, so they
        are initialized in Keras' session once made (as upstream's helper did for Keras)."""
        if self.helper_initialized or tf.compat.v1.executing_eagerly_outside_functions():
            return
        made = [v for v in [self.helper.counter, *self.helper.locally_aggregated_grads] if v is not None]
        session().run(tf.compat.v1.variables_initializer(made))
        self.helper_initialized = True

    def reduce_once(self, grads: Sequence[Any], variables: Sequence[Any]) -> List[Any]:
        """:meth:`reduce`, remembering the result so that ``apply_gradients`` of it does not reduce it again."""
        reduced = self.reduce(grads, variables)
        self.reduced = {id(g): g for g in reduced if g is not None}
        return reduced

    def already_reduced(self, grads: Sequence[Any]) -> bool:
        present = [g for g in grads if g is not None]
        return bool(present) and all(self.reduced.get(id(g)) is g for g in present)


def _distributed_class(base: type, settings: _Settings) -> type:
    """A subclass of the tf_keras optimizer class ``base`` whose gradients are reduced across ranks."""

    class _DistributedOptimizer(base):
        _hvd_settings = settings

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._hvd = _State(type(self)._hvd_settings)

        def register_local_var(self, var: Any) -> None:
            """Keep ``var``'s gradient local to this rank (not allreduced, not broadcast by this optimizer)."""
            self._hvd.register_local_var(var)

        def get_gradients(self, loss, params):
            """Graph-mode Keras' gradients, reduced across ranks (as upstream)."""
            grads = super().get_gradients(loss, params)
            return self._hvd.reduce_once(grads, tf.nest.flatten(params))

        def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
            """Upstream's hook: the ``(gradient, variable)`` pairs of ``loss``, reduced across ranks (with
            ``backward_passes_per_step``, this pass's share, as the helper gives it); ``apply_gradients`` of
            these pairs does not reduce them again."""
            if hasattr(base, "_compute_gradients"):        # legacy optimizers (OptimizerV2)
                pairs = super()._compute_gradients(loss, var_list, grad_loss, tape=tape)
            else:                                          # tf_keras's v2 optimizers take no grad_loss
                if grad_loss is not None:
                    raise ValueError("grad_loss needs a legacy tf_keras optimizer (tf.keras.optimizers.legacy.*).")
                pairs = super().compute_gradients(loss, var_list, tape=tape)
            pairs = list(pairs)
            variables = [v for _, v in pairs]
            return list(zip(self._hvd.reduce_once([g for g, _ in pairs], variables), variables))

        def apply_gradients(self, grads_and_vars, *args, **kwargs):
            pairs = list(grads_and_vars)
            if not pairs:
                return super().apply_gradients(pairs, *args, **kwargs)
            grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
            state = self._hvd
            if not state.already_reduced(grads):
                grads = state.reduce(grads, variables)
            pairs = list(zip(grads, variables))
            if state.helper is None:
                return super().apply_gradients(pairs, *args, **kwargs)
            with tf.init_scope():
                _ = self.iterations    # legacy optimizers create it lazily; skipped passes count on it

            def apply():
                return super(_DistributedOptimizer, self).apply_gradients(pairs, *args, **kwargs)

            return state.helper.apply_gradients(apply, self, pairs)

    if not _is_legacy(base):
        def variables(self):
            return CallableList(super(_DistributedOptimizer, self).variables)

        _DistributedOptimizer.variables = property(variables, doc="The optimizer's variables (also callable).")
    _DistributedOptimizer.__name__ = base.__name__
    _DistributedOptimizer.__qualname__ = base.__qualname__
    # Upstream's module (its tests check it). .h5 and SavedModel files name the class only; a .keras file names
    # horovod._keras.<Class>, which resolves to tf_keras's class for plain tf_keras (see horovod._keras).
    _DistributedOptimizer.__module__ = "horovod._keras"
    return _DistributedOptimizer


def distributed_optimizer_class(base: type, settings: _Settings) -> type:
    """The distributed subclass of a tf_keras optimizer class (``load_model`` uses it for a file's classes)."""
    if getattr(base, "_hvd_settings", None) is not None:
        raise ValueError("This optimizer is already a Horovod DistributedOptimizer; wrap the original once.")
    return _distributed_class(base, settings)


def create_distributed_optimizer(optimizer: Any, local_layers: Optional[Iterable[Any]] = None,
                                 **settings: Any) -> Any:
    """Wrap a tf_keras optimizer instance (see the module docstring); ``settings`` are ``settings_for``'s."""
    settings["name"] = settings.get("name") or f"Distributed{type(optimizer).__name__}"
    resolved = settings_for(**settings)
    wrapped = distributed_optimizer_class(type(optimizer), resolved).from_config(optimizer.get_config())
    for layer in local_layer_list(local_layers):
        for var in layer.trainable_weights:
            wrapped.register_local_var(var)
    return wrapped
