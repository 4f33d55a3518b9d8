"""Horovod's Keras callbacks with tf-keras (Keras 2) models and optimizers under ``TF_USE_LEGACY_KERAS=1``: the
broadcast (with a local variable kept out of it), metric averaging, the learning-rate warmup and schedule read
and set through ``optimizer.lr``, upstream's momentum correction of a legacy optimizer, BestModelCheckpoint to
``.h5``, ``BatchNormalization(fused=False)``, and a Keras 3 model and a tf_keras model trained in one process.

tests/integration/test_keras_suite.py runs this file with TF_USE_LEGACY_KERAS=1; without it the file is skipped.
"""
import os

import numpy as np
import pytest

if os.environ.get("TF_USE_LEGACY_KERAS") != "1":
    pytest.skip("tf-keras bodies: run with TF_USE_LEGACY_KERAS=1 (the keras suite does)", allow_module_level=True)
tf = pytest.importorskip("tensorflow")
pytest.importorskip("tf_keras")
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import keras as keras3  # noqa: E402  (Keras 3: `import keras` is still Keras 3 under TF_USE_LEGACY_KERAS=1)

import horovod.keras as hvd_keras  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402

keras = tf.keras
K = keras.backend


def model_for_rank(seed, batch_norm=False):
    keras.utils.set_random_seed(seed)
    layers = [keras.layers.Dense(3, activation="relu", input_shape=(4,))]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization(fused=False))
    return keras.Sequential(layers + [keras.layers.Dense(1)])


def data(rows=16, seed=0):
    rng = np.random.RandomState(seed)
    return rng.randn(rows, 4).astype(np.float32), rng.randn(rows, 1).astype(np.float32)


class Record(keras.callbacks.Callback):
    """Records lr and momentum at each batch's start (after the schedule callbacks) and end, and epoch logs."""

    def __init__(self):
        super().__init__()
        self.lrs, self.momentums, self.momentums_after, self.epoch_logs = [], [], [], []
        self.first_weights = None

    def on_train_begin(self, logs=None):
        self.first_weights = [w.copy() for w in self.model.get_weights()]

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(K.get_value(self.model.optimizer.lr)))
        self.momentums.append(float(K.get_value(getattr(self.model.optimizer, "momentum", 0.0))))

    def on_train_batch_end(self, batch, logs=None):
        self.momentums_after.append(float(K.get_value(getattr(self.model.optimizer, "momentum", 0.0))))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs))


def gathered(array, name):
    return hvd.allgather(np.asarray(array, np.float64)[None], name=name).numpy()


def assert_same_on_every_rank(array, name):
    everyone = gathered(array, name)
    np.testing.assert_allclose(everyone, np.broadcast_to(everyone[:1], everyone.shape), rtol=1e-6)


def test_broadcast_callback_keeps_a_local_variable_local():
    model = model_for_rank(seed=100 + hvd.rank(), batch_norm=True)
    local = model.layers[-1].kernel
    own_local = local.numpy().copy()
    root = [hvd.broadcast(w, 0, name=f"tfk.cb.root.{i}").numpy() for i, w in enumerate(model.get_weights())]
    opt = hvd.DistributedOptimizer(keras.optimizers.legacy.SGD(lr=0.05, momentum=0.9))
    opt.register_local_var(local)
    model.compile(opt, "mse")
    record = Record()
    x, y = data(seed=hvd.rank())
    model.fit(x, y, batch_size=4, epochs=2, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=local), record])
    local_index = next(i for i, v in enumerate(model.weights) if v.ref() == local.ref())
    for i, (got, want) in enumerate(zip(record.first_weights, root)):
        np.testing.assert_array_equal(got, own_local if i == local_index else want)
    for v in model.trainable_weights:
        if v.ref() != local.ref():
            assert_same_on_every_rank(v.numpy(), f"tfk.cb.after.{v.name}")
    if hvd.size() > 1:
        everyone = gathered(local.numpy(), "tfk.cb.local")
        assert not np.allclose(everyone, everyone[:1]), "the local variable kept each rank's value"


def test_broadcast_callback_when_only_rank_0_resumes_from_a_checkpoint(tmp_path):
    """Only rank 0's optimizer has variables when training starts; the others get them from the first step."""
    x, y = data(seed=hvd.rank())
    if hvd.rank() == 0:
        trained = model_for_rank(seed=5)
        trained.compile(keras.optimizers.legacy.SGD(lr=0.05, momentum=0.9), "mse")
        trained.fit(x, y, batch_size=4, epochs=1, verbose=0)
        trained.save(str(tmp_path / "resume.h5"))
        model = hvd.load_model(str(tmp_path / "resume.h5"))
        assert len(model.optimizer.weights) == 5, "iterations and four momentum slots come back"
    else:
        model = model_for_rank(seed=6)
        model.compile(hvd.DistributedOptimizer(keras.optimizers.legacy.SGD(lr=0.05, momentum=0.9)), "mse")
        assert len(model.optimizer.weights) == 0
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    for i, v in enumerate(model.weights + model.optimizer.weights):
        assert_same_on_every_rank(v.numpy(), f"tfk.cb.resume.{i}")


