"""horovod.tensorflow (and horovod.tensorflow.keras) with op=hvd.Adasum: allreduce and grouped allreduce eagerly,
inside tf.function and in a TF1 graph, their gradient, on a process set, against a single-process reference of
the formula (tests/support/adasum_reference.py); DistributedGradientTape, the TF1 delta optimizer and the Keras
optimizer; and a training run on the digits data that converges.

Every rank builds every rank's input from fixed seeds, so each rank computes the whole job's expected result.
"""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import horovod.tensorflow as hvd  # noqa: E402
import horovod.tensorflow.keras as hvd_keras  # noqa: E402
from tests.support.adasum_reference import adasum, tolerance  # noqa: E402
from tests.support.process_sets import even_odd_sets  # noqa: E402  (turns dynamic process sets on)

MODES = ["eager", "function", "graph"]
DTYPES = [np.float16, np.float32, np.float64]
v1 = tf.compat.v1


def run(mode, fn, *args):
    """``fn`` eagerly, in a fresh tf.function, or in a fresh TF1 graph run by a session; numpy results."""
    if mode == "graph":
        with tf.Graph().as_default():
            out = fn(*[tf.constant(a) for a in args])
            with v1.Session() as sess:
                return sess.run(out)
    out = fn(*[tf.constant(a) for a in args]) if mode == "eager" else tf.function(fn)(*args)
    return tf.nest.map_structure(lambda t: t.numpy(), out)


def gradient(rank, shape, dtype=np.float64, salt=0):
    return np.random.default_rng(100 * salt + rank).normal(size=shape).astype(dtype)


def assert_adasum(got, per_rank):
    got = np.asarray(got)
    assert got.dtype == per_rank[0].dtype and got.shape == per_rank[0].shape
    np.testing.assert_allclose(got.astype(np.float64), adasum(per_rank).astype(np.float64),
                               **tolerance(per_rank[0].dtype))


# ---------------------------------------------------------------------------------------------- collectives
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_allreduce_and_grouped_allreduce_match_the_reference(mode, dtype):
    rank, size = hvd.rank(), hvd.size()
    shapes = [(3, 5), (11,)]
    per_rank = [[gradient(r, shape, dtype, salt=i) * (i + 1) for r in range(size)] for i, shape in enumerate(shapes)]
    single, grouped = run(mode, lambda a, b: (hvd.allreduce(a, op=hvd.Adasum),
                                              hvd.grouped_allreduce([a, b], op=hvd.Adasum)),
                          *[tensors[rank] for tensors in per_rank])
    assert_adasum(single, per_rank[0])
    for got, tensors in zip(grouped, per_rank):            # per tensor, though fused into one buffer
        assert_adasum(got, tensors)


def test_allreduce_grad_is_the_adasum_of_the_gradients():
    rank, size = hvd.rank(), hvd.size()
    upstream = [gradient(r, (6,), salt=5) for r in range(size)]
    x = tf.constant(gradient(rank, (6,)))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = hvd.allreduce(x, op=hvd.Adasum)
    assert_adasum(tape.gradient(y, x, output_gradients=tf.constant(upstream[rank])).numpy(), upstream)


@pytest.fixture
def sets():
    yield from even_odd_sets()


def test_adasum_on_a_process_set(sets):
    ps, _ = sets
    per_rank = {r: gradient(r, (10,), np.float32) for r in ps.ranks}
    out = run("function", lambda t: hvd.allreduce(t, op=hvd.Adasum, process_set=ps), per_rank[hvd.rank()])
    assert_adasum(out, [per_rank[r] for r in ps.ranks])


def test_sparse_gradients_and_reducescatter_keep_upstreams_errors():
    slices = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0], tf.int64), dense_shape=tf.constant([2, 2], tf.int64))
    with pytest.raises(NotImplementedError, match="The Adasum reduction does not currently support sparse tensors"):
        hvd.allreduce(slices, op=hvd.Adasum)
    with pytest.raises(tf.errors.AbortedError, match="Reducescatter currently only supports AVERAGE and SUM"):
        hvd.reducescatter(tf.ones([2 * hvd.size()]), op=hvd.Adasum)


