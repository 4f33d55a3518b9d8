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


def test_get_local_and_global_gradients_is_upstreams_split_view():
    """Upstream's signature: (target, sources) -> (local (source, grad) pairs, global (source, grad) pairs)."""
    local, shared, x, y = build(hvd.rank())
    variables = local.trainable_weights + shared.trainable_weights
    with tf.GradientTape() as tape:
        loss = loss_of(local, shared, x, y)
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[local])
    local_pairs, global_pairs = tape.get_local_and_global_gradients(loss, variables)
    assert [v for v, _ in local_pairs] == variables[:2] and [v for v, _ in global_pairs] == variables[2:]
    check([g.numpy() for _, g in local_pairs + global_pairs], expected(True))


def model_parallel_data(rank):
    """A shared trunk, a per-rank head whose width depends on the rank (the ranks' local variables have different
    shapes, as in model parallelism), and this rank's inputs."""
    return (np.random.default_rng(5).normal(size=(4, 3)), np.random.default_rng(50 + rank).normal(size=(3, rank + 2)),
            np.random.default_rng(60 + rank).normal(size=(6, 4)))


def model_parallel_loss(trunk, head, x):
    return tf.reduce_sum(tf.tanh(tf.matmul(tf.tanh(tf.matmul(x, trunk)), head)) ** 2)


def model_parallel_step(rank, mode):
    """One step's gradients of (trunk, head) through a DistributedGradientTape with the head local."""
    trunk0, head0, x0 = model_parallel_data(rank)

    def step(trunk, head, x):
        with tf.GradientTape() as tape:
            loss = model_parallel_loss(trunk, head, x)
        tape = hvd.DistributedGradientTape(tape)
        tape.register_local_source(head)
        return tape.gradient(loss, [trunk, head])

    if mode == "graph":
        with tf.Graph().as_default():
            trunk = tf.compat.v1.get_variable("trunk", initializer=trunk0)
            head = tf.compat.v1.get_variable("head", initializer=head0)
            grads = step(trunk, head, tf.constant(x0))
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                return sess.run(grads)
    trunk, head, x = tf.Variable(trunk0), tf.Variable(head0), tf.constant(x0)
    grads = step(trunk, head, x) if mode == "eager" else tf.function(step)(trunk, head, x)
    return [g.numpy() for g in grads]


def model_parallel_plain(rank):
    """The same step's gradients in one process, without Horovod."""
    trunk, head, x = (tf.Variable(v) for v in model_parallel_data(rank))
    with tf.GradientTape() as tape:
        loss = model_parallel_loss(trunk, head, x)
    return [g.numpy() for g in tape.gradient(loss, [trunk, head])]


@pytest.mark.parametrize("mode", MODES + ["graph"])
def test_model_parallel_step_with_rank_shaped_local_variables(mode):
    size, rank = hvd.size(), hvd.rank()
    g_trunk, g_head = model_parallel_step(rank, mode)
    plain = [model_parallel_plain(r) for r in range(size)]
    np.testing.assert_allclose(g_trunk, np.mean([p[0] for p in plain], axis=0), rtol=1e-10)
    assert g_head.shape == (3, rank + 2)
    np.testing.assert_allclose(g_head, plain[rank][1] / size, rtol=1e-10)


def test_tf_keras_layers_can_be_local():
    """Keras 2 (tf-keras, what tf.keras is under TF_USE_LEGACY_KERAS=1) layers are accepted as local layers."""
    tf_keras = pytest.importorskip("tf_keras")
    size, rank = hvd.size(), hvd.rank()
    local = tf_keras.layers.Dense(2, kernel_initializer=tf_keras.initializers.Constant(float(rank + 1)))
    shared = tf_keras.layers.Dense(1, kernel_initializer="ones")
    x = tf.ones([3, 4])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(shared(local(x))) * float(rank + 1)
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=local)
    variables = local.trainable_weights + shared.trainable_weights
    grads = [g.numpy() for g in tape.gradient(loss, variables)]
    # d loss / d local kernel = (rank + 1) * 3 (rows) * shared kernel (1): this rank's own, divided by size
    np.testing.assert_allclose(grads[0], np.full((4, 2), 3.0 * (rank + 1) / size))
    # d loss / d shared kernel = (rank + 1) * sum over rows of local(x) = (rank + 1) * 3 * 4 * (rank + 1)
    np.testing.assert_allclose(grads[2], np.full((2, 1), np.mean([12.0 * (r + 1) ** 2 for r in range(size)])))


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
