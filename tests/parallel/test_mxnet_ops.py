"""horovod.mxnet collectives at any number of ranks: every collective x dtype x form, scale factors, the MXNet
engine's ordering (pending producers and readers), zero-copy exchange, host staging, and the object helpers.

Each rank builds every rank's contribution deterministically from the rank number, so each rank computes the
whole job's expected result locally. Values are small integers, exact in every dtype.
"""
import mxnet as mx
import numpy as np
import pytest

import horovod.mxnet as hvd
from horovod.mxnet import tensors
from tests.support.blocking import count_blocking

REDUCE_DTYPES = ["uint8", "int8", "int32", "int64", "float16", "float32", "float64"]
MOVE_DTYPES = REDUCE_DTYPES + ["bool"]
FLOATS = {"float16", "float32", "float64"}


def contrib(rank, shape, dtype, salt=0):
    i = np.arange(int(np.prod(shape)), dtype=np.int64) + salt
    if dtype == "bool":
        vals = (i + rank) % 3 == 0
    elif dtype == "uint8":
        vals = (3 * i + rank) % 11
    else:
        vals = (3 * i + rank) % 11 - 5
    return vals.astype(dtype).reshape(shape)


def nd(rank, shape, dtype, salt=0):
    return mx.nd.array(contrib(rank, shape, dtype, salt), dtype=dtype)


def reduce_expected(shape, dtype, op, size, prescale=1.0, postscale=1.0, salt=0):
    parts = np.stack([contrib(r, shape, dtype, salt).astype(np.float64) for r in range(size)])
    if op == hvd.Min:
        return parts.min(0)
    if op == hvd.Max:
        return parts.max(0)
    if prescale != 1.0:
        parts = parts * prescale
        if dtype not in FLOATS:
            parts = np.trunc(parts)
    result = parts.sum(0)
    factor = postscale / size if op == hvd.Average else postscale
    if factor != 1.0:
        result = result * factor
        if dtype not in FLOATS:
            result = np.trunc(result)
    return result


def assert_close(out, expected, dtype):
    assert isinstance(out, mx.nd.NDArray), type(out)
    assert np.dtype(out.dtype) == np.dtype(dtype), (out.dtype, dtype)
    assert out.shape == tuple(expected.shape), (out.shape, expected.shape)
    got = out.asnumpy()
    if dtype == "bool":
        np.testing.assert_array_equal(got, expected)
    else:
        tol = {"float16": 2e-3, "float32": 1e-6, "float64": 1e-12}.get(dtype, 0)
        np.testing.assert_allclose(got.astype(np.float64), np.asarray(expected, np.float64), rtol=tol, atol=tol)


OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max}


@pytest.mark.parametrize("dtype", REDUCE_DTYPES)
@pytest.mark.parametrize("form", ["allreduce", "allreduce_", "grouped_allreduce", "grouped_allreduce_"])
def test_allreduce(form, dtype):
    size, rank = hvd.size(), hvd.rank()
    for op_name, op in OPS.items():
        shapes = [(5,), (2, 3)]
        inputs = [nd(rank, s, dtype, salt=k) for k, s in enumerate(shapes)]
        name = f"ar.{form}.{dtype}.{op_name}"
        fn = getattr(hvd, form)
        if form.startswith("grouped"):
            outs = fn(inputs, name=name, op=op)
        else:
            outs = [fn(t, name=f"{name}.{k}", op=op) for k, t in enumerate(inputs)]
        for k, (s, out, tensor) in enumerate(zip(shapes, outs, inputs)):
            assert (out is tensor) == form.endswith("_"), "in-place forms return their input, the others a new one"
            assert_close(out, reduce_expected(s, dtype, op, size, salt=k), dtype)


