"""The few collectives the Keras bindings need, on whichever backend Keras runs (``keras.backend.backend()``).

- tensorflow: ``horovod.tensorflow``'s ops, so they work eagerly and inside the ``tf.function`` of ``model.fit``;
- torch: ``horovod.torch``'s ops on the gradients' tensors (the torch trainer runs eagerly);
- jax: an ordered ``jax.experimental.io_callback`` onto the numpy op layer, so it works inside the jitted train
  step (ordered, so every rank's collectives run in program order);
- numpy: the numpy op layer directly.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import keras
import numpy as np

from horovod.common import gradient_presence as presence
from horovod.common.types import ReduceOp
from horovod.core import ops
from horovod.core.presence_check import verdict_on_host
from horovod.core.process_sets import ProcessSet


def backend() -> str:
    """The name of the Keras backend in use."""
    return keras.backend.backend()


def is_sparse(grad: Any) -> bool:
    """True for a TensorFlow ``tf.IndexedSlices`` gradient (embedding lookups)."""
    if backend() != "tensorflow":
        return False
    import tensorflow as tf

    return isinstance(grad, tf.IndexedSlices)


def to_dense(grad: Any) -> Any:
    """A dense tensor for ``grad`` (tf.IndexedSlices are scattered into their dense shape)."""
    if is_sparse(grad):
        import tensorflow as tf

        return tf.convert_to_tensor(grad)
    return grad


def sparse_allreduce(grad: Any, name: str, op: ReduceOp, process_set: ProcessSet) -> Any:
    """Upstream's reduction of a tf.IndexedSlices gradient: allgather of values and indices."""
    import horovod.tensorflow as hvd_tf

    return hvd_tf.allreduce(grad, op=op, name=name, process_set=process_set, ignore_name_scope=True)


def grouped_allreduce(tensors: Sequence[Any], name: str, op: ReduceOp, prescale_factor: float,
                      postscale_factor: float, process_set: ProcessSet,
                      check: Optional[Callable[[], None]] = None) -> List[Any]:
    """Allreduce backend tensors as one negotiated, fused unit; returns backend tensors of the same shapes.
    ``check`` (a :func:`presence_check`) runs first, in the same TensorFlow node or JAX callback."""
    kind = backend()
    if kind == "tensorflow":
        from horovod.tensorflow.mpi_ops import _grouped_allreduce

        if check is not None:
            from horovod.tensorflow.none_gradients import grouped_allreduce_checked

            return grouped_allreduce_checked(list(tensors), name, op, prescale_factor, postscale_factor,
                                             process_set, check)

        return _grouped_allreduce(list(tensors), name=name, op=op, prescale_factor=prescale_factor,
                                  postscale_factor=postscale_factor, ignore_name_scope=True,
                                  process_set=process_set)
    if kind == "torch":
        import horovod.torch as hvd_torch

        if check is not None:
            check()
        return hvd_torch.grouped_allreduce(list(tensors), name=name, op=op, prescale_factor=prescale_factor,
                                           postscale_factor=postscale_factor, process_set=process_set)

    def host(*arrays):
        if check is not None:
            check()
        arrays = [np.require(a, requirements="C") for a in arrays]
        outs = [np.empty_like(a) for a in arrays]
        with ops.blocking():
            ops.grouped_allreduce_async(arrays, outs, f"grouped_allreduce.{name}", op, prescale_factor,
                                        postscale_factor, process_set).wait()
        return tuple(outs)

    if kind == "jax":
        import jax
        from jax.experimental import io_callback

        shapes = tuple(jax.ShapeDtypeStruct(t.shape, t.dtype) for t in tensors)
        return list(io_callback(host, shapes, *tensors, ordered=True))
    if kind == "numpy":
        return list(host(*[np.asarray(t) for t in tensors]))
    raise NotImplementedError(f"Horovod's Keras bindings do not support the {kind!r} Keras backend; use "
                              "tensorflow, torch, jax or numpy (KERAS_BACKEND).")


class NoneGradientError(ValueError):
    """A gradient is None on some ranks but not on others (raised on every rank). On the TensorFlow backend
    ``horovod.tensorflow.none_gradients.NoneGradientError`` (a ValueError too) is raised instead."""


def presence_check(grads: Sequence[Any], variables: Optional[Sequence[Any]], name: str, process_set: ProcessSet,
                   remedy: str) -> Callable[[], None]:
    """A host function that raises on every rank when some of ``grads`` are None on some ranks only (see
    ``horovod.tensorflow.none_gradients``): one blocking Sum allreduce of the presence vector on the op layer,
    and an allgather only when the sums show such a gradient. Run it before the gradients' collectives:
    :func:`grouped_allreduce` takes it as ``check``, :func:`check_alone` runs it by itself."""
    if backend() == "tensorflow":
        from horovod.tensorflow.none_gradients import host_check

        return host_check(grads, variables, name, process_set, who=name, remedy=remedy)
    grads = list(grads)
    labels = [presence.label(None if variables is None else variables[i], i) for i in range(len(grads))]
    vector = presence.presence_vector([g is None for g in grads])

    def check() -> None:
        message = verdict_on_host(vector, labels, name, process_set, name, remedy)
        if message is not None:
            raise NoneGradientError(message)

    return check


def check_alone(check: Callable[[], None]) -> None:
    """Run ``check`` where no gradient collective carries it (this rank has no dense gradient): a node of its
    own on TensorFlow, an ordered callback inside JAX's jitted step, a call on the other backends."""
    kind = backend()
    if kind == "tensorflow":
        from horovod.tensorflow.none_gradients import check_node

        check_node(check)
    elif kind == "jax":
        import jax
        from jax.experimental import io_callback

        def host(x):
            check()
            return x

        io_callback(host, jax.ShapeDtypeStruct((1,), np.int32), np.zeros(1, np.int32), ordered=True)
    else:
        check()
