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


class _SavedOptimizer:
    """A ``custom_objects`` entry for one built-in optimizer name: ``from_config`` builds the Horovod wrapper of
    the legacy or the v2 class of that name, whichever the saved config was written by."""

    def __init__(self, legacy: Optional[type], v2: Optional[type], settings: _Settings, legacy_default: bool):
        self.legacy, self.v2, self.settings, self.legacy_default = legacy, v2, settings, legacy_default

    def _choose(self, config: Dict[str, Any]) -> type:
        legacy = config.get("is_legacy_optimizer", True) if config else self.legacy_default
        if not tf.executing_eagerly():
            legacy = True           # graph-mode Keras has only the legacy optimizers
        cls = (self.legacy or self.v2) if legacy else (self.v2 or self.legacy)
        return distributed_optimizer_class(cls, self.settings)

    def from_config(self, config: Dict[str, Any], custom_objects: Optional[Dict[str, Any]] = None) -> Any:
        config = dict(config)
        cls = self._choose(config)
        if not _is_v2(cls):
            config.pop("is_legacy_optimizer", None)
        return cls.from_config(config, custom_objects=custom_objects)

    def __call__(self, **config: Any) -> Any:
        return self.from_config(config)


def _is_v2(cls: type) -> bool:
    return issubclass(cls, tf_keras().optimizers.Optimizer)


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
    return module.models.load_model(filepath, custom_objects=objects)
