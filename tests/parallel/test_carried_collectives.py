"""Carried collectives (core/engine/carried.py): a small blocking allreduce, broadcast or allgather that no fast
round takes sends its input with its request, and rank 0 answers with the result.

They run where the job has no fast rounds (a tcp or hierarchical plane, HOROVOD_FAST_ROUNDS=0) and more than one
rank; elsewhere (shm jobs, one rank) every body still checks its results, which then come another way. An
allreduce's expected numbers are every rank's input, reduced in rank order in the tensor's dtype, as the module
says.
"""
import numpy as np
import pytest

import horovod.numpy as hvd
from horovod.common.exceptions import HorovodInternalError
from horovod.core import basics, ops

OPS = {"sum": hvd.Sum, "average": hvd.Average, "min": hvd.Min, "max": hvd.Max, "product": hvd.Product}
KERNELS = {"sum": np.add, "min": np.minimum, "max": np.maximum, "product": np.multiply}


def _engine():
    return basics.engine_for(None)


def _carries(nbytes: int) -> bool:
    """Whether a blocking allreduce or broadcast of ``nbytes`` (an allgather of ``nbytes / size`` per rank) is
    carried in this job."""
    engine = _engine()
    budget = engine.settings.coordinator_carry_bytes
    return engine.fast is None and engine.size > 1 and 0 < budget and nbytes * (engine.size - 1) <= budget


def _expect(before: int, nbytes: int, rounds: int = 1, carried: bool = True) -> None:
    expected = rounds if carried and _carries(nbytes) else 0
    assert _engine().carried_ops == before + expected, f"{_engine().carried_ops - before} of {expected} carried"


def _input(rank: int, dtype, count: int = 64) -> np.ndarray:
    return (np.arange(1, count + 1) % 5 + rank + 1).astype(dtype)


def _rank_order(op: str, dtype, size: int, count: int = 64) -> np.ndarray:
    """Every rank's input reduced in rank order, in ``dtype`` (not Average: its scaling has rules of its own)."""
    out = _input(0, dtype, count)
    for r in range(1, size):
        out = KERNELS[op](out, _input(r, dtype, count)).astype(dtype)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.float16])
@pytest.mark.parametrize("op", list(OPS))
def test_every_op_reduces_in_rank_order_and_agrees_with_the_data_plane(dtype, op):
    rank, size = hvd.rank(), hvd.size()
    x = _input(rank, dtype)
    before = _engine().carried_ops
    got = hvd.allreduce(x, op=OPS[op], name=f"cr.{op}.{np.dtype(dtype).name}")
    _expect(before, x.nbytes)
    assert got.dtype == x.dtype and got.shape == x.shape
    if _carries(x.nbytes) and op != "average":
        np.testing.assert_array_equal(got, _rank_order(op, dtype, size))
    # the same op through the data plane (an async call is never carried): the same numbers, the last bits of a
    # float16 product or average aside, which another reduction order may round differently
    plane = ops.allreduce_async(x, name=f"cr.plane.{op}.{np.dtype(dtype).name}", op=OPS[op]).wait()
    assert _engine().carried_ops == before + (1 if _carries(x.nbytes) else 0), "an async allreduce was carried"
    if dtype == np.float16:
        np.testing.assert_allclose(got.astype(np.float64), plane.astype(np.float64), rtol=2e-3)
    else:
        np.testing.assert_array_equal(got, plane)
    everyone = hvd.allgather(got[None], name=f"cr.same.{op}.{np.dtype(dtype).name}")
    assert all(row.tobytes() == everyone[0].tobytes() for row in everyone), "ranks got different bits"


def test_scale_factors_in_place_and_integer_average():
    rank, size = hvd.rank(), hvd.size()
    x = np.full((4, 8), rank + 1, np.float32)
    before = _engine().carried_ops
    hvd.allreduce_(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0, name="cr.scaled")
    _expect(before, x.nbytes)
    np.testing.assert_allclose(x, np.full((4, 8), 0.5 * 4.0 * size * (size + 1) / 2))
    ints = np.full(7, 10 * rank + 3, np.int32)
    before = _engine().carried_ops
    got = hvd.allreduce(ints, op=hvd.Average, name="cr.int.average")
    _expect(before, ints.nbytes)
    plane = ops.allreduce_async(ints, name="cr.int.average.plane", op=hvd.Average).wait()
    np.testing.assert_array_equal(got, plane)


