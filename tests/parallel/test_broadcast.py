"""Broadcast at any number of ranks: every dtype from every root, in place and out of place, and objects."""
import numpy as np
import pytest

import horovod.numpy as hvd
from tests.support.blocking import count_blocking, every_blocking_call
from tests.support.ranks import ALL_DTYPES, dtype_id


def value_of(rank, shape, dtype):
    n = int(np.prod(shape, dtype=np.int64))
    vals = (np.arange(n) * 7 + 3 * rank + 1) % 50
    if np.dtype(dtype) == np.bool_:
        vals = (vals + rank) % 2
    return vals.astype(dtype).reshape(shape)


@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_broadcast_every_dtype_from_every_root(dtype, in_place):
    rank, size = hvd.rank(), hvd.size()
    for shape in [(4, 3), (), (0,), (17,)]:
        for root in range(size):
            t = value_of(rank, shape, dtype)
            original = t.copy()
            want = value_of(root, shape, dtype)
            if in_place:
                out = hvd.broadcast_(t, root_rank=root)
                assert out is t
            else:
                out = hvd.broadcast(t, root_rank=root)
                assert out is not t
                np.testing.assert_array_equal(t, original)     # the input is left alone, also off the root
            assert out.dtype == np.dtype(dtype) and out.shape == shape
            np.testing.assert_array_equal(out, want, err_msg=f"root {root}, shape {shape}")


def test_broadcast_async_forms():
    rank, size = hvd.rank(), hvd.size()
    tensors = [np.full(5, rank * 10 + k, np.int32) for k in range(size)]
    handles = [hvd.broadcast_async_(t, root_rank=k, name=f"bcast.inplace.{k}") for k, t in enumerate(tensors)]
    for k, (t, h) in enumerate(zip(tensors, handles)):
        assert hvd.synchronize(h) is t
        np.testing.assert_array_equal(t, np.full(5, k * 10 + k))
    handles = [hvd.broadcast_async(np.full(3, rank + 0.5), root_rank=size - 1 - k) for k in range(size)]
    for k, h in enumerate(handles):
        np.testing.assert_array_equal(hvd.synchronize(h), np.full(3, size - 1 - k + 0.5))


def test_broadcast_named_repeatedly():
    rank, size = hvd.rank(), hvd.size()
    for step in range(2 * size):
        root = step % size
        out = hvd.broadcast(np.full((2, 2), rank + step, np.float32), root_rank=root, name="bcast.repeat")
        np.testing.assert_array_equal(out, np.full((2, 2), root + step))


def test_broadcast_large_crosses_the_shm_chunk():
    rank, size = hvd.rank(), hvd.size()
    root = size - 1
    n = 2_500_001                                    # 10 MB of float32
    t = np.full(n, rank, np.float32) if rank != root else (np.arange(n) % 1009).astype(np.float32)
    hvd.broadcast_(t, root_rank=root)
    np.testing.assert_array_equal(t, (np.arange(n) % 1009).astype(np.float32))


@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.int32, np.float64], ids=dtype_id)
def test_broadcast_large_from_every_root_single_copy(dtype):
    """Above the shm plane's single-copy threshold (1 MB) the root writes a part into each peer and the peers
    read the rest straight from the root: every root, lengths that are not whole pages, out of place too."""
    rank, size = hvd.rank(), hvd.size()
    for count in (1_100_003, 3_000_000 // np.dtype(dtype).itemsize + 5):
        for root in range(size):
            want = value_of(root, (count,), dtype)
            t = value_of(rank, (count,), dtype)
            out = hvd.broadcast(t, root_rank=root, name=f"bcast.large.{count}.{root}")
            np.testing.assert_array_equal(out, want, err_msg=f"root {root}, {count} elements")
            np.testing.assert_array_equal(t, value_of(rank, (count,), dtype))
            hvd.broadcast_(t, root_rank=root, name=f"bcast.large_.{count}.{root}")
            np.testing.assert_array_equal(t, want, err_msg=f"in place, root {root}, {count} elements")


def test_broadcast_object_dicts_arrays_and_lambdas():
    rank, size = hvd.rank(), hvd.size()
    for root in range(size):
        obj = {"root": rank, "nested": {"list": [rank, "x" * rank], "tuple": (1, 2.5)}, "none": None}
        got = hvd.broadcast_object(obj, root_rank=root)
        assert got == {"root": root, "nested": {"list": [root, "x" * root], "tuple": (1, 2.5)}, "none": None}
    arr = hvd.broadcast_object(np.arange(6).reshape(2, 3) * (rank + 1), root_rank=size - 1)
    np.testing.assert_array_equal(arr, np.arange(6).reshape(2, 3) * size)
    offset = rank * 100
    fn = hvd.broadcast_object(lambda x: x + offset, root_rank=0, name="fn")
    assert fn(1) == 1                                 # the root's closure (offset 0), shipped with cloudpickle
    assert hvd.broadcast_object(None if rank else "only on root", root_rank=0, name="str") == "only on root"


def test_allgather_object():
    rank, size = hvd.rank(), hvd.size()
    got = hvd.allgather_object({"rank": rank, "payload": "y" * (rank * 37)})
    assert got == [{"rank": r, "payload": "y" * (r * 37)} for r in range(size)]
    arrays = hvd.allgather_object(np.full(rank + 1, rank, np.int16))
    assert len(arrays) == size
    for r, a in enumerate(arrays):
        assert a.dtype == np.int16
        np.testing.assert_array_equal(a, np.full(r + 1, r, np.int16))
    fns = hvd.allgather_object(lambda x, k=rank: x * 10 + k)
    assert [f(1) for f in fns] == [10 + r for r in range(size)]
    assert hvd.allgather_object(rank % 2 == 0, name="flags") == [r % 2 == 0 for r in range(size)]


def test_object_helpers_wait_at_once(monkeypatch):
    """broadcast_object and allgather_object are two blocking collectives each (the size, then the bytes), and
    say so: a fast round (one host) or the carried path (across hosts) may take them."""
    blocking = count_blocking(monkeypatch)
    rank, size = hvd.rank(), hvd.size()
    assert hvd.broadcast_object({"step": 7, "from": rank}, root_rank=size - 1, name="bl") == {"step": 7,
                                                                                             "from": size - 1}
    assert hvd.allgather_object(("rank", rank), name="bl") == [("rank", r) for r in range(size)]
    assert blocking == ["broadcast_object.bl.sz", "broadcast_object.bl.t",
                        "allgather_object.bl.sz", "allgather_object.bl.t"], blocking


def test_numpy_blocking_calls_say_they_wait_at_once(monkeypatch):
    """horovod.numpy's blocking calls submit and wait at once and say so (ops.blocking())."""
    blocking = count_blocking(monkeypatch)
    rank, size = hvd.rank(), hvd.size()
    expected = every_blocking_call(hvd, np.full(size * 2, rank + 1.0, np.float32), np.copy)
    assert sorted(blocking) == sorted(expected), blocking
