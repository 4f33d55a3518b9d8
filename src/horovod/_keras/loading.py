"""``load_model``: load a saved Keras model with its optimizer re-created as a ``DistributedOptimizer``.

Which Keras loads it is decided by the file, not by ``TF_USE_LEGACY_KERAS``: a file that tf_keras (Keras 2) wrote
(its recorded ``keras_version`` is 2.x, or it is a SavedModel directory) goes to ``horovod._keras.keras2.loading``,
anything else to Keras 3.
"""
from __future__ import annotations

import json
import os
import zipfile
from typing import Any, Dict, Iterable, Optional

import keras

from horovod._keras.optimizer import distributed_optimizer_class, settings_for


def _optimizer_classes() -> Iterable[type]:
    """The optimizer classes Keras ships (``keras.optimizers.Adam`` ...), which a saved model may name."""
    for value in vars(keras.optimizers).values():
        if isinstance(value, type) and issubclass(value, keras.optimizers.Optimizer) \
                and value is not keras.optimizers.Optimizer and value.__name__ != "LossScaleOptimizer":
            yield value


def _major(version: Any) -> Optional[int]:
    if isinstance(version, bytes):
        version = version.decode("utf-8", "replace")
    try:
        return int(str(version).split(".", 1)[0])
    except ValueError:
        return None


def saved_keras_major(filepath: Any) -> Optional[int]:
    """The major Keras version that wrote ``filepath`` (2 for a SavedModel directory), or None if unknown."""
    if hasattr(filepath, "attrs"):                      # an open h5py.File
        return _major(filepath.attrs.get("keras_version", ""))
    if not isinstance(filepath, (str, os.PathLike)):
        return None
    path = os.fspath(filepath)
    if os.path.isdir(path):
        return 2 if os.path.exists(os.path.join(path, "saved_model.pb")) else None
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            if "metadata.json" not in archive.namelist():
                return None
            return _major(json.loads(archive.read("metadata.json")).get("keras_version", ""))
    try:
        import h5py
    except ImportError:
        return None
    if not h5py.is_hdf5(path):
        return None
    with h5py.File(path, "r") as f:
        return _major(f.attrs.get("keras_version", ""))


def load_model(filepath: Any, custom_optimizers: Optional[Iterable[type]] = None,
               custom_objects: Optional[Dict[str, Any]] = None, compression: Any = None,
               legacy_opts: bool = False, **settings: Any) -> Any:
    """Load a model saved with ``model.save``, re-creating its optimizer as a Horovod ``DistributedOptimizer``
    with its saved state (slots, iterations) restored.

    ``custom_optimizers``: further optimizer classes the file may name. ``custom_objects``: passed to Keras.
    ``legacy_opts``: for tf_keras files, see ``horovod._keras.keras2.loading`` (Keras 3 has no legacy optimizers).
    """
    major = saved_keras_major(filepath)
    if major is not None and major < 3:
        from horovod._keras.keras2.loading import load_model as load_keras2

        return load_keras2(filepath, custom_optimizers, custom_objects, compression, legacy_opts, **settings)
    def settings_of(cls: type) -> Any:
        return settings_for(name=f"Distributed{cls.__name__}", compression=compression, **settings)

    objects: Dict[str, Any] = {cls.__name__: distributed_optimizer_class(cls, settings_of(cls))
                               for cls in list(_optimizer_classes()) + list(custom_optimizers or ())}
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects)
    _wrap_plain_optimizer(model, settings_of)
    return model


def _wrap_plain_optimizer(model: Any, settings_of: Any) -> None:
    """Keras 3 resolves a built-in optimizer class (saved by a program without Horovod) without looking at
    ``custom_objects``; such a loaded optimizer is replaced here by its distributed form, with its state."""
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(optimizer, keras.optimizers.Optimizer) or getattr(type(optimizer), "_hvd_settings", None) \
            or isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return
    cls = type(optimizer)
    wrapped = distributed_optimizer_class(cls, settings_of(cls)).from_config(optimizer.get_config())
    if optimizer.built:
        wrapped.build(list(optimizer._trainable_variables))
        for new, old in zip(wrapped.variables, optimizer.variables):
            new.assign(old)
    model.optimizer = wrapped
