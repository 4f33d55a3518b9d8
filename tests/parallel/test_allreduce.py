"""Allreduce at any number of ranks: dtypes x ops x forms, scaling, shapes, fusion, naming, the cache path.

Each rank contributes a deterministic tensor derived from its rank, so every rank can compute the expected
result of the whole job locally. Values are small integers, so that sums and products are exact in every
dtype (bfloat16 included) whatever order the data plane reduces in.
"""
import os
import time

import numpy as np
import pytest

import horovod.numpy as hvd
from horovod.core import basics
from tests.support.ranks import (
    ALL_DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    assert_same_on_all_ranks,
    dtype_id,
    is_float,
    tolerance,
)

OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
FORMS = ["sync", "async", "inplace", "grouped", "grouped_inplace"]


def test_the_data_plane_is_the_one_the_launch_asked_for():
    expected = os.environ.get("HVD_TEST_EXPECT_DATA_PLANE")
    if not expected:
        pytest.skip("the outer test did not say which data plane to expect")
    assert basics.data_plane().startswith(expected), basics.data_plane()


def contribution(rank, shape, dtype, op):
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    i = np.arange(n, dtype=np.int64)
    if dt == np.bool_:
        vals = (i + rank) % 3 == 0
    elif op == hvd.Product:
        vals = 1 + (i + rank) % 2                   # 1 or 2: the product of 4 ranks is at most 16
    elif dt.kind == "u":
        vals = (3 * i + rank) % 11
    else:
        vals = (3 * i + rank) % 11 - 5
    return vals.astype(dt).reshape(shape)


def expected(shape, dtype, op, size, prescale=1.0, postscale=1.0):
    dt = np.dtype(dtype)
    parts = np.stack([contribution(r, shape, dt, op) for r in range(size)])
    if dt == np.bool_:
        if op == hvd.Min:
            return np.logical_and.reduce(parts, axis=0)
        return np.logical_or.reduce(parts, axis=0)      # Sum and Max: logical or
    parts = parts.astype(np.float64)
    if prescale != 1.0:
        parts = parts * prescale
        if not is_float(dt):
            parts = np.trunc(parts)                 # the prescaled copy is stored in the integer dtype
    if op in (hvd.Sum, hvd.Average):
        result = parts.sum(axis=0)
    elif op == hvd.Min:
        result = parts.min(axis=0)
    elif op == hvd.Max:
        result = parts.max(axis=0)
    else:
        result = parts.prod(axis=0)
    factor = postscale / size if op == hvd.Average else postscale
    if factor != 1.0:
        result = result * factor
        if not is_float(dt):
            result = np.trunc(result)               # integer results truncate, as upstream's ScaleBuffer does
    return result


def check(out, shape, dtype, op, size, prescale=1.0, postscale=1.0):
    assert isinstance(out, np.ndarray)
    assert out.dtype == np.dtype(dtype), (out.dtype, dtype)
    assert out.shape == tuple(shape), (out.shape, shape)
    want = expected(shape, dtype, op, size, prescale, postscale)
    if np.dtype(dtype) == np.bool_:
        np.testing.assert_array_equal(out, want)
    elif is_float(dtype):
        np.testing.assert_allclose(out.astype(np.float64), want, **tolerance(dtype))
    else:
        np.testing.assert_array_equal(out.astype(np.float64), want)


def run_form(form, op, dtype, shape=(5, 3), name=None, **scales):
    """Allreduce this rank's contribution in ``form``; returns [(result, shape), ...]."""
    rank = hvd.rank()
    t = contribution(rank, shape, dtype, op)
    original = t.copy()
    if form == "sync":
        out = hvd.allreduce(t, op=op, name=name, **scales)
        assert out is not t
        np.testing.assert_array_equal(t, original)      # out-of-place leaves the input alone
        return [(out, shape)]
    if form == "async":
        handle = hvd.allreduce_async(t, op=op, name=name, **scales)
        deadline = time.monotonic() + 60
        while not hvd.poll(handle):
            assert time.monotonic() < deadline, "allreduce_async never completed"
            time.sleep(0.0005)
        assert hvd.poll(handle)
        out = hvd.synchronize(handle)
        np.testing.assert_array_equal(t, original)
        return [(out, shape)]
    if form == "inplace":
        out = hvd.allreduce_(t, op=op, name=name, **scales)
        assert out is t
        return [(out, shape)]
    shape2 = (7,)
    t2 = contribution(rank, shape2, dtype, op)
    if form == "grouped":
        outs = hvd.grouped_allreduce([t, t2], op=op, name=name, **scales)
        assert isinstance(outs, list) and len(outs) == 2
        np.testing.assert_array_equal(t, original)
    else:
        outs = hvd.grouped_allreduce_([t, t2], op=op, name=name, **scales)
        assert outs[0] is t and outs[1] is t2
    return [(outs[0], shape), (outs[1], shape2)]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_dtype_op_form(dtype, op_name, form):
    op = OPS[op_name]
    if np.dtype(dtype) == np.bool_ and op in (hvd.Average, hvd.Product):
        pytest.skip("bool supports Sum, Min and Max (Average is checked to raise below)")
    for out, shape in run_form(form, op, dtype):
        check(out, shape, dtype, op, hvd.size())


