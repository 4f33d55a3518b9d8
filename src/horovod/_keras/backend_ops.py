"""The few collectives the Keras bindings need, on whichever backend Keras runs (``keras.backend.backend()``).

- tensorflow: ``horovod.tensorflow``'s ops, so they work eagerly and inside the ``tf.function`` of ``model.fit``;
- torch: ``horovod.torch``'s ops on the gradients' tensors (the torch trainer runs eagerly);
- jax: an ordered ``jax.experimental.io_callback`` onto the numpy op layer, so it works inside the jitted train
  step (ordered, so every rank's collectives run in program order);
- numpy: the numpy op layer directly.
"""
from __future__ import annotations

from typing import Any, List, Sequence

import keras
import numpy as np

from horovod.common.types import ReduceOp
from horovod.core import ops
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
                      postscale_factor: float, process_set: ProcessSet) -> List[Any]:
    """Allreduce backend tensors as one negotiated, fused unit; returns backend tensors of the same shapes."""
    kind = backend()
    if kind == "tensorflow":
        from horovod.tensorflow.mpi_ops import _grouped_allreduce

        return _grouped_allreduce(list(tensors), name=name, op=op, prescale_factor=prescale_factor,
                                  postscale_factor=postscale_factor, ignore_name_scope=True,
                                  process_set=process_set)
    if kind == "torch":
        import horovod.torch as hvd_torch

        return hvd_torch.grouped_allreduce(list(tensors), name=name, op=op, prescale_factor=prescale_factor,
                                           postscale_factor=postscale_factor, process_set=process_set)

    def host(*arrays):
        arrays = [np.require(a, requirements="C") for a in arrays]
        outs = [np.empty_like(a) for a in arrays]
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