def test_metric_average_callback_averages_logs_over_ranks():
    raw, averaged = Record(), Record()
    model = model_for_rank(seed=7)
    model.compile(keras.optimizers.legacy.SGD(lr=0.01), "mse", metrics=["mae"])
    x, y = data(seed=10 + hvd.rank())
    model.fit(x, y, batch_size=8, epochs=2, verbose=0,
              callbacks=[raw, hvd.callbacks.MetricAverageCallback(), averaged])
    for epoch in range(2):
        for key in ("loss", "mae"):
            everyone = gathered(raw.epoch_logs[epoch][key], f"tfk.cb.metric.{epoch}.{key}")
            assert averaged.epoch_logs[epoch][key] == pytest.approx(everyone.mean(), rel=1e-6)


@pytest.mark.parametrize("kind", ["legacy", "v2"])
def test_learning_rate_warmup_through_optimizer_lr(kind):
    size, steps, warmup, lr = hvd.size(), 4, 2, 0.4
    optimizer = keras.optimizers.legacy.SGD(lr=lr) if kind == "legacy" else keras.optimizers.SGD(lr)
    model = model_for_rank(seed=1)
    model.compile(hvd.DistributedOptimizer(optimizer), "mse")
    record = Record()
    x, y = data(rows=16)
    history = model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=warmup), record])
    expected = []
    for epoch in range(3):
        for batch in range(steps):
            if epoch < warmup:
                e = epoch + batch / steps + 1.0 / steps
                expected.append(lr / size * (e * (size - 1) / warmup + 1))
            else:
                expected.append(expected[-1])
    np.testing.assert_allclose(record.lrs, expected, rtol=1e-6)
    assert history.history["lr"][warmup - 1] == pytest.approx(lr, rel=1e-6), "round value at warmup's end"


def test_schedule_corrects_a_legacy_momentum_for_one_batch():
    model = model_for_rank(seed=2)
    model.compile(hvd.DistributedOptimizer(keras.optimizers.legacy.SGD(lr=0.1, momentum=0.9)), "mse")
    record = Record()
    x, y = data(rows=8)
    schedule = [hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=0.5, start_epoch=1,
                                                           end_epoch=4),
                hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=lambda e: 0.1, start_epoch=4)]
    model.fit(x, y, batch_size=4, epochs=5, verbose=0, callbacks=[*schedule, record])
    # A constant multiplier decays exponentially from start_epoch (upstream's code): 0.5**0, 0.5**1, 0.5**2.
    np.testing.assert_allclose(record.lrs, [0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.025, 0.025, 0.01, 0.01], rtol=1e-6)
    # As upstream: momentum * new_lr / old_lr during the batch of each change, then 0.9 again.
    np.testing.assert_allclose(record.momentums, [0.9, 0.9, 0.9, 0.9, 0.45, 0.9, 0.45, 0.9, 0.36, 0.9], rtol=1e-6)
    assert record.momentums_after[-1] == pytest.approx(0.9) and record.epoch_logs[4]["lr"] == pytest.approx(0.01)


def test_momentum_correction_scales_a_v2_optimizers_slots():
    model = model_for_rank(seed=3)
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    model.compile(optimizer, "mse")
    x, y = data(rows=8)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    slots = optimizer.momentums
    before = [m.numpy().copy() for m in slots]
    callback = hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=0.25)
    callback.set_model(model)
    callback.on_epoch_begin(1)          # 0.1 * 0.25 ** (1 - 0)
    callback.on_batch_begin(0)
    assert float(K.get_value(optimizer.lr)) == pytest.approx(0.025)
    for b, m in zip(before, slots):
        np.testing.assert_allclose(m.numpy(), b * 0.25, rtol=1e-6)


def test_best_model_checkpoint_saves_h5(tmp_path):
    model = model_for_rank(seed=4)
    model.compile(keras.optimizers.legacy.SGD(lr=0.0), "mse")
    x, y = data(rows=8)
    checkpoint = hvd.callbacks.BestModelCheckpoint(monitor="loss")
    checkpoint.filepath = str(tmp_path / f"best-{hvd.rank()}.h5")
    model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[checkpoint])
    assert checkpoint.save_best_only and checkpoint.best == pytest.approx(model.evaluate(x, y, verbose=0), rel=1e-5)
    loaded = hvd.load_model(checkpoint.filepath)
    np.testing.assert_allclose(loaded.get_weights()[0], model.get_weights()[0])


def test_keras3_and_tf_keras_models_train_in_one_process():
    """horovod.keras decides per object: the same callback classes and DistributedOptimizer serve a Keras 3 model
    and a tf_keras model side by side."""
    x, y = data(seed=20 + hvd.rank())
    keras3.utils.set_random_seed(30 + hvd.rank())
    modern = keras3.Sequential([keras3.Input((4,)), keras3.layers.Dense(2), keras3.layers.Dense(1)])
    modern.compile(hvd_keras.DistributedOptimizer(keras3.optimizers.SGD(0.05, momentum=0.9)), "mse")
    legacy = model_for_rank(seed=40 + hvd.rank())
    legacy.compile(hvd_keras.DistributedOptimizer(keras.optimizers.legacy.SGD(lr=0.05, momentum=0.9)), "mse")
    for model in (modern, legacy):
        callbacks = [hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0), hvd_keras.callbacks.MetricAverageCallback(),
                     hvd_keras.callbacks.LearningRateWarmupCallback(initial_lr=0.05, warmup_epochs=1)]
        history = model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=callbacks)
        assert_same_on_every_rank(history.history["loss"], f"tfk.mixed.loss.{model.name}")
        for i, w in enumerate(model.get_weights()):
            assert_same_on_every_rank(w, f"tfk.mixed.{model.name}.{i}")
