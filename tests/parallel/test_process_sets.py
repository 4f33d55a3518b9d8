"""Process sets at any number of ranks (contract section 2.11): every collective on a set, sets of unequal size,
a rank in several sets, overlapping and disjoint sets, add/remove in a loop with nothing left behind, and the
errors a user sees. Dynamic process sets are on (as upstream's own test files turn them on).

At 1 rank there is no set but the global one; the tests that need two sets skip there.
"""
import os
import threading

import numpy as np
import pytest

import horovod.numpy as hvd
from horovod.common.exceptions import HorovodInternalError
from tests.support.process_sets import temporary_sets  # turns dynamic process sets on, as upstream's files do


def halves():
    """The even and the odd ranks: disjoint sets, of unequal size at an odd number of ranks."""
    size = hvd.size()
    return [r for r in range(size) if r % 2 == 0], [r for r in range(size) if r % 2 == 1]


@pytest.fixture
def even_odd():
    if hvd.size() < 2:
        pytest.skip("needs 2 ranks for two process sets")
    even, odd = (hvd.add_process_set(ranks) for ranks in halves())
    yield even, odd
    assert hvd.remove_process_set(odd) and hvd.remove_process_set(even)


def mine(sets):
    return next(ps for ps in sets if ps.included())


def test_process_set_attributes(even_odd):
    even, odd = even_odd
    rank = hvd.rank()
    assert even.process_set_id is not None and odd.process_set_id not in (None, 0, even.process_set_id)
    assert even.ranks == halves()[0] and odd.ranks == halves()[1]
    assert even.included() == (rank % 2 == 0) and odd.included() == (rank % 2 == 1)
    own = mine(even_odd)
    assert own.rank() == own.ranks.index(rank) and own.size() == len(own.ranks)
    other = odd if own is even else even
    assert other.rank() is None and other.size() == len(other.ranks)
    assert hvd.global_process_set.process_set_id == 0 and hvd.global_process_set.ranks == list(range(hvd.size()))
    assert hvd.global_process_set.size() == hvd.size() and hvd.global_process_set.rank() == rank
    assert "process_set_id=" in str(even)


def test_every_collective_on_disjoint_sets(even_odd):
    rank = hvd.rank()
    ps = mine(even_odd)
    ranks, n = ps.ranks, ps.size()
    total = sum(ranks)
    out = hvd.allreduce(np.full((2, 3), float(rank)), op=hvd.Sum, name="ar", process_set=ps)
    np.testing.assert_array_equal(out, np.full((2, 3), float(total)))
    avg = hvd.allreduce(np.full(5, float(rank), np.float32), name="avg", process_set=ps)
    np.testing.assert_allclose(avg, np.full(5, total / n, np.float32))
    grouped = hvd.grouped_allreduce([np.full(3, float(rank)), np.full(7, 2.0 * rank)], op=hvd.Sum, name="gar",
                                    process_set=ps)
    np.testing.assert_array_equal(grouped[0], np.full(3, float(total)))
    np.testing.assert_array_equal(grouped[1], np.full(7, 2.0 * total))
    gathered = hvd.allgather(np.full((rank + 1, 2), rank), name="ag", process_set=ps)
    expected = np.concatenate([np.full((r + 1, 2), r) for r in ranks])
    np.testing.assert_array_equal(gathered, expected)
    parts = hvd.grouped_allgather([np.full(1, rank), np.full((2, 2), rank)], name="gag", process_set=ps)
    np.testing.assert_array_equal(parts[0], np.array(ranks))
    np.testing.assert_array_equal(parts[1], np.concatenate([np.full((2, 2), r) for r in ranks]))
    root = ranks[-1]                                 # the root is a global rank
    got = hvd.broadcast(np.full(4, rank), root_rank=root, name="bc", process_set=ps)
    np.testing.assert_array_equal(got, np.full(4, root))
    out, received = hvd.alltoall(np.repeat(np.arange(n), 2) + 100 * rank, splits=[2] * n, name="a2a",
                                 process_set=ps)
    np.testing.assert_array_equal(out, np.concatenate([np.full(2, ps.rank()) + 100 * r for r in ranks]))
    assert list(received) == [2] * n
    equal = hvd.alltoall(np.arange(n) + 10 * rank, name="a2a.equal", process_set=ps)     # splits from the set size
    np.testing.assert_array_equal(equal, np.array([ps.rank() + 10 * r for r in ranks]))
    block = hvd.reducescatter(np.arange(2 * n, dtype=np.float64) * (rank + 1), op=hvd.Sum, name="rs",
                              process_set=ps)
    k = ps.rank()
    np.testing.assert_array_equal(block, np.arange(2 * n)[2 * k:2 * k + 2] * sum(r + 1 for r in ranks))
    blocks = hvd.grouped_reducescatter([np.ones((n, 2)) * rank], op=hvd.Sum, name="grs", process_set=ps)
    np.testing.assert_array_equal(blocks[0], np.full((1, 2), float(total)))
    hvd.barrier(process_set=ps)
    assert hvd.broadcast_object({"from": rank}, root_rank=root, process_set=ps) == {"from": root}
    assert hvd.allgather_object(rank * 10, process_set=ps) == [r * 10 for r in ranks]