@pytest.mark.parametrize("form", ["sync", "async", "inplace", "grouped"])
def test_bool_average_raises_value_error(form):
    t = np.ones(4, np.bool_)
    with pytest.raises(ValueError, match="bool"):
        if form == "sync":
            hvd.allreduce(t, op=hvd.Average)
        elif form == "async":
            hvd.allreduce_async(t, op=hvd.Average)
        elif form == "inplace":
            hvd.allreduce_(t, op=hvd.Average)
        else:
            hvd.grouped_allreduce([t, t.copy()], op=hvd.Average)
    # Average is the default op, so a bare allreduce of a bool tensor is refused too.
    with pytest.raises(ValueError):
        hvd.allreduce(t)
    assert hvd.allreduce(t, op=hvd.Max).all()


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32], ids=dtype_id)
@pytest.mark.parametrize("op_name,prescale,postscale", [
    ("Sum", 0.5, 3.0), ("Sum", 2.0, 1.0), ("Average", 2.0, 0.25), ("Average", 1.0, 4.0), ("Max", 3.0, 0.5),
])
def test_prescale_postscale(dtype, op_name, prescale, postscale, form):
    op = OPS[op_name]
    for out, shape in run_form(form, op, dtype, prescale_factor=prescale, postscale_factor=postscale):
        check(out, shape, dtype, op, hvd.size(), prescale, postscale)


@pytest.mark.parametrize("shape", [(), (0,), (0, 3), (1,), (17,), (4, 5, 3), (2, 1, 1, 2)], ids=str)
@pytest.mark.parametrize("op_name", ["Sum", "Average", "Min"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64], ids=dtype_id)
def test_shapes_scalars_and_empty(shape, op_name, dtype):
    op = OPS[op_name]
    for form in ("sync", "inplace", "grouped"):
        for out, out_shape in run_form(form, op, dtype, shape=shape):
            check(out, out_shape, dtype, op, hvd.size())


def test_scalar_from_numpy_scalar_array():
    out = hvd.allreduce(np.array(hvd.rank() + 1.0), op=hvd.Sum)
    assert out.shape == () and float(out) == hvd.size() * (hvd.size() + 1) / 2


@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_large_tensor_crosses_the_shm_chunk(op_name):
    op = OPS[op_name]
    n = 3_000_001                                  # 12 MB of float32: three 4 MiB chunks, odd element count
    rank, size = hvd.rank(), hvd.size()
    base = (np.arange(n, dtype=np.int64) % 1000).astype(np.float32)
    out = hvd.allreduce(base + rank, op=op)
    total = base.astype(np.float64) * size + size * (size - 1) / 2
    want = total / size if op == hvd.Average else total
    np.testing.assert_allclose(out, want, rtol=1e-6)
    assert_same_on_all_ranks(out)


def test_large_grouped_and_fused_tensors():
    rank, size = hvd.rank(), hvd.size()
    sizes = [1_500_000, 1_500_007, 3, 700_001]
    tensors = [(np.arange(n, dtype=np.int64) % 97 + rank).astype(np.float64) for n in sizes]
    outs = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    for n, out in zip(sizes, outs):
        want = (np.arange(n, dtype=np.int64) % 97) * size + size * (size - 1) // 2
        np.testing.assert_array_equal(out, want.astype(np.float64))
    in_place = [t.copy() for t in tensors]
    hvd.grouped_allreduce_(in_place, op=hvd.Max)
    for n, out in zip(sizes, in_place):
        np.testing.assert_array_equal(out, (np.arange(n, dtype=np.int64) % 97 + size - 1).astype(np.float64))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("n", [1000, 100_003])
