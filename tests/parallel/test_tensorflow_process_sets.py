"""horovod.tensorflow (and horovod.tensorflow.keras) on process sets: every collective eagerly, inside
tf.function and in a TF1 graph, their gradients, the helpers, DistributedGradientTape /
PartialDistributedGradientTape and the Keras DistributedOptimizer with ``process_set=``.

Each test adds the even and the odd ranks as two sets and works on the set this rank is in. At 3 ranks the sets
have unequal sizes ([0, 2] and [1]) and rank 2 is position 1 of its set, so every place that must use the set's
size or this rank's position in the set (Average, gradients, shapes, local-gradient scaling) is exercised.
At 1 rank only the global-set test runs.
"""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import horovod.tensorflow as hvd  # noqa: E402
import horovod.tensorflow.keras as hvd_keras  # noqa: E402
from tests.support.process_sets import even_odd_sets  # noqa: E402  (turns dynamic process sets on)

MODES = ["eager", "function", "graph"]


@pytest.fixture
def sets():
    """(this rank's set, the other set): the even and the odd ranks; removed afterwards."""
    yield from even_odd_sets()


def run(mode, fn, *args):
    """``fn`` eagerly, in a fresh tf.function, or in a fresh TF1 graph run by a session; numpy results."""
    if mode == "graph":
        values = [np.asarray(a) for a in args]
        with tf.Graph().as_default():
            out = fn(*[tf.constant(v) for v in values])
            with tf.compat.v1.Session() as sess:
                return sess.run(out)
    out = fn(*args) if mode == "eager" else tf.function(fn)(*args)
    return tf.nest.map_structure(lambda t: t.numpy(), out)


def data(rank, shape, salt=0, dtype=np.float64):
    rng = np.random.default_rng(1000 * salt + rank)
    return np.round(rng.normal(size=shape) * 10).astype(dtype)


def rows(rank):
    return rank % 3 + 1


def grad_of(fn, x, upstream):
    """d sum(fn(x) * upstream) / dx, eagerly."""
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return tape.gradient(y, x, output_gradients=tf.constant(upstream)).numpy()


# ---------------------------------------------------------------------------------------------- global set
def test_the_global_set_given_explicitly_and_the_size_ops():
    rank, size = hvd.rank(), hvd.size()
    ps = hvd.global_process_set
    out = hvd.allreduce(tf.constant(data(rank, [3])), process_set=ps)
    np.testing.assert_allclose(out.numpy(), sum(data(r, [3]) for r in range(size)) / size)
    assert int(hvd.size_op(0)) == size and int(hvd.process_set_included_op(0)) == 1
    assert hvd.allgather_object(rank, process_set=ps) == list(range(size))


# ---------------------------------------------------------------------------------------------- reductions
@pytest.mark.parametrize("mode", MODES)
def test_allreduce_sum_and_average_on_a_set(sets, mode):
    ps, _ = sets
    x = data(hvd.rank(), [4, 3])
    total = sum(data(r, [4, 3]) for r in ps.ranks)
    summed, averaged = run(mode, lambda t: (hvd.allreduce(t, op=hvd.Sum, process_set=ps),
                                            hvd.allreduce(t, process_set=ps)), x)
    np.testing.assert_allclose(summed, total)
    np.testing.assert_allclose(averaged, total / ps.size())
    grouped = run(mode, lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum, process_set=ps), x,
                  data(hvd.rank(), [5], salt=1))
    np.testing.assert_allclose(grouped[0], total)
    np.testing.assert_allclose(grouped[1], sum(data(r, [5], salt=1) for r in ps.ranks))


