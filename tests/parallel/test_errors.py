"""Errors every rank must see, with messages that say which tensor, which ranks and what differs.

After every test, a normal allreduce must still work: an error in one collective does not break the job.
"""
import re

import numpy as np
import pytest

import horovod.numpy as hvd
from horovod.core import ops


@pytest.fixture(autouse=True)
def job_still_works():
    yield
    size = hvd.size()
    out = hvd.allreduce(np.full(3, hvd.rank(), np.float64), op=hvd.Sum, name="errors.health")
    np.testing.assert_array_equal(out, np.full(3, size * (size - 1) / 2))


def needs_peers():
    if hvd.size() == 1:
        pytest.skip("a cross-rank mismatch needs at least two ranks")


def names_rank(message, rank):
    """True when ``message`` names ``rank`` ("rank 3", "ranks 1, 3", "rank(s) 0, 3")."""
    return re.search(rf"\branks?(\(s\))? (\d+, )*{rank}\b", message, re.IGNORECASE) is not None


def fails_everywhere(fn):
    """Run ``fn`` and return the message of the RuntimeError (HorovodInternalError) it must raise."""
    with pytest.raises(RuntimeError) as info:
        fn()
    assert isinstance(info.value, hvd.HorovodInternalError), type(info.value)
    return str(info.value)


def assert_names_everything(message, tensor, values_by_rank):
    assert tensor in message, f"the message does not name tensor {tensor!r}: {message}"
    for value in set(values_by_rank.values()):
        assert value in message, f"the message does not show {value!r}: {message}"
    for rank in values_by_rank:
        assert names_rank(message, rank), f"the message does not name rank {rank}: {message}"


def test_mismatched_shapes():
    needs_peers()
    rank, size = hvd.rank(), hvd.size()
    shape = (2, 3) if rank % 2 == 0 else (3, 3)
    message = fails_everywhere(lambda: hvd.allreduce(np.ones(shape, np.float32), name="mismatch.shape"))
    assert_names_everything(message, "mismatch.shape",
                            {r: "[2, 3]" if r % 2 == 0 else "[3, 3]" for r in range(size)})
    assert "shape" in message.lower()


def test_mismatched_shapes_of_every_rank():
    needs_peers()
    rank, size = hvd.rank(), hvd.size()
    message = fails_everywhere(lambda: hvd.allreduce(np.ones(rank + 1, np.float32), op=hvd.Sum,
                                                     name="mismatch.shape.each"))
    assert_names_everything(message, "mismatch.shape.each", {r: f"[{r + 1}]" for r in range(size)})


def test_mismatched_shapes_broadcast_and_reducescatter():
    needs_peers()
    rank = hvd.rank()
    message = fails_everywhere(lambda: hvd.broadcast(np.ones(2 + rank % 2), root_rank=0, name="mismatch.bshape"))
    assert "mismatch.bshape" in message and "[2]" in message and "[3]" in message
    message = fails_everywhere(lambda: hvd.reducescatter(np.ones(4 + rank % 2), op=hvd.Sum,
                                                         name="mismatch.rsshape"))
    assert "mismatch.rsshape" in message and "[4]" in message and "[5]" in message


def test_mismatched_allgather_row_shapes():
    needs_peers()
    rank, size = hvd.rank(), hvd.size()
    cols = 2 if rank == 0 else 3
    message = fails_everywhere(lambda: hvd.allgather(np.ones((rank + 1, cols)), name="mismatch.rows"))
    assert_names_everything(message, "mismatch.rows", {r: "[2]" if r == 0 else "[3]" for r in range(size)})


def test_mismatched_dtypes():
    needs_peers()
    rank, size = hvd.rank(), hvd.size()
    dtype = np.float32 if rank % 2 == 0 else np.float64
    message = fails_everywhere(lambda: hvd.allreduce(np.ones(4, dtype), name="mismatch.dtype"))
    assert_names_everything(message, "mismatch.dtype",
                            {r: "float32" if r % 2 == 0 else "float64" for r in range(size)})


