"""Keras 2 through ``tf_keras`` (``TF_USE_LEGACY_KERAS=1`` makes ``tf.keras`` that package): the distributed
optimizer for its legacy and v2 optimizers, its model and optimizer state for the callbacks, and ``load_model``.
TensorFlow only. ``horovod._keras.flavor`` decides, per object, whether this or the Keras 3 path applies."""
from __future__ import annotations

from typing import Any


def session() -> Any:
    """Graph-mode Keras' session (``tf.compat.v1.keras.backend.get_session()``, which tf_keras's TF2 API does not
    export), with its global variables initialized."""
    from tf_keras.src import backend

    return backend.get_session()
