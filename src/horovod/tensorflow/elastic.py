"""``horovod.tensorflow.elastic``: elastic training for TensorFlow (upstream's module): ``run``,
``TensorFlowKerasState`` (a Keras model and its optimizer, Keras 3 or tf-keras) and ``TensorFlowState`` (a list of
variables); ``ObjectState`` is re-exported. See :mod:`horovod.common.elastic` for the loop and the protocol."""
from __future__ import annotations

import functools
import re
from typing import Any, Callable, List, Optional

import tensorflow as tf

from horovod.common.elastic import ObjectState, run_fn
from horovod.common.exceptions import HorovodInternalError
from horovod.core import basics
from horovod.tensorflow import powersgd
from horovod.tensorflow.functions import broadcast_object, broadcast_object_fn, broadcast_variables
from horovod.tensorflow.util import _executing_eagerly

__all__ = ["TensorFlowKerasState", "TensorFlowState", "ObjectState", "run"]
# Any of Horovod's graph nodes (HorovodAllreduce, HorovodGroupedAllreduce of DistributedGradientTape and the Keras
# optimizers, HorovodAllgather, HorovodBroadcast, HorovodJoin...): a fixed list of names missed the grouped
# allreduce, so a lost peer ended every survivor instead of re-forming the job.
_COLLECTIVE_NODE = re.compile(r"\bHorovod[A-Z]\w*")


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``func(state, ...)`` to keep training as workers come and go. A TensorFlow error raised by one of
    Horovod's graph nodes counts as a failed collective (``HorovodInternalError``): restore, re-form, sync."""
    return run_fn(graph_errors_as_internal(func), _reset)


def graph_errors_as_internal(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func``, raising ``HorovodInternalError`` for the ``tf.errors.UnknownError`` of a failed Horovod graph node
    (a ``tf.function``, Keras' train function), as it does eagerly; ``horovod.keras``' run uses it on TensorFlow."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except tf.errors.UnknownError as exc:
            # Eagerly the error already is a HorovodInternalError (horovod.tensorflow.errors); from a graph, TF
            # rebuilds it from the node's status, and only the node's name says it was Horovod's (upstream's rule).
            if not isinstance(exc, HorovodInternalError) and _COLLECTIVE_NODE.search(str(exc)):
                raise HorovodInternalError(str(exc)) from exc
            raise

    return wrapper


def _reset() -> None:
    basics.shutdown()
    basics.init()
    powersgd.reset_all_states()     # survivors and new ranks start PowerSGD from the same step and Qs


def _optimizer_variables(optimizer) -> List[tf.Variable]:
    """An optimizer's variables: a property in Keras 3, a method in tf-keras (Keras 2)."""
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def _global_variables() -> List[tf.Variable]:
    return tf.compat.v1.global_variables()


class TensorFlowKerasState(ObjectState):
    """A built Keras model and its optimizer (``model.optimizer`` by default), plus any keyword attributes.

    ``backend`` is for TF1 graph mode (Keras 2): the session that runs the broadcast comes from
    ``backend.get_session()``.
    """

    def __init__(self, model, optimizer=None, backend=None, **kwargs: Any) -> None:
        self.model = model
        if hasattr(model, "build") and not model.built:
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.optimizer = optimizer or model.optimizer
        self.backend = backend
        self._save_model()
        if not backend or _executing_eagerly():
            self._bcast_model = self._broadcast_eagerly
            bcast_object = broadcast_object
        else:
            bcast_op = broadcast_variables(_global_variables(), root_rank=0)    # built once: no new uids
            self._bcast_model = lambda: self.backend.get_session().run(bcast_op)
            bcast_object = broadcast_object_fn(session=self.backend.get_session())
        super().__init__(bcast_object=bcast_object, get_rank=basics.rank, **kwargs)

    def _broadcast_eagerly(self) -> None:
        broadcast_variables(self.model.variables, root_rank=0)
        optimizer_variables = _optimizer_variables(self.optimizer)
        if optimizer_variables:
            broadcast_variables(optimizer_variables, root_rank=0)

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        self._load_model()
        super().restore()

    def sync(self) -> None:
        self._bcast_model()
        self._save_model()
        super().sync()

    def _save_model(self) -> None:
        if _executing_eagerly():
            self._saved_model_state = [v.numpy() for v in self.model.variables]
            self._saved_optimizer_state = [v.numpy() for v in _optimizer_variables(self.optimizer)]
        else:
            self._saved_model_state = self.model.get_weights()
            self._saved_optimizer_state = self.optimizer.get_weights()

    def _load_model(self) -> None:
        if _executing_eagerly():
            for var, saved in zip(self.model.variables, self._saved_model_state):
                var.assign(saved)
            for var, saved in zip(_optimizer_variables(self.optimizer), self._saved_optimizer_state):
                var.assign(saved)
        else:
            self.model.set_weights(self._saved_model_state)
            self.optimizer.set_weights(self._saved_optimizer_state)


class TensorFlowState(ObjectState):
    """A list of ``tf.Variable``s (``tf.compat.v1.global_variables()`` by default), plus keyword attributes.
    ``session`` is for TF1 graph mode (default: the default session)."""

    def __init__(self, variables: Optional[List[tf.Variable]] = None, session=None, **kwargs: Any) -> None:
        self.variables = variables or _global_variables()
        self.session = session or (None if _executing_eagerly() else tf.compat.v1.get_default_session())
        self._bcast_op = broadcast_variables(self.variables, root_rank=0)
        self._save_model()
        bcast = broadcast_object if _executing_eagerly() else broadcast_object_fn(session=self.session)
        super().__init__(bcast_object=lambda obj: bcast(obj), get_rank=basics.rank, **kwargs)

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        for var, value in zip(self.variables, self._values):
            if _executing_eagerly():
                var.assign(value)
            else:
                var.load(value, self.session)
        super().restore()

    def sync(self) -> None:
        if self.session is not None:
            self.session.run(self._bcast_op)
        elif _executing_eagerly():
            broadcast_variables(self.variables, root_rank=0)
        self._save_model()
        super().sync()

    def _save_model(self) -> None:
        self._values = [v.numpy() if _executing_eagerly() else v.eval(self.session) for v in self.variables]