def test_results_bitwise_identical_across_ranks(dtype, n):
    # Random values: the float result depends on the reduction order, so equal bits on every rank mean
    # every element was reduced once, in one order, and distributed.
    rng = np.random.default_rng(1234 + hvd.rank())
    t = rng.standard_normal(n).astype(dtype)
    for op in (hvd.Average, hvd.Sum):
        out = hvd.allreduce(t, op=op, prescale_factor=0.5, postscale_factor=3.0)
        assert_same_on_all_ranks(out)
        parts = [np.random.default_rng(1234 + r).standard_normal(n).astype(dtype).astype(np.float64)
                 for r in range(hvd.size())]
        want = np.sum(parts, axis=0) * 1.5 / (hvd.size() if op == hvd.Average else 1)
        tol = tolerance(dtype)
        np.testing.assert_allclose(out.astype(np.float64), want, rtol=tol["rtol"] * 8,
                                   atol=tol["atol"] * 8 * hvd.size())


def test_many_tensors_in_flight_fused():
    rank, size = hvd.rank(), hvd.size()
    sizes = [1 + (i * 977) % 5000 for i in range(60)]
    dtypes = [np.float32 if i % 2 else np.float64 for i in range(60)]
    ops = [hvd.Average if i % 5 == 0 else hvd.Sum for i in range(60)]
    handles = []
    for i, (n, dt, op) in enumerate(zip(sizes, dtypes, ops)):
        t = (np.arange(n) % 13 + rank + i).astype(dt)
        name = f"fusion.{i}" if i % 3 == 0 else None       # named and unnamed mixed
        handles.append(hvd.allreduce_async(t, op=op, name=name))
    outs = [hvd.synchronize(h) for h in handles]
    for i, (n, dt, op, out) in enumerate(zip(sizes, dtypes, ops, outs)):
        total = (np.arange(n) % 13 + i) * size + size * (size - 1) / 2
        want = total / size if op == hvd.Average else total
        assert out.dtype == dt and out.shape == (n,)
        np.testing.assert_allclose(out, want, rtol=1e-6, err_msg=f"tensor {i}")


