"""``horovod.tensorflow.keras.elastic``: elastic training with Keras on TensorFlow (upstream's module):
``KerasState``, the elastic callbacks, and ``run``."""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from horovod._keras.elastic import CommitStateCallback, UpdateBatchStateCallback, UpdateEpochStateCallback
from horovod.tensorflow.elastic import TensorFlowKerasState, run

__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]


class KerasState(TensorFlowKerasState):
    """A built Keras model and its optimizer (``model.optimizer`` by default), plus any keyword attributes."""

    def __init__(self, model, optimizer=None, **kwargs: Any) -> None:
        super().__init__(model, optimizer=optimizer, backend=tf.keras.backend, **kwargs)