def test_allreduce_grads_on_a_set(sets):
    ps, _ = sets
    x, ones = data(hvd.rank(), [3]), np.ones(3)
    np.testing.assert_allclose(grad_of(lambda t: hvd.allreduce(t, op=hvd.Sum, process_set=ps), x, ones),
                               np.full(3, float(ps.size())))
    np.testing.assert_allclose(grad_of(lambda t: hvd.allreduce(t, process_set=ps), x, ones), ones)
    grads = grad_of(lambda t: hvd.grouped_allreduce([t, 2 * t], op=hvd.Sum, process_set=ps)[1], x, ones)
    np.testing.assert_allclose(grads, np.full(3, 2.0 * ps.size()))


def test_indexed_slices_average_over_the_set(sets):
    ps, _ = sets
    slices = tf.IndexedSlices(tf.constant(data(hvd.rank(), [1, 2])), tf.constant([hvd.rank()], tf.int64),
                              dense_shape=tf.constant([hvd.size(), 2], tf.int64))
    dense = tf.convert_to_tensor(hvd.allreduce(slices, process_set=ps)).numpy()
    expected = np.zeros((hvd.size(), 2))
    for r in ps.ranks:
        expected[r] = data(r, [1, 2])[0] / ps.size()
    np.testing.assert_allclose(dense, expected)


# ---------------------------------------------------------------------------------------------- movement
@pytest.mark.parametrize("mode", MODES)
def test_allgather_and_grouped_allgather_on_a_set(sets, mode):
    ps, _ = sets
    rank = hvd.rank()
    gathered, grouped = run(mode, lambda a, b: (hvd.allgather(a, process_set=ps),
                                                hvd.grouped_allgather([a, b], process_set=ps)),
                            data(rank, [rows(rank), 2]), data(rank, [1], salt=1))
    expected = np.concatenate([data(r, [rows(r), 2]) for r in ps.ranks])
    np.testing.assert_allclose(gathered, expected)
    np.testing.assert_allclose(grouped[0], expected)
    np.testing.assert_allclose(grouped[1], np.concatenate([data(r, [1], salt=1) for r in ps.ranks]))


@pytest.mark.parametrize("grouped", [False, True], ids=["allgather", "grouped_allgather"])
def test_allgather_grad_is_this_ranks_block_of_the_set(sets, grouped):
    """Every member backpropagates block i (member i's rows) filled with i: the averaged gradient is the same,
    and this rank gets the block of its position in the set."""
    ps, _ = sets
    rank = hvd.rank()
    upstream = np.concatenate([np.full((rows(r), 2), float(i)) for i, r in enumerate(ps.ranks)])
    if grouped:
        def fn(t):
            return hvd.grouped_allgather([t], process_set=ps)[0]
    else:
        def fn(t):
            return hvd.allgather(t, process_set=ps)
    np.testing.assert_allclose(grad_of(fn, data(rank, [rows(rank), 2]), upstream),
                               np.full((rows(rank), 2), float(ps.rank())))


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_on_a_set(sets, mode):
    ps, _ = sets
    root = ps.ranks[-1]                                      # a global rank
    out = run(mode, lambda t: hvd.broadcast(t, root, process_set=ps), data(hvd.rank(), [3]))
    np.testing.assert_allclose(out, data(root, [3]))
    grad = grad_of(lambda t: hvd.broadcast(t, root, process_set=ps), data(hvd.rank(), [3]), np.ones(3))
    np.testing.assert_allclose(grad, np.full(3, 1.0 if hvd.rank() == root else 0.0))


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_on_a_set(sets, mode):
    ps, _ = sets
    n, me = ps.size(), ps.rank()
    x = np.concatenate([np.full((j + 1, 2), 100.0 * me + j) for j in range(n)])
    splits = np.arange(1, n + 1, dtype=np.int32)
    out, received = run(mode, lambda t, s: hvd.alltoall(t, s, process_set=ps), x, splits)
    np.testing.assert_allclose(out, np.concatenate([np.full((me + 1, 2), 100.0 * i + me) for i in range(n)]))
    assert list(received) == [me + 1] * n
    grad = grad_of(lambda t: hvd.alltoall(t, splits, process_set=ps)[0], x, out * 2)
    np.testing.assert_allclose(grad, x * 2)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_reducescatter_on_a_set(sets, mode, op_name):
    ps, _ = sets
    n, me = ps.size(), ps.rank()
    op = getattr(hvd, op_name)
    total = sum(data(r, [2 * n + 1, 2]) for r in ps.ranks) / (n if op == hvd.Average else 1)
    start = 2 * me + min(me, 1)                              # position 0 gets the extra row

    def fn(t):
        out = hvd.reducescatter(t, op=op, process_set=ps)
        assert out.shape[0] in (None, 2 + (me == 0))         # the static shape counts rows in the set
        return out

    np.testing.assert_allclose(run(mode, fn, data(hvd.rank(), [2 * n + 1, 2])), total[start:start + 2 + (me == 0)])
    grouped = run(mode, lambda t: hvd.grouped_reducescatter([t], op=op, process_set=ps),
                  data(hvd.rank(), [2 * n + 1, 2]))
    np.testing.assert_allclose(grouped[0], total[start:start + 2 + (me == 0)])
    grad = grad_of(lambda t: hvd.reducescatter(t, op=op, process_set=ps), data(hvd.rank(), [2 * n + 1, 2]),
                   np.ones((2 + (me == 0), 2)))
    np.testing.assert_allclose(grad, np.full((2 * n + 1, 2), float(n) if op == hvd.Sum else 1.0))