@pytest.mark.parametrize("dtype", REDUCE_DTYPES)
def test_allreduce_average_default_and_scale_factors(dtype):
    size, rank = hvd.size(), hvd.rank()
    shape = (4, 2)
    out = hvd.allreduce(nd(rank, shape, dtype), name=f"ar.default.{dtype}")
    assert_close(out, reduce_expected(shape, dtype, hvd.Average, size), dtype)
    out = hvd.allreduce(nd(rank, shape, dtype), average=False, name=f"ar.avgfalse.{dtype}")
    assert_close(out, reduce_expected(shape, dtype, hvd.Sum, size), dtype)
    pre, post = (0.5, 3.0) if dtype in FLOATS else (2.0, 3.0)
    for form in ("allreduce", "allreduce_"):
        out = getattr(hvd, form)(nd(rank, shape, dtype), op=hvd.Sum, prescale_factor=pre, postscale_factor=post,
                                 name=f"ar.scaled.{form}.{dtype}", priority=3)
        assert_close(out, reduce_expected(shape, dtype, hvd.Sum, size, pre, post), dtype)
    outs = hvd.grouped_allreduce_([nd(rank, shape, dtype)], op=hvd.Average, prescale_factor=pre,
                                  postscale_factor=post, name=f"gar.scaled.{dtype}")
    assert_close(outs[0], reduce_expected(shape, dtype, hvd.Average, size, pre, post), dtype)


def test_grouped_allreduce_mixes_dtypes():
    size, rank = hvd.size(), hvd.rank()
    inputs = [nd(rank, (3,), d, salt=k) for k, d in enumerate(REDUCE_DTYPES)]
    outs = hvd.grouped_allreduce(inputs, op=hvd.Sum, name="gar.mixed")
    for k, (d, out) in enumerate(zip(REDUCE_DTYPES, outs)):
        assert_close(out, reduce_expected((3,), d, hvd.Sum, size, salt=k), d)


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_allgather_and_grouped_allgather(dtype):
    size, rank = hvd.size(), hvd.rank()
    out = hvd.allgather(nd(rank, (rank + 1, 3), dtype), name=f"ag.{dtype}")
    expected = np.concatenate([contrib(r, (r + 1, 3), dtype) for r in range(size)])
    assert_close(out, expected, dtype)
    outs = hvd.grouped_allgather([nd(rank, (rank + 1, 3), dtype), nd(rank, (2,), dtype, salt=1)],
                                 name=f"gag.{dtype}")
    assert_close(outs[0], expected, dtype)
    assert_close(outs[1], np.concatenate([contrib(r, (2,), dtype, salt=1) for r in range(size)]), dtype)


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_broadcast_from_every_root(dtype):
    size, rank = hvd.size(), hvd.rank()
    for root in range(size):
        tensor = nd(rank, (2, 4), dtype)
        out = hvd.broadcast(tensor, root, name=f"bc.{dtype}.{root}")
        assert out is not tensor
        assert_close(out, contrib(root, (2, 4), dtype), dtype)
        assert_close(tensor, contrib(rank, (2, 4), dtype), dtype)         # the input is left alone
        same = hvd.broadcast_(tensor, root_rank=root, name=f"bc_.{dtype}.{root}")
        assert same is tensor
        assert_close(tensor, contrib(root, (2, 4), dtype), dtype)


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_alltoall_equal_and_with_splits(dtype):
    size, rank = hvd.size(), hvd.rank()
    tensor = nd(rank, (2 * size, 3), dtype)
    out = hvd.alltoall(tensor, name=f"a2a.{dtype}")
    assert isinstance(out, mx.nd.NDArray), "without splits, upstream returns the output alone"
    expected = np.concatenate([contrib(r, (2 * size, 3), dtype)[2 * rank:2 * rank + 2] for r in range(size)])
    assert_close(out, expected, dtype)
    # rank r sends j + 1 rows to rank j (splits as an NDArray, as upstream's programs pass them)
    rows = sum(j + 1 for j in range(size))
    splits = mx.nd.array([j + 1 for j in range(size)], dtype="int32")
    out, received = hvd.alltoall(nd(rank, (rows, 2), dtype), splits=splits, name=f"a2a.splits.{dtype}")
    assert isinstance(received, mx.nd.NDArray) and np.dtype(received.dtype) == np.int32
    np.testing.assert_array_equal(received.asnumpy(), [rank + 1] * size)
    start = sum(j + 1 for j in range(rank))
    expected = np.concatenate([contrib(r, (rows, 2), dtype)[start:start + rank + 1] for r in range(size)])
    assert_close(out, expected, dtype)