def test_the_budget_is_bytes_through_rank_0():
    """The largest carried allreduce and the next size up, each with the right result."""
    engine = _engine()
    size = hvd.size()
    largest = engine.settings.coordinator_carry_bytes // max(size - 1, 1) // 4
    for count in (largest, largest + 1):
        x = np.full(count, hvd.rank() + 1, np.float32)
        before = engine.carried_ops
        got = hvd.allreduce(x, op=hvd.Sum, name=f"cr.budget.{count}")
        _expect(before, x.nbytes)
        np.testing.assert_array_equal(got, np.full(count, size * (size + 1) / 2, np.float32))
    if size > 1 and engine.fast is None and engine.settings.coordinator_carry_bytes > 0:
        assert _carries(largest * 4) and not _carries((largest + 1) * 4)


@pytest.mark.parametrize("kind", ["empty", "scalar", "matrix"])
def test_empty_scalar_and_matrix_inputs(kind):
    rank, size = hvd.rank(), hvd.size()
    base = {"empty": np.zeros(0), "scalar": np.array(1.5),
            "matrix": np.arange(15, dtype=np.float64).reshape(3, 5)}[kind]
    x = np.asarray(base + rank)
    before = _engine().carried_ops
    got = hvd.allreduce(x, op=hvd.Sum, name=f"cr.{kind}")
    _expect(before, x.nbytes)
    assert got.shape == x.shape
    np.testing.assert_array_equal(got, size * base + size * (size - 1) / 2)


def test_a_rank_with_another_shape_fails_every_rank_with_the_usual_message():
    rank, size = hvd.rank(), hvd.size()
    if size < 2:
        pytest.skip("needs two ranks to disagree")
    x = np.ones(3 if rank == 0 else 4, np.float32)
    with pytest.raises(HorovodInternalError, match=r"Mismatched ALLREDUCE tensor shapes for tensor "
                                                   r"'[^']*cr\.mismatch'.*rank 0 sent \[3\]"):
        hvd.allreduce(x, name="cr.mismatch")
    got = hvd.allreduce(np.ones(4, np.float32), op=hvd.Sum, name="cr.after")     # the job goes on
    np.testing.assert_array_equal(got, np.full(4, size, np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
def test_broadcast_from_every_root(dtype):
    rank, size = hvd.rank(), hvd.size()
    for root in range(size):
        x = (np.arange(24).reshape(4, 6) * (rank + 1)).astype(dtype)
        before = _engine().carried_ops
        got = hvd.broadcast(x, root, name=f"cb.{root}.{np.dtype(dtype).name}")
        _expect(before, x.nbytes)
        assert got.dtype == x.dtype and got.shape == x.shape
        np.testing.assert_array_equal(got, (np.arange(24).reshape(4, 6) * (root + 1)).astype(dtype))
        y = np.full(5, rank, np.float64)
        before = _engine().carried_ops
        hvd.broadcast_(y, root, name=f"cb.inplace.{root}.{np.dtype(dtype).name}")
        _expect(before, y.nbytes)
        np.testing.assert_array_equal(y, np.full(5, root, np.float64))


def test_broadcast_object_and_the_budgets_edge():
    rank, size = hvd.rank(), hvd.size()
    assert hvd.broadcast_object({"from": rank, "data": list(range(10))}, 0) == {"from": 0, "data": list(range(10))}
    budget = _engine().settings.coordinator_carry_bytes
    largest = budget // max(size - 1, 1)
    for nbytes in (largest, largest + 1):
        x = np.full(nbytes, rank, np.uint8)
        before = _engine().carried_ops
        got = hvd.broadcast(x, size - 1, name=f"cb.edge.{nbytes}")
        _expect(before, nbytes)
        np.testing.assert_array_equal(got, np.full(nbytes, size - 1, np.uint8))


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
def test_allgather_of_rows_that_differ_between_ranks(dtype):
    rank, size = hvd.rank(), hvd.size()
    x = np.full((rank + 1, 3), rank, dtype)          # rank r sends r + 1 rows
    before = _engine().carried_ops
    got = hvd.allgather(x, name=f"cg.{np.dtype(dtype).name}")
    # every rank decides on its own input: carried only when the largest, the last rank's, fits too
    carried = all(_carries((r + 1) * 3 * x.itemsize * size) for r in range(size))
    _expect(before, 0, carried=carried)
    expected = np.concatenate([np.full((r + 1, 3), r, dtype) for r in range(size)])
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, expected)
    scalar_rows = hvd.allgather(np.array([rank * 1.5]), name="cg.one")
    np.testing.assert_array_equal(scalar_rows, np.arange(size) * 1.5)


def test_an_allgather_too_large_for_the_budget_runs_on_the_data_plane():
    rank, size = hvd.rank(), hvd.size()
    budget = _engine().settings.coordinator_carry_bytes
    count = budget // 4 + 1                            # one element more than rank 0 may send at 2 ranks
    x = np.full(count, rank, np.float32)
    before = _engine().carried_ops
    got = hvd.allgather(x, name="cg.large")
    assert _engine().carried_ops == before
    np.testing.assert_array_equal(got, np.repeat(np.arange(size, dtype=np.float32), count))
