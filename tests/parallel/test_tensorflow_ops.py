"""horovod.tensorflow collectives at any number of ranks: every collective x dtype, eagerly, inside tf.function
and in a TF1 graph run by a session (as upstream's tests run them), checked against numpy.

Each rank builds every rank's contribution deterministically from the rank number, so each rank can compute the
whole job's expected result locally. Values are small integers, exact in every dtype (bfloat16 included).
"""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import horovod.tensorflow as hvd  # noqa: E402
from tests.support.blocking import count_blocking  # noqa: E402

FLOATS = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
REDUCE_DTYPES = FLOATS + [tf.int32, tf.int64]
MOVE_DTYPES = REDUCE_DTYPES + [tf.uint8, tf.int8, tf.bool]
MODES = ["eager", "function", "graph"]
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max}


def dt_id(dtype):
    return dtype.name


def run(mode, fn, *args):
    """Call ``fn`` eagerly, traced into a fresh tf.function, or built into a fresh TF1 graph whose outputs one
    session.run fetches; return numpy results."""
    if mode == "graph":
        values = [(a.numpy(), a.dtype) if isinstance(a, tf.Tensor) else (a, None) for a in args]
        with tf.Graph().as_default():
            out = fn(*[tf.constant(v, dtype=d) for v, d in values])
            config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
            with tf.compat.v1.Session(config=config) as sess:
                return sess.run(out)
    out = fn(*args) if mode == "eager" else tf.function(fn)(*args)
    return tf.nest.map_structure(lambda t: t.numpy(), out)


def contrib_np(rank, shape, salt=0, dtype=tf.float32):
    n = int(np.prod(shape))
    i = np.arange(n, dtype=np.int64) + salt
    if dtype == tf.bool:
        return ((i + rank) % 3 == 0).reshape(shape)
    if dtype == tf.uint8:
        return ((3 * i + rank) % 11).astype(np.float64).reshape(shape)
    return ((3 * i + rank) % 11 - 5).astype(np.float64).reshape(shape)


def contrib(rank, shape, dtype, salt=0):
    vals = contrib_np(rank, shape, salt, dtype)
    return tf.constant(vals, dtype=dtype) if dtype == tf.bool else tf.cast(tf.constant(vals), dtype)


def reduce_expected(shape, dtype, op, size, pre=1.0, post=1.0, salt=0):
    parts = np.stack([contrib_np(r, shape, salt, dtype) for r in range(size)])
    is_float = dtype.is_floating
    if pre != 1.0:
        parts = parts * pre
        if not is_float:
            parts = np.trunc(parts)
    if op == hvd.Min:
        result = parts.min(0)
    elif op == hvd.Max:
        result = parts.max(0)
    else:
        result = parts.sum(0)
    factor = post / size if op == hvd.Average else post
    if factor != 1.0:
        result = result * factor
        if not is_float:
            result = np.trunc(result)
    return result


def tol(dtype):
    return {tf.float16: 2e-3, tf.bfloat16: 1.6e-2, tf.float32: 1e-6, tf.float64: 1e-12}.get(dtype, 0)


def assert_close(out, expected, dtype):
    out = np.asarray(out)
    assert out.dtype == dtype.as_numpy_dtype, (out.dtype, dtype)
    assert out.shape == tuple(expected.shape), (out.shape, expected.shape)
    if dtype == tf.bool:
        np.testing.assert_array_equal(out, expected)
    else:
        np.testing.assert_allclose(out.astype(np.float64), expected, rtol=tol(dtype), atol=tol(dtype))


