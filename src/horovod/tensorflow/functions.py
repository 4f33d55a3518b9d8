"""Broadcast and gather helpers for variables and Python objects (upstream's ``horovod/tensorflow/functions.py``)."""
from __future__ import annotations

from typing import Any, Callable, List, Optional

import tensorflow as tf

from horovod.core import ops
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.tensorflow.mpi_ops import _MOVE_DTYPES, _broadcast_many, _name, _no_autograph, _read, _tensor
from horovod.tensorflow.util import _executing_eagerly


@_no_autograph
def broadcast_variables(variables, root_rank: int, process_set: ProcessSet = global_process_set,
                        inplace: bool = False) -> Optional[tf.Operation]:
    """Overwrite every variable with ``root_rank``'s value, in one fused exchange.

    As upstream: eagerly it assigns at once and returns None; in a graph (TF1 or ``tf.function``) it returns one
    op that runs the exchange and the assignments. ``inplace`` is accepted for upstream compatibility (both forms
    assign the broadcast values; there is no extra copy to avoid).
    """
    variables = list(variables)
    if variables:
        values = [_tensor(_read(v), _MOVE_DTYPES, "broadcast_variables") for v in variables]
        outs = _broadcast_many(values, root_rank, _name("broadcast_variables", None, process_set=process_set), process_set)
        assigns = [v.assign(o) for v, o in zip(variables, outs)]
    else:
        assigns = []
    if _executing_eagerly():
        return None
    return tf.group(*assigns)


def broadcast_object(obj: Any, root_rank: int = 0, session=None, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Send a picklable object from ``root_rank`` to every rank, at once, eagerly or while a graph is built.

    ``session`` is accepted for upstream's TF1 signature: the object goes through the op layer directly, so no
    session runs anything.
    """
    return ops.broadcast_object(obj, root_rank, name, process_set)


def broadcast_object_fn(root_rank: int = 0, session=None, name: Optional[str] = None,
                        process_set: ProcessSet = global_process_set) -> Callable[[Any], Any]:
    """A function ``obj -> broadcast_object(obj, root_rank, ...)`` (upstream builds it for a TF1 session; this one
    works in graph mode and eagerly alike)."""
    def fn(obj):
        return broadcast_object(obj, root_rank, session, name, process_set)
    return fn


def allgather_object(obj: Any, session=None, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> List[Any]:
    """Gather one picklable object from every rank, as a list indexed by rank."""
    return ops.allgather_object(obj, name, process_set)
