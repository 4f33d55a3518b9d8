"""``SyncBatchNormalization``: Keras batch normalization whose training statistics cover the global batch.

In training mode each rank computes, per channel, the sum and the sum of squares of its inputs and its sample
count, and one allreduce (Sum) of the three gives the global mean and (biased) variance, which normalize the
outputs and update the moving statistics. Because our allreduce is differentiable (its gradient is the allreduce
of the gradient), the gradients are those of batch normalization over all ranks' samples, with no hand-written
backward. Ranks may hold different numbers of samples (upstream averages per-rank moments, which is exact only
for equal batches). Inference uses the moving statistics, locally.

The layer follows ``tf.keras``, as upstream's subclass of ``tf.keras.layers.BatchNormalization`` did: a Keras 3
layer, or under ``TF_USE_LEGACY_KERAS=1`` a tf_keras (Keras 2) layer, whose variables are tf_keras variables that
a TF1 ``session.run`` fetches (``SyncBatchNormalizationKeras3`` and ``tf_keras_sync_batch_norm()`` name each).
"""
from __future__ import annotations

import functools
import os

import keras
import tensorflow as tf

from horovod.common.types import Sum
from horovod.tensorflow.mpi_ops import _allreduce, size


def _global_moments(local_sum, local_sqsum, local_count):
    """Mean and (biased) variance over every rank's samples, from this rank's per-channel sums and count."""
    total = _allreduce(tf.stack([local_sum, local_sqsum, local_count]), op=Sum)
    count = tf.maximum(total[2], tf.ones_like(total[2]))
    mean = total[0] / count
    return mean, tf.maximum(total[1] / count - tf.square(mean), tf.zeros_like(mean))


def _check_fused(fused) -> None:
    if fused in (True, None):
        raise ValueError("SyncBatchNormalization does not support fused=True; pass fused=False (the default).")


@keras.saving.register_keras_serializable(package="horovod")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Drop-in replacement for ``keras.layers.BatchNormalization`` that normalizes over all ranks' samples in
    training mode (eagerly, in ``tf.function`` and in ``model.fit``). Requires Keras' TensorFlow backend."""

    def __init__(self, fused: bool = False, **kwargs) -> None:
        _check_fused(fused)
        if keras.backend.backend() != "tensorflow":
            raise ValueError("horovod.tensorflow.SyncBatchNormalization needs Keras' TensorFlow backend "
                             f"(KERAS_BACKEND=tensorflow), not {keras.backend.backend()!r}.")
        super().__init__(**kwargs)

    def _moments(self, inputs, mask):
        if size() == 1:
            return super()._moments(inputs, mask)
        axes = self._reduction_axes
        channels = inputs.shape[self.axis]
        if mask is None:
            local_sum = tf.reduce_sum(inputs, axes)
            local_sqsum = tf.reduce_sum(tf.square(inputs), axes)
            per_channel = tf.cast(tf.size(inputs) // channels, inputs.dtype)
            local_count = tf.fill([channels], per_channel)
        else:
            weights = tf.cast(tf.broadcast_to(tf.expand_dims(tf.cast(mask, inputs.dtype), -1), tf.shape(inputs)),
                              inputs.dtype)
            local_sum = tf.reduce_sum(inputs * weights, axes)
            local_sqsum = tf.reduce_sum(tf.square(inputs) * weights, axes)
            local_count = tf.reduce_sum(weights, axes)
        return _global_moments(local_sum, local_sqsum, local_count)


@functools.cache
def tf_keras_sync_batch_norm() -> type:
    """The tf_keras (Keras 2) ``SyncBatchNormalization`` class (made once, when first asked for)."""
    from horovod._keras.flavor import tf_keras

    module = tf_keras()

    @module.utils.register_keras_serializable(package="horovod")
    class SyncBatchNormalization(module.layers.BatchNormalization):
        """tf_keras's ``BatchNormalization`` normalizing over all ranks' samples in training mode."""

        def __init__(self, fused: bool = False, **kwargs) -> None:
            _check_fused(fused)
            kwargs.setdefault("name", "sync_batch_normalization")      # upstream's default name
            super().__init__(fused=fused, **kwargs)

        def _calculate_mean_and_var(self, inputs, reduction_axes, keep_dims, mask=None):
            if size() == 1:
                return super()._calculate_mean_and_var(inputs, reduction_axes, keep_dims, mask=mask)
            if mask is None:
                weights = tf.ones_like(inputs)
            else:
                weights = tf.broadcast_to(tf.expand_dims(tf.cast(mask, inputs.dtype), -1), tf.shape(inputs))
            local_sum = tf.reduce_sum(inputs * weights, reduction_axes, keepdims=keep_dims)
            local_sqsum = tf.reduce_sum(tf.square(inputs) * weights, reduction_axes, keepdims=keep_dims)
            local_count = tf.reduce_sum(weights, reduction_axes, keepdims=keep_dims)
            return _global_moments(local_sum, local_sqsum, local_count)

    return SyncBatchNormalization


def _legacy_keras() -> bool:
    """Whether ``tf.keras`` is tf_keras in this process (TensorFlow reads the same variable)."""
    return os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true", "yes")


SyncBatchNormalizationKeras3 = SyncBatchNormalization
if _legacy_keras():
    SyncBatchNormalization = tf_keras_sync_batch_norm()     # upstream subclassed tf.keras's layer
