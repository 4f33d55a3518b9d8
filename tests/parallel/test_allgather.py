"""Allgather at any number of ranks: dtypes, dim 0 differing per rank (zero rows included), grouped, async."""
import numpy as np
import pytest

import horovod.numpy as hvd
from tests.support.ranks import ALL_DTYPES, assert_same_on_all_ranks, dtype_id


def rows_of(rank, nrows, row_shape, dtype):
    """Rank ``rank``'s block: every element encodes (rank, position), so misplaced rows are detected."""
    n = nrows * int(np.prod(row_shape, dtype=np.int64))
    vals = (np.arange(n) + 10 * rank) % 100
    if np.dtype(dtype) == np.bool_:
        vals = (vals + rank) % 2
    return vals.astype(dtype).reshape((nrows, *row_shape))


def expected(counts, row_shape, dtype):
    return np.concatenate([rows_of(r, c, row_shape, dtype) for r, c in enumerate(counts)])


LAYOUTS = {
    "r_plus_1": lambda r, s: r + 1,
    "rank_0_empty": lambda r, s: r,          # rank 0 contributes zero rows
    "last_empty": lambda r, s: 0 if r == s - 1 else 2,
    "equal": lambda r, s: 3,
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("row_shape", [(), (3,), (2, 3)], ids=str)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_allgather_dtypes_and_uneven_rows(dtype, row_shape, layout):
    rank, size = hvd.rank(), hvd.size()
    counts = [LAYOUTS[layout](r, size) for r in range(size)]
    t = rows_of(rank, counts[rank], row_shape, dtype)
    original = t.copy()
    out = hvd.allgather(t)
    assert out.dtype == np.dtype(dtype)
    assert out.shape == (sum(counts), *row_shape)
    np.testing.assert_array_equal(out, expected(counts, row_shape, dtype))
    np.testing.assert_array_equal(t, original)


def test_allgather_every_rank_empty():
    out = hvd.allgather(np.zeros((0, 4), np.float32))
    assert out.shape == (0, 4) and out.dtype == np.float32


@pytest.mark.parametrize("dtype", [np.float32, np.int16, np.bool_], ids=dtype_id)
def test_allgather_async_poll_synchronize(dtype):
    rank, size = hvd.rank(), hvd.size()
    handles = [hvd.allgather_async(rows_of(rank, rank + k, (2,), dtype)) for k in range(5)]
    for k, h in enumerate(handles):
        out = hvd.synchronize(h)
        np.testing.assert_array_equal(out, expected([r + k for r in range(size)], (2,), dtype))


def test_grouped_allgather():
    rank, size = hvd.rank(), hvd.size()
    specs = [((3,), np.float32, lambda r: r + 1), ((), np.int64, lambda r: 2), ((2, 2), np.bool_, lambda r: r),
             ((5,), np.float16, lambda r: 1)]
    tensors = [rows_of(rank, n(rank), shape, dt) for shape, dt, n in specs]
    for outs in (hvd.grouped_allgather(tensors), hvd.synchronize(hvd.grouped_allgather_async(tensors))):
        assert isinstance(outs, list) and len(outs) == len(specs)
        for (shape, dt, n), out in zip(specs, outs):
            assert out.dtype == np.dtype(dt)
            np.testing.assert_array_equal(out, expected([n(r) for r in range(size)], shape, dt))


def test_grouped_allgather_named_repeatedly():
    rank, size = hvd.rank(), hvd.size()
    for step in range(4):
        outs = hvd.grouped_allgather([np.full((rank + 1, 2), step, np.int32), np.full(step + 1, rank, np.int8)],
                                     name="grouped_allgather.repeat")
        assert outs[0].shape == (size * (size + 1) // 2, 2) and (outs[0] == step).all()
        np.testing.assert_array_equal(outs[1], np.repeat(np.arange(size), step + 1).astype(np.int8))


def test_allgather_named_repeatedly_with_changing_rows():
    # The cached response for a name records every rank's dim 0: a change must renegotiate, not reuse it.
    rank, size = hvd.rank(), hvd.size()
    for step in range(6):
        nrows = (rank + step) % 3
        out = hvd.allgather(np.full((nrows, 2), rank, np.float64), name="allgather.changing")
        counts = [(r + step) % 3 for r in range(size)]
        np.testing.assert_array_equal(out, np.repeat(np.arange(size), counts).astype(np.float64)[:, None]
                                      * np.ones((1, 2)))


def test_fused_allgathers_with_uneven_and_empty_blocks():
    # Submitted together, same dtype: the coordinator fuses them into one gather, cut apart rank by rank.
    rank, size = hvd.rank(), hvd.size()
    specs = [((3,), lambda r: r), ((), lambda r: 2), ((2, 2), lambda r: (r + 1) % 2), ((4,), lambda r: 0),
             ((1,), lambda r: size - r), ((2,), lambda r: 1 if r == 0 else 0)]
    for _ in range(2):                               # the second time from the response cache
        handles = [hvd.allgather_async(rows_of(rank, n(rank), shape, np.float32)) for shape, n in specs]
        for (shape, n), handle in zip(specs, handles):
            out = hvd.synchronize(handle)
            np.testing.assert_array_equal(out, expected([n(r) for r in range(size)], shape, np.float32))


def test_allgather_large_crosses_the_shm_chunk():
    rank, size = hvd.rank(), hvd.size()
    n = 1_200_000 + rank * 1001                      # about 4.8 MB per rank, each rank a different size (the
    # output, 9.6 MB at 2 ranks to 19 MB at 4, takes the single-copy path where cross-memory reads are allowed)
    t = (np.arange(n) % 251 + rank).astype(np.float32)
    out = hvd.allgather(t)
    want = np.concatenate([(np.arange(1_200_000 + r * 1001) % 251 + r).astype(np.float32) for r in range(size)])
    np.testing.assert_array_equal(out, want)
    assert_same_on_all_ranks(out)


def test_allgather_scalar_is_refused_locally():
    with pytest.raises(ValueError, match="dimension"):
        hvd.allgather(np.array(1.0, np.float32))
    with pytest.raises(ValueError, match="dimension"):
        hvd.grouped_allgather([np.ones(2, np.float32), np.array(1.0, np.float32)])