def test_mismatched_reduce_ops():
    needs_peers()
    rank, size = hvd.rank(), hvd.size()
    op = hvd.Sum if rank == 0 else hvd.Average
    message = fails_everywhere(lambda: hvd.allreduce(np.ones(4, np.float32), op=op, name="mismatch.op"))
    assert_names_everything(message, "mismatch.op", {r: "Sum" if r == 0 else "Average" for r in range(size)})


def test_mismatched_scale_factors():
    needs_peers()
    rank, size = hvd.rank(), hvd.size()
    pre = 1.0 if rank == 0 else 2.0
    message = fails_everywhere(lambda: hvd.allreduce(np.ones(4, np.float32), op=hvd.Sum, prescale_factor=pre,
                                                     name="mismatch.prescale"))
    assert "mismatch.prescale" in message and "prescale" in message.lower()
    assert "1.0" in message and "2.0" in message and names_rank(message, 0) and names_rank(message, size - 1)
    post = 1.0 if rank == 0 else 0.5
    message = fails_everywhere(lambda: hvd.allreduce(np.ones(4, np.float32), op=hvd.Sum, postscale_factor=post,
                                                     name="mismatch.postscale"))
    assert "mismatch.postscale" in message and "postscale" in message.lower() and "0.5" in message


def test_mismatched_broadcast_root():
    needs_peers()
    rank, size = hvd.rank(), hvd.size()
    message = fails_everywhere(lambda: hvd.broadcast(np.ones(3), root_rank=rank, name="mismatch.root"))
    assert "mismatch.root" in message and "root" in message.lower()
    for r in range(size):
        assert names_rank(message, r) and str(r) in message, message


@pytest.mark.parametrize("root", ["size", "negative"])
def test_out_of_range_broadcast_root(root):
    size = hvd.size()
    root_rank = size if root == "size" else -1
    message = fails_everywhere(lambda: hvd.broadcast(np.ones(3), root_rank=root_rank, name=f"bad.root.{root}"))
    assert f"bad.root.{root}" in message and str(root_rank) in message and "root" in message.lower()


def test_mismatched_operations_on_the_same_name():
    # Through hvd.* the op is part of the tensor name (allreduce.x vs allgather.x, as upstream), so a clash
    # needs the op layer, which bindings like TensorFlow's use with their own names.
    needs_peers()
    rank, size = hvd.rank(), hvd.size()
    t = np.ones((1, 2), np.float32)
    if rank % 2 == 0:
        handle = ops.allreduce_async(t, name="mismatch.optype", op=hvd.Sum)
    else:
        handle = ops.allgather_async(t, name="mismatch.optype")
    message = fails_everywhere(handle.wait)
    assert_names_everything(message, "mismatch.optype",
                            {r: "ALLREDUCE" if r % 2 == 0 else "ALLGATHER" for r in range(size)})


def test_error_inside_a_group_fails_the_group():
    needs_peers()
    rank = hvd.rank()
    good = np.ones(3, np.float32)
    bad = np.ones(2 + rank % 2, np.float32)
    message = fails_everywhere(lambda: hvd.grouped_allreduce([good, bad], op=hvd.Sum, name="mismatch.group"))
    assert "mismatch.group" in message and "[2]" in message and "[3]" in message
    outs = hvd.grouped_allreduce([good, good], op=hvd.Sum, name="mismatch.group")   # the name is free again
    np.testing.assert_array_equal(outs[1], np.full(3, hvd.size()))