def test_basics_and_size_ops():
    assert hvd.is_initialized()
    assert 0 <= hvd.rank() < hvd.size() and 0 <= hvd.local_rank() < hvd.local_size()
    assert int(hvd.size_op()) == hvd.size() and int(hvd.rank_op()) == hvd.rank()
    assert int(hvd.local_size_op()) == hvd.local_size() and int(hvd.local_rank_op()) == hvd.local_rank()
    assert int(hvd.process_set_included_op()) == 1

    @tf.function
    def sizes():
        return hvd.size_op(), hvd.rank_op(), hvd.local_rank_op(), hvd.local_size_op()

    assert [int(v) for v in sizes()] == [hvd.size(), hvd.rank(), hvd.local_rank(), hvd.local_size()]
    assert hvd.allgather_object(hvd.rank()) == list(range(hvd.size()))
    assert hvd.broadcast_object({"r": hvd.rank()}, root_rank=hvd.size() - 1) == {"r": hvd.size() - 1}
    assert isinstance(hvd.mpi_built(), bool) and hvd.Average == 0 and hvd.Sum == 1


# ------------------------------------------------------------------------------------------------ allreduce
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("dtype", REDUCE_DTYPES, ids=dt_id)
def test_allreduce(dtype, op_name, mode):
    rank, size, op = hvd.rank(), hvd.size(), OPS[op_name]
    t = contrib(rank, (3, 5), dtype)
    named = run(mode, lambda x: hvd.allreduce(x, op=op, name=f"ar.{dtype.name}.{op_name}.{mode}"), t)
    unnamed = run(mode, lambda x: hvd.allreduce(x, op=op), t)
    exp = reduce_expected((3, 5), dtype, op, size)
    assert_close(named, exp, dtype)
    assert_close(unnamed, exp, dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.int32], ids=dt_id)
@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_allreduce_prescale_postscale(op_name, dtype, mode):
    rank, size, op = hvd.rank(), hvd.size(), OPS[op_name]
    t = contrib(rank, (6,), dtype)
    out = run(mode, lambda x: hvd.allreduce(x, op=op, prescale_factor=2.0, postscale_factor=0.5), t)
    assert_close(out, reduce_expected((6,), dtype, op, size, pre=2.0, post=0.5), dtype)


def test_allreduce_default_op_is_average_and_average_flag():
    size = hvd.size()
    np.testing.assert_allclose(hvd.allreduce(tf.fill([4], 2.0 * size)).numpy(), np.full(4, 2.0 * size))
    np.testing.assert_allclose(hvd.allreduce(tf.ones([3]), average=False).numpy(), np.full(3, float(size)))
    with pytest.raises(ValueError):
        hvd.allreduce(tf.ones([3]), average=True, op=hvd.Sum)


