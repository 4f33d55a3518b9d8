"""horovod.keras callbacks inside model.fit, on the backend named by KERAS_BACKEND: the broadcast makes every
rank's weights rank 0's, metrics are averaged over ranks, the learning-rate warmup and schedule set upstream's
values, and BestModelCheckpoint keeps only improvements.
"""
import numpy as np
import pytest

keras = pytest.importorskip("keras")
pytest.importorskip({"tensorflow": "tensorflow", "torch": "torch", "jax": "jax"}[keras.backend.backend()])

import horovod.keras as hvd  # noqa: E402


def model_for_rank(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu"), keras.layers.Dense(1)])


def data(rows=16, seed=0):
    rng = np.random.RandomState(seed)
    return rng.randn(rows, 4).astype(np.float32), rng.randn(rows, 1).astype(np.float32)


class Record(keras.callbacks.Callback):
    """Records the learning rate at each batch's start (after the schedule callbacks) and each epoch's logs."""

    def __init__(self):
        super().__init__()
        self.lrs, self.epoch_logs, self.first_weights = [], [], None

    def on_train_begin(self, logs=None):
        self.first_weights = [w.copy() for w in self.model.get_weights()]

    def on_train_batch_begin(self, batch, logs=None):
        if keras.backend.backend() == "jax":
            self.model.jax_state_sync()
        self.lrs.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs))


def gathered(array, name):
    return keras.ops.convert_to_numpy(hvd.allgather(np.asarray(array, np.float64)[None], name=name))


def test_broadcast_callback_starts_every_rank_from_rank_0s_weights():
    model = model_for_rank(seed=100 + hvd.rank())
    root = [keras.ops.convert_to_numpy(hvd.broadcast(w, 0, name=f"cb.root.{i}"))
            for i, w in enumerate(model.get_weights())]
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), "mse")
    record = Record()
    x, y = data(seed=hvd.rank())
    model.fit(x, y, batch_size=4, epochs=2, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), record])
    for got, want in zip(record.first_weights, root):
        np.testing.assert_array_equal(got, want)
    for i, w in enumerate(model.get_weights()):
        everyone = gathered(w, f"cb.after.{i}")
        np.testing.assert_allclose(everyone, np.broadcast_to(everyone[:1], everyone.shape), rtol=1e-6)
    slots = [keras.ops.convert_to_numpy(v) for v in model.optimizer.variables]
    for i, s in enumerate(slots):
        everyone = gathered(s, f"cb.slots.{i}")
        np.testing.assert_allclose(everyone, np.broadcast_to(everyone[:1], everyone.shape), rtol=1e-6)


def test_broadcast_callback_when_only_rank_0_resumes_from_a_checkpoint(tmp_path):
    """Only rank 0's optimizer has variables when training starts; the others get them from the first step."""
    x, y = data(seed=hvd.rank())
    if hvd.rank() == 0:
        trained = model_for_rank(seed=5)
        trained.compile(keras.optimizers.SGD(0.05, momentum=0.9), "mse")
        trained.fit(x, y, batch_size=4, epochs=1, verbose=0)
        trained.save(tmp_path / "resume.keras")
        model = hvd.load_model(str(tmp_path / "resume.keras"))
        assert hasattr(model.optimizer, "register_local_var"), "a plain optimizer is made distributed on loading"
    else:
        model = model_for_rank(seed=6)
        model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), "mse")
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    for i, v in enumerate(list(model.weights) + list(model.optimizer.variables)):
        everyone = gathered(keras.ops.convert_to_numpy(v), f"cb.resume.{i}")
        np.testing.assert_allclose(everyone, np.broadcast_to(everyone[:1], everyone.shape), rtol=1e-6)


@pytest.mark.parametrize("metrics", [["mae"], []], ids=["loss-and-mae", "loss-only"])
def test_metric_average_callback_averages_logs_over_ranks(metrics):
    raw, averaged = Record(), Record()
    model = model_for_rank(seed=7)
    model.compile(keras.optimizers.SGD(0.01), "mse", metrics=metrics)
    x, y = data(seed=10 + hvd.rank())          # different data: different losses per rank
    model.fit(x, y, batch_size=8, epochs=2, verbose=0,
              callbacks=[raw, hvd.callbacks.MetricAverageCallback(), averaged])
    for epoch in range(2):
        for key in ["loss", *metrics]:
            everyone = gathered(raw.epoch_logs[epoch][key], f"cb.metric.{epoch}.{key}")
            assert averaged.epoch_logs[epoch][key] == pytest.approx(everyone.mean(), rel=1e-6)
            if hvd.size() > 1:
                assert not np.allclose(everyone, everyone[0]), "the ranks' raw metrics should differ"


def test_learning_rate_warmup_values():
    size, steps, warmup, lr = hvd.size(), 4, 2, 0.4
    model = model_for_rank(seed=1)
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(lr)), "mse")
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


def test_learning_rate_schedule_staircase_and_momentum_correction():
    model = model_for_rank(seed=2)
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9), "mse")
    record = Record()
    x, y = data(rows=8)
    schedule = [hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=0.5, start_epoch=1,
                                                           end_epoch=4),
                hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=lambda e: 0.1, start_epoch=4)]
    model.fit(x, y, batch_size=4, epochs=5, verbose=0, callbacks=[*schedule, record])
    # A constant multiplier decays exponentially from start_epoch (upstream's code): 0.5**0, 0.5**1, 0.5**2.
    np.testing.assert_allclose(record.lrs, [0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.025, 0.025, 0.01, 0.01], rtol=1e-6)
    assert record.epoch_logs[4]["lr"] == pytest.approx(0.01, rel=1e-6)


@pytest.mark.parametrize("name", ["SGD", "RMSprop"])
def test_momentum_correction_scales_the_momentum_slots_once(name):
    model = model_for_rank(seed=3)
    optimizer = getattr(keras.optimizers, name)(0.1, momentum=0.9)
    model.compile(optimizer, "mse")
    x, y = data(rows=8)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    slots = optimizer.momentums if name == "SGD" else optimizer._momentums   # RMSprop's are lr-scaled steps too
    assert slots
    before = [keras.ops.convert_to_numpy(m).copy() for m in slots]
    callback = hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=0.25)
    callback.set_model(model)
    callback.on_epoch_begin(1)          # 0.1 * 0.25 ** (1 - 0)
    callback.on_batch_begin(0)
    assert float(keras.ops.convert_to_numpy(optimizer.learning_rate)) == pytest.approx(0.025)
    for b, m in zip(before, slots):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(m), b * 0.25, rtol=1e-6)
    callback.on_batch_begin(1)          # staircase: only the epoch's first batch changes anything
    for b, m in zip(before, slots):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(m), b * 0.25, rtol=1e-6)


def test_best_model_checkpoint_keeps_only_improvements(tmp_path):
    model = model_for_rank(seed=4)
    model.compile(keras.optimizers.SGD(0.0), "mse")         # lr 0: val_loss never improves after epoch 1
    x, y = data(rows=8)
    checkpoint = hvd.callbacks.BestModelCheckpoint(monitor="loss")
    checkpoint.filepath = str(tmp_path / f"best-{hvd.rank()}.keras")
    model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[checkpoint])
    assert (tmp_path / f"best-{hvd.rank()}.keras").exists()
    assert checkpoint.save_best_only
    assert checkpoint.best == pytest.approx(float(model.evaluate(x, y, verbose=0)), rel=1e-5)
    unset = hvd.callbacks.BestModelCheckpoint()
    with pytest.raises(ValueError, match="set `callback.filepath`"):
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[unset])
