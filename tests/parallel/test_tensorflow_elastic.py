"""Elastic training's worker side in TensorFlow, eagerly, at any number of ranks without the driver:
TensorFlowKerasState and TensorFlowState sync from rank 0 and restore their last commit, and ``hvd.elastic.run``
re-forms the job in place after a failed collective."""
import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd
from tests.support.elastic import run_failing_once


def make_model(seed):
    tf.keras.utils.set_random_seed(seed)
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    optimizer = tf.keras.optimizers.SGD(0.1, momentum=0.9)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def test_keras_state_syncs_from_rank_0_and_restores_its_commit():
    model, optimizer = make_model(seed=hvd.rank())
    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=hvd.rank())
    state.sync()
    kernels = hvd.allgather_object(model.layers[0].kernel.numpy())
    assert all(np.array_equal(k, kernels[0]) for k in kernels) and state.epoch == 0
    state.commit()
    model.layers[0].kernel.assign_add(tf.ones_like(model.layers[0].kernel))
    state.epoch = 3
    state.restore()
    assert np.array_equal(model.layers[0].kernel.numpy(), kernels[0]) and state.epoch == 0


def test_variables_state_syncs_and_restores():
    v = tf.Variable(np.full(4, float(hvd.rank())))
    state = hvd.elastic.TensorFlowState([v], batch=hvd.rank())
    state.sync()
    assert np.array_equal(v.numpy(), np.zeros(4)) and state.batch == 0
    state.commit()
    v.assign(np.ones(4))
    state.restore()
    assert np.array_equal(v.numpy(), np.zeros(4))


def test_run_re_forms_the_job_after_a_failed_collective():
    state = hvd.elastic.TensorFlowState([tf.Variable(np.zeros(2))], step=0)
    result, attempts = run_failing_once(
        hvd.elastic.run, state,
        lambda step: float(hvd.allreduce(tf.constant([float(step)]), op=hvd.Sum, name="tf.elastic.after")[0]))
    assert result == 2.0 * hvd.size() and attempts == [0, 1]
