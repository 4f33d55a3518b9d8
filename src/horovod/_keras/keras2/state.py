"""A tf_keras model's and optimizer's state, as the callbacks read and change it: variables, the learning rate and
the momentum. It goes through ``tf_keras.backend`` (``batch_get_value``/``batch_set_value``, ``get_value``), so
it works eagerly and, as upstream's callbacks did, in a graph-mode (TF1) Keras session.
"""
from __future__ import annotations

from typing import Any, Iterable, List, Optional

import numpy as np

from horovod._keras.flavor import tf_keras
from horovod.core import ops
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.tensorflow.gradient_tape import _key


def optimizer_variables(optimizer: Any) -> List[Any]:
    """The optimizer's variables: legacy optimizers have a ``variables()`` method, v2 ones a property."""
    found = getattr(optimizer, "variables", None)
    if found is None:
        return []
    return list(found() if callable(found) else found)


def broadcast_model(model: Any, root_rank: int, local_variables: Iterable[Any] = (),
                    process_set: ProcessSet = global_process_set, include_optimizer: bool = True) -> None:
    """Make ``model``'s variables, and (``include_optimizer``) its optimizer's, equal to ``root_rank``'s
    (``local_variables``, matched by ``var.ref()`` as upstream, keep this rank's values). All broadcasts start
    before the first completes."""
    backend = tf_keras().backend
    skip = {_key(v) for v in local_variables}
    variables = [v for v in model.variables if _key(v) not in skip]
    optimizer = getattr(model, "optimizer", None)
    if include_optimizer and optimizer is not None:
        variables += [v for v in optimizer_variables(optimizer) if _key(v) not in skip]
    if not variables:
        return
    arrays = [np.require(a, requirements="C") for a in backend.batch_get_value(variables)]
    handles = [ops.broadcast_async(a, int(root_rank), None, f"BroadcastGlobalVariables.{i}", process_set)
               for i, a in enumerate(arrays)]
    backend.batch_set_value([(v, h.wait().reshape(a.shape)) for v, a, h in zip(variables, arrays, handles)])


def get_lr(optimizer: Any) -> float:
    """The optimizer's current learning rate (``optimizer.lr`` as upstream reads it)."""
    return float(tf_keras().backend.get_value(optimizer.learning_rate))


def set_lr(optimizer: Any, value: float) -> None:
    """Set the learning rate; the next training step uses it (it is a variable of the step, not a constant)."""
    optimizer.learning_rate = value


def momentum_hyper(optimizer: Any) -> Optional[float]:
    """A legacy optimizer's ``momentum`` hyperparameter (a variable that each step reads), or None when the
    optimizer has no such hyperparameter (v2 optimizers keep ``momentum`` as a Python float)."""
    hyper = getattr(optimizer, "_hyper", None)
    if not isinstance(hyper, dict) or "momentum" not in hyper:
        return None
    return float(tf_keras().backend.get_value(optimizer.momentum))


def set_momentum_hyper(optimizer: Any, value: float) -> None:
    """Set a legacy optimizer's ``momentum`` hyperparameter (see ``momentum_hyper``)."""
    optimizer.momentum = value
