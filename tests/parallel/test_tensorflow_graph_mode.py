"""TF1 graph mode: one session.run that fetches many independent collectives must never deadlock, whatever order
TensorFlow starts them in on each rank and however small the inter-op thread pool is.

Every rank builds the same collectives (dozens of them, of every kind), either in the same order without names or
in a rank-dependent order with names, and fetches all of them in one session.run, several times. Each value is a
known function of the rank, so every result is checked against numpy.
"""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import horovod.tensorflow as hvd  # noqa: E402

v1 = tf.compat.v1
THREADS = [1, 2]


def session(threads):
    return v1.Session(config=v1.ConfigProto(inter_op_parallelism_threads=threads, intra_op_parallelism_threads=1))


def rank_values(r, k, shape, dtype=np.float32):
    """Rank r's contribution to collective k: small integers, exact in every dtype used here."""
    n = int(np.prod(shape))
    return ((np.arange(n) * (k + 1) + 3 * r) % 13 - 6).reshape(shape).astype(dtype)


def build(k, named):
    """Collective number k (its kind cycles through every collective); returns (fetch, expected)."""
    size, rank = hvd.size(), hvd.rank()
    name = f"g{k}" if named else None
    kind = k % 9
    every = [rank_values(r, k, (2 * size, 3)) for r in range(size)]
    mine = tf.constant(every[rank])
    if kind == 0:
        return hvd.allreduce(mine, op=hvd.Sum, name=name), np.sum(every, 0)
    if kind == 1:
        other = [rank_values(r, k + 100, (5,), np.int64) for r in range(size)]
        outs = hvd.grouped_allreduce([mine, tf.constant(other[rank])], op=hvd.Sum, name=name)
        return outs, [np.sum(every, 0), np.sum(other, 0)]
    if kind == 2:
        rows = [rank_values(r, k, (r + 1, 2), np.float64) for r in range(size)]
        return hvd.allgather(tf.constant(rows[rank]), name=name), np.concatenate(rows)
    if kind == 3:
        rows = [rank_values(r, k, (r + 1, 2), np.int32) for r in range(size)]
        outs = hvd.grouped_allgather([tf.constant(rows[rank]), mine], name=name)
        return outs, [np.concatenate(rows), np.concatenate(every)]
    if kind == 4:
        root = k % size
        return hvd.broadcast(mine, root, name=name), every[root]
    if kind == 5:
        out = hvd.reducescatter(mine, op=hvd.Sum, name=name)
        return out, np.sum(every, 0)[2 * rank:2 * rank + 2]
    if kind == 6:
        outs = hvd._grouped_reducescatter([mine, mine * 2], op=hvd.Sum, name=name)
        total = np.sum(every, 0)[2 * rank:2 * rank + 2]
        return outs, [total, 2 * total]
    if kind == 7:
        out = hvd.alltoall(tf.cast(tf.abs(mine), tf.uint8 if k % 2 else tf.float16), name=name)
        return out, np.abs(np.concatenate([e[2 * rank:2 * rank + 2] for e in every]))
    values = [rank_values(r, k, (2, 3)) for r in range(size)]
    sparse = tf.IndexedSlices(tf.constant(values[rank]), tf.constant([rank, rank + 1], tf.int64),
                              tf.constant([size + 1, 3], tf.int64))
    (out,) = hvd.grouped_allreduce([sparse], op=hvd.Sum, name=name)
    dense = np.zeros((size + 1, 3))
    for r in range(size):
        dense[r:r + 2] += values[r]
    return tf.convert_to_tensor(out), dense


def check(got, want):
    if isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            check(g, w)
        return
    np.testing.assert_allclose(np.asarray(got, np.float64), want)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("named", [False, True], ids=["same-order", "rank-order"])
def test_one_run_fetches_dozens_of_independent_collectives(named, threads):
    count = 36
    order = list(range(count))
    if named:   # every rank builds them in its own order; the names pair them up
        np.random.default_rng(hvd.rank()).shuffle(order)
    with tf.Graph().as_default():
        built = {k: build(k, named) for k in order}
        fetches = [built[k][0] for k in range(count)]
        with session(threads) as sess:
            for _ in range(3):
                results = sess.run(fetches)
                for k, got in enumerate(results):
                    check(got, built[k][1])


@pytest.mark.parametrize("threads", THREADS)
def test_collectives_that_feed_collectives(threads):
    """Chains: each rank's next collective needs the previous one's result, while independent ones run beside."""
    size = hvd.size()
    with tf.Graph().as_default():
        x = tf.ones([4])
        chain = x
        for _ in range(6):
            chain = hvd.allreduce(chain, op=hvd.Sum)
        side = [hvd.allgather(tf.fill([1], float(i))) for i in range(10)]
        with session(threads) as sess:
            got_chain, got_side = sess.run([chain, side])
    np.testing.assert_allclose(got_chain, np.full(4, float(size) ** 6))
    for i, g in enumerate(got_side):
        np.testing.assert_allclose(g, np.full(size, float(i)))


def test_join_in_a_session():
    with tf.Graph().as_default():
        last = hvd.join()
        with session(1) as sess:
            assert 0 <= sess.run(last) < hvd.size()

