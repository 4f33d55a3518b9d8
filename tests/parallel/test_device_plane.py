"""The device plane's schedules at any number of ranks, on the emulated device (tests/support/emulated_device.py):
device requests go through negotiation, fusion and the device executors exactly as CUDA tensors do, and move
through windows small enough (1000 bytes) that every collective here takes several uneven chunks.

The expected values come from the host suites' own references, so a device result must equal the host one.
"""
import os

import numpy as np
import pytest

import horovod.numpy as hvd
from horovod.common.exceptions import HorovodInternalError
from horovod.core import ops
from tests.parallel import test_allgather, test_allreduce, test_alltoall, test_reducescatter
from tests.support.emulated_device import EMULATED, register
from tests.support.ranks import (
    ALL_DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    assert_same_on_all_ranks,
    dtype_id,
    is_float,
    tolerance,
)

os.environ["HOROVOD_CUDA_IPC_WINDOW_BYTES"] = "1000"     # read when the plane is made, at the first device op
register()

SHAPES = [(0,), (1,), (7,), (333,), (40, 9)]


def _check_reduced(out, want, dtype):
    if is_float(dtype):
        np.testing.assert_allclose(out.astype(np.float64), want.astype(np.float64), **tolerance(dtype))
    else:
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("op_name", list(test_allreduce.OPS))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_device_allreduce(dtype, op_name):
    op = test_allreduce.OPS[op_name]
    if np.dtype(dtype) == np.bool_ and op in (hvd.Average, hvd.Product):
        pytest.skip("not defined for bool tensors")
    for shape in SHAPES:
        t = test_allreduce.contribution(hvd.rank(), shape, dtype, op)
        original = t.copy()
        out = ops.allreduce_async(t, None, f"dev.{op_name}.{shape}", op, device=EMULATED).wait()
        assert out.shape == t.shape and out.dtype == t.dtype
        _check_reduced(out, test_allreduce.expected(shape, dtype, op, hvd.size()), dtype)
        np.testing.assert_array_equal(t, original)
        assert_same_on_all_ranks(out)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32], ids=dtype_id)
def test_device_grouped_allreduce_in_place_with_scaling(dtype):
    shapes = [(5,), (130,), (1,), (17, 3), (0,)]
    tensors = [test_allreduce.contribution(hvd.rank(), s, dtype, hvd.Sum) for s in shapes]
    outs = ops.grouped_allreduce_async(tensors, tensors, "dev.grouped", hvd.Average, 0.5, 3.0,
                                       device=EMULATED).wait()
    for shape, out, t in zip(shapes, outs, tensors):
        assert out is t
        _check_reduced(out, test_allreduce.expected(shape, dtype, hvd.Average, hvd.size(), 0.5, 3.0), dtype)


@pytest.mark.parametrize("row_shape", [(), (3,), (70,)], ids=str)
@pytest.mark.parametrize("dtype", INT_DTYPES + FLOAT_DTYPES, ids=dtype_id)
def test_device_allgather_uneven_rows(dtype, row_shape):
    rank, size = hvd.rank(), hvd.size()
    for layout in test_allgather.LAYOUTS.values():
        counts = [layout(r, size) for r in range(size)]
        t = test_allgather.rows_of(rank, counts[rank], row_shape, dtype)
        out = ops.allgather_async(t, "dev.allgather", device=EMULATED).wait()
        np.testing.assert_array_equal(out, test_allgather.expected(counts, row_shape, dtype))


def test_device_broadcast_from_every_root():
    rank, size = hvd.rank(), hvd.size()
    for root in range(size):
        t = np.arange(777, dtype=np.float32) * (rank + 1)
        out = ops.broadcast_async(t, root, None, f"dev.bcast.{root}", device=EMULATED).wait()
        np.testing.assert_array_equal(out, np.arange(777, dtype=np.float32) * (root + 1))
        in_place = t.copy()
        ops.broadcast_async(in_place, root, in_place, f"dev.bcast_.{root}", device=EMULATED).wait()
        np.testing.assert_array_equal(in_place, out)


@pytest.mark.parametrize("op_name", ["Sum", "Average"])
@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.float64], ids=dtype_id)
def test_device_reducescatter_uneven_rows(dtype, op_name):
    op = test_reducescatter.OPS[op_name]
    for shape in test_reducescatter.shapes_for(hvd.size()) + [(3 * hvd.size() + 1, 50)]:
        t = test_reducescatter.contribution(hvd.rank(), shape, dtype)
        out = ops.reducescatter_async(t, "dev.rs", op, 2.0, 0.5, device=EMULATED).wait()
        test_reducescatter.check(out, shape, dtype, op, 2.0, 0.5)


@pytest.mark.parametrize("row_shape", [(), (60,)], ids=str)
def test_device_alltoall_uneven_splits(row_shape):
    rank, size = hvd.rank(), hvd.size()
    splits = test_alltoall.uneven_splits(rank, size)
    t = test_alltoall.send_tensor(rank, splits, row_shape, np.float64)
    out, received = ops.alltoall_async(t, splits, "dev.alltoall", device=EMULATED).wait()
    want = [test_alltoall.uneven_splits(src, size)[rank] for src in range(size)]
    assert list(received) == want
    np.testing.assert_array_equal(out, np.concatenate(
        [test_alltoall.block(src, rank, want[src], row_shape, np.float64) for src in range(size)]))


def test_host_and_device_buffers_of_one_tensor_are_refused_with_the_ranks_named():
    if hvd.size() == 1:
        pytest.skip("needs two ranks")
    t = np.ones(4, np.float32)
    device = EMULATED if hvd.rank() else 0
    with pytest.raises(HorovodInternalError) as info:
        ops.allreduce_async(t, None, "dev.mixed", hvd.Sum, device=device).wait()
    message = str(info.value)
    assert "Mismatched devices" in message and "rank 0 sent a tensor in host memory" in message, message


def test_the_collectives_above_ran_on_the_device_plane():
    from horovod.core import basics

    ops.allreduce_async(np.ones(3), None, "dev.plane", hvd.Sum, device=EMULATED).wait()
    plane = basics.engine_for(None).devices.get(EMULATED)
    assert plane.window_bytes == 1000 and len(plane.windows) == hvd.size()
