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
