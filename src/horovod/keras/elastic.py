"""``horovod.keras.elastic``: elastic training with standalone Keras 3 on any backend (upstream's module):
``KerasState``, the elastic callbacks (``horovod._keras.elastic``) and ``run``.

Unlike ``horovod.tensorflow.keras.elastic``, nothing here needs TensorFlow: the state keeps the model's and the
optimizer's variables as numpy arrays and syncs them with ``horovod._keras.values``' broadcasts, so it works
with ``KERAS_BACKEND`` set to ``tensorflow``, ``torch`` or ``jax``. See :mod:`horovod.common.elastic` for the
loop and the protocol.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, List

import keras
import numpy as np

from horovod._keras import values
from horovod._keras.elastic import CommitStateCallback, UpdateBatchStateCallback, UpdateEpochStateCallback
from horovod._keras.flavor import is_tf_keras
from horovod.common.elastic import ObjectState, run_fn
from horovod.core import basics
from horovod.core.ops import broadcast_object

__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``func(state, ...)`` to keep training as workers come and go: after a failed collective the last
    commit is restored, the job re-formed (``shutdown()``, ``init()``) and the state synced from rank 0. On
    TensorFlow, the error of a failed collective inside ``model.fit``'s graph counts as one too."""
    if keras.backend.backend() == "tensorflow":
        from horovod.tensorflow.elastic import graph_errors_as_internal

        func = graph_errors_as_internal(func)
    return run_fn(func, _reset)


def _reset() -> None:
    basics.shutdown()
    basics.init()
    # PowerSGD's state (the TensorFlow backend's, loaded only with it) starts again on every rank, so that
    # survivors and new ranks agree on its step count and Qs.
    powersgd = sys.modules.get("horovod.tensorflow.powersgd")
    if powersgd is not None:
        powersgd.reset_all_states()


def _to_numpy(variable: Any) -> np.ndarray:
    """A copy of a variable's value (Keras 3 on any backend, or a tf_keras ``tf.Variable``): a torch CPU
    tensor's numpy view would follow later updates."""
    value = variable.value if isinstance(variable, keras.Variable) else variable
    return np.array(keras.ops.convert_to_numpy(value), copy=True)


def _optimizer_variables(optimizer: Any) -> List[Any]:
    """A Keras 3 optimizer's variables (a property), or a tf_keras one's (a method). Not
    ``horovod._keras.keras2.state.optimizer_variables``: that module imports TensorFlow."""
    found = optimizer.variables
    return list(found() if callable(found) else found)


def _build(optimizer: Any, variables: List[Any]) -> None:
    """Create the optimizer's slots now unless it has them (Keras 3: ``built``; tf_keras: ``_built``; a legacy
    tf_keras optimizer, which has no ``build``, creates them in its first step)."""
    if not getattr(optimizer, "built", getattr(optimizer, "_built", False)) and hasattr(optimizer, "build"):
        optimizer.build(variables)


class KerasState(ObjectState):
    """A built Keras model and its optimizer (``model.optimizer`` by default), plus any keyword attributes
    (e.g. ``epoch=0, batch=0``), kept across resets.

    ``save`` copies every model and optimizer variable to host memory, ``restore`` assigns the copies back and
    ``sync`` broadcasts rank 0's variables and attributes. The optimizer is built here if it is not yet, so that
    a worker that joins a running job has the same variables to receive as the survivors have to send.
    """

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
        if hasattr(model, "build") and not model.built:
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        if is_tf_keras(model) and values._graph_mode():
            raise ValueError("horovod.keras.elastic.KerasState needs eager execution; in a TF1 graph-mode "
                             "program use horovod.tensorflow.keras.elastic.KerasState instead.")
        self.model = model
        self.optimizer = optimizer or getattr(model, "optimizer", None)
        if self.optimizer is None:
            raise ValueError("No optimizer: compile the model first, or pass KerasState(model, optimizer).")
        _build(self.optimizer, model.trainable_variables)
        self._save_model()
        super().__init__(bcast_object=lambda obj: broadcast_object(obj, 0, "elastic.KerasState"),
                         get_rank=basics.rank, **kwargs)

    def _variables(self) -> List[Any]:
        return list(self.model.variables) + _optimizer_variables(self.optimizer)

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        for variable, saved in zip(self._saved_variables, self._saved_values):
            variable.assign(saved)
        super().restore()

    def sync(self) -> None:
        values.sync_backend_state(self.model)
        values.broadcast_variables(self._variables(), root_rank=0, name="elastic.KerasState.variables")
        self._save_model()
        super().sync()

    def _save_model(self) -> None:
        # During fit on JAX the trainer holds the current values: write them back into the variables first.
        values.sync_backend_state(self.model)
        self._saved_variables = self._variables()
        self._saved_values = [_to_numpy(v) for v in self._saved_variables]
