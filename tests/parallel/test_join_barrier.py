"""Barrier and join at any number of ranks (upstream's join semantics, contract section 2.10)."""
import time

import numpy as np
import pytest

import horovod.numpy as hvd
from tests.support.timing import SLACK_S


def test_barrier():
    for _ in range(3):
        hvd.barrier()
    hvd.barrier(process_set=hvd.global_process_set)


def test_barrier_waits_for_the_slowest_rank():
    rank, size = hvd.rank(), hvd.size()
    if size == 1:
        start = time.monotonic()
        hvd.barrier()
        assert time.monotonic() - start < SLACK_S     # alone, a barrier does not wait
        return
    hvd.barrier()                                    # line everyone up first
    start = time.monotonic()
    if rank == size - 1:
        time.sleep(0.6)
    hvd.barrier()
    waited = time.monotonic() - start
    assert waited >= 0.3, f"rank {rank} left the barrier after {waited:.3f}s, before the slow rank arrived"


def wait_until_everyone_else_joined(tag):
    """Return only after every other rank has called join(): an allreduce that only this rank submits can
    complete only once every other rank has joined (joined ranks count as ready)."""
    hvd.allreduce(np.zeros(1), op=hvd.Sum, name=f"join.last.{tag}")


def test_join_with_uneven_work():
    rank, size = hvd.rank(), hvd.size()
    for k in range(rank + 1):                        # rank r runs r + 1 steps; steps >= 1 happen after joins
        participants = size - k                      # ranks k..size-1 still run step k
        t = np.full(4, 2.0 * (k + 1), np.float32)
        avg = hvd.allreduce(t, op=hvd.Average, name=f"join.avg.{k}")
        np.testing.assert_allclose(avg, t * participants / size, rtol=1e-6,
                                   err_msg=f"step {k}: joined ranks must contribute zeros to Average")
        total = hvd.allreduce(t, op=hvd.Sum, name=f"join.sum.{k}")
        np.testing.assert_allclose(total, t * participants, rtol=1e-6)
        grouped = hvd.grouped_allreduce([t, np.full(2, k + 1, np.int32)], op=hvd.Sum, name=f"join.grp.{k}")
        np.testing.assert_array_equal(grouped[1], np.full(2, (k + 1) * participants))
        in_place = np.full(3, 1.0)
        hvd.allreduce_(in_place, op=hvd.Average, name=f"join.inplace.{k}")
        np.testing.assert_allclose(in_place, np.full(3, participants / size))
    # The highest rank did the most steps: its last step completed only after every other rank joined.
    last = hvd.join()
    assert last == size - 1, f"join() returned {last} on rank {rank}; the last rank to join was {size - 1}"
    assert hvd.allgather(np.array([last])).tolist() == [size - 1] * size
    # After everyone joined, the job carries on normally.
    np.testing.assert_array_equal(hvd.allreduce(np.ones(2), op=hvd.Sum), np.full(2, size))


def test_join_returns_the_same_last_rank_everywhere():
    rank, size = hvd.rank(), hvd.size()
    for round_ in range(3):
        last_rank = (round_ + 1) % size               # a different rank joins last each round
        if rank == last_rank:
            wait_until_everyone_else_joined(round_)
        result = hvd.join()
        assert result == last_rank
        assert hvd.allgather(np.array([result], np.int64)).tolist() == [last_rank] * size


def test_join_with_no_work_everywhere():
    size = hvd.size()
    result = hvd.join()
    assert 0 <= result < size
    assert hvd.allgather(np.array([result])).tolist() == [result] * size


def test_collectives_other_than_allreduce_fail_while_a_rank_has_joined():
    rank, size = hvd.rank(), hvd.size()
    if size == 1:
        pytest.skip("needs a rank that has joined and one that has not")
    if rank == 0:
        assert hvd.join() == size - 1
    else:
        attempts = {
            "Allgather": lambda: hvd.allgather(np.ones((1, 2), np.float32), name="joined.allgather"),
            "Broadcast": lambda: hvd.broadcast(np.ones(2, np.float32), root_rank=1, name="joined.broadcast"),
            "Alltoall": lambda: hvd.alltoall(np.ones(size, np.float32), name="joined.alltoall"),
            "Reducescatter": lambda: hvd.reducescatter(np.ones(size, np.float32), op=hvd.Sum,
                                                       name="joined.reducescatter"),
        }
        for what, attempt in attempts.items():
            with pytest.raises(RuntimeError) as info:
                attempt()
            assert isinstance(info.value, hvd.HorovodInternalError)
            message = str(info.value)
            assert what in message and "Join" in message, message
            assert "rank(s) 0" in message or "rank 0" in message, message
        # An allreduce still works, with rank 0 contributing zeros.
        out = hvd.allreduce(np.ones(3), op=hvd.Average, name="joined.allreduce")
        np.testing.assert_allclose(out, np.full(3, (size - 1) / size))
        if rank == size - 1:
            wait_until_everyone_else_joined("errors")
        assert hvd.join() == size - 1
    # Everyone joined: allgather works again.
    np.testing.assert_array_equal(hvd.allgather(np.array([rank])), np.arange(size))