def test_allreduce_of_variable_and_scalar_and_name_scope():
    size = hvd.size()
    v = tf.Variable([1.0, 2.0])
    np.testing.assert_allclose(hvd.allreduce(v, op=hvd.Sum).numpy(), [size, 2.0 * size])
    assert hvd.allreduce(tf.constant(3.0), op=hvd.Sum).numpy() == 3.0 * size

    @tf.function
    def scoped(x):
        with tf.name_scope("outer"):
            a = hvd.allreduce(x, op=hvd.Sum, name="scoped")
            b = hvd.allreduce(x, op=hvd.Sum, name="scoped", ignore_name_scope=True)
        return a, b, hvd.allreduce(x, op=hvd.Sum), hvd.allreduce(x, op=hvd.Sum)

    for out in scoped(tf.ones([2])):
        np.testing.assert_allclose(out.numpy(), [size, size])


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
@pytest.mark.parametrize("mode", MODES)
def test_allreduce_compression_keeps_the_input_dtype(mode, compression):
    rank, size = hvd.rank(), hvd.size()
    comp = getattr(hvd.Compression, compression)
    t = contrib(rank, (10,), tf.float32) * 0.5
    out = run(mode, lambda x: hvd.allreduce(x, op=hvd.Sum, compression=comp), t)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, reduce_expected((10,), tf.float32, hvd.Sum, size) * 0.5, rtol=1e-2, atol=1e-2)
    ints = run(mode, lambda x: hvd.allreduce(x, op=hvd.Sum, compression=comp), contrib(rank, (4,), tf.int32))
    assert ints.dtype == np.int32


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", REDUCE_DTYPES, ids=dt_id)
def test_grouped_allreduce(dtype, mode):
    rank, size = hvd.rank(), hvd.size()
    ts = [contrib(rank, (3, 2), dtype), contrib(rank, (7,), dtype, salt=1), contrib(rank, (), dtype, salt=2)]
    outs = run(mode, lambda *xs: hvd.grouped_allreduce(list(xs), op=hvd.Sum), *ts)
    assert len(outs) == 3
    for out, shape, salt in zip(outs, [(3, 2), (7,), ()], [0, 1, 2]):
        assert_close(out, reduce_expected(shape, dtype, hvd.Sum, size, salt=salt), dtype)
    outs = run(mode, lambda *xs: hvd.grouped_allreduce(list(xs), name=f"gar.{dtype.name}.{mode}"), *ts)
    assert_close(outs[1], reduce_expected((7,), dtype, hvd.Average, size, salt=1), dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_allreduce_indexed_slices(op_name, mode):
    rank, size, op = hvd.rank(), hvd.size(), OPS[op_name]

    def fn(values, indices):
        s = hvd.allreduce(tf.IndexedSlices(values, indices, dense_shape=tf.constant([size + 2, 3], tf.int64)),
                          op=op)
        assert isinstance(s, tf.IndexedSlices)
        return s.values, s.indices, tf.convert_to_tensor(s)

    values = tf.fill([2, 3], float(rank + 1))
    indices = tf.constant([rank, rank + 2], tf.int64)
    vals, idx, dense = run(mode, fn, values, indices)
    scale = 1.0 / size if op == hvd.Average else 1.0
    np.testing.assert_array_equal(idx, np.array([[r, r + 2] for r in range(size)]).reshape(-1))
    np.testing.assert_allclose(vals, np.repeat(np.arange(1, size + 1), 2)[:, None] * np.ones(3) * scale)
    expected = np.zeros((size + 2, 3))
    for r in range(size):
        expected[r] += (r + 1) * scale
        expected[r + 2] += (r + 1) * scale
    np.testing.assert_allclose(dense, expected, rtol=1e-6)
    with pytest.raises(NotImplementedError):
        hvd.allreduce(tf.IndexedSlices(values, indices), op=hvd.Max)


# ------------------------------------------------------------------------------------------------ allgather
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=dt_id)
def test_allgather_uneven_rows(dtype, mode):
    rank, size = hvd.rank(), hvd.size()
    t = contrib(rank, (rank + 1, 2, 3), dtype)
    out = run(mode, lambda x: hvd.allgather(x, name=f"ag.{dtype.name}.{mode}"), t)
    exp = np.concatenate([contrib_np(r, (r + 1, 2, 3), 0, dtype) for r in range(size)])
    assert_close(out, exp, dtype)
    out = run(mode, hvd.allgather, t)
    assert_close(out, exp, dtype)


def test_allgather_static_shape_in_function():
    @tf.function
    def fn(x):
        y = hvd.allgather(x)
        assert y.shape.as_list() == [None, 4], y.shape
        r = hvd.reducescatter(tf.ones([2 * hvd.size() + 1, 4]), op=hvd.Sum)
        assert r.shape.as_list() == [2 + (1 if hvd.rank() == 0 else 0), 4], r.shape
        o = hvd.alltoall(tf.ones([hvd.size(), 4]))   # without splits: the output alone, as upstream
        assert o.shape.as_list() == [None, 4]
        o, s = hvd.alltoall(tf.ones([hvd.size(), 4]), splits=[1] * hvd.size())
        assert o.shape.as_list() == [None, 4] and s.shape.as_list() == [hvd.size()]
        return y

    assert fn(tf.ones([3, 4])).shape == (3 * hvd.size(), 4)


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allgather(mode):
    rank, size = hvd.rank(), hvd.size()
    ts = [contrib(rank, (rank + 1, 2), tf.float32), contrib(rank, (2 * rank + 1,), tf.int64, salt=3)]
    outs = run(mode, lambda a, b: hvd.grouped_allgather([a, b]), *ts)
    assert_close(outs[0], np.concatenate([contrib_np(r, (r + 1, 2)) for r in range(size)]), tf.float32)
    assert_close(outs[1], np.concatenate([contrib_np(r, (2 * r + 1,), 3) for r in range(size)]), tf.int64)


