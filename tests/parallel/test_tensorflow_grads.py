"""horovod.tensorflow gradients through tf.GradientTape (eagerly and inside tf.function) and tf.gradients (TF1
graph), and DistributedGradientTape against single-process gradients on the whole batch.

Upstream's rules: allreduce -> allreduce of the gradient (same op and factors); allgather and broadcast -> the
gradient averaged across ranks (then this rank's rows / zero off the root); alltoall -> alltoall back with the
received splits; reducescatter -> the gradient times the set size (op Sum only), times the prescale and
postscale factors, then allgathered (upstream's numbers, which for op Sum are size times the true gradient of the
summed loss).
"""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import horovod.tensorflow as hvd  # noqa: E402

MODES = ["eager", "function"]
GRAPH_MODES = MODES + ["graph"]


def grad_of(mode, fn, x):
    """d sum(w * fn(x)) / dx with w = 1..n over fn's output, eagerly, inside a tf.function, or with tf.gradients
    in a TF1 graph run by a session."""
    def loss_of(y):
        w = tf.reshape(tf.range(1, tf.size(y) + 1, dtype=y.dtype), tf.shape(y))
        return tf.reduce_sum(w * y)

    def body(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
            loss = loss_of(y)
        return y, tape.gradient(loss, x)

    if mode == "graph":
        value = x.numpy()
        with tf.Graph().as_default():
            xg = tf.constant(value)
            y = fn(xg)
            (g,) = tf.gradients(loss_of(y), [xg])
            with tf.compat.v1.Session() as sess:
                y, g = sess.run([y, g])
    else:
        y, g = body(x) if mode == "eager" else tf.function(body)(x)
        y, g = y.numpy(), g.numpy()
    return y, g, np.arange(1, y.size + 1, dtype=np.float64).reshape(y.shape)


@pytest.mark.parametrize("mode", GRAPH_MODES)
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64], ids=lambda d: d.name)
@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_allreduce_grad(op_name, dtype, mode):
    size, op = hvd.size(), getattr(hvd, op_name)
    x = tf.cast(tf.fill([2, 3], float(hvd.rank() + 1)), dtype)
    _, g, w = grad_of(mode, lambda t: hvd.allreduce(t, op=op, prescale_factor=2.0, postscale_factor=0.5), x)
    # dL/dx = allreduce(w) with the same op/scales; w is the same on every rank.
    expected = w * size * (1.0 / size if op == hvd.Average else 1.0)
    np.testing.assert_allclose(g, expected, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce_grad(mode):
    size = hvd.size()
    a, b = tf.ones([3]), tf.ones([2, 2])

    def body(a, b):
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            ya, yb = hvd.grouped_allreduce([a * 2.0, b], op=hvd.Sum)
            loss = tf.reduce_sum(ya) + 3.0 * tf.reduce_sum(yb)
        return tape.gradient(loss, [a, b])

    ga, gb = body(a, b) if mode == "eager" else tf.function(body)(a, b)
    np.testing.assert_allclose(ga.numpy(), np.full(3, 2.0 * size))
    np.testing.assert_allclose(gb.numpy(), np.full((2, 2), 3.0 * size))


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_allgather_grad_uneven_rows(mode):
    rank, size = hvd.rank(), hvd.size()
    x = tf.fill([rank + 1, 2], float(rank))
    y, g, w = grad_of(mode, hvd.allgather, x)
    assert y.shape == (size * (size + 1) // 2, 2)
    offset = rank * (rank + 1) // 2
    # The incoming gradient w is the same on every rank, so its average is w; keep this rank's rows.
    np.testing.assert_allclose(g, w[offset:offset + rank + 1])


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allgather_grad(mode):
    rank = hvd.rank()
    a, b = tf.fill([rank + 1], 1.0), tf.fill([2, 3], 1.0)

    def body(a, b):
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            ya, yb = hvd.grouped_allgather([a, b])
            loss = tf.reduce_sum(ya * 5.0) + tf.reduce_sum(yb * 7.0)
        return tape.gradient(loss, [a, b])

    ga, gb = body(a, b) if mode == "eager" else tf.function(body)(a, b)
    np.testing.assert_allclose(ga.numpy(), np.full(rank + 1, 5.0))
    np.testing.assert_allclose(gb.numpy(), np.full((2, 3), 7.0))


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_broadcast_grad(mode):
    rank, size = hvd.rank(), hvd.size()
    root = size - 1
    x = tf.fill([4], float(rank))
    y, g, w = grad_of(mode, lambda t: hvd.broadcast(t, root), x)
    np.testing.assert_allclose(y, np.full(4, float(root)))
    np.testing.assert_allclose(g, w if rank == root else np.zeros(4))


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_alltoall_grad(mode):
    rank, size = hvd.rank(), hvd.size()
    splits = [(rank + j) % 3 for j in range(size)]
    x = tf.fill([sum(splits), 2], float(rank))

    def loss_of(x):
        out, received = hvd.alltoall(x, splits)
        return tf.reduce_sum(out * tf.cast(tf.reshape(tf.repeat(tf.range(size), received), [-1, 1]) + 1,
                                           out.dtype))

    def body(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = loss_of(x)
        return tape.gradient(loss, x)

    if mode == "graph":
        with tf.Graph().as_default():
            xg = tf.constant(x.numpy())
            (grad,) = tf.gradients(loss_of(xg), [xg])
            with tf.compat.v1.Session() as sess:
                g = sess.run(grad)
    else:
        g = (body(x) if mode == "eager" else tf.function(body)(x)).numpy()
    # Rows sent to rank j come back with weight (this rank + 1) from j's loss.
    np.testing.assert_allclose(g, np.full((sum(splits), 2), rank + 1.0))


@pytest.mark.parametrize("mode", GRAPH_MODES)
@pytest.mark.parametrize("op_name", ["Sum", "Average"])
@pytest.mark.parametrize("scales", [(1.0, 1.0), (2.0, 0.25)], ids=["unscaled", "scaled"])
def test_reducescatter_grad_is_upstreams(scales, op_name, mode):
    size, op = hvd.size(), getattr(hvd, op_name)
    pre, post = scales
    x = tf.ones([2 * size, 3])
    y, g, w = grad_of(mode, lambda t: hvd.reducescatter(t, op=op, prescale_factor=pre, postscale_factor=post), x)
    # Every rank's w is 1..6 over its 2 rows: the allgathered gradient is that block repeated per rank, times
    # the set size for Sum (not for Average), times both factors.
    expected = np.tile(w, (size, 1)) * (size if op == hvd.Sum else 1) * pre * post
    np.testing.assert_allclose(g, expected, rtol=1e-6)


@pytest.mark.parametrize("mode", GRAPH_MODES)
@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_grouped_reducescatter_grad_is_upstreams(op_name, mode):
    size, op = hvd.size(), getattr(hvd, op_name)

    def fn(t):
        a, b = hvd.grouped_reducescatter([t, 3.0 * t], op=op, prescale_factor=0.5)
        return tf.concat([a, b], axis=1)

    _, g, w = grad_of(mode, fn, tf.ones([size, 2], tf.float64))
    # Rank r's output row is [a_r (2 values), b_r (2 values)] with weights w = 1..4; b = reducescatter(3 t).
    scale = (size if op == hvd.Sum else 1) * 0.5
    expected = np.tile(w[:, :2] + 3.0 * w[:, 2:], (size, 1)) * scale
    np.testing.assert_allclose(g, expected, rtol=1e-12)


# ------------------------------------------------------------------------------------------------ tape
def make_data(rank, n=6):
    rng = np.random.default_rng(100 + rank)
    return rng.normal(size=(n, 4)).astype(np.float32), rng.normal(size=(n, 1)).astype(np.float32)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("groups", [None, 2])
def test_distributed_gradient_tape_matches_the_whole_batch(groups, mode):
    rank, size = hvd.rank(), hvd.size()
    init = np.random.default_rng(7)
    w = tf.Variable(init.normal(size=(4, 3)).astype(np.float32))
    b = tf.Variable(np.zeros(3, np.float32))
    v = tf.Variable(init.normal(size=(3, 1)).astype(np.float32))
    variables = [w, b, v]

    def loss_fn(x, y):
        return tf.reduce_mean((tf.matmul(tf.tanh(tf.matmul(x, w) + b), v) - y) ** 2)

    def distributed(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(x, y)
        tape = hvd.DistributedGradientTape(tape, groups=groups)
        return tape.gradient(loss, variables)

    x, y = make_data(rank)
    grads = distributed(x, y) if mode == "eager" else tf.function(distributed)(x, y)
    xs, ys = zip(*[make_data(r) for r in range(size)])
    with tf.GradientTape() as tape:
        loss = loss_fn(np.concatenate(xs), np.concatenate(ys))
    expected = tape.gradient(loss, variables)
    for got, exp in zip(grads, expected):
        np.testing.assert_allclose(got.numpy(), exp.numpy(), rtol=1e-5, atol=1e-6)


def test_distributed_gradient_tape_sparse_and_sum():
    size = hvd.size()
    table = tf.Variable(tf.ones([size + 2, 2]))
    dense = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, [hvd.rank(), hvd.rank() + 1])) + tf.reduce_sum(dense * hvd.rank())
    tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
    g_table, g_dense = tape.gradient(loss, [table, dense])
    assert isinstance(g_table, tf.IndexedSlices)
    expected = np.zeros((size + 2, 2))
    for r in range(size):
        expected[[r, r + 1]] += 1
    np.testing.assert_allclose(tf.convert_to_tensor(g_table).numpy(), expected)
    np.testing.assert_allclose(g_dense.numpy(), np.full(2, size * (size - 1) / 2))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, [0])) * (hvd.rank() + 1)
    g = hvd.DistributedGradientTape(tape, sparse_as_dense=True).gradient(loss, table)
    assert not isinstance(g, tf.IndexedSlices)
    np.testing.assert_allclose(g.numpy()[0], np.full(2, (size + 1) / 2))


