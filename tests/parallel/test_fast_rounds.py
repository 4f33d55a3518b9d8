"""Fast rounds (core/engine/fast_rounds.py): blocking collectives agreed, and small ones reduced, through shared
memory; large ones copied once between the ranks' own arrays (direct rounds).

Runs first in its job (test_parallel_suite.py): a join seals the fast rounds for the rest of the job. Where the
job has no fast rounds (one rank, several hosts, HOROVOD_FAST_ROUNDS=0), every body still checks its results,
which then come through the coordinator.
"""
import threading
import time

import numpy as np
import pytest

import horovod.numpy as hvd
from horovod.backends.shm import FAST_SLOT_BYTES
from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import RequestType
from horovod.core import basics, ops
from horovod.core.engine.fast_rounds import (
    DIRECT_ALLREDUCE_FROM,
    DIRECT_FROM,
    REDUCE_TOTAL_BYTES,
    SPLIT_FROM,
    goes_direct,
    splits,
)


def _fast():
    return basics.engine_for(None).fast


def _matched() -> int:
    fast = _fast()
    return fast.matched if fast is not None else 0


def _expect_fast(before: int, rounds: int = 1) -> None:
    """With fast rounds on, exactly ``rounds`` more ran fast on this rank."""
    if _fast() is not None:
        assert _matched() == before + rounds, f"{_matched() - before} of {rounds} rounds ran fast"


def _direct() -> int:
    fast = _fast()
    return fast.direct if fast is not None else 0


def _expect_direct(before: int, rounds: int, nbytes: int) -> None:
    """Where the ranks may copy to and from each other's memory, exactly ``rounds`` more fast rounds of ``nbytes``
    copied directly on this rank (HOROVOD_SHM_CROSS_MEMORY=0: none; more ranks than cores: only what does not fit
    a slot)."""
    fast = _fast()
    if fast is not None:
        expected = rounds if fast.pids is not None and (fast.roomy or nbytes > FAST_SLOT_BYTES) else 0
        assert _direct() == before + expected, f"{_direct() - before} of {expected} rounds copied directly"


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.float16])
@pytest.mark.parametrize("op", ["sum", "average", "min", "max", "product"])
def test_every_op_gives_the_coordinators_numbers(dtype, op):
    rank = hvd.rank()
    reduce_op = {"sum": hvd.Sum, "average": hvd.Average, "min": hvd.Min, "max": hvd.Max,
                 "product": hvd.Product}[op]
    x = (np.arange(1, 65) % 5 + rank + 1).astype(dtype)
    before = _matched()
    fast = hvd.allreduce(x, op=reduce_op, name=f"fr.{op}.{np.dtype(dtype).name}")
    _expect_fast(before)
    with_coordinator = ops.allreduce_async(x, name=f"fr.slow.{op}.{np.dtype(dtype).name}", op=reduce_op).wait()
    np.testing.assert_array_equal(fast, with_coordinator)
    assert fast.dtype == x.dtype and fast.shape == x.shape


def test_scale_factors_and_in_place():
    rank, size = hvd.rank(), hvd.size()
    x = np.full((4, 8), rank + 1, np.float32)
    before = _matched()
    hvd.allreduce_(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0, name="fr.scaled")
    _expect_fast(before)
    np.testing.assert_allclose(x, np.full((4, 8), 0.5 * 4.0 * size * (size + 1) / 2))


def _allreduce_goes_direct(nbytes: int) -> bool:
    """Whether a blocking allreduce of ``nbytes`` should copy directly here: only where the ranks may copy to and
    from each other's memory, and the slots cannot take it (more than REDUCE_TOTAL_BYTES read per rank and no split
    round, however many cores the ranks share) or, where every rank has a core, from DIRECT_ALLREDUCE_FROM."""
    fast = _fast()
    return fast is not None and fast.pids is not None and (
        (nbytes * fast.size > REDUCE_TOTAL_BYTES and not _splits(nbytes))
        or (fast.roomy and nbytes >= DIRECT_ALLREDUCE_FROM))


