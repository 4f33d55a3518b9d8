"""horovod.torch errors: cross-rank mismatches fail on every rank with a message naming the tensor; local misuse
raises ValueError at enqueue. After every test a normal allreduce still works.
"""
import pytest
import torch

import horovod.torch as hvd

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def job_still_works():
    yield
    size = hvd.size()
    out = hvd.allreduce(torch.full((3,), float(hvd.rank()), dtype=torch.float64), op=hvd.Sum,
                        name="torch.errors.health")
    assert torch.equal(out, torch.full((3,), size * (size - 1) / 2, dtype=torch.float64))


def needs_peers():
    if hvd.size() == 1:
        pytest.skip("a cross-rank mismatch needs at least two ranks")


def fails_everywhere(fn, name):
    with pytest.raises(RuntimeError) as info:
        fn()
    assert isinstance(info.value, hvd.HorovodInternalError), type(info.value)
    message = str(info.value)
    assert name in message, f"the message does not name tensor {name!r}: {message}"
    return message


def test_mismatched_shapes():
    needs_peers()
    rank = hvd.rank()
    shape = (2, 3) if rank == 0 else (3, 3)
    message = fails_everywhere(lambda: hvd.allreduce(torch.ones(shape), name="t.mismatch.shape"),
                               "t.mismatch.shape")
    assert "[2, 3]" in message or "(2, 3)" in message, message
    fails_everywhere(lambda: hvd.broadcast(torch.ones(2 + rank % 2), 0, name="t.mismatch.bshape"),
                     "t.mismatch.bshape")
    fails_everywhere(lambda: hvd.reducescatter(torch.ones(4 + rank % 2), op=hvd.Sum, name="t.mismatch.rs"),
                     "t.mismatch.rs")
    fails_everywhere(lambda: hvd.allgather(torch.ones(1, 2 + rank % 2), name="t.mismatch.ag"), "t.mismatch.ag")


def test_mismatched_shapes_async():
    needs_peers()
    rank = hvd.rank()
    handle = hvd.allreduce_async(torch.ones(1 + rank), name="t.mismatch.async")
    fails_everywhere(lambda: hvd.synchronize(handle), "t.mismatch.async")


def test_mismatched_dtypes():
    needs_peers()
    dtype = torch.float32 if hvd.rank() == 0 else torch.float64
    message = fails_everywhere(lambda: hvd.allreduce(torch.ones(4, dtype=dtype), name="t.mismatch.dtype"),
                               "t.mismatch.dtype")
    assert "float32" in message.lower() or "float64" in message.lower(), message
    dtype = torch.int32 if hvd.rank() == 0 else torch.int64
    fails_everywhere(lambda: hvd.allgather(torch.ones(2, dtype=dtype), name="t.mismatch.agdtype"),
                     "t.mismatch.agdtype")


def test_mismatched_reduce_ops_under_the_same_name():
    needs_peers()
    op = hvd.Sum if hvd.rank() == 0 else hvd.Average
    fails_everywhere(lambda: hvd.allreduce(torch.ones(4), op=op, name="t.mismatch.op"), "t.mismatch.op")
    fails_everywhere(lambda: hvd.broadcast(torch.ones(3), root_rank=hvd.rank(), name="t.mismatch.root"),
                     "t.mismatch.root")
    pre = 1.0 if hvd.rank() == 0 else 2.0
    fails_everywhere(lambda: hvd.allreduce(torch.ones(4), op=hvd.Sum, prescale_factor=pre,
                                           name="t.mismatch.pre"), "t.mismatch.pre")


def test_mismatch_inside_a_group():
    needs_peers()
    bad = torch.ones(2 + hvd.rank() % 2)
    fails_everywhere(lambda: hvd.grouped_allreduce([torch.ones(3), bad], op=hvd.Sum, name="t.mismatch.group"),
                     "t.mismatch.group")
    outs = hvd.grouped_allreduce([torch.ones(3), torch.ones(2)], op=hvd.Sum, name="t.mismatch.group")
    assert torch.equal(outs[1], torch.full((2,), float(hvd.size())))


def test_duplicate_in_flight_name_raises_value_error():
    needs_peers()
    # "t.dup" cannot complete before rank 0 submits it, which rank 0 does only after the signal allreduce,
    # which the other ranks reach only after checking the duplicate.
    t = torch.ones(4)
    if hvd.rank() != 0:
        first = hvd.allreduce_async(t, op=hvd.Sum, name="t.dup")
        with pytest.raises(ValueError, match="t.dup"):
            hvd.allreduce_async(t, op=hvd.Sum, name="t.dup")
        with pytest.raises(ValueError, match="t.dup"):
            hvd.allreduce_async_(t.clone(), op=hvd.Sum, name="t.dup")
        hvd.allreduce(t, name="t.dup.signal")
    else:
        hvd.allreduce(t, name="t.dup.signal")
        first = hvd.allreduce_async(t, op=hvd.Sum, name="t.dup")
    assert torch.equal(hvd.synchronize(first), torch.full((4,), float(hvd.size())))