def test_many_in_place_tensors_in_flight():
    rank, size = hvd.rank(), hvd.size()
    tensors = [np.full(10 + i, rank + i, np.int32) for i in range(40)]
    handles = [hvd.allreduce_async_(t, op=hvd.Sum, name=f"inplace.{i}") for i, t in enumerate(tensors)]
    for i, (t, h) in enumerate(zip(tensors, handles)):
        assert hvd.synchronize(h) is t
        assert (t == (i * size + size * (size - 1) // 2)).all()


def test_default_and_explicit_names():
    rank, size = hvd.rank(), hvd.size()
    t = np.full(3, rank, np.float32)
    # Unnamed ops in flight together get distinct default names.
    handles = [hvd.allreduce_async(t + k, op=hvd.Sum) for k in range(8)]
    for k, h in enumerate(handles):
        np.testing.assert_array_equal(hvd.synchronize(h), np.full(3, k * size + size * (size - 1) / 2))
    # The same user name under different ops does not collide: the op is part of the tensor name.
    h1 = hvd.allreduce_async(t, op=hvd.Sum, name="shared")
    h2 = hvd.allgather_async(t.reshape(1, 3), name="shared")
    h3 = hvd.broadcast_async(t, root_rank=0, name="shared")
    np.testing.assert_array_equal(hvd.synchronize(h1), np.full(3, size * (size - 1) / 2))
    np.testing.assert_array_equal(hvd.synchronize(h2), np.repeat(np.arange(size, dtype=np.float32), 3).reshape(size, 3))
    np.testing.assert_array_equal(hvd.synchronize(h3), np.zeros(3))
    # Named grouped ops.
    outs = hvd.grouped_allreduce([t, t * 2], op=hvd.Sum, name="grouped.named")
    np.testing.assert_array_equal(outs[1], np.full(3, size * (size - 1)))


def test_repeated_name_after_completion_uses_the_cache():
    rank, size = hvd.rank(), hvd.size()
    for step in range(5):
        t = np.full(6, rank * (step + 1), np.float64)
        out = hvd.allreduce(t, op=hvd.Sum, name="repeated")
        np.testing.assert_array_equal(out, np.full(6, (step + 1) * size * (size - 1) / 2))
    # Same name with a new shape and then a new op: the cached response no longer applies.
    out = hvd.allreduce(np.full((2, 2), rank, np.float64), op=hvd.Sum, name="repeated")
    np.testing.assert_array_equal(out, np.full((2, 2), size * (size - 1) / 2))
    out = hvd.allreduce(np.full((2, 2), rank, np.float64), op=hvd.Max, name="repeated")
    np.testing.assert_array_equal(out, np.full((2, 2), size - 1))
    out = hvd.allreduce(np.full((2, 2), rank, np.float32), op=hvd.Max, name="repeated")
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.full((2, 2), size - 1))
    # And back to the first form, repeatedly (cached again).
    for step in range(3):
        out = hvd.allreduce(np.full(6, rank + step, np.float64), op=hvd.Sum, name="repeated")
        np.testing.assert_array_equal(out, np.full(6, size * step + size * (size - 1) / 2))


def test_grouped_repeated_name_uses_the_cache():
    rank, size = hvd.rank(), hvd.size()
    for step in range(4):
        outs = hvd.grouped_allreduce([np.full(3, rank + step, np.float32), np.full(5, step, np.int32)],
                                     op=hvd.Sum, name="grouped.repeated")
        np.testing.assert_array_equal(outs[0], np.full(3, size * step + size * (size - 1) / 2))
        np.testing.assert_array_equal(outs[1], np.full(5, size * step))


def test_average_argument_compatibility():
    rank, size = hvd.rank(), hvd.size()
    t = np.full(2, rank + 1, np.float64)
    np.testing.assert_allclose(hvd.allreduce(t), np.full(2, (size + 1) / 2))            # default: Average
    np.testing.assert_allclose(hvd.allreduce(t, average=False), np.full(2, size * (size + 1) / 2))
    np.testing.assert_allclose(hvd.allreduce(t, average=True), np.full(2, (size + 1) / 2))
    with pytest.raises(ValueError):
        hvd.allreduce(t, average=True, op=hvd.Sum)


def test_synchronize_unknown_handle_returns_none():
    assert hvd.synchronize(10**9) is None


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=dtype_id)
def test_integer_average_truncates(dtype):
    # (rank + 1) summed is size*(size+1)/2; Average truncates toward zero for integer tensors.
    out = hvd.allreduce(np.full(4, hvd.rank() + 1, dtype), op=hvd.Average)
    size = hvd.size()
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, np.full(4, int(size * (size + 1) / 2 / size), dtype))


@pytest.mark.parametrize("follower", ["large_allreduce", "broadcast", "allgather", "alltoall", "reducescatter"])
def test_small_allreduce_then_another_collective_back_to_back(follower):
    # Both ops are submitted before either is waited on, so the coordinator releases them in one response
    # list and the data plane runs them back to back with no negotiation round in between: the second
    # collective must not overwrite buffers that slower ranks still read for the first.
    rank, size = hvd.rank(), hvd.size()
    for it in range(40):
        h1 = hvd.allreduce_async(np.full(1000, rank + it, np.float32), op=hvd.Sum)
        if follower == "large_allreduce":
            h2 = hvd.allreduce_async(np.full(100_000, rank + 1.0, np.float64), op=hvd.Sum)
            want = np.full(100_000, size * (size + 1) / 2)
        elif follower == "broadcast":
            h2 = hvd.broadcast_async(np.full(1000, rank + 7, np.float32), root_rank=size - 1)
            want = np.full(1000, size - 1 + 7)
        elif follower == "allgather":
            h2 = hvd.allgather_async(np.full(1000, rank + 7, np.float32))
            want = np.repeat(np.arange(size) + 7, 1000)
        elif follower == "alltoall":
            h2 = hvd.alltoall_async(np.full(1000 * size, rank + 7, np.float32))
            want = np.repeat(np.arange(size) + 7, 1000)
        else:
            h2 = hvd.reducescatter_async(np.full(1000 * size, rank + 7, np.float32), op=hvd.Sum)
            want = np.full(1000, size * 7 + size * (size - 1) / 2)
        first, second = hvd.synchronize(h1), hvd.synchronize(h2)
        np.testing.assert_array_equal(first, np.full(1000, size * it + size * (size - 1) / 2),
                                      err_msg=f"iteration {it}: the small allreduce")
        np.testing.assert_array_equal(second, want, err_msg=f"iteration {it}: the {follower} after it")