def _splits(nbytes: int) -> bool:
    """Whether an allreduce of ``nbytes`` through the slots is split: at 3 ranks and more, from SPLIT_FROM to a
    slot."""
    return hvd.size() >= 3 and SPLIT_FROM <= nbytes <= FAST_SLOT_BYTES


def test_a_slot_sized_op_goes_fast_and_a_larger_one_only_direct():
    """The largest allreduce through the slots: a slot (split at 3 ranks and more), or less where every rank would
    read more than REDUCE_TOTAL_BYTES of whole slots, or just below DIRECT_ALLREDUCE_FROM where every rank has a
    core. A larger one goes fast only as a direct round."""
    size = hvd.size()
    largest = FAST_SLOT_BYTES if size >= 3 else min(FAST_SLOT_BYTES, REDUCE_TOTAL_BYTES // size)   # split from 3
    if _fast() is not None and _fast().roomy and _fast().pids is not None:
        largest = min(largest, DIRECT_ALLREDUCE_FROM - 4)
    fits = np.ones(largest // 4, np.float32)
    before, direct = _matched(), _direct()
    np.testing.assert_array_equal(hvd.allreduce(fits, op=hvd.Sum, name="fr.fits"), np.full_like(fits, size))
    _expect_fast(before)
    assert _direct() == direct
    big = np.ones(FAST_SLOT_BYTES // 4 + 1, np.float32)
    np.testing.assert_array_equal(hvd.allreduce(big, op=hvd.Sum, name="fr.big"), np.full_like(big, size))
    _expect_fast(before + (1 if _fast() is not None else 0), 1 if _allreduce_goes_direct(big.nbytes) else 0)


# Element counts that do not split evenly among 2-4 ranks: one beyond REDUCE_TOTAL_BYTES read per rank only at 4
# ranks (through the whole slots at 2, split at 3 and 4), one beyond a slot (direct).
@pytest.mark.parametrize("count", [REDUCE_TOTAL_BYTES // 16 + 1, FAST_SLOT_BYTES // 4 + 7])
@pytest.mark.parametrize("where", ["new", "in place", "strided"])
def test_a_large_allreduce_copies_once(count, where):
    """A direct allreduce gives the coordinator's numbers (Average, a prescale), into a new output, in place,
    or into an output that is not contiguous."""
    rank = hvd.rank()
    x = ((np.arange(count) % 7) * (rank + 1) + rank * rank).astype(np.float32)
    slow = ops.allreduce_async(x, name=f"fr.large.slow.{count}.{where}", op=hvd.Average, prescale_factor=0.5).wait()
    before, direct = _matched(), _direct()
    output = {"new": None, "in place": x, "strided": np.zeros(2 * count, np.float32)[::2]}[where]
    with ops.blocking():
        got = ops.allreduce_async(x, output, name=f"fr.large.{count}.{where}", op=hvd.Average,
                                  prescale_factor=0.5).wait()
    np.testing.assert_array_equal(got, slow)
    if output is not None:
        np.testing.assert_array_equal(output, slow)
    goes_direct = _allreduce_goes_direct(x.nbytes)
    fits_slots = _fast() is not None and x.nbytes <= FAST_SLOT_BYTES and (
        x.nbytes * hvd.size() <= REDUCE_TOTAL_BYTES or _splits(x.nbytes))
    _expect_fast(before, 1 if goes_direct or fits_slots else 0)
    assert _direct() == direct + (1 if goes_direct else 0)


@pytest.mark.parametrize("rows", [DIRECT_ALLREDUCE_FROM // 24 + 5, FAST_SLOT_BYTES // 24 + 5,
                                  3 * FAST_SLOT_BYTES // 24 + 1])
def test_a_large_reducescatter_copies_once(rows):
    """Beyond a slot, and from DIRECT_ALLREDUCE_FROM where every rank has a core, a reducescatter reads this
    rank's rows (upstream's split: they do not divide evenly at 2-4 ranks) straight from every peer's input."""
    rank, size = hvd.rank(), hvd.size()
    x = (np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) % 11 + rank) * (rank + 1)
    slow = ops.reducescatter_async(x, name=f"fr.rs.large.slow.{rows}", op=hvd.Average, postscale_factor=3.0).wait()
    before, direct = _matched(), _direct()
    fast = hvd.reducescatter(x, op=hvd.Average, postscale_factor=3.0, name=f"fr.rs.large.{rows}")
    np.testing.assert_array_equal(fast, slow)
    assert fast.shape == (rows // size + (1 if rank < rows % size else 0), 3)
    cross = _fast() is not None and _fast().pids is not None
    goes_direct = cross and (x.nbytes > FAST_SLOT_BYTES or _fast().roomy)
    _expect_fast(before, 1 if goes_direct or x.nbytes <= FAST_SLOT_BYTES else 0)
    assert _direct() == direct + (1 if goes_direct else 0)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_broadcast_from_every_root_goes_fast(dtype):
    rank, size = hvd.rank(), hvd.size()
    for root in range(size):
        x = (np.arange(24).reshape(4, 6) + 100 * rank).astype(dtype)
        before = _matched()
        got = hvd.broadcast(x, root, name=f"fr.bcast.{root}.{np.dtype(dtype).name}")
        _expect_fast(before)
        np.testing.assert_array_equal(got, (np.arange(24).reshape(4, 6) + 100 * root).astype(dtype))
        assert got.dtype == x.dtype and got.shape == x.shape
        y = np.full(5, rank, dtype)
        hvd.broadcast_(y, root, name=f"fr.bcast_.{root}.{np.dtype(dtype).name}")
        np.testing.assert_array_equal(y, np.full(5, root, dtype))
        strided = np.zeros(10, dtype)[::2]          # into another, strided output: the root copies its own input
        before = _matched()
        with ops.blocking():
            ops.broadcast_async(np.full(5, rank, dtype), root, output=strided,
                                name=f"fr.bcast.strided.{root}.{np.dtype(dtype).name}").wait()
        _expect_fast(before)
        np.testing.assert_array_equal(strided, np.full(5, root, dtype))


def test_allgather_of_equal_shapes_goes_fast_and_unequal_ones_through_the_coordinator():
    rank, size = hvd.rank(), hvd.size()
    before = _matched()
    got = hvd.allgather(np.full((3, 2), rank, np.float64), name="fr.gather")
    _expect_fast(before)
    np.testing.assert_array_equal(got, np.repeat(np.arange(size, dtype=np.float64), 3)[:, None] * np.ones(2))
    before = _matched()
    got = hvd.allgather(np.full((rank + 1, 2), rank, np.int32), name="fr.gather.uneven")
    _expect_fast(before, 0 if size > 1 else 1)        # the ranks' keys differ: the coordinator gathers
    np.testing.assert_array_equal(got[:, 0], np.concatenate([np.full(r + 1, r) for r in range(size)]))


# The smallest direct broadcast, and one of three slots and a bit (not a whole number of pages).
@pytest.mark.parametrize("count", [DIRECT_FROM[RequestType.BROADCAST] // 4, 3 * FAST_SLOT_BYTES // 4 + 1])
def test_a_large_broadcast_copies_once_from_every_root(count):
    rank, size = hvd.rank(), hvd.size()
    for root in range(size):
        x = np.arange(count, dtype=np.float32) + 1000 * rank
        expected = np.arange(count, dtype=np.float32) + 1000 * root
        before, direct = _matched(), _direct()
        np.testing.assert_array_equal(hvd.broadcast(x, root, name=f"fr.direct.{count}.{root}"), expected)
        hvd.broadcast_(x, root, name=f"fr.direct_.{count}.{root}")
        np.testing.assert_array_equal(x, expected)
        strided = np.zeros(2 * count, np.float32)[::2]         # not contiguous: received into a scratch array
        with ops.blocking():
            ops.broadcast_async(np.arange(count, dtype=np.float32) + 1000 * rank, root, output=strided,
                                name=f"fr.direct.strided.{count}.{root}").wait()
        np.testing.assert_array_equal(strided, expected)
        cross = _fast() is not None and _fast().pids is not None
        _expect_fast(before, 3 if cross or count * 4 <= FAST_SLOT_BYTES else 0)   # else beyond a slot
        _expect_direct(direct, 3, count * 4)


# The smallest direct allgather (rows of 24 bytes: not a whole number of pages), one beyond a slot per rank, and
# one of 40 MB of output (direct too: there is no upper limit).
@pytest.mark.parametrize("rows, direct", [(-(-DIRECT_FROM[RequestType.ALLGATHER] // 24), True), (FAST_SLOT_BYTES // 24 + 5, True),
                                          ("large", True)])
def test_a_large_allgather_copies_once(rows, direct):
    rank, size = hvd.rank(), hvd.size()
    if rows == "large":
        rows = (40 << 20) // 24 // size + 1
    x = np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) + 1e6 * rank
    before, copied = _matched(), _direct()
    got = hvd.allgather(x, name=f"fr.direct.gather.{rows}")
    cross = _fast() is not None and _fast().pids is not None
    _expect_fast(before, 1 if direct and (cross or x.nbytes <= FAST_SLOT_BYTES) else 0)
    _expect_direct(copied, 1 if direct else 0, x.nbytes)
    assert got.shape == (rows * size, 3)
    for r in range(size):
        np.testing.assert_array_equal(got[r * rows:(r + 1) * rows], x - 1e6 * rank + 1e6 * r)


@pytest.mark.parametrize("op", ["sum", "average"])
@pytest.mark.parametrize("rows", [1, 7, 12])
def test_reducescatter_goes_fast_with_upstreams_row_split(op, rows):
    """Rows that do not divide (7 at 2-4 ranks), fewer rows than ranks (1), scale factors: the coordinator's
    numbers, fast."""
    rank, size = hvd.rank(), hvd.size()
    reduce_op = hvd.Sum if op == "sum" else hvd.Average
    x = (np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) + rank) * (rank + 1)
    before = _matched()
    fast = hvd.reducescatter(x, op=reduce_op, prescale_factor=0.5, postscale_factor=3.0, name=f"fr.rs.{op}.{rows}")
    _expect_fast(before)
    slow = ops.reducescatter_async(x, name=f"fr.rs.slow.{op}.{rows}", op=reduce_op, prescale_factor=0.5,
                                   postscale_factor=3.0).wait()
    np.testing.assert_array_equal(fast, slow)
    mine = rows // size + (1 if rank < rows % size else 0)
    assert fast.shape == (mine, 3)


def test_torch_broadcast_allgather_and_reducescatter_go_fast():
    torch = pytest.importorskip("torch")
    import horovod.torch as hvd_torch

    rank, size = hvd.rank(), hvd.size()
    before = _matched()
    got = hvd_torch.broadcast(torch.full((7,), float(rank)), 0, name="fr.torch.bcast")
    assert got.tolist() == [0.0] * 7
    gathered = hvd_torch.allgather(torch.full((2,), rank, dtype=torch.int32), name="fr.torch.gather")
    assert gathered.tolist() == [r for r in range(size) for _ in range(2)] and gathered.dtype == torch.int32
    scattered = hvd_torch.reducescatter(torch.ones(size * 2, 3), op=hvd_torch.Sum, name="fr.torch.rs")
    assert scattered.tolist() == [[float(size)] * 3] * 2
    _expect_fast(before, 3)


def test_many_rounds_in_a_row_stay_fast_and_correct():
    rank, size = hvd.rank(), hvd.size()
    before = _matched()
    for i in range(200):
        got = hvd.allreduce(np.array([rank + i], np.int64), op=hvd.Sum, name="fr.loop")
        assert int(got[0]) == size * i + size * (size - 1) // 2, (i, got)
    _expect_fast(before, 200)


def test_a_rank_with_an_op_in_flight_sends_the_round_to_the_coordinator():
    """Rank 0 still has an async op in flight, so its records say SLOW; the others' fast round does not match,
    and they hand it to the coordinator. The async op was submitted after the blocking one on the other ranks:
    the coordinator matches by name, as it always did."""
    rank, size = hvd.rank(), hvd.size()
    x = np.full(8, rank + 1.0)
    if rank == 0:
        handle = ops.allreduce_async(x, name="fr.async", op=hvd.Sum)
        blocking = hvd.allreduce(x, op=hvd.Sum, name="fr.blocking")
        early = handle.wait()
    else:
        blocking = hvd.allreduce(x, op=hvd.Sum, name="fr.blocking")
        early = ops.allreduce_async(x, name="fr.async", op=hvd.Sum).wait()
    total = size * (size + 1) / 2
    np.testing.assert_array_equal(blocking, np.full(8, total))
    np.testing.assert_array_equal(early, np.full(8, total))
    before = _matched()                 # afterwards the ranks count alike again: the next round is fast
    hvd.allreduce(x, op=hvd.Sum, name="fr.after")
    _expect_fast(before)


def test_different_shapes_still_get_the_coordinators_error():
    rank, size = hvd.rank(), hvd.size()
    if size == 1:
        pytest.skip("a shape mismatch needs two ranks")
    expected = r"Mismatched ALLREDUCE tensor shapes for tensor .allreduce.fr.shapes.: rank 0 sent \[4\]; rank 1 sent \[5\]"
    with pytest.raises(HorovodInternalError, match=expected):
        hvd.allreduce(np.ones(4 + rank, np.float32), op=hvd.Sum, name="fr.shapes")
    before = _matched()
    hvd.allreduce(np.ones(2), op=hvd.Sum, name="fr.after.shapes")
    _expect_fast(before)


def test_two_threads_per_rank_in_any_order():
    """Each rank runs two threads of blocking allreduces on distinct names, plus async ones, in its own
    interleaving: records no longer line up, rounds fall back to the coordinator, and every result is right."""
    rank, size = hvd.rank(), hvd.size()
    errors = []

    def work(tag: str) -> None:
        try:
            for i in range(30):
                got = hvd.allreduce(np.array([rank + i], np.float64), op=hvd.Sum, name=f"fr.thread.{tag}.{i}")
                assert got[0] == size * i + size * (size - 1) / 2
                if i % 7 == 0:
                    h = ops.allreduce_async(np.ones(3), name=f"fr.thread.async.{tag}.{i}", op=hvd.Sum)
                    assert h.wait().tolist() == [size] * 3
                if rank == 0 and i % 5 == 0:
                    time.sleep(0.002)
        except Exception as exc:        # reported below, on the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    hvd.barrier()


def test_waits_poll_only_where_every_rank_on_the_machine_has_a_core():
    """Every rank of this job runs on this machine: the engine thread and the data plane's receives poll
    (HOROVOD_SPIN_MICROSECONDS) only when the ranks fit its cores, else they block at once."""
    from horovod.backends import spin
    from horovod.common import config

    configured = config.get("HOROVOD_SPIN_MICROSECONDS") / 1e6
    expected = configured if hvd.size() <= spin.cores() else 0.0
    engine = basics.engine_for(None)
    assert engine.spin_s == pytest.approx(expected)
    comm = getattr(engine.backend, "comm", None)
    if comm is not None:
        assert comm.spin_s == pytest.approx(expected)


def _split() -> int:
    fast = _fast()
    return fast.split if fast is not None else 0


def _rank_input(r, count, dtype, salt=0):
    return ((np.arange(count) * 7 + 3 * r + salt) % 13 + 1).astype(dtype)


@pytest.mark.parametrize("op", ["sum", "average", "min", "max", "product"])
@pytest.mark.parametrize("extra", [0, 1, 5])
def test_a_split_allreduce_gives_the_rank_order_numbers(op, extra):
    """From SPLIT_FROM bytes at three ranks and more an allreduce through the slots is split (each rank reduces its
    segment, then copies the peers'): its bits are those of every slot reduced in rank order, at sizes that do not
    divide among the ranks, for every op, with scale factors."""
    rank, size = hvd.rank(), hvd.size()
    count = SPLIT_FROM // 4 + size * 3 + extra
    reduce_op = {"sum": hvd.Sum, "average": hvd.Average, "min": hvd.Min, "max": hvd.Max,
                 "product": hvd.Product}[op]
    ufunc = {"sum": np.add, "average": np.add, "min": np.minimum, "max": np.maximum, "product": np.multiply}[op]
    pre, post = (0.5, 3.0) if op in ("sum", "average") else (1.0, 1.0)
    parts = [(_rank_input(r, count, np.float32) * np.float32(pre)) for r in range(size)]
    expected = parts[0].copy()
    for part in parts[1:]:
        ufunc(expected, part, out=expected)
    scale = post / size if op == "average" else post
    if scale != 1.0:
        expected *= np.float32(scale)
    before, split_before = _matched(), _split()
    got = hvd.allreduce(_rank_input(rank, count, np.float32), op=reduce_op, prescale_factor=pre,
                        postscale_factor=post, name=f"split.{op}.{extra}")
    np.testing.assert_array_equal(got, expected)
    fast = _fast()
    if fast is not None and not goes_direct(RequestType.ALLREDUCE, count * 4, size, fast.pids is not None,
                                            fast.roomy):
        _expect_fast(before)
        assert _split() == split_before + (1 if splits(RequestType.ALLREDUCE, count * 4, size, False) else 0)


def test_split_allreduces_in_a_row_in_place_and_into_strided_outputs():
    """Many split rounds in a row on both buffers, in place, into a new output and into a strided one, with a
    rank that arrives late now and then: every round's bits are the rank-order sum."""
    rank, size = hvd.rank(), hvd.size()
    count = SPLIT_FROM // 4 + 2 * size + 1
    for step in range(12):
        expected = _rank_input(0, count, np.float32, step).copy()
        for r in range(1, size):
            expected += _rank_input(r, count, np.float32, step)
        if step % 4 == rank % 4:
            time.sleep(0.002)
        mine = _rank_input(rank, count, np.float32, step)
        if step % 3 == 0:
            hvd.allreduce_(mine, op=hvd.Sum, name="split.row")
            got = mine
        elif step % 3 == 1:
            got = hvd.allreduce(mine, op=hvd.Sum, name="split.row")
        else:
            strided = np.zeros(2 * count, np.float32)[::2]
            with ops.blocking():
                ops.allreduce_async(mine, strided, name="split.row", op=hvd.Sum).wait()
            got = strided
        np.testing.assert_array_equal(got, expected, err_msg=f"step {step}")


# ---------------------------------------------------------------- grouped rounds
_GROUP_DTYPES = [np.float32, np.float64, np.int32, np.float16, np.float32]
_GROUP_COUNTS = [1, 7, 33, 100, 257]         # bytes that are and are not multiples of GROUP_ALIGN


def _group_inputs(rank: int, shift: int = 0):
    return [((np.arange(count) + i + shift) % 5 + rank + 1).astype(dtype).reshape(-1, 1) if count % 2 else
            ((np.arange(count) + i + shift) % 5 + rank + 1).astype(dtype).reshape(2, -1)
            for i, (dtype, count) in enumerate(zip(_GROUP_DTYPES, _GROUP_COUNTS))]


@pytest.mark.parametrize("op", ["sum", "average", "min", "max", "product"])
def test_a_grouped_allreduce_is_one_round_with_the_coordinators_numbers(op):
    """Members of mixed dtypes, shapes and sizes (some not a multiple of GROUP_ALIGN) go in one fast round and
    give, each, what the coordinator gives for the same group."""
    reduce_op = {"sum": hvd.Sum, "average": hvd.Average, "min": hvd.Min, "max": hvd.Max,
                 "product": hvd.Product}[op]
    xs = _group_inputs(hvd.rank())
    before = _matched()
    fast = hvd.grouped_allreduce(xs, op=reduce_op, name=f"fr.group.{op}")
    _expect_fast(before)
    with_coordinator = ops.grouped_allreduce_async(xs, None, f"fr.group.slow.{op}", reduce_op).wait()
    for got, expected, x in zip(fast, with_coordinator, xs):
        np.testing.assert_array_equal(got, expected)
        assert got.dtype == x.dtype and got.shape == x.shape


def test_grouped_rounds_in_place_with_scale_factors_and_in_a_row():
    """In place (the inputs are the outputs), scaled, and many in a row on the two buffers: each round's numbers
    are its own."""
    rank, size = hvd.rank(), hvd.size()
    before = _matched()
    for i in range(20):
        xs = [np.full(5, rank + i, np.float32), np.full((3, 3), rank - i, np.float64)]
        hvd.grouped_allreduce_(xs, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0, name="fr.group.inplace")
        ranks = size * (size - 1) / 2
        np.testing.assert_allclose(xs[0], np.full(5, 2.0 * (ranks + size * i)))
        np.testing.assert_allclose(xs[1], np.full((3, 3), 2.0 * (ranks - size * i)))
        got = hvd.allreduce(np.array([i], np.int64), op=hvd.Sum, name="fr.group.between")
        assert int(got[0]) == size * i
    _expect_fast(before, 40)


def test_a_group_larger_than_the_slots_goes_through_the_coordinator():
    """Members that fit a slot each but not together (or whose whole slots every rank would read past
    REDUCE_TOTAL_BYTES) take the coordinator, with the same numbers."""
    size = hvd.size()
    count = FAST_SLOT_BYTES // 4 // 2 + 16
    xs = [np.full(count, hvd.rank() + 1, np.float32), np.full(count, 2 * hvd.rank(), np.float32)]
    before = _matched()
    got = hvd.grouped_allreduce(xs, op=hvd.Sum, name="fr.group.large")
    _expect_fast(before, 0)
    np.testing.assert_array_equal(got[0], np.full(count, size * (size + 1) / 2, np.float32))
    np.testing.assert_array_equal(got[1], np.full(count, size * (size - 1), np.float32))


def test_groups_that_differ_between_ranks_do_not_match():
    """Rank 0's group has a member of another dtype: the keys differ, every rank sends its group to the
    coordinator, which reports the mismatch as it always did; the next group is fast again."""
    rank, size = hvd.rank(), hvd.size()
    if size == 1:
        pytest.skip("a mismatch needs two ranks")
    xs = [np.ones(4, np.float32), np.ones(4, np.float64 if rank == 0 else np.float32)]
    with pytest.raises(HorovodInternalError, match=r"Mismatched data types .*fr\.group\.dtypes_1of2"):
        hvd.grouped_allreduce(xs, op=hvd.Sum, name="fr.group.dtypes")
    before = _matched()
    got = hvd.grouped_allreduce([np.ones(4, np.float32), np.ones(2, np.int32)], op=hvd.Sum, name="fr.group.after")
    _expect_fast(before)
    np.testing.assert_array_equal(got[1], np.full(2, size, np.int32))


def test_torch_grouped_allreduces_go_fast():
    """horovod.torch's blocking grouped allreduces say they wait at once: one fast round each."""
    torch = pytest.importorskip("torch")
    import horovod.torch as hvd_torch

    size = hvd.size()
    before = _matched()
    got = hvd_torch.grouped_allreduce([torch.ones(3), torch.full((2, 2), 2.0)], op=hvd_torch.Sum,
                                      name="fr.group.torch")
    _expect_fast(before)
    assert got[1].tolist() == [[2.0 * size] * 2] * 2
    xs = [torch.ones(3), torch.ones(5, dtype=torch.float64)]
    hvd_torch.grouped_allreduce_(xs, op=hvd_torch.Sum, name="fr.group.torch_")
    _expect_fast(before, 2)
    assert xs[1].tolist() == [float(size)] * 5
