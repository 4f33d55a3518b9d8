"""Broadcast and gather helpers for variables and Python objects (upstream's ``horovod/tensorflow/functions.py``)."""
from __future__ import annotations

from typing import Any, Callable, List, Optional

from horovod.common import ops
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.tensorflow.mpi_ops import _MOVE_DTYPES, _broadcast_many, _name, _tensor, broadcast_


def broadcast_variables(variables, root_rank: int, process_set: ProcessSet = global_process_set,
                        inplace: bool = False):
    """Overwrite every variable with ``root_rank``'s value (one fused exchange); returns the assign ops.

    ``inplace`` is accepted for upstream compatibility; both forms assign the broadcast values.
    """
    variables = list(variables)
    if not variables:
        return []
    if inplace:
        return broadcast_(variables, root_rank, name="broadcast_variables", process_set=process_set)
    values = [_tensor(v.read_value() if hasattr(v, "read_value") else v, _MOVE_DTYPES, "broadcast_variables")
              for v in variables]
    outs = _broadcast_many(values, int(root_rank), _name("broadcast_variables", None), process_set)
    return [v.assign(o) for v, o in zip(variables, outs)]


def broadcast_object(obj: Any, root_rank: int = 0, session=None, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Send a picklable object from ``root_rank`` to every rank (``session`` is TF1's and ignored)."""
    return ops.broadcast_object(obj, root_rank, name, process_set)


def broadcast_object_fn(root_rank: int = 0, session=None, name: Optional[str] = None,
                        process_set: ProcessSet = global_process_set) -> Callable[[Any], Any]:
    """A function ``obj -> broadcast_object(obj, root_rank, ...)``."""
    def fn(obj):
        return broadcast_object(obj, root_rank, session, name, process_set)
    return fn


def allgather_object(obj: Any, session=None, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> List[Any]:
    """Gather one picklable object from every rank, as a list indexed by rank."""
    return ops.allgather_object(obj, name, process_set)
