"""Graph-mode (TF1) Keras 2 through tf-keras: ``tf.compat.v1.disable_eager_execution()``, so ``model.fit`` builds
its train op from the optimizer's ``get_gradients``, and the callbacks and value collectives run in Keras' session.

The keras suite runs this file alone (eager execution is switched off for the whole process), with
TF_USE_LEGACY_KERAS=1; without it the file is skipped.
"""
import os

import numpy as np
import pytest

if os.environ.get("TF_USE_LEGACY_KERAS") != "1":
    pytest.skip("tf-keras bodies: run with TF_USE_LEGACY_KERAS=1 (the keras suite does)", allow_module_level=True)
tf = pytest.importorskip("tensorflow")
pytest.importorskip("tf_keras")
tf.compat.v1.disable_eager_execution()

import horovod.tensorflow.keras as hvd  # noqa: E402

keras = tf.keras
K = keras.backend


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.layers.Dense(4, activation="tanh", input_shape=(3,)), keras.layers.Dense(1)])


def test_eager_execution_is_off():
    assert not tf.executing_eagerly()


def test_get_gradients_reduces_once(tmp_path):
    var = tf.Variable(np.zeros(3, np.float32))
    loss = tf.reduce_sum(var * tf.constant(np.arange(1, 4, dtype=np.float32) * (hvd.rank() + 1)))
    opt = hvd.DistributedOptimizer(keras.optimizers.legacy.SGD(lr=1.0), op=hvd.Sum)
    grads = opt.get_gradients(loss, [var])
    train = opt.apply_gradients(zip(grads, [var]))
    session = tf.compat.v1.keras.backend.get_session()
    session.run(var.initializer)
    summed = sum(r + 1 for r in range(hvd.size())) * np.arange(1, 4)
    np.testing.assert_allclose(session.run(grads[0]), summed)
    session.run(train)
    np.testing.assert_allclose(session.run(var), -summed, err_msg="get_gradients' sum is not reduced again")


def test_fit_equals_single_process_training_on_the_global_batch():
    size, rank, per_rank, steps = hvd.size(), hvd.rank(), 4, 3
    rng = np.random.RandomState(0)
    x = rng.randn(steps * size * per_rank, 3).astype(np.float32)
    y = rng.randn(steps * size * per_rank, 1).astype(np.float32)
    rows = np.concatenate([np.arange(k * size * per_rank + rank * per_rank, k * size * per_rank + (rank + 1) * per_rank)
                           for k in range(steps)])
    distributed = make_model(seed=5 + rank)
    distributed.compile(hvd.DistributedOptimizer(keras.optimizers.legacy.SGD(lr=0.1, momentum=0.5)), "mse")
    reference = make_model(seed=5)
    reference.compile(keras.optimizers.legacy.SGD(lr=0.1, momentum=0.5), "mse")
    distributed.set_weights(reference.get_weights())
    distributed.fit(x[rows], y[rows], batch_size=per_rank, shuffle=False, epochs=2, verbose=0)
    reference.fit(x, y, batch_size=size * per_rank, shuffle=False, epochs=2, verbose=0)
    for got, want in zip(distributed.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_gradient_aggregation_in_graph_mode():
    x, y = np.ones((8, 3), np.float32), np.ones((8, 1), np.float32)
    model = keras.Sequential([keras.layers.Dense(1, input_shape=(3,), kernel_initializer="zeros")])
    model.compile(hvd.DistributedOptimizer(keras.optimizers.legacy.SGD(lr=0.1), backward_passes_per_step=2), "mse")
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    # Two passes, one update with the summed gradient: d/dw mean((w.x - 1)^2) at w = 0 is -2 per pass.
    np.testing.assert_allclose(model.get_weights()[0], np.full((3, 1), 0.4), rtol=1e-5)
    assert int(K.get_value(model.optimizer.iterations)) == 2


def test_callbacks_and_values_in_graph_mode():
    model = make_model(seed=50 + hvd.rank())
    model.compile(hvd.DistributedOptimizer(keras.optimizers.legacy.SGD(lr=0.1, momentum=0.9)), "mse")
    rng = np.random.RandomState(hvd.rank())
    x, y = rng.randn(16, 3).astype(np.float32), rng.randn(16, 1).astype(np.float32)
    history = model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=1)])
    assert history.history["lr"][0] == pytest.approx(0.1)
    losses = hvd.allgather(np.asarray(history.history["loss"])[None], name="tfk.graph.loss")
    assert isinstance(losses, np.ndarray), "graph mode: the value collectives return numpy, as upstream's session"
    np.testing.assert_allclose(losses, np.broadcast_to(losses[:1], losses.shape), rtol=1e-6)
    for i, w in enumerate(model.get_weights()):
        everyone = hvd.allgather(w[None], name=f"tfk.graph.w.{i}")
        np.testing.assert_allclose(everyone, np.broadcast_to(everyone[:1], everyone.shape), rtol=1e-6)


def test_broadcast_global_variables_runs_in_the_session():
    var = tf.Variable(np.full(3, float(hvd.rank()), np.float32))
    tf.compat.v1.keras.backend.get_session().run(var.initializer)
    hvd.broadcast_global_variables(0)
    np.testing.assert_array_equal(K.get_value(var), np.zeros(3))


def test_sync_batch_normalization_is_a_tf_keras_layer_whose_statistics_a_session_fetches():
    """Upstream's TF1 test: hvd.SyncBatchNormalization (horovod.tensorflow's) under tf-keras, its moments over
    every rank's samples, fetched with session.run; rank r holds r + 2 samples."""
    import tf_keras

    import horovod.tensorflow as hvd_tf

    size, rank = hvd.size(), hvd.rank()
    rng = np.random.RandomState(3)
    counts = [r + 2 for r in range(size)]
    data = rng.randn(sum(counts), 4).astype(np.float32) * 2 + 1
    mine = data[sum(counts[:rank]):sum(counts[:rank + 1])]
    layer = hvd_tf.SyncBatchNormalization(momentum=0.0, epsilon=1e-3)
    assert isinstance(layer, tf_keras.layers.BatchNormalization)
    out = layer(tf.constant(mine), training=True)
    session = tf.compat.v1.keras.backend.get_session()
    session.run(tf.compat.v1.variables_initializer(layer.variables))
    normalized = session.run([out] + layer.updates)[0]       # a graph runs the moving averages' updates if asked
    np.testing.assert_allclose(normalized, (mine - data.mean(axis=0)) / np.sqrt(data.var(axis=0) + 1e-3),
                               rtol=1e-4, atol=1e-4)
    moving_mean, moving_variance = session.run([layer.moving_mean, layer.moving_variance])
    np.testing.assert_allclose(moving_mean, data.mean(axis=0), rtol=1e-5, atol=1e-5)
    # momentum 0: the moving variance is the global batch's (biased, as tf_keras keeps it)
    np.testing.assert_allclose(moving_variance, data.var(axis=0), rtol=1e-4, atol=1e-4)