# ------------------------------------------------------------------------------------------------ broadcast
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=dt_id)
def test_broadcast(dtype, mode):
    rank, size = hvd.rank(), hvd.size()
    for root in sorted({0, size - 1}):
        t = contrib(rank, (2, 5), dtype)
        out = run(mode, lambda x, root=root: hvd.broadcast(x, root, name=f"bc.{dtype.name}.{mode}.{root}"), t)
        assert_close(out, contrib_np(root, (2, 5), 0, dtype), dtype)
        np.testing.assert_array_equal(t.numpy(), contrib(rank, (2, 5), dtype).numpy())


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_broadcast_inplace_and_broadcast_variables(mode):
    rank, size = hvd.rank(), hvd.size()
    root = size - 1
    a = tf.Variable(contrib(rank, (3,), tf.float32))
    b = tf.Variable(contrib(rank, (2, 2), tf.int32, salt=1))
    run(mode, lambda: [tf.convert_to_tensor(v) for v in hvd.broadcast_([a, b], root)])
    assert_close(a.numpy(), contrib_np(root, (3,)), tf.float32)
    assert_close(b.numpy(), contrib_np(root, (2, 2), 1), tf.int32)
    c = tf.Variable(tf.fill([4], float(rank)))
    d = tf.Variable(tf.fill([2], rank))

    def bv():
        hvd.broadcast_variables([c, d], root_rank=0)
        return tf.constant(0)

    run(mode, bv)
    np.testing.assert_array_equal(c.numpy(), np.zeros(4, np.float32))
    np.testing.assert_array_equal(d.numpy(), np.zeros(2, np.int32))


# ------------------------------------------------------------------------------------------------ alltoall
def splits_of(r, size):
    return [(r + j) % 3 for j in range(size)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=dt_id)
def test_alltoall_with_splits(dtype, mode):
    rank, size = hvd.rank(), hvd.size()

    def rows(r):
        return contrib_np(r, (sum(splits_of(r, size)), 2), 0, dtype)

    t = tf.constant(rows(rank), dtype=dtype) if dtype == tf.bool else tf.cast(tf.constant(rows(rank)), dtype)
    splits = tf.constant(splits_of(rank, size), tf.int32)
    out, received = run(mode, lambda x, s: hvd.alltoall(x, s, name=f"a2a.{dtype.name}.{mode}"), t, splits)
    expected, recv = [], []
    for r in range(size):
        sp = splits_of(r, size)
        start = sum(sp[:rank])
        expected.append(rows(r)[start:start + sp[rank]])
        recv.append(sp[rank])
    assert_close(out, np.concatenate(expected), dtype)
    np.testing.assert_array_equal(received, recv)
    assert received.dtype == np.int32


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_equal_splits(mode):
    rank, size = hvd.rank(), hvd.size()
    t = tf.constant([[rank * 100 + j] for j in range(2 * size)], tf.int64)
    out = run(mode, hvd.alltoall, t)   # without splits upstream returns the output alone
    expected = [r * 100 + j for r in range(size) for j in (2 * rank, 2 * rank + 1)]
    np.testing.assert_array_equal(out[:, 0], expected)
    for splits in ([2] * size, np.full(size, 2, np.int64), []):   # empty splits: split equally too
        out, received = run(mode, lambda x, splits=splits: hvd.alltoall(x, splits=splits), t)
        np.testing.assert_array_equal(out[:, 0], expected)
        np.testing.assert_array_equal(received, [2] * size)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [tf.uint8, tf.int32, tf.float16, tf.bool], ids=dt_id)