def test_distributed_gradient_tape_as_context_manager_and_persistent():
    size = hvd.size()
    v = tf.Variable([1.0, 2.0])
    with hvd.DistributedGradientTape(tf.GradientTape(persistent=True)) as tape:
        loss = tf.reduce_sum(v * float(hvd.rank() + 1))
    expected = np.full(2, (size + 1) / 2)
    np.testing.assert_allclose(tape.gradient(loss, v).numpy(), expected)
    np.testing.assert_allclose(tape.gradient(loss, [v])[0].numpy(), expected)
    grads = tape.gradient(loss, {"v": v})
    np.testing.assert_allclose(grads["v"].numpy(), expected)


def test_keras_model_trained_with_the_tape_stays_in_sync():
    keras = pytest.importorskip("keras")
    tf.random.set_seed(hvd.rank())          # different initial weights on every rank ...
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    opt = keras.optimizers.SGD(0.1)
    hvd.broadcast_variables(model.variables, root_rank=0)   # ... until the broadcast

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    rng = np.random.default_rng(hvd.rank())
    for _ in range(3):
        x = rng.normal(size=(16, 4)).astype("float32")
        step(x, x.sum(1, keepdims=True))
    sums = hvd.allgather_object([float(v.numpy().sum()) for v in model.variables])
    for other in sums[1:]:
        np.testing.assert_allclose(other, sums[0], rtol=1e-6)


def test_eager_tape_over_a_tf_function():
    """The tape records a tf.function call; TF builds the backward function from the collectives' gradients."""
    rank, size = hvd.rank(), hvd.size()

    @tf.function
    def forward(x):
        return hvd.allreduce(x, op=hvd.Sum) * 2.0, hvd.allgather(x), hvd.broadcast(x, 0)

    x = tf.fill([2, 2], float(rank + 1))
    with tf.GradientTape() as tape:
        tape.watch(x)
        a, g, b = forward(x)
        loss = tf.reduce_sum(a) + 3.0 * tf.reduce_sum(g) + 5.0 * tf.reduce_sum(b)
    grad = tape.gradient(loss, x).numpy()
    expected = 2.0 * size + 3.0 + (5.0 if rank == 0 else 0.0)
    np.testing.assert_allclose(grad, np.full((2, 2), expected))
