"""Reducescatter at any number of ranks: Sum and Average, uneven dim 0, multi-dim, scaling, grouped."""
import numpy as np
import pytest

import horovod.numpy as hvd
from tests.support.ranks import FLOAT_DTYPES, INT_DTYPES, dtype_id, is_float, tolerance

OPS = {"Sum": hvd.Sum, "Average": hvd.Average}


def contribution(rank, shape, dtype):
    n = int(np.prod(shape, dtype=np.int64))
    vals = (np.arange(n) * 5 + rank) % 13
    if np.dtype(dtype).kind == "i":
        vals = vals - 6
    return vals.astype(dtype).reshape(shape)


def my_rows(n, rank, size):
    """Upstream's split: n // size rows each, and ranks below n % size get one more."""
    counts = [n // size + (1 if r < n % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    return start, start + counts[rank]


def expected(shape, dtype, op, size, rank, prescale=1.0, postscale=1.0):
    parts = np.stack([contribution(r, shape, dtype) for r in range(size)]).astype(np.float64)
    if prescale != 1.0:
        parts = parts * prescale
        if not is_float(dtype):
            parts = np.trunc(parts)
    total = parts.sum(axis=0)
    factor = postscale / size if op == hvd.Average else postscale
    if factor != 1.0:
        total = total * factor
        if not is_float(dtype):
            total = np.trunc(total)
    lo, hi = my_rows(shape[0], rank, size)
    return total[lo:hi]


def check(out, shape, dtype, op, prescale=1.0, postscale=1.0):
    rank, size = hvd.rank(), hvd.size()
    lo, hi = my_rows(shape[0], rank, size)
    assert out.dtype == np.dtype(dtype)
    assert out.shape == (hi - lo, *shape[1:]), (out.shape, shape)
    want = expected(shape, dtype, op, size, rank, prescale, postscale)
    if is_float(dtype):
        np.testing.assert_allclose(out.astype(np.float64), want, **tolerance(dtype))
    else:
        np.testing.assert_array_equal(out.astype(np.float64), want)


def shapes_for(size):
    return [(size * 2, 3), (size * 2 + 1, 3), (2 * size + size - 1,), (1, 4), (size + 1, 2, 2), (3,)]


@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("dtype", INT_DTYPES + FLOAT_DTYPES, ids=dtype_id)
def test_reducescatter_dtypes_and_uneven_rows(dtype, op_name):
    op = OPS[op_name]
    for shape in shapes_for(hvd.size()):
        t = contribution(hvd.rank(), shape, dtype)
        original = t.copy()
        check(hvd.reducescatter(t, op=op), shape, dtype, op)
        np.testing.assert_array_equal(t, original)


def test_reducescatter_default_op_is_average():
    size = hvd.size()
    out = hvd.reducescatter(np.full((size, 2), hvd.rank() + 1.0))
    np.testing.assert_allclose(out, np.full((1, 2), (size + 1) / 2))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32], ids=dtype_id)
@pytest.mark.parametrize("op_name,prescale,postscale", [("Sum", 0.5, 3.0), ("Average", 2.0, 0.5), ("Sum", 3.0, 1.0)])
def test_reducescatter_prescale_postscale(dtype, op_name, prescale, postscale):
    op = OPS[op_name]
    for shape in shapes_for(hvd.size())[:3]:
        t = contribution(hvd.rank(), shape, dtype)
        out = hvd.reducescatter(t, op=op, prescale_factor=prescale, postscale_factor=postscale)
        check(out, shape, dtype, op, prescale, postscale)


def test_reducescatter_async_and_grouped():
    rank, size = hvd.rank(), hvd.size()
    shapes = [(size * 3 + 1, 2), (size,), (2 * size - 1, 3, 1)]
    dtypes = [np.float32, np.int64, np.float64]
    tensors = [contribution(rank, s, d) for s, d in zip(shapes, dtypes)]
    for op in (hvd.Sum, hvd.Average):
        outs = hvd.grouped_reducescatter(tensors, op=op)
        assert isinstance(outs, list) and len(outs) == 3
        for out, s, d in zip(outs, shapes, dtypes):
            check(out, s, d, op)
        outs = hvd.synchronize(hvd.grouped_reducescatter_async(tensors, op=op, prescale_factor=2.0))
        for out, s, d in zip(outs, shapes, dtypes):
            check(out, s, d, op, prescale=2.0)
    handles = [hvd.reducescatter_async(contribution(rank, (size + k, 2), np.float32), op=hvd.Sum) for k in range(4)]
    for k, h in enumerate(handles):
        check(hvd.synchronize(h), (size + k, 2), np.float32, hvd.Sum)


@pytest.mark.parametrize("dtype", [np.float32, np.int32], ids=dtype_id)
def test_fused_reducescatters_with_scaling_and_ranks_without_rows(dtype):
    # Submitted together with one dtype, op and scales: the coordinator fuses them into one reducescatter.
    rank, size = hvd.rank(), hvd.size()
    shapes = [(size * 2 + 1, 3), (1, 2), (size,), (size + 1, 2, 2), (max(1, size - 1),)]
    for op in (hvd.Sum, hvd.Average):
        for _ in range(2):                          # the second time from the response cache
            handles = [hvd.reducescatter_async(contribution(rank, s, dtype), op=op, prescale_factor=2.0,
                                               postscale_factor=0.5, name=f"fused.rs.{i}")
                       for i, s in enumerate(shapes)]
            for s, handle in zip(shapes, handles):
                check(hvd.synchronize(handle), s, dtype, op, prescale=2.0, postscale=0.5)


def test_reducescatter_named_repeatedly():
    rank, size = hvd.rank(), hvd.size()
    for step in range(4):
        shape = (size + step, 2)
        out = hvd.reducescatter(contribution(rank, shape, np.float32), op=hvd.Sum, name="reducescatter.repeat")
        check(out, shape, np.float32, hvd.Sum)


def test_reducescatter_large():
    rank, size = hvd.rank(), hvd.size()
    shape = (size * 500_000 + 3,)                    # 2 MB per rank block and a remainder
    t = (np.arange(shape[0]) % 101 + rank).astype(np.float32)
    out = hvd.reducescatter(t, op=hvd.Sum)
    lo, hi = my_rows(shape[0], rank, size)
    np.testing.assert_array_equal(out, ((np.arange(shape[0]) % 101) * size + size * (size - 1) / 2)[lo:hi])


@pytest.mark.parametrize("op", [hvd.Min, hvd.Max, hvd.Product])
def test_reducescatter_other_ops_raise_value_error(op):
    t = np.ones((hvd.size(), 2), np.float32)
    with pytest.raises(ValueError, match="Sum"):
        hvd.reducescatter(t, op=op)
    with pytest.raises(ValueError, match="Sum"):
        hvd.grouped_reducescatter([t], op=op)
    with pytest.raises(ValueError):
        hvd.reducescatter(np.array(1.0, np.float32), op=hvd.Sum)     # a scalar has no dim 0
    assert hvd.allreduce(np.ones(1), op=hvd.Sum)[0] == hvd.size()