# ---------------------------------------------------------------------------------------------- wrappers
def linear_loss(w, rank, salt=0):
    """loss_r = sum(w * x_r): the gradient of rank r is x_r."""
    return tf.reduce_sum(w * tf.constant(gradient(rank, [4], salt=salt)))


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_distributed_gradient_tape_combines_gradients_with_adasum(mode):
    rank, size = hvd.rank(), hvd.size()
    w = tf.Variable(np.zeros(4))

    def grads():
        with tf.GradientTape() as tape:
            loss = linear_loss(w, rank)
        return hvd.DistributedGradientTape(tape, op=hvd.Adasum).gradient(loss, [w])[0]

    got = grads() if mode == "eager" else tf.function(grads)()
    assert_adasum(got.numpy(), [gradient(r, [4]) for r in range(size)])


@pytest.mark.parametrize("passes", [1, 2])
def test_tf1_delta_optimizer_in_a_graph(passes):
    """GradientDescent(lr): a rank's delta over ``passes`` steps is -lr * (sum of its gradients); on the
    exchange step every rank's weights become start + Adasum(deltas)."""
    rank, size = hvd.rank(), hvd.size()
    w0 = gradient(7, [4])
    with tf.Graph().as_default():
        w = v1.get_variable("w", initializer=tf.constant(w0))
        step = v1.placeholder(tf.int32, [])
        x = tf.gather(tf.constant(np.stack([gradient(rank, [4], salt=s) for s in range(2)])), step)
        opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(0.5), op=hvd.Adasum,
                                       backward_passes_per_step=passes)
        assert opt.get_name() == "DistributedDeltaGradientDescentOptimizer"
        train = opt.minimize(tf.reduce_sum(w * x), var_list=[w])
        assert "delta_start" in opt.get_slot_names()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for s in range(passes):
                sess.run(train, {step: s})
            got = sess.run(w)
    deltas = [-0.5 * sum(gradient(r, [4], salt=s) for s in range(passes)) for r in range(size)]
    np.testing.assert_allclose(got, w0 + adasum(deltas), rtol=1e-12, atol=1e-12)


def test_tf1_delta_optimizer_eagerly():
    rank, size = hvd.rank(), hvd.size()
    w = tf.Variable(np.zeros(4))
    opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(1.0), op=hvd.Adasum)
    for s in range(2):
        opt.minimize(lambda s=s: linear_loss(w, rank, salt=s), var_list=[w])
    expected = sum(adasum([-gradient(r, [4], salt=s) for r in range(size)]) for s in range(2))
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-12, atol=1e-12)


def test_keras_optimizer_combines_gradients_with_adasum():
    rank, size = hvd.rank(), hvd.size()
    layer = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros", dtype="float64")
    layer.build((None, 4))
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(1.0), op=hvd.Adasum)
    x = tf.constant(gradient(rank, [1, 4]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(x))
    opt.apply_gradients(zip(tape.gradient(loss, layer.trainable_weights), layer.trainable_weights))
    expected = -adasum([gradient(r, [1, 4]).T for r in range(size)])
    np.testing.assert_allclose(layer.kernel.numpy(), expected, rtol=1e-12, atol=1e-12)


def test_adasum_training_converges_on_digits():
    """A Keras model trained with model.fit and the Keras DistributedOptimizer(op=Adasum) on each rank's shard."""
    from sklearn.datasets import load_digits

    rank, size = hvd.rank(), hvd.size()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)[rank::size]
    y = digits.target[rank::size]
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                                                           op=hvd.Adasum),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    hvd_keras.broadcast_variables(model.variables, root_rank=0)
    history = model.fit(x, y, batch_size=64, epochs=12, verbose=0, shuffle=False)
    final = float(hvd.allreduce(tf.constant(history.history["loss"][-1]), name="adasum.digits.final"))
    # Seeded (seed 0), the final loss is 0.08, 0.09, 0.08 and 0.13 at 1-4 ranks on the reference VM, from a
    # first epoch's loss of 1.57-2.18; seeds 0-9 end at 0.19 at worst and start at 1.34 at least. The bound is
    # more than 1.5 times the worst: still far below the untrained loss (ln 10 = 2.3).
    assert history.history["loss"][0] > 0.5 and final < 0.35, (history.history["loss"], final)
    kernels = hvd.allgather(tf.reshape(model.layers[0].kernel, [1, -1]), name="adasum.digits.check").numpy()
    np.testing.assert_allclose(kernels, np.broadcast_to(kernels[:1], kernels.shape))