def test_alltoall_zero_rows(dtype, mode):
    """Ranks with nothing to send: zero-row tensors, with splits=None, all-zero splits, and beside ranks that
    do send."""
    rank, size = hvd.rank(), hvd.size()
    empty = tf.zeros([0, 3], dtype)
    out = run(mode, hvd.alltoall, empty)
    assert out.shape == (0, 3) and out.dtype == dtype.as_numpy_dtype
    out, received = run(mode, lambda x: hvd.alltoall(x, splits=[0] * size), empty)
    assert out.shape == (0, 3) and list(received) == [0] * size
    # rank 0 sends one row to every rank, the others send nothing
    rows = size if rank == 0 else 0
    t = contrib(rank, (rows, 3), dtype)
    out, received = run(mode, lambda x: hvd.alltoall(x, splits=[1 if rank == 0 else 0] * size), t)
    assert_close(out, contrib_np(0, (size, 3), 0, dtype)[rank:rank + 1], dtype)
    np.testing.assert_array_equal(received, [1] + [0] * (size - 1))


# ------------------------------------------------------------------------------------------------ reducescatter
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op_name", ["Sum", "Average"])
@pytest.mark.parametrize("dtype", REDUCE_DTYPES, ids=dt_id)
def test_reducescatter(dtype, op_name, mode):
    rank, size, op = hvd.rank(), hvd.size(), OPS[op_name]
    n = 2 * size + 1
    t = contrib(rank, (n, 3), dtype)
    out = run(mode, lambda x: hvd.reducescatter(x, op=op, name=f"rs.{dtype.name}.{op_name}.{mode}"), t)
    full = reduce_expected((n, 3), dtype, op, size)
    start = sum(n // size + (1 if r < n % size else 0) for r in range(rank))
    rows = n // size + (1 if rank < n % size else 0)
    assert_close(out, full[start:start + rows], dtype)


@pytest.mark.parametrize("mode", MODES)
def test_grouped_reducescatter(mode):
    rank, size = hvd.rank(), hvd.size()
    ts = [contrib(rank, (size, 2), tf.float32), contrib(rank, (2 * size,), tf.int32, salt=1)]
    outs = run(mode, lambda a, b: hvd.grouped_reducescatter([a, b], op=hvd.Sum), *ts)
    assert_close(outs[0], reduce_expected((size, 2), tf.float32, hvd.Sum, size)[rank:rank + 1], tf.float32)
    assert_close(outs[1], reduce_expected((2 * size,), tf.int32, hvd.Sum, size, salt=1)[2 * rank:2 * rank + 2],
                 tf.int32)
    with pytest.raises(ValueError):
        hvd.reducescatter(tf.ones([size]), op=hvd.Max)


# ------------------------------------------------------------------------------------------------ misc
def test_unsupported_dtype_raises_locally():
    with pytest.raises(ValueError, match="not supported"):
        hvd.allreduce(tf.constant(["a"]))
    with pytest.raises(ValueError, match="not supported"):
        hvd.allreduce(tf.constant([True]))
    with pytest.raises(ValueError, match="op=Adasum needs float16, float32 or float64 tensors"):
        hvd.allreduce(tf.ones([2], tf.int32), op=hvd.Adasum)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_same_function_many_steps_and_join(mode):
    size = hvd.size()

    def step(x):
        return hvd.allreduce(x, op=hvd.Sum), hvd.allgather(x), hvd.broadcast(x, 0)

    fn = step if mode == "eager" else tf.function(step)
    for i in range(5):
        a, g, b = fn(tf.fill([3], float(i)))
        np.testing.assert_allclose(a.numpy(), np.full(3, i * size))
        assert g.shape == (3 * size,) and b.numpy()[0] == i
    last = hvd.join() if mode == "eager" else tf.function(hvd.join)()
    assert last.dtype == tf.int32 and last.shape == ()
    assert 0 <= int(last) < size
    assert hvd.allgather_object(int(last)) == [int(last)] * size


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [tf.float32, tf.int64, tf.bfloat16, tf.bool], ids=dt_id)
def test_large_outputs(dtype, mode):
    """Outputs of 64 KiB and more are handed to TF without a copy (DLPack on 64-byte-aligned buffers)."""
    rank, size = hvd.rank(), hvd.size()
    shape = (256, 130)
    t = contrib(rank, shape, dtype)
    if dtype != tf.bool:
        out = run(mode, lambda x: hvd.allreduce(x, op=hvd.Sum), t)
        assert_close(out, reduce_expected(shape, dtype, hvd.Sum, size), dtype)
        more = hvd.allreduce(t, op=hvd.Sum) + tf.cast(1, dtype)
        assert_close(more.numpy(), reduce_expected(shape, dtype, hvd.Sum, size) + 1, dtype)
    gathered = run(mode, hvd.allgather, t)
    assert_close(gathered, np.concatenate([contrib_np(r, shape, 0, dtype) for r in range(size)]), dtype)
    out = run(mode, lambda x: hvd.broadcast(x, 0), t)
    assert_close(out, contrib_np(0, shape, 0, dtype), dtype)


