"""None gradients in tf-keras (Keras 2) DistributedOptimizers (``TF_USE_LEGACY_KERAS=1``; issue 28, item 5):
skipped when None on every rank, an error on every rank that names the variable when None on some ranks only,
eagerly and in a ``tf.function``.
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

import horovod.tensorflow.keras as hvd  # noqa: E402
from horovod._keras.optimizer import KERAS_REMEDY  # noqa: E402

keras = tf.keras
KINDS = ["legacy", "v2"]
MODES = ["eager", "function"]


def sgd(kind):
    return keras.optimizers.legacy.SGD(lr=1.0) if kind == "legacy" else keras.optimizers.SGD(learning_rate=1.0)


def run(mode, fn):
    """``fn`` eagerly or inside a ``tf.function`` (its result is dropped: a legacy optimizer returns an op)."""
    def call():
        fn()

    return call() if mode == "eager" else tf.function(call)()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_none_on_every_rank_is_skipped(kind, mode):
    a, b = tf.Variable(np.zeros(3, np.float32), name="shared"), tf.Variable(np.zeros(2, np.float32), name="unused")
    opt = hvd.DistributedOptimizer(sgd(kind))
    run(mode, lambda: opt.apply_gradients([(tf.fill([3], float(hvd.rank() + 1)), a), (None, b)]))
    np.testing.assert_allclose(a.numpy(), np.full(3, -(hvd.size() + 1) / 2.0), rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), np.zeros(2))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_none_on_some_ranks_raises_on_every_rank(kind, mode):
    if hvd.size() == 1:
        pytest.skip("needs two ranks")
    a, b = tf.Variable(np.zeros(3, np.float32), name="shared"), tf.Variable(np.zeros(2, np.float32), name="branch")
    opt = hvd.DistributedOptimizer(sgd(kind))
    skip = hvd.rank() % 2 == 1
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        run(mode, lambda: opt.apply_gradients([(tf.ones([3]), a), (None if skip else tf.ones([2]), b)]))
    ranks = range(hvd.size())
    odd, even = [r for r in ranks if r % 2 == 1], [r for r in ranks if r % 2 == 0]
    message = str(info.value)
    assert (f"DistributedSGD: the gradient of variable 'branch:0' is None on rank(s) {odd} but not on rank(s) "
            f"{even}.") in message, message
    assert KERAS_REMEDY in message
