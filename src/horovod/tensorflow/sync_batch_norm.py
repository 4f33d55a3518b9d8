"""``SyncBatchNormalization``: Keras batch normalization whose training statistics cover the global batch.

In training mode each rank computes, per channel, the sum and the sum of squares of its inputs and its sample
count, and one allreduce (Sum) of the three gives the global mean and (biased) variance, which normalize the
outputs and update the moving statistics. Because our allreduce is differentiable (its gradient is the allreduce
of the gradient), the gradients are those of batch normalization over all ranks' samples, with no hand-written
backward. Ranks may hold different numbers of samples (upstream averages per-rank moments, which is exact only
for equal batches). Inference uses the moving statistics, locally.
"""
from __future__ import annotations

import keras
import tensorflow as tf

from horovod.common.types import Sum
from horovod.tensorflow.mpi_ops import _allreduce, size


@keras.saving.register_keras_serializable(package="horovod")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Drop-in replacement for ``keras.layers.BatchNormalization`` that normalizes over all ranks' samples in
    training mode (eagerly, in ``tf.function`` and in ``model.fit``). Requires Keras' TensorFlow backend."""

    def __init__(self, fused: bool = False, **kwargs) -> None:
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True; pass fused=False (the default).")
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
        total = _allreduce(tf.stack([local_sum, local_sqsum, local_count]), op=Sum)
        count = tf.maximum(total[2], tf.ones_like(total[2]))
        mean = total[0] / count
        variance = tf.maximum(total[1] / count - tf.square(mean), tf.zeros_like(mean))
        return mean, variance