def test_each_set_runs_on_the_data_plane_the_job_expects(even_odd):
    """The outer test says which plane the job uses (shm, tcp, hierarchical, mpi): a set of two or more ranks
    gets one of the same kind, of its own."""
    from horovod.core import basics

    expected = os.environ.get("HVD_TEST_EXPECT_DATA_PLANE")
    ps = mine(even_odd)
    if not expected or expected == "local" or ps.size() < 2:
        pytest.skip("the outer test did not say which data plane to expect, or this rank's set has one rank")
    backend = basics.engine_for(ps).backend
    assert backend.name == expected and backend is not basics.engine().backend, (backend.name, expected)
    assert backend.size == ps.size() and backend.rank == ps.rank()


def test_a_rank_outside_the_set_gets_value_error_at_the_call(even_odd):
    even, odd = even_odd
    other = odd if even.included() else even
    for call in (lambda: hvd.allreduce(np.ones(2), process_set=other),
                 lambda: hvd.allgather(np.ones(2), process_set=other),
                 lambda: hvd.broadcast(np.ones(2), root_rank=other.ranks[0], process_set=other),
                 lambda: hvd.barrier(process_set=other)):
        with pytest.raises(ValueError, match=rf"Rank {hvd.rank()} is not in process set {other.process_set_id}"):
            call()


def test_an_unregistered_set_is_refused():
    with pytest.raises(ValueError, match="is not registered"):
        hvd.allreduce(np.ones(2), process_set=hvd.ProcessSet([0]))


def test_overlapping_sets_and_the_same_name_in_two_sets_at_once():
    size, rank = hvd.size(), hvd.rank()
    if size < 3:
        pytest.skip("needs 3 ranks for two overlapping sets that differ from the global set")
    with temporary_sets([0, 1], range(1, size)) as (low, high):
        handles = []
        for ps in (low, high):               # rank 1 is in both: the same name is in flight in both sets
            if ps.included():
                handles.append((ps, hvd.allreduce_async(np.full(3, float(rank)), op=hvd.Sum, name="shared",
                                                        process_set=ps)))
        for ps, handle in handles:
            np.testing.assert_array_equal(hvd.synchronize(handle), np.full(3, float(sum(ps.ranks))))


def test_a_stalled_set_does_not_block_another():
    """Rank 0 submits on set [0, 1], which rank 1 holds back; meanwhile every rank completes collectives on the
    global set (and, at 4 ranks, ranks 2 and 3 on a set of their own)."""
    size, rank = hvd.size(), hvd.rank()
    if size < 3:
        pytest.skip("needs 3 ranks for a set that differs from the global set and has two members")
    held = hvd.add_process_set([0, 1])
    other = hvd.add_process_set([2, 3]) if size >= 4 else None
    try:
        pending = hvd.allreduce_async(np.ones(2), op=hvd.Sum, name="held", process_set=held) if rank == 0 else None
        for i in range(3):
            np.testing.assert_array_equal(hvd.allreduce(np.ones(2), op=hvd.Sum, name=f"free.{i}"),
                                          np.full(2, float(size)))
            if other is not None and other.included():
                np.testing.assert_array_equal(hvd.allreduce(np.ones(2), op=hvd.Sum, name=f"free.{i}",
                                                            process_set=other), np.full(2, 2.0))
        assert pending is None or not hvd.poll(pending)      # still held back by rank 1
        hvd.barrier()
        if rank == 1:
            hvd.allreduce(np.ones(2), op=hvd.Sum, name="held", process_set=held)
        if pending is not None:
            np.testing.assert_array_equal(hvd.synchronize(pending), np.full(2, 2.0))
    finally:
        if other is not None:
            assert hvd.remove_process_set(other)
        assert hvd.remove_process_set(held)


def test_a_mismatch_inside_a_set_names_the_ranks_by_their_global_rank(even_odd):
    ps = even_odd[1]                           # the odd ranks: their global ranks differ from their set ranks
    if not ps.included():
        return
    if ps.size() < 2:
        pytest.skip("needs two odd ranks")
    shape = (2 + ps.rank(),)
    with pytest.raises(HorovodInternalError) as info:
        hvd.allreduce(np.ones(shape), name="mismatch", process_set=ps)
    message = str(info.value)
    assert "Mismatched ALLREDUCE tensor shapes" in message
    assert f"rank {ps.ranks[0]} sent [2]" in message and f"rank {ps.ranks[1]} sent [3]" in message, message


