"""``load_model`` for models saved by tf_keras (Keras 2): the optimizer comes back as a Horovod
``DistributedOptimizer``, with its saved state.

As upstream, every optimizer class tf_keras ships is offered to the loader in ``custom_objects`` as its wrapped
form (under its lower-case name, which tf_keras looks up for built-in optimizers, and its class name). A saved
config says whether it was a legacy optimizer (it has no ``is_legacy_optimizer: False``); the wrapper follows it,
as tf_keras's own loader does. ``legacy_opts`` decides only for a config that does not say (upstream's argument
chose for every file).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, Optional

import tensorflow as tf

from horovod._keras.flavor import tf_keras
from horovod._keras.keras2.optimizer import distributed_optimizer_class
from horovod._keras.optimizer import _Settings, settings_for


def _classes(namespace: Any, base: type) -> Dict[str, type]:
    """The optimizer classes a tf_keras namespace exports, by lower-case name."""
    found = {}
    for value in vars(namespace).values():
        if isinstance(value, type) and issubclass(value, base) and value is not base \
                and "LossScale" not in value.__name__:
            found[value.__name__.lower()] = value
    return found


def _is_v2(cls: type) -> bool:
    return issubclass(cls, tf_keras().optimizers.Optimizer)


def _choose(legacy: Optional[type], v2: Optional[type], config: Dict[str, Any], legacy_default: bool) -> type:
    """The class of one optimizer name a saved ``config`` was written by (tf_keras's own loader's rule: a v2
    optimizer's config says ``is_legacy_optimizer: False``; graph-mode Keras has only the legacy ones). Drops the
    marker from ``config`` for a legacy class."""
    is_legacy = config.get("is_legacy_optimizer", True) if config else legacy_default
    if not tf.executing_eagerly():
        is_legacy = True
    cls = (legacy or v2) if is_legacy else (v2 or legacy)
    if not _is_v2(cls):
        config.pop("is_legacy_optimizer", None)
    return cls


def plain_optimizer_class(name: str, config: Dict[str, Any]) -> type:
    """tf_keras's own optimizer class ``name`` (legacy or v2, as ``config`` says); see ``saved_names``."""
    module = tf_keras()
    key = name.lower()
    legacy = _classes(module.optimizers.legacy, module.optimizers.legacy.Optimizer).get(key)
    v2 = _classes(module.optimizers, module.optimizers.Optimizer).get(key)
    if legacy is None and v2 is None:
        raise TypeError(f"tf_keras has no optimizer named {name!r}; load the model with hvd.load_model("
                        "custom_optimizers=[YourOptimizer]) or custom_objects.")
    return _choose(legacy, v2, config, legacy_default=False)


class _SavedOptimizer:
    """A ``custom_objects`` entry for one built-in optimizer name: ``from_config`` builds the Horovod wrapper of
    the legacy or the v2 class of that name, whichever the saved config was written by."""

    def __init__(self, legacy: Optional[type], v2: Optional[type], settings: _Settings, legacy_default: bool):
        self.legacy, self.v2, self.settings, self.legacy_default = legacy, v2, settings, legacy_default

    def from_config(self, config: Dict[str, Any], custom_objects: Optional[Dict[str, Any]] = None) -> Any:
        config = dict(config)
        cls = distributed_optimizer_class(_choose(self.legacy, self.v2, config, self.legacy_default), self.settings)
        return cls.from_config(config, custom_objects=custom_objects)

    def __call__(self, **config: Any) -> Any:
        return self.from_config(config)


def load_model(filepath: Any, custom_optimizers: Optional[Iterable[type]] = None,
               custom_objects: Optional[Dict[str, Any]] = None, compression: Any = None,
               legacy_opts: bool = False, **settings: Any) -> Any:
    """Load a tf_keras model (``.h5``, ``.keras`` or SavedModel) with its optimizer re-created as a Horovod
    ``DistributedOptimizer``; ``custom_optimizers`` are further optimizer classes the file may name."""
    module = tf_keras()
    legacy = _classes(module.optimizers.legacy, module.optimizers.legacy.Optimizer)
    v2 = _classes(module.optimizers, module.optimizers.Optimizer)

    def resolved(cls_name: str) -> _Settings:
        return settings_for(name=f"Distributed{cls_name}", compression=compression, **settings)

    objects: Dict[str, Any] = {}
    for key in sorted(set(legacy) | set(v2)):
        entry = _SavedOptimizer(legacy.get(key), v2.get(key), resolved((legacy.get(key) or v2[key]).__name__),
                                legacy_opts)
        objects[key] = entry
        objects[(legacy.get(key) or v2[key]).__name__] = entry
    for cls in custom_optimizers or ():
        objects[cls.__name__] = distributed_optimizer_class(cls, resolved(cls.__name__))
    objects.update(custom_objects or {})
    model = module.models.load_model(filepath, custom_objects=objects)
    _wrap_plain_optimizer(model, resolved)
    return model


def _wrap_plain_optimizer(model: Any, resolved: Any) -> None:
    """A ``.keras`` file names a built-in optimizer by its public path, which tf_keras resolves without looking at
    ``custom_objects``; such a loaded optimizer is replaced here by its distributed form, with its state."""
    module = tf_keras()
    optimizer = getattr(model, "optimizer", None)
    kinds = (module.optimizers.Optimizer, module.optimizers.legacy.Optimizer)
    if not isinstance(optimizer, kinds) or getattr(type(optimizer), "_hvd_settings", None) \
            or "LossScale" in type(optimizer).__name__:
        return
    cls = type(optimizer)
    wrapped = distributed_optimizer_class(cls, resolved(cls.__name__)).from_config(optimizer.get_config())
    if _is_v2(cls):
        if optimizer.variables:
            wrapped.build(model.trainable_variables)
            for new, old in zip(wrapped.variables, optimizer.variables):
                new.assign(old)
    elif optimizer.weights:
        wrapped._create_all_weights(model.trainable_variables)
        wrapped.set_weights(optimizer.get_weights())
    model.optimizer = wrapped
