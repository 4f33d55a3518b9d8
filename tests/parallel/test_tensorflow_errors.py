"""horovod.tensorflow errors: a cross-rank mismatch fails on every rank, eagerly (HorovodInternalError) and
inside tf.function (a tf.errors.OpError carrying the same message), naming the tensor. After every test a
normal allreduce still works.
"""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import horovod.tensorflow as hvd  # noqa: E402


@pytest.fixture(autouse=True)
def job_still_works():
    yield
    size = hvd.size()
    out = hvd.allreduce(tf.fill([3], float(hvd.rank())), op=hvd.Sum, name="tf.errors.health")
    np.testing.assert_allclose(out.numpy(), np.full(3, size * (size - 1) / 2))


def needs_peers():
    if hvd.size() == 1:
        pytest.skip("a cross-rank mismatch needs at least two ranks")


def fails_everywhere(mode, fn, name):
    if mode == "eager":
        with pytest.raises(hvd.HorovodInternalError) as info:
            fn()
    else:
        with pytest.raises(tf.errors.OpError) as info:
            tf.function(fn)()
    message = str(info.value)
    assert name in message, f"the message does not name tensor {name!r}: {message}"
    return message


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_mismatched_shapes(mode):
    needs_peers()
    rank = hvd.rank()
    shape = [2, 3] if rank == 0 else [3, 3]
    message = fails_everywhere(mode, lambda: hvd.allreduce(tf.ones(shape), name=f"t.shape.{mode}"),
                               f"t.shape.{mode}")
    assert "[2, 3]" in message or "(2, 3)" in message, message
    fails_everywhere(mode, lambda: hvd.broadcast(tf.ones([2 + rank % 2]), 0, name=f"t.bshape.{mode}"),
                     f"t.bshape.{mode}")
    fails_everywhere(mode, lambda: hvd.allgather(tf.ones([1, 2 + rank % 2]), name=f"t.ag.{mode}"), f"t.ag.{mode}")


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_mismatched_dtypes(mode):
    needs_peers()
    dtype = tf.float32 if hvd.rank() == 0 else tf.float64
    fails_everywhere(mode, lambda: hvd.allreduce(tf.ones([4], dtype), name=f"t.dtype.{mode}"), f"t.dtype.{mode}")


def test_local_misuse_raises_value_error():
    with pytest.raises(ValueError):
        hvd.alltoall(tf.ones([hvd.size() + 1]) if hvd.size() > 1 else tf.ones([3]), splits=[1] * (hvd.size() + 1))
    with pytest.raises(ValueError):
        hvd.allgather(tf.constant(1.0))


# ------------------------------------------------------------------------------------------------ error types
# Upstream's kernels fail with FailedPreconditionError when the ranks disagree (found while negotiating),
# InvalidArgumentError for what one rank can reject alone, AbortedError for a reducescatter op other than Sum or
# Average: eagerly, inside tf.function and in a TF1 graph run by a session alike.
MODES = ["eager", "function", "graph"]


def raises_in(mode, build, error):
    """Build (and, in a graph, run) ``build()``; the raised error, which must be an ``error``."""
    with pytest.raises(error) as info:
        if mode == "eager":
            build()
        elif mode == "function":
            tf.function(build)()
        else:
            with tf.Graph().as_default():
                out = build()
                config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2)
                with tf.compat.v1.Session(config=config) as sess:
                    sess.run(out)
    return info.value


def mismatch(kind, name):
    """A collective named ``name`` whose ``kind`` differs between rank 0 and the others."""
    odd = hvd.rank() % 2 == 1
    if kind == "shape":
        return lambda: hvd.allreduce(tf.ones([2, 3 + odd]), name=name)
    if kind == "ndim":
        return lambda: hvd.allreduce(tf.ones([6, 1] if odd else [6]), name=name)
    if kind == "dtype":
        return lambda: hvd.allreduce(tf.ones([4], tf.float64 if odd else tf.float32), name=name)
    if kind == "root":
        return lambda: hvd.broadcast(tf.ones([3]), int(odd), name=name)
    if kind == "reduce_op":
        return lambda: hvd.allreduce(tf.ones([3]), op=hvd.Max if odd else hvd.Sum, name=name)
    if kind == "prescale":
        return lambda: hvd.allreduce(tf.ones([3]), op=hvd.Sum, prescale_factor=2.0 if odd else 1.0, name=name)
    if kind == "allgather_dims":
        return lambda: hvd.allgather(tf.ones([1, 2 + odd]), name=name)
    if kind == "reducescatter_shape":
        return lambda: hvd.reducescatter(tf.ones([2, 3 + odd]), name=name)
    if kind == "alltoall_ndim":
        return lambda: hvd.alltoall(tf.ones([hvd.size(), 1] if odd else [hvd.size()]), name=name)
    raise AssertionError(kind)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["shape", "ndim", "dtype", "root", "reduce_op", "prescale", "allgather_dims",
                                  "reducescatter_shape", "alltoall_ndim"])