def test_duplicate_in_flight_name_raises_value_error_at_enqueue():
    needs_peers()
    # Rank 0 holds back its submission of "dup.first" until every other rank has checked the duplicate (the
    # first op cannot complete without rank 0), then every other rank holds back "dup.second" for rank 0.
    rank = hvd.rank()
    t = np.ones(4, np.float32)
    if rank != 0:
        first = hvd.allreduce_async(t, op=hvd.Sum, name="dup.first")
        with pytest.raises(ValueError, match="dup.first"):
            hvd.allreduce_async(t, op=hvd.Sum, name="dup.first")
        with pytest.raises(ValueError, match="dup.first"):
            hvd.allreduce_async_(t.copy(), op=hvd.Sum, name="dup.first")
        hvd.allreduce(t, name="dup.signal.1")
        np.testing.assert_array_equal(hvd.synchronize(first), np.full(4, hvd.size()))
        hvd.allreduce(t, name="dup.signal.2")
        second = hvd.allreduce_async(t, op=hvd.Sum, name="dup.second")
        np.testing.assert_array_equal(hvd.synchronize(second), np.full(4, hvd.size()))
    else:
        hvd.allreduce(t, name="dup.signal.1")
        first = hvd.allreduce_async(t, op=hvd.Sum, name="dup.first")
        np.testing.assert_array_equal(hvd.synchronize(first), np.full(4, hvd.size()))
        second = hvd.allreduce_async(t, op=hvd.Sum, name="dup.second")
        with pytest.raises(ValueError, match="dup.second"):
            hvd.allreduce_async(t, op=hvd.Sum, name="dup.second")
        with pytest.raises(ValueError, match="dup.second"):
            hvd.allreduce_async_(t.copy(), op=hvd.Sum, name="dup.second")
        hvd.allreduce(t, name="dup.signal.2")
        np.testing.assert_array_equal(hvd.synchronize(second), np.full(4, hvd.size()))


def test_non_contiguous_tensor_raises_value_error():
    t = np.arange(20, dtype=np.float32).reshape(4, 5)
    views = [t[:, ::2], t.T, np.arange(10.0)[::2]]
    for view in views:
        assert not view.flags.c_contiguous
        splits = [view.shape[0]] + [0] * (hvd.size() - 1)
        calls = (lambda v: hvd.allreduce(v), lambda v: hvd.allreduce_(v), lambda v: hvd.allgather(v),
                 lambda v: hvd.broadcast(v, 0), lambda v: hvd.grouped_allreduce([np.ones(2), v]),
                 lambda v, s=splits: hvd.alltoall(v, splits=s), lambda v: hvd.reducescatter(v, op=hvd.Sum))
        for call in calls:
            with pytest.raises(ValueError, match="contiguous"):
                call(view)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128, np.uint32, np.uint64, np.str_], ids=str)
def test_unsupported_dtype_raises_value_error(dtype):
    t = np.zeros(4, dtype)
    with pytest.raises(ValueError, match="not supported"):
        hvd.allreduce(t)
    with pytest.raises(ValueError, match="not supported"):
        hvd.allgather(t)
    with pytest.raises(ValueError, match="not supported"):
        hvd.broadcast(t, 0)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_], ids=str)
def test_adasum_of_a_non_float_tensor_says_which_dtypes_it_takes(dtype):
    for call in (lambda: hvd.allreduce(np.ones(4, dtype), op=hvd.Adasum),
                 lambda: hvd.grouped_allreduce([np.ones(4, np.float32), np.ones(4, dtype)], op=hvd.Adasum)):
        with pytest.raises(ValueError, match="op=Adasum needs float16, float32 or float64 tensors"):
            call()


def test_reducescatter_refuses_adasum():
    for call in (lambda: hvd.reducescatter(np.ones(4, np.float32), op=hvd.Adasum),
                 lambda: hvd.grouped_reducescatter([np.ones(4, np.float32)], op=hvd.Adasum)):
        with pytest.raises(ValueError, match="reducescatter supports op=Sum and op=Average, not Adasum"):
            call()


def test_not_an_array_raises_value_error():
    with pytest.raises(ValueError):
        hvd.allreduce([1.0, 2.0])


def test_many_errors_in_a_row_then_normal_work():
    needs_peers()
    rank, size = hvd.rank(), hvd.size()
    for k in range(5):
        fails_everywhere(lambda k=k: hvd.allreduce(np.ones(1 + (rank + k) % 2), name="mismatch.again"))
    handles = [hvd.allreduce_async(np.full(5, rank + k, np.float32), op=hvd.Sum) for k in range(10)]
    for k, h in enumerate(handles):
        np.testing.assert_array_equal(hvd.synchronize(h), np.full(5, size * k + size * (size - 1) / 2))