def test_non_contiguous_tensor_raises_value_error():
    t = torch.arange(20, dtype=torch.float32).reshape(4, 5)
    size = hvd.size()
    for view in [t.t(), t[:, ::2]]:
        assert not view.is_contiguous()
        splits = [view.shape[0]] + [0] * (size - 1)
        calls = [lambda v: hvd.allreduce(v), lambda v: hvd.allreduce_(v), lambda v: hvd.allreduce_async(v),
                 lambda v: hvd.allgather(v), lambda v: hvd.broadcast(v, 0), lambda v: hvd.broadcast_(v, 0),
                 lambda v: hvd.grouped_allreduce([torch.ones(2), v]), lambda v: hvd.grouped_allgather([v]),
                 lambda v, s=splits: hvd.alltoall(v, splits=s), lambda v: hvd.reducescatter(v, op=hvd.Sum),
                 lambda v: hvd.grouped_reducescatter([v], op=hvd.Sum)]
        for call in calls:
            with pytest.raises(ValueError, match="contiguous"):
                call(view)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=str)
def test_unsupported_dtype_raises_value_error(dtype):
    t = torch.ones(4, dtype=dtype)
    calls = [lambda: hvd.allreduce(t), lambda: hvd.allreduce_(t), lambda: hvd.allgather(t),
             lambda: hvd.broadcast(t, 0), lambda: hvd.alltoall(t.repeat(hvd.size())),
             lambda: hvd.reducescatter(t, op=hvd.Sum), lambda: hvd.grouped_allreduce([t])]
    for call in calls:
        with pytest.raises(ValueError, match="not supported"):
            call()


def test_bool_is_not_supported_by_reductions():
    t = torch.ones(4, dtype=torch.bool)
    for call in [lambda: hvd.allreduce(t), lambda: hvd.allreduce_async_(t), lambda: hvd.grouped_allreduce([t]),
                 lambda: hvd.reducescatter(t, op=hvd.Sum)]:
        with pytest.raises(ValueError, match="not supported"):
            call()
    # ...but moves fine.
    assert hvd.allgather(t, name="t.bool.ag").shape == (4 * hvd.size(),)


@pytest.mark.parametrize("op_name", ["Adasum", "Min", "Max", "Product"])
def test_reducescatter_rejects_other_ops_with_runtime_error(op_name):
    # Upstream's core refuses these ("Reducescatter currently only supports AVERAGE and SUM."), which its torch
    # binding raises as a RuntimeError on every rank, at the call.
    op = getattr(hvd, op_name)
    t = torch.ones(2 * hvd.size(), 2)
    calls = [lambda: hvd.reducescatter(t, op=op), lambda: hvd.reducescatter_async(t, op=op),
             lambda: hvd.grouped_reducescatter([t, t], op=op), lambda: hvd.grouped_reducescatter_async([t], op=op)]
    for call in calls:
        with pytest.raises(RuntimeError, match=f"reducescatter supports op=Sum and op=Average, not op={op_name}"):
            call()
    for call in [lambda: hvd.reducescatter(torch.ones(2, dtype=torch.bool), op=op),
                 lambda: hvd.grouped_reducescatter([t, torch.ones(2, dtype=torch.complex64)], op=op)]:
        with pytest.raises(ValueError, match="not supported"):      # the tensors are checked first, as upstream
            call()


def test_adasum_runs_and_its_misuse_is_reported():
    # Adasum is available (see test_torch_adasum.py for its values): equal tensors everywhere give that tensor.
    t = torch.arange(4, dtype=torch.float32)
    assert torch.equal(hvd.allreduce(t, op=hvd.Adasum, name="t.adasum"), t)
    # Integer tensors are refused at the call, as upstream supports floating types only.
    with pytest.raises(ValueError, match="op=Adasum needs float16, float32 or float64 tensors, not int64"):
        hvd.allreduce(torch.ones(4, dtype=torch.int64), op=hvd.Adasum)
    with pytest.raises(ValueError, match="op=Adasum needs float16"):
        hvd.grouped_allreduce_async([t, torch.ones(2, dtype=torch.int32)], op=hvd.Adasum)
    # Ranks that disagree about the op fail on every rank, naming the tensor.
    if hvd.size() > 1:
        op = hvd.Adasum if hvd.rank() == 0 else hvd.Sum
        fails_everywhere(lambda: hvd.allreduce(t, op=op, name="t.adasum.mismatch"), "t.adasum.mismatch")


def test_many_errors_in_a_row_then_normal_work():
    needs_peers()
    for k in range(4):
        fails_everywhere(lambda k=k: hvd.allreduce(torch.ones(1 + (hvd.rank() + k) % 2), name="t.again"), "t.again")
    out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="t.again")
    assert torch.equal(out, torch.full((2,), float(hvd.size())))