def test_a_mismatch_is_a_failed_precondition_error(kind, mode):
    needs_peers()
    name = f"mm.{kind}.{mode}"
    error = raises_in(mode, mismatch(kind, name), tf.errors.FailedPreconditionError)
    assert name in error.message and "Mismatched" in error.message, error.message
    if mode == "eager":
        assert isinstance(error, hvd.HorovodInternalError), type(error).__mro__


@pytest.mark.parametrize("mode", MODES)
def test_bad_alltoall_splits_are_invalid_argument_errors(mode):
    size = hvd.size()
    error = raises_in(mode, lambda: hvd.alltoall(tf.ones([size + 1, 2]), splits=[1] * size),
                      tf.errors.InvalidArgumentError)
    assert "must be non-negative and add up to dim 0" in error.message, error.message
    error = raises_in(mode, lambda: hvd.alltoall(tf.ones([size + 1, 2]), splits=[size + 1] + [0] * size),
                      tf.errors.InvalidArgumentError)
    assert "one entry per rank" in error.message, error.message
    if size > 1:
        error = raises_in(mode, lambda: hvd.alltoall(tf.ones([size + 1, 2])), tf.errors.InvalidArgumentError)
        assert "divides dim 0" in error.message, error.message


def test_splits_fed_at_run_time_are_checked_at_run_time():
    size = hvd.size()
    with tf.Graph().as_default():
        splits = tf.compat.v1.placeholder(tf.int32, [None])
        out, received = hvd.alltoall(tf.ones([2 * size, 2]), splits=splits)
        with tf.compat.v1.Session() as sess:
            with pytest.raises(tf.errors.InvalidArgumentError, match="add up to dim 0"):
                sess.run(out, {splits: [1] * size})
            got, got_received = sess.run([out, received], {splits: [2] * size})
    assert got.shape == (2 * size, 2) and list(got_received) == [2] * size


@pytest.mark.parametrize("mode", MODES)
def test_arguments_one_rank_rejects_are_invalid_argument_errors(mode):
    size = hvd.size()
    for build, text in [(lambda: hvd.allgather(tf.constant(1.0)), "scalar"),
                        (lambda: hvd.reducescatter(tf.constant(1.0)), "scalar"),
                        (lambda: hvd.alltoall(tf.constant(1.0)), "scalar"),
                        (lambda: hvd.broadcast(tf.ones([2]), size), "invalid root rank"),
                        (lambda: hvd.broadcast(tf.ones([2]), -1), "invalid root rank")]:
        error = raises_in(mode, build, tf.errors.InvalidArgumentError)
        assert text in error.message, error.message
        assert isinstance(error, ValueError)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op_name", ["Max", "Min", "Product", "Adasum"])
def test_reducescatter_with_another_op_is_an_aborted_error(op_name, mode):
    error = raises_in(mode, lambda: hvd.reducescatter(tf.ones([2, 2]), op=getattr(hvd, op_name)),
                      tf.errors.AbortedError)
    assert "Reducescatter currently only supports AVERAGE and SUM" in error.message
    assert isinstance(error, ValueError)


def test_a_collective_beside_a_joined_rank_is_a_failed_precondition_error():
    """Rank 0 joins at once; the others' allgather cannot run without it (upstream's precondition error)."""
    needs_peers()
    if hvd.rank() == 0:
        last = hvd.join()
    else:
        with pytest.raises(tf.errors.FailedPreconditionError, match="not supported with Join"):
            hvd.allgather(tf.ones([1, 2]), name="tf.errors.joined")
        last = hvd.join()
    assert 0 < int(last) < hvd.size()