# ---------------------------------------------------------------------------------------------- helpers
def test_variables_objects_and_size_ops_on_a_set(sets):
    ps, other = sets
    root = ps.ranks[0]
    v = tf.Variable(data(hvd.rank(), [3]))
    hvd.broadcast_variables([v], root_rank=root, process_set=ps)
    np.testing.assert_allclose(v.numpy(), data(root, [3]))
    assert hvd.broadcast_object(("from", hvd.rank()), root_rank=root, process_set=ps) == ("from", root)
    assert hvd.allgather_object(hvd.rank(), process_set=ps) == ps.ranks
    assert int(hvd.size_op(ps.process_set_id)) == ps.size()
    assert int(hvd.process_set_included_op(ps.process_set_id)) == 1
    assert int(hvd.process_set_included_op(other.process_set_id)) == 0

    @tf.function
    def ops():
        return (hvd.size_op(ps.process_set_id), hvd.size_op(other.process_set_id),
                hvd.process_set_included_op(other.process_set_id))

    assert [int(t) for t in ops()] == [ps.size(), other.size(), 0]
    with tf.Graph().as_default():
        fetch = [hvd.size_op(process_set_id=ps.process_set_id), hvd.process_set_included_op(ps.process_set_id)]
        with tf.compat.v1.Session() as sess:
            assert [int(t) for t in sess.run(fetch)] == [ps.size(), 1]


@pytest.mark.parametrize("mode", MODES)
def test_a_rank_outside_the_set_gets_invalid_argument_error(sets, mode):
    """Eagerly it is also a ValueError (the op layer's type); a graph's kernel fails with TF's own class."""
    _, other = sets
    message = rf"Rank {hvd.rank()} is not in process set {other.process_set_id}"
    expected = ValueError if mode == "eager" else tf.errors.InvalidArgumentError
    for fn in (lambda t: hvd.allreduce(t, process_set=other),
               lambda t: hvd.allgather(t, process_set=other),
               lambda t: hvd.broadcast(t, other.ranks[0], process_set=other),
               lambda t: hvd.reducescatter(t, process_set=other)):
        with pytest.raises(expected, match=message) as info:
            run(mode, fn, np.ones(2))
        assert isinstance(info.value, tf.errors.InvalidArgumentError)