@pytest.mark.parametrize("splits_dtype", ["float32", "int64"])
def test_alltoall_splits_that_are_not_int32_are_refused_before_anything_is_sent(splits_dtype):
    size = hvd.size()
    splits = mx.nd.array([1] * size, dtype=splits_dtype)
    with pytest.raises(ValueError, match="alltoall splits must be an int32 NDArray"):
        hvd.alltoall(mx.nd.arange(0, size), splits=splits, name=f"a2a.bad.{splits_dtype}")
    out, received = hvd.alltoall(mx.nd.arange(0, size), splits=splits.astype("int32"), name="a2a.after")
    assert out.shape == (size,)                 # the job goes on: nothing was submitted for the refused call


@pytest.mark.parametrize("dtype", REDUCE_DTYPES)
def test_reducescatter_and_grouped(dtype):
    size, rank = hvd.size(), hvd.rank()
    rows = 2 * size + 1                          # uneven: ranks < rows % size get one more row
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    for op_name, op in (("Sum", hvd.Sum), ("Average", hvd.Average)):
        full = reduce_expected((rows, 2), dtype, op, size)
        out = hvd.reducescatter(nd(rank, (rows, 2), dtype), op=op, name=f"rs.{dtype}.{op_name}")
        assert_close(out, full[start:start + counts[rank]], dtype)
        outs = hvd.grouped_reducescatter([nd(rank, (rows, 2), dtype), nd(rank, (size, 3), dtype, salt=2)], op=op,
                                         name=f"grs.{dtype}.{op_name}")
        assert_close(outs[0], full[start:start + counts[rank]], dtype)
        assert_close(outs[1], reduce_expected((size, 3), dtype, op, size, salt=2)[rank:rank + 1], dtype)
    out = hvd.reducescatter(nd(rank, (size, 2), dtype), name=f"rs.default.{dtype}")      # Average by default
    assert_close(out, reduce_expected((size, 2), dtype, hvd.Average, size)[rank:rank + 1], dtype)


def test_inputs_wait_for_their_pending_producer():
    """An input still being computed on MXNet's engine is read only once its producer finished."""
    size = hvd.size()
    for k in range(3):
        ones = mx.nd.ones((384, 384))
        produced = mx.nd.dot(ones, ones)            # pushed to the engine; not done when allreduce starts
        out = hvd.allreduce(produced, op=hvd.Sum, name=f"engine.producer.{k}")
        np.testing.assert_array_equal(out.asnumpy(), np.full((384, 384), 384.0 * size))
        gathered = hvd.allgather(mx.nd.dot(ones, ones)[0:1], name=f"engine.producer.ag.{k}")
        np.testing.assert_array_equal(gathered.asnumpy(), np.full((size, 384), 384.0))


def test_in_place_waits_for_pending_writers_and_readers():
    """allreduce_/broadcast_ overwrite a tensor only after the engine's pending reads of its old values and
    writes of it finished; the operator that reads it afterwards sees the reduced values."""
    size = hvd.size()
    for k in range(3):
        ones = mx.nd.ones((384, 384))
        tensor = mx.nd.dot(ones, ones)                  # pending writer
        before = mx.nd.dot(tensor, ones)                # pending reader of the old values
        hvd.allreduce_(tensor, op=hvd.Sum, postscale_factor=3.0, name=f"engine.inplace.{k}")  # differs at 1 rank
        after = tensor * 2                              # reads the reduced values
        np.testing.assert_array_equal(before.asnumpy(), np.full((384, 384), 384.0 * 384.0))
        np.testing.assert_array_equal(after.asnumpy(), np.full((384, 384), 2 * 3 * 384.0 * size))
        target = mx.nd.dot(ones, ones) + hvd.rank()
        reader = target + 0
        hvd.broadcast_(target, 0, name=f"engine.bcast.{k}")
        np.testing.assert_array_equal(reader.asnumpy(), np.full((384, 384), 384.0 + hvd.rank()))
        np.testing.assert_array_equal(target.asnumpy(), np.full((384, 384), 384.0))


def test_host_arrays_are_exchanged_without_a_copy():
    tensor = mx.nd.arange(12).reshape((3, 4))
    tensor.wait_to_read()                       # the binding waits so before it takes a view (see above)
    view = tensors.numpy_view(tensor)
    assert view.ctypes.data == tensors.data_pointer(tensor), "the view is over the NDArray's own buffer"
    view[1, 1] = -7.0
    assert tensor.asnumpy()[1, 1] == -7.0
    address = tensors.data_pointer(tensor)
    out = hvd.allreduce_(tensor, op=hvd.Max, name="zero.copy")
    assert out is tensor and tensors.data_pointer(tensor) == address, "reduced in the caller's own buffer"


