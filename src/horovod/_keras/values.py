"""Collectives on values (numpy arrays, Python numbers or tensors of any Keras backend) for the Keras
modules' ``allreduce``/``allgather``/``broadcast``/``reducescatter``, and broadcasting Keras variables.

They run eagerly on the numpy op layer and return a tensor of the Keras backend (an eager tensor on
TensorFlow, as upstream's TF2 path returns; in a graph-mode (TF1) program, where upstream ran the op in Keras'
session, the numpy result).
"""
from __future__ import annotations

import sys
from typing import Any, Iterable, List, Optional

import keras
import numpy as np

import horovod.numpy as hvd_np
from horovod.common.types import Average, ReduceOp
from horovod.core import ops
from horovod.core.process_sets import ProcessSet, global_process_set


def _array(value: Any) -> np.ndarray:
    # np.require keeps 0-d arrays 0-d (np.ascontiguousarray would make them 1-d).
    return np.require(keras.ops.convert_to_numpy(value), requirements="C")


def _graph_mode() -> bool:
    """True inside a TF1 graph program (``tf.compat.v1.disable_eager_execution()``); never imports TF."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and not tf.executing_eagerly()


def _tensor(arr: np.ndarray) -> Any:
    if _graph_mode():
        return arr
    return keras.ops.convert_to_tensor(arr, dtype=keras.backend.standardize_dtype(arr.dtype))


def allreduce(value: Any, name: Optional[str] = None, average: Optional[bool] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0, op: Optional[ReduceOp] = None,
              compression=None, process_set: ProcessSet = global_process_set) -> Any:
    """Reduce ``value`` across ranks (Average unless ``op``/``average`` say otherwise) and return the result.

    ``compression`` is accepted for upstream compatibility; a value is sent as it is.
    """
    arr = _array(value)
    out = hvd_np.allreduce(arr, average=average, name=name, op=op, prescale_factor=prescale_factor,
                           postscale_factor=postscale_factor, process_set=process_set)
    return _tensor(out.reshape(arr.shape))


def allgather(value: Any, name: Optional[str] = None, process_set: ProcessSet = global_process_set) -> Any:
    """Concatenate every rank's ``value`` along dimension 0 (ranks may differ in that dimension)."""
    return _tensor(hvd_np.allgather(_array(value), name=name, process_set=process_set))


def broadcast(value: Any, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> Any:
    """Return ``root_rank``'s ``value`` on every rank."""
    arr = _array(value)
    return _tensor(hvd_np.broadcast(arr, root_rank, name=name, process_set=process_set).reshape(arr.shape))


def reducescatter(value: Any, name: Optional[str] = None, op: ReduceOp = Average,
                  process_set: ProcessSet = global_process_set) -> Any:
    """Reduce ``value`` across ranks and return this rank's block of dimension 0."""
    return _tensor(hvd_np.reducescatter(_array(value), name=name, op=op, process_set=process_set))


def sync_backend_state(model: Any) -> None:
    """Write the JAX trainer's in-flight state back into the model's variables (a no-op on other backends), so
    that a callback reads current values and its assignments are picked up by the next step."""
    sync = getattr(model, "jax_state_sync", None)
    if sync is not None and keras.backend.backend() == "jax":
        sync()


def broadcast_variables(variables: Iterable[Any], root_rank: int, name: str = "broadcast_variables",
                        process_set: ProcessSet = global_process_set) -> List[Any]:
    """Overwrite Keras variables with ``root_rank``'s values: all broadcasts start together (the engine fuses
    them into few exchanges), then every variable is assigned. Returns the variables."""
    variables = list(variables)
    # A Keras 3 variable's value; a tf.Variable (tf_keras) converts as it is (its `value` is a method).
    arrays = [_array(v.value if isinstance(v, keras.Variable) else v) for v in variables]
    handles = [ops.broadcast_async(a, int(root_rank), None, f"{name}.{i}", process_set)
               for i, a in enumerate(arrays)]
    for v, a, h in zip(variables, arrays, handles):
        v.assign(h.wait().reshape(a.shape))
    return variables


def broadcast_model(model: Any, root_rank: int, local_variables: Iterable[Any] = (),
                    process_set: ProcessSet = global_process_set, include_optimizer: bool = True) -> None:
    """Make ``model``'s variables, and (``include_optimizer``) its optimizer's once built, equal to
    ``root_rank``'s; variables listed in ``local_variables`` keep this rank's values."""
    sync_backend_state(model)
    skip = {id(v) for v in local_variables}
    variables = [v for v in model.variables if id(v) not in skip]
    optimizer = getattr(model, "optimizer", None)
    if include_optimizer and optimizer is not None and getattr(optimizer, "built", False):
        variables += [v for v in optimizer.variables if id(v) not in skip]
    broadcast_variables(variables, root_rank, "BroadcastGlobalVariables", process_set)


def broadcast_global_variables(root_rank: int) -> Any:
    """TF1 graph mode only (as upstream): broadcast ``tf.compat.v1.global_variables()``, in tf_keras' session.

    Keras 3 keeps no global variable collection; in eager mode use the ``BroadcastGlobalVariablesCallback`` in
    ``model.fit``, or ``hvd.broadcast_variables(model.variables, root_rank)`` in a custom loop.
    """
    if _graph_mode():
        import horovod.tensorflow as hvd_tf

        op = hvd_tf.broadcast_global_variables(root_rank)
        if "tf_keras" not in sys.modules:
            return op
        from horovod._keras.keras2 import session

        # As upstream: run it in Keras' session (graph-mode Keras is tf_keras; Keras 3 has no TF1 mode).
        return session().run(op)
    raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution. Please use "
                       "`hvd.callbacks.BroadcastGlobalVariablesCallback(0)` in model.fit, or "
                       "`hvd.broadcast_variables(<model/optimizer variables>, root_rank=0)` instead.")
