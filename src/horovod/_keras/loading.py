"""``load_model``: load a saved Keras model with its optimizer re-created as a ``DistributedOptimizer``."""
from __future__ import annotations

from typing import Any, Dict, Iterable, Optional

import keras

from horovod._keras.optimizer import distributed_optimizer_class, settings_for


def _optimizer_classes() -> Iterable[type]:
    """The optimizer classes Keras ships (``keras.optimizers.Adam`` ...), which a saved model may name."""
    for value in vars(keras.optimizers).values():
        if isinstance(value, type) and issubclass(value, keras.optimizers.Optimizer) \
                and value is not keras.optimizers.Optimizer and value.__name__ != "LossScaleOptimizer":
            yield value


def load_model(filepath: str, custom_optimizers: Optional[Iterable[type]] = None,
               custom_objects: Optional[Dict[str, Any]] = None, compression: Any = None,
               legacy_opts: bool = False, **settings: Any) -> Any:
    """Load a model saved with ``model.save`` (``.keras``), re-creating its optimizer as a Horovod
    ``DistributedOptimizer`` with its saved state (slots, iterations) restored.

    ``custom_optimizers``: further optimizer classes the file may name. ``custom_objects``: passed to Keras.
    ``legacy_opts`` is accepted for upstream compatibility (Keras 3 has no legacy optimizers).
    """
    wrapped = {}
    for cls in list(_optimizer_classes()) + list(custom_optimizers or ()):
        wrapped[cls.__name__] = distributed_optimizer_class(
            cls, settings_for(name=f"Distributed{cls.__name__}", compression=compression, **settings))
    objects = dict(wrapped)
    objects.update(custom_objects or {})
    return keras.models.load_model(filepath, custom_objects=objects)