def test_device_arrays_are_staged_through_host_memory(monkeypatch):
    """What a GPU NDArray goes through (this MXNet wheel has no GPU): a host copy in, a copy back out."""
    monkeypatch.setattr(tensors, "is_host", lambda tensor: False)
    size, rank = hvd.size(), hvd.rank()
    tensor = nd(rank, (3, 2), "float32")
    out = hvd.allreduce(tensor, op=hvd.Sum, name="staged.ar")
    assert_close(out, reduce_expected((3, 2), "float32", hvd.Sum, size), "float32")
    same = hvd.allreduce_(tensor, op=hvd.Sum, name="staged.ar_")
    assert same is tensor
    assert_close(tensor, reduce_expected((3, 2), "float32", hvd.Sum, size), "float32")
    target = nd(rank, (2,), "int32")
    hvd.broadcast_(target, 0, name="staged.bc_")
    assert_close(target, contrib(0, (2,), "int32"), "int32")
    out = hvd.allgather(nd(rank, (1, 2), "int64"), name="staged.ag")
    assert_close(out, np.concatenate([contrib(r, (1, 2), "int64") for r in range(size)]), "int64")


def test_object_helpers():
    size, rank = hvd.size(), hvd.rank()
    obj = {"rank": rank, "payload": list(range(rank + 1))}
    for root in range(size):
        assert hvd.broadcast_object(obj, root_rank=root, name=f"obj.{root}") == {"rank": root,
                                                                                "payload": list(range(root + 1))}
    gathered = hvd.allgather_object(("r", rank), name="objs")
    assert gathered == [("r", r) for r in range(size)]


def test_join_with_uneven_work_returns_the_last_rank_and_joined_ranks_add_zeros():
    size, rank = hvd.size(), hvd.rank()
    for step in range(1 + rank):
        out = hvd.allreduce(mx.nd.ones((3,)), op=hvd.Sum, name=f"join.step.{step}")
        np.testing.assert_array_equal(out.asnumpy(), [size - step] * 3)     # ranks below `step` have joined
    assert hvd.join() == size - 1


def test_blocking_calls_say_they_wait_at_once(monkeypatch):
    """allreduce, allreduce_, broadcast, broadcast_, allgather and reducescatter submit and wait at once and say
    so (ops.blocking()), so that fast rounds (one host) and carried collectives (across hosts) may take them."""
    blocking = count_blocking(monkeypatch)
    rank, size = hvd.rank(), hvd.size()
    x = mx.nd.full((size * 2,), float(rank + 1))
    summed = hvd.allreduce(x, op=hvd.Sum, name="bl.ar")
    in_place = hvd.allreduce_(x.copy(), op=hvd.Sum, name="bl.ar_")
    sent = hvd.broadcast(x, 0, name="bl.bc")
    sent_in_place = hvd.broadcast_(x.copy(), 0, name="bl.bc_")
    gathered = hvd.allgather(x, name="bl.ag")
    scattered = hvd.reducescatter(x, op=hvd.Sum, name="bl.rs")
    grouped = hvd.grouped_allreduce([x, x], op=hvd.Sum, name="bl.gar")
    assert sorted(blocking) == sorted(["allreduce.bl.ar", "allreduce.bl.ar_", "broadcast.bl.bc", "broadcast.bl.bc_",
                                       "allgather.bl.ag", "reducescatter.bl.rs", "grouped_allreduce.bl.gar"]), blocking
    total = size * (size + 1) / 2
    np.testing.assert_array_equal(summed.asnumpy(), np.full(size * 2, total))
    np.testing.assert_array_equal(in_place.asnumpy(), np.full(size * 2, total))
    np.testing.assert_array_equal(sent.asnumpy(), np.ones(size * 2))
    np.testing.assert_array_equal(sent_in_place.asnumpy(), np.ones(size * 2))
    np.testing.assert_array_equal(gathered.asnumpy(), np.repeat(np.arange(1, size + 1, dtype=np.float32), size * 2))
    np.testing.assert_array_equal(scattered.asnumpy(), np.full(2, total))
    np.testing.assert_array_equal(grouped[1].asnumpy(), np.full(size * 2, total))