def test_graph_names_do_not_depend_on_how_often_a_rank_traced():
    """Unnamed ops in a graph are named at trace time from the graph, not from the process-wide counter: a rank
    that traces an extra time (here: rank 0, for another input signature) still agrees with the others."""
    size = hvd.size()

    @tf.function
    def fn(x):
        return hvd.allreduce(x, op=hvd.Sum), hvd.allgather(x)

    if hvd.rank() == 0:
        fn.get_concrete_function(tf.TensorSpec([None, 7], tf.float64))
    a, g = fn(tf.ones([2]))
    np.testing.assert_allclose(a.numpy(), np.full(2, float(size)))
    assert g.shape == (2 * size,)
    # Unnamed eager ops (process-wide counter) still line up afterwards.
    np.testing.assert_allclose(hvd.allreduce(tf.ones([3]), op=hvd.Sum).numpy(), np.full(3, float(size)))


@pytest.mark.parametrize("mode", MODES)
def test_join_with_uneven_work(mode):
    """Rank 0 joins at once; the others allreduce first, and the joined rank contributes zeros."""
    rank, size = hvd.rank(), hvd.size()
    if size == 1:
        pytest.skip("uneven work needs two ranks")
    if rank == 0:
        last = run(mode, hvd.join)
    else:
        out = run(mode, lambda x: hvd.allreduce(x, op=hvd.Sum, name=f"tf.join.uneven.{mode}"), tf.ones([3]))
        np.testing.assert_allclose(out, np.full(3, size - 1.0))
        last = run(mode, hvd.join)
    assert int(last) != 0
    assert hvd.allgather_object(int(last)) == [int(last)] * size



@pytest.mark.parametrize("mode", ["eager", "function"])
def test_blocking_calls_say_they_wait_at_once(mode, monkeypatch):
    """allreduce, broadcast, allgather and reducescatter submit and wait at once, and say so (ops.blocking()), so
    that fast rounds (one host) and carried collectives (across hosts) may take them, as the other bindings'."""
    blocking = count_blocking(monkeypatch)
    rank, size = hvd.rank(), hvd.size()
    x = tf.fill([size * 2], float(rank + 1))

    def calls(t):
        return (hvd.allreduce(t, op=hvd.Sum, name="bl.ar"), hvd.broadcast(t, 0, name="bl.bc"),
                hvd.allgather(t, name="bl.ag"), hvd.reducescatter(t, op=hvd.Sum, name="bl.rs"),
                hvd.grouped_allreduce([t, t], op=hvd.Sum, name="bl.gar"))

    summed, sent, gathered, scattered, grouped = run(mode, calls, x)
    assert sorted(blocking) == sorted(["allreduce.bl.ar", "broadcast.bl.bc", "allgather.bl.ag",
                                       "reducescatter.bl.rs", "grouped_allreduce.bl.gar"]), blocking
    np.testing.assert_array_equal(summed, np.full(size * 2, size * (size + 1) / 2))
    np.testing.assert_array_equal(sent, np.ones(size * 2))
    np.testing.assert_array_equal(gathered, np.repeat(np.arange(1, size + 1, dtype=np.float32), size * 2))
    np.testing.assert_array_equal(scattered, np.full(2, size * (size + 1) / 2))
    np.testing.assert_array_equal(grouped[1], np.full(size * 2, size * (size + 1) / 2))
