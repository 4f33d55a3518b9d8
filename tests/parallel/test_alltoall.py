"""Alltoall at any number of ranks: equal and uneven splits, multi-dimensional rows, dtypes, local errors."""
import numpy as np
import pytest

import horovod.numpy as hvd
from tests.support.ranks import ALL_DTYPES, dtype_id


def block(src, dst, nrows, row_shape, dtype):
    """The rows rank ``src`` sends to rank ``dst``: each element encodes (src, dst, position)."""
    n = nrows * int(np.prod(row_shape, dtype=np.int64))
    vals = (np.arange(n) + 10 * src + 3 * dst) % 100
    if np.dtype(dtype) == np.bool_:
        vals = (vals + src + dst) % 2
    return vals.astype(dtype).reshape((nrows, *row_shape))


def send_tensor(rank, splits, row_shape, dtype):
    return np.concatenate([block(rank, dst, n, row_shape, dtype) for dst, n in enumerate(splits)])


def uneven_splits(src, size):
    """Rank ``src``'s row counts per destination, zeros included."""
    return [(src + 2 * dst) % 3 for dst in range(size)]


@pytest.mark.parametrize("row_shape", [(), (3,), (2, 2)], ids=str)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_alltoall_equal_split(dtype, row_shape):
    rank, size = hvd.rank(), hvd.size()
    k = 2
    t = send_tensor(rank, [k] * size, row_shape, dtype)
    original = t.copy()
    out = hvd.alltoall(t)
    assert isinstance(out, np.ndarray), "without splits alltoall returns the output alone"
    assert out.dtype == np.dtype(dtype) and out.shape == (k * size, *row_shape)
    np.testing.assert_array_equal(out, np.concatenate([block(src, rank, k, row_shape, dtype)
                                                       for src in range(size)]))
    np.testing.assert_array_equal(t, original)


@pytest.mark.parametrize("splits_type", ["list", "int32_array", "int64_array"])
@pytest.mark.parametrize("row_shape", [(), (4,), (2, 3)], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.bool_, np.float64], ids=dtype_id)
def test_alltoall_uneven_splits(dtype, row_shape, splits_type):
    rank, size = hvd.rank(), hvd.size()
    splits = uneven_splits(rank, size)
    t = send_tensor(rank, splits, row_shape, dtype)
    arg = splits if splits_type == "list" else np.array(splits, np.int32 if splits_type == "int32_array" else np.int64)
    out, received = hvd.alltoall(t, splits=arg)
    want_received = [uneven_splits(src, size)[rank] for src in range(size)]
    np.testing.assert_array_equal(np.asarray(received), want_received)
    assert out.dtype == np.dtype(dtype) and out.shape == (sum(want_received), *row_shape)
    np.testing.assert_array_equal(out, np.concatenate(
        [block(src, rank, want_received[src], row_shape, dtype) for src in range(size)]))


def test_alltoall_everything_to_one_rank():
    rank, size = hvd.rank(), hvd.size()
    splits = [0] * size
    splits[size - 1] = rank + 1
    out, received = hvd.alltoall(np.full((rank + 1, 2), rank, np.int64), splits=splits)
    if rank == size - 1:
        np.testing.assert_array_equal(received, [r + 1 for r in range(size)])
        np.testing.assert_array_equal(out[:, 0], np.repeat(np.arange(size), np.arange(1, size + 1)))
    else:
        np.testing.assert_array_equal(received, [0] * size)
        assert out.shape == (0, 2)


def test_alltoall_async_and_repeated_name():
    rank, size = hvd.rank(), hvd.size()
    handles = [hvd.alltoall_async(np.full(size * (k + 1), rank + k, np.float32)) for k in range(4)]
    for k, h in enumerate(handles):
        np.testing.assert_array_equal(hvd.synchronize(h), np.repeat(np.arange(size) + k, k + 1).astype(np.float32))
    for step in range(5):
        splits = [(rank + dst + step) % 2 for dst in range(size)]
        out, received = hvd.alltoall(np.full(sum(splits), rank, np.int32), splits=splits, name="alltoall.repeat")
        want = [(src + rank + step) % 2 for src in range(size)]
        np.testing.assert_array_equal(received, want)
        np.testing.assert_array_equal(out, np.repeat(np.arange(size), want))


def test_alltoall_large():
    rank, size = hvd.rank(), hvd.size()
    per = 400_000                                    # 1.6 MB per destination
    t = np.concatenate([np.full(per, rank * size + dst, np.float32) for dst in range(size)])
    out = hvd.alltoall(t)
    np.testing.assert_array_equal(out, np.repeat(np.arange(size) * size + rank, per).astype(np.float32))


def test_alltoall_splits_not_summing_to_dim0_raises():
    size = hvd.size()
    t = np.zeros((size * 2, 3), np.float32)
    too_many = [2] * size
    too_many[0] += 1
    too_few = [2] * size
    too_few[-1] -= 1
    for splits in (too_many, too_few, [2] * (size + 1)):
        with pytest.raises(ValueError, match="splits"):
            hvd.alltoall(t, splits=splits)
    if size > 1:
        negative = [2] * size
        negative[0], negative[1] = -1, 5             # adds up to dim 0, but a count is negative
        with pytest.raises(ValueError, match="splits"):
            hvd.alltoall(t, splits=negative)
    assert hvd.allreduce(np.ones(1), op=hvd.Sum)[0] == size      # nothing was enqueued: the job goes on


def test_alltoall_dim0_not_divisible_without_splits_raises():
    size = hvd.size()
    if size == 1:
        pytest.skip("every dim 0 divides by 1")
    with pytest.raises(ValueError, match="splits"):
        hvd.alltoall(np.zeros(size + 1, np.float32))
    with pytest.raises(ValueError):
        hvd.alltoall(np.array(1.0, np.float32))     # a scalar has no dim 0
    assert hvd.allreduce(np.ones(1), op=hvd.Sum)[0] == size
