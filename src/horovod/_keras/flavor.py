"""Which Keras an object belongs to: Keras 3 (``import keras``) or Keras 2 through ``tf_keras`` (what ``tf.keras``
is when ``TF_USE_LEGACY_KERAS=1``).

Both can live in one process (under ``TF_USE_LEGACY_KERAS=1`` a program's ``import keras`` is still Keras 3 while
``tf.keras`` is ``tf_keras``), so the Keras bindings decide per object, not by the environment variable: an
optimizer, model or layer whose class (or a base class) comes from the ``tf_keras`` package is a Keras 2 object
and takes the TensorFlow-only path in ``horovod._keras.keras2``; everything else takes the Keras 3 path.
"""
from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any, Optional

_TRUE = ("1", "true", "yes", "on")


def legacy_keras_requested() -> bool:
    """True when ``TF_USE_LEGACY_KERAS`` asks TensorFlow to make ``tf.keras`` the ``tf_keras`` package."""
    return os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in _TRUE


def _from_tf_keras(cls: type) -> bool:
    return any(getattr(c, "__module__", "").split(".", 1)[0] == "tf_keras" for c in cls.__mro__)


def is_tf_keras(obj: Any) -> bool:
    """True for a ``tf_keras`` (Keras 2) object or class: an optimizer, model, layer, callback...

    Cheap and import-free: an object can only be a tf_keras one once the ``tf_keras`` package is loaded.
    """
    if "tf_keras" not in sys.modules or obj is None:
        return False
    return _from_tf_keras(obj if isinstance(obj, type) else type(obj))


def tf_keras() -> ModuleType:
    """The ``tf_keras`` package (Keras 2), with an error that says how to install it."""
    try:
        import tf_keras as module
    except ImportError as exc:      # pragma: no cover - depends on the installation
        raise ImportError("This needs tf-keras (Keras 2 for TensorFlow): pip install 'horovod[tf-keras]' or "
                          "pip install tf-keras, then set TF_USE_LEGACY_KERAS=1 to make tf.keras use it.") from exc
    return module


def loaded_tf_keras() -> Optional[ModuleType]:
    """The ``tf_keras`` package if this process has imported it, else None."""
    return sys.modules.get("tf_keras")