def test_removing_a_set_with_collectives_in_flight_names_the_set():
    size, rank = hvd.size(), hvd.rank()
    if size < 3:
        pytest.skip("needs 3 ranks for a two-member set that differs from the global set")
    ps = hvd.add_process_set([0, 1])
    pending = hvd.allreduce_async(np.ones(2), op=hvd.Sum, name="inflight", process_set=ps) if rank == 0 else None
    with pytest.raises(ValueError, match=rf"Cannot remove process set {ps.process_set_id} \(ranks \[0, 1\]\): "
                                         r"collectives are still in flight on it \(rank 0: \S*inflight"):
        hvd.remove_process_set(ps)           # every rank raises, the ranks that have nothing in flight too
    assert ps.process_set_id is not None
    if rank == 1:
        hvd.allreduce(np.ones(2), op=hvd.Sum, name="inflight", process_set=ps)
    if pending is not None:
        np.testing.assert_array_equal(hvd.synchronize(pending), np.full(2, 2.0))
    assert hvd.remove_process_set(ps)
    assert ps.process_set_id is None and not hvd.remove_process_set(ps)


def test_add_remove_in_a_loop_leaves_nothing_behind():
    if hvd.size() < 2:
        pytest.skip("needs 2 ranks")

    def resources():
        with open("/proc/self/maps") as maps:
            mapped = sum(1 for line in maps if "/dev/shm/horovod" in line)
        return len(os.listdir("/proc/self/fd")), threading.active_count(), mapped

    def one_round(i):
        sets = [hvd.add_process_set(ranks) for ranks in halves() if ranks]
        for ps in sets:
            if ps.included():
                hvd.allreduce(np.ones(1000, np.float32), name=f"loop.{i}", process_set=ps)
        for ps in reversed(sets):
            assert hvd.remove_process_set(ps)

    one_round(0)                              # the first round may start lazily made helpers (sender threads)
    hvd.barrier()
    before = resources()
    for i in range(1, 6):
        one_round(i)
    hvd.barrier()
    assert resources() == before, f"before {before}, after {resources()} (fds, threads, shm mappings)"


def test_duplicates_and_bad_ranks_are_refused():
    size = hvd.size()
    with pytest.raises(ValueError, match="duplicate process set"):
        hvd.add_process_set(list(range(size)))          # the global set has these ranks
    with pytest.raises(ValueError, match=rf"not ranks of this job \(valid ranks are 0..{size - 1}\)"):
        hvd.add_process_set([0, size])
    assert not hvd.remove_process_set(hvd.global_process_set)
    if size >= 2:
        with temporary_sets([1]), pytest.raises(ValueError, match="duplicate process set"):
            hvd.add_process_set(hvd.ProcessSet([1]))


def test_a_one_rank_set_runs_its_collectives_alone():
    size, rank = hvd.size(), hvd.rank()
    if size < 2:
        pytest.skip("needs 2 ranks")
    with temporary_sets(*[[r] for r in range(size)]) as sets:
        ps = sets[rank]
        np.testing.assert_array_equal(hvd.allreduce(np.full(3, float(rank)), process_set=ps), np.full(3, rank))
        np.testing.assert_array_equal(hvd.allgather(np.full(2, rank), process_set=ps), np.full(2, rank))


def test_join_on_a_set_with_uneven_work(even_odd):
    """Members of a set run different numbers of steps, then join the set: a joined member contributes zeros, and
    join returns the (global) rank that joined last, on every member."""
    ps = mine(even_odd)
    position, n = ps.rank(), ps.size()
    for step in range(position + 1):
        out = hvd.allreduce(np.ones(2), op=hvd.Sum, name=f"uneven.{step}", process_set=ps)
        np.testing.assert_array_equal(out, np.full(2, float(n - step)))
    assert hvd.join(process_set=ps) == ps.ranks[-1]


def test_unnamed_collectives_are_numbered_per_set(even_odd):
    """The even ranks run two unnamed collectives on their set, the odd ranks one on theirs; an unnamed collective
    on the global set then still has the same name on every rank (upstream numbers per process, and would not)."""
    even, _ = even_odd
    ps = mine(even_odd)
    for _ in range(2 if ps is even else 1):
        hvd.allreduce(np.ones(2), op=hvd.Sum, process_set=ps)
    np.testing.assert_array_equal(hvd.allreduce(np.ones(2), op=hvd.Sum), np.full(2, float(hvd.size())))