@pytest.mark.parametrize("mode", MODES)
def test_a_set_that_is_not_registered_is_a_value_error_when_the_op_is_built(mode):
    fake = hvd.ProcessSet(list(range(hvd.size())))
    fake.process_set_id = 123                           # an id set by hand: upstream's tests do this
    for fn in (lambda t: hvd.allreduce(t, process_set=fake),
               lambda t: hvd.allgather(t, process_set=fake),
               lambda t: hvd.broadcast(t, 0, process_set=fake),
               lambda t: hvd.alltoall(t, process_set=fake),
               lambda t: hvd.reducescatter(t, process_set=fake)):
        with pytest.raises(ValueError, match="is not registered: this job has no process set with id 123") as info:
            run(mode, fn, np.ones(2 * hvd.size()))
        assert not isinstance(info.value, tf.errors.OpError)     # raised in Python, not from inside the graph


# ---------------------------------------------------------------------------------------------- training
def linear_loss(w, rank, salt=0):
    """loss_r = sum(w * x_r): the gradient of rank r is x_r."""
    return tf.reduce_sum(w * tf.constant(data(rank, [4], salt)))


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_distributed_gradient_tape_averages_over_the_set(sets, mode):
    ps, other = sets
    w = tf.Variable(np.zeros(4))

    def step(process_set):
        with tf.GradientTape() as tape:
            loss = linear_loss(w, hvd.rank())
        return hvd.DistributedGradientTape(tape, process_set=process_set).gradient(loss, [w])[0]

    grad = step(ps) if mode == "eager" else tf.function(step)(ps)
    np.testing.assert_allclose(grad.numpy(), sum(data(r, [4]) for r in ps.ranks) / ps.size())
    # A rank outside the set keeps its own gradient (upstream's _allreduce_cond).
    np.testing.assert_allclose(step(other).numpy(), data(hvd.rank(), [4]))


def test_partial_tape_scales_local_gradients_by_the_set_size(sets):
    ps, _ = sets
    shared, local = tf.Variable(np.zeros(4)), tf.Variable(np.zeros(4))
    with tf.GradientTape() as tape:
        loss = linear_loss(shared, hvd.rank()) + linear_loss(local, hvd.rank(), salt=1)
    tape = hvd.DistributedGradientTape(tape, process_set=ps)
    tape.register_local_source(local)
    g_shared, g_local = tape.gradient(loss, [shared, local])
    np.testing.assert_allclose(g_shared.numpy(), sum(data(r, [4]) for r in ps.ranks) / ps.size())
    np.testing.assert_allclose(g_local.numpy(), data(hvd.rank(), [4], salt=1) / ps.size())


def test_keras_distributed_optimizer_averages_over_the_set(sets):
    ps, _ = sets
    layer = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros", dtype="float64")
    local = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros", dtype="float64")
    x = tf.constant(data(hvd.rank(), [1, 4]))
    layer.build((None, 4))
    local.build((None, 4))
    opt = hvd_keras.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), process_set=ps, local_layers=[local])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(x)) + tf.reduce_sum(local(x))
    variables = layer.trainable_weights + local.trainable_weights
    opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
    mean = sum(data(r, [1, 4]) for r in ps.ranks)[0] / ps.size()
    np.testing.assert_allclose(layer.kernel.numpy()[:, 0], -mean)
    np.testing.assert_allclose(local.kernel.numpy()[:, 0], -data(hvd.rank(), [1, 4])[0] / ps.size())


def test_tf1_distributed_optimizer_averages_over_the_set(sets):
    ps, _ = sets
    w = tf.Variable(np.zeros(4))
    opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0), process_set=ps)
    opt.minimize(lambda: linear_loss(w, hvd.rank()), var_list=[w])
    np.testing.assert_allclose(w.numpy(), -sum(data(r, [4]) for r in ps.ranks) / ps.size())


def test_join_on_a_set_with_uneven_work(sets):
    ps, _ = sets
    position, n = ps.rank(), ps.size()
    for step in range(position + 1):
        out = hvd.allreduce(tf.ones(2), op=hvd.Sum, name=f"uneven.{step}", process_set=ps)
        assert out.numpy().tolist() == [float(n - step)] * 2
    assert int(hvd.join(process_set=ps)) == ps.ranks[-1]
