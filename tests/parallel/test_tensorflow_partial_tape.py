"""PartialDistributedGradientTape and register_local_source: the gradients of local layers are this rank's own
(divided by the number of ranks with scale_local_gradients=True), the others are averaged across ranks.

Every rank rebuilds every rank's model (the local layer's weights and the data depend on the rank through fixed
seeds) and computes the plain, single-process gradients, from which the expected values follow.
"""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import horovod.tensorflow as hvd  # noqa: E402

MODES = ["eager", "function"]


def build(rank):
    """A per-rank (local) Dense layer followed by a shared (global) one; inputs and targets of ``rank``."""
    local_init = np.random.default_rng(1000 + rank).normal(size=(4, 3)).astype(np.float32)
    global_init = np.random.default_rng(7).normal(size=(3, 1)).astype(np.float32)
    local = keras.layers.Dense(3, activation="tanh", kernel_initializer=keras.initializers.Constant(local_init))
    shared = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(global_init),
                                bias_initializer="ones")
    rng = np.random.default_rng(100 + rank)
    x, y = rng.normal(size=(5, 4)).astype(np.float32), rng.normal(size=(5, 1)).astype(np.float32)
    local.build((None, 4))
    shared.build((None, 3))
    return local, shared, x, y


def loss_of(local, shared, x, y):
    return tf.reduce_mean((shared(local(x)) - y) ** 2)


def plain_gradients(rank):
    local, shared, x, y = build(rank)
    variables = local.trainable_weights + shared.trainable_weights
    with tf.GradientTape() as tape:
        loss = loss_of(local, shared, x, y)
    return [g.numpy() for g in tape.gradient(loss, variables)]


def expected(scale_local_gradients):
    size, rank = hvd.size(), hvd.rank()
    per_rank = [plain_gradients(r) for r in range(size)]
    mine = per_rank[rank]
    factor = 1.0 / size if scale_local_gradients else 1.0
    local = [g * factor for g in mine[:2]]
    shared = [np.mean([grads[i] for grads in per_rank], axis=0) for i in (2, 3)]
    return local + shared


def check(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scale", [True, False], ids=["scaled", "unscaled"])
def test_partial_tape_keeps_local_layer_gradients(scale, mode):
    local, shared, x, y = build(hvd.rank())
    variables = local.trainable_weights + shared.trainable_weights

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(local, shared, x, y)
        tape = hvd.PartialDistributedGradientTape(tape, local_layers=local, scale_local_gradients=scale)
        return tape.gradient(loss, variables)

    grads = step(x, y) if mode == "eager" else tf.function(step)(x, y)
    check([g.numpy() for g in grads], expected(scale))


def test_register_local_source_on_a_distributed_tape_with_tf_variables():
    size, rank = hvd.size(), hvd.rank()
    shared = tf.Variable([1.0, 2.0])
    mine = tf.Variable([3.0])
    with tf.GradientTape() as tape:
        loss = float(rank + 1) * (tf.reduce_sum(shared) + 5.0 * tf.reduce_sum(mine))
    tape = hvd.DistributedGradientTape(tape)
    tape.register_local_source(mine)
    g_shared, g_mine = tape.gradient(loss, [shared, mine])
    np.testing.assert_allclose(g_shared.numpy(), np.full(2, (size + 1) / 2))
    np.testing.assert_allclose(g_mine.numpy(), [5.0 * (rank + 1) / size])


def test_get_local_and_global_gradients_splits_given_gradients():
    size, rank = hvd.size(), hvd.rank()
    local, shared, _, _ = build(rank)
    tape = hvd.PartialDistributedGradientTape(tf.GradientTape(), local_layers=[local])
    sources = {"local": local.kernel, "shared": shared.kernel}
    grads = {"local": tf.fill([4, 3], float(rank + 1)), "shared": tf.fill([3, 1], float(rank + 1))}
    out = tape.get_local_and_global_gradients(grads, sources)
    np.testing.assert_allclose(out["local"].numpy(), np.full((4, 3), (rank + 1) / size))
    np.testing.assert_allclose(out["shared"].numpy(), np.full((3, 1), (size + 1) / 2))


def test_without_local_layers_it_is_a_distributed_tape():
    local, shared, x, y = build(hvd.rank())
    variables = local.trainable_weights + shared.trainable_weights
    with tf.GradientTape() as tape:
        loss = loss_of(local, shared, x, y)
    grads = hvd.PartialDistributedGradientTape(tape).gradient(loss, variables)
    per_rank = [plain_gradients(r) for r in range(hvd.size())]
    check([g.numpy() for g in grads[2:]], [np.mean([p[i] for p in per_rank], axis=0) for i in (2, 3)])


def test_local_layers_must_be_keras_layers():
    with pytest.raises(ValueError) as info:
        hvd.PartialDistributedGradientTape(tf.GradientTape(), local_layers=[tf.Variable(1.0)])
    assert "All local layers must be of tf.keras.layers.Layer type" in str(info.value)
    assert "ResourceVariable" in str(info.value)
