"""horovod.mxnet errors in upstream's types: cross-rank mismatches fail on every rank with a message naming the
tensor; local misuse raises at the call. Every error is an ``mxnet.base.MXNetError`` (what upstream raises, from its
engine operator) and also what the other bindings raise (HorovodInternalError / ValueError). After every test a
normal allreduce still works.
"""
import pickle

import mxnet as mx
import numpy as np
import pytest
from mxnet.base import MXNetError

import horovod.mxnet as hvd
from horovod.core import ops


@pytest.fixture(autouse=True)
def job_still_works():
    yield
    size = hvd.size()
    out = hvd.allreduce(mx.nd.full((3,), hvd.rank(), dtype="float64"), op=hvd.Sum, name="mx.errors.health")
    np.testing.assert_array_equal(out.asnumpy(), np.full((3,), size * (size - 1) / 2))


def needs_peers():
    if hvd.size() == 1:
        pytest.skip("a cross-rank mismatch needs at least two ranks")


def fails_everywhere(fn, name):
    with pytest.raises(MXNetError) as info:
        fn()
    assert isinstance(info.value, hvd.HorovodInternalError), type(info.value).__mro__
    message = str(info.value)
    assert name in message, f"the message does not name tensor {name!r}: {message}"
    return message


def test_mismatched_shapes():
    needs_peers()
    rank = hvd.rank()
    shape = (2, 3) if rank == 0 else (3, 3)
    message = fails_everywhere(lambda: hvd.allreduce(mx.nd.ones(shape), name="m.shape"), "m.shape")
    assert "[2, 3]" in message or "(2, 3)" in message, message
    fails_everywhere(lambda: hvd.allreduce_(mx.nd.ones(shape), name="m.shape_"), "m.shape_")
    fails_everywhere(lambda: hvd.broadcast(mx.nd.ones((2 + rank % 2,)), 0, name="m.bshape"), "m.bshape")
    fails_everywhere(lambda: hvd.reducescatter(mx.nd.ones((4 + rank % 2,)), op=hvd.Sum, name="m.rs"), "m.rs")
    fails_everywhere(lambda: hvd.allgather(mx.nd.ones((1, 2 + rank % 2)), name="m.ag"), "m.ag")
    fails_everywhere(lambda: hvd.grouped_allreduce([mx.nd.ones((3,)), mx.nd.ones((2 + rank % 2,))],
                                                   name="m.group"), "m.group")


def test_mismatched_dtypes():
    needs_peers()
    dtype = "float32" if hvd.rank() == 0 else "float64"
    message = fails_everywhere(lambda: hvd.allreduce(mx.nd.ones((4,), dtype=dtype), name="m.dtype"), "m.dtype")
    assert "float32" in message.lower() or "float64" in message.lower(), message
    dtype = "int32" if hvd.rank() == 0 else "int64"
    fails_everywhere(lambda: hvd.allgather(mx.nd.ones((2,), dtype=dtype), name="m.agdtype"), "m.agdtype")
    fails_everywhere(lambda: hvd.broadcast_(mx.nd.ones((2,), dtype=dtype), 0, name="m.bcdtype"), "m.bcdtype")


def test_duplicate_in_flight_name():
    needs_peers()
    # "allreduce.m.dup" cannot complete before rank 0 submits it, which rank 0 does only after the signal, which
    # the other ranks reach only after checking the duplicate. (horovod.mxnet's calls wait for their result, so
    # the first one is started through the op layer.)
    if hvd.rank() != 0:
        first = ops.allreduce_async(np.ones(4, np.float32), name="allreduce.m.dup", op=hvd.Sum)
        for call in (hvd.allreduce, hvd.allreduce_):
            with pytest.raises(MXNetError, match="m.dup") as info:
                call(mx.nd.ones((4,)), op=hvd.Sum, name="m.dup")
            assert isinstance(info.value, ValueError)
        hvd.allreduce(mx.nd.ones((4,)), name="m.dup.signal")
    else:
        hvd.allreduce(mx.nd.ones((4,)), name="m.dup.signal")
        first = ops.allreduce_async(np.ones(4, np.float32), name="allreduce.m.dup", op=hvd.Sum)
    np.testing.assert_array_equal(first.wait(), np.full((4,), float(hvd.size())))


@pytest.mark.parametrize("dtype", ["bool", "bfloat16"])
def test_unsupported_dtypes(dtype):
    tensor = mx.nd.zeros((4,), dtype=dtype)
    calls = [lambda: hvd.allreduce(tensor), lambda: hvd.allreduce_(tensor), lambda: hvd.grouped_allreduce([tensor]),
             lambda: hvd.reducescatter(tensor)]
    if dtype == "bfloat16":          # bool moves data; bfloat16 is not among upstream's MXNet types at all
        calls += [lambda: hvd.allgather(tensor), lambda: hvd.broadcast(tensor, 0), lambda: hvd.alltoall(tensor)]
    for call in calls:
        with pytest.raises(MXNetError, match=f"Tensor type {dtype} is not supported") as info:
            call()
        assert isinstance(info.value, ValueError)
    again = pickle.loads(pickle.dumps(info.value))          # e.g. sent to a driver: the original class comes back
    assert type(again) is ValueError and str(again) == str(info.value)


def test_other_local_misuse():
    with pytest.raises(MXNetError, match="expects an mxnet NDArray"):
        hvd.allreduce(np.ones(3))
    sparse = mx.nd.ones((4, 2)).tostype("row_sparse")
    with pytest.raises(MXNetError, match="row_sparse"):
        hvd.allreduce(sparse)
    with pytest.raises(ValueError, match="must be non-negative and add up"):
        hvd.alltoall(mx.nd.ones((3,)), splits=[4] + [0] * (hvd.size() - 1))
    with pytest.raises(ValueError, match="reducescatter supports op=Sum and op=Average"):
        hvd.reducescatter(mx.nd.ones((4,)), op=hvd.Max)
    with pytest.raises(ValueError, match="supersedes average"):
        hvd.allreduce(mx.nd.ones((4,)), average=True, op=hvd.Sum)
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported with op != Average"):
        hvd.DistributedOptimizer(mx.optimizer.SGD(), gradient_predivide_factor=2.0, op=hvd.Sum)
    with pytest.raises(ValueError, match="invalid params of type"):      # at one rank too, unlike upstream
        hvd.broadcast_parameters([mx.nd.ones((2,))])
