"""Keras elastic training on TensorFlow at any number of ranks without the driver: KerasState syncs from rank 0,
and the elastic callbacks commit during ``model.fit`` and keep ``state.batch`` and ``state.epoch`` current."""
import numpy as np
import tensorflow as tf

import horovod.tensorflow.keras as hvd


class Counting:
    """A stand-in state that records commits (the callbacks only call commit and set batch/epoch)."""

    def __init__(self):
        self.commits, self.batch, self.epoch = 0, 0, 0

    def commit(self):
        self.commits += 1


def fit(callbacks, epochs=2, steps=3):
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")
    x, y = np.ones((steps * 2, 4), np.float32), np.ones((steps * 2, 1), np.float32)
    model.fit(x, y, batch_size=2, epochs=epochs, callbacks=callbacks, verbose=0)
    return model


def test_callbacks_commit_and_track_batch_and_epoch():
    state = Counting()
    fit([hvd.elastic.CommitStateCallback(state, batches_per_commit=2), hvd.elastic.UpdateBatchStateCallback(state),
         hvd.elastic.UpdateEpochStateCallback(state)])
    # Every 2nd batch across epochs (batches 2, 4 and 6 of 6) and at each epoch's end, as upstream counts.
    assert state.commits == 3 + 2
    assert state.batch == 0 and state.epoch == 2


def test_keras_state_syncs_the_model_from_rank_0():
    model = fit([], epochs=1)
    model.layers[0].kernel.assign(tf.fill(model.layers[0].kernel.shape, float(hvd.rank())))
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    state.sync()
    np.testing.assert_array_equal(model.layers[0].kernel.numpy(), np.zeros((4, 1)))
