"""Direct fast rounds (core/engine/fast_rounds.py) in one process: two ranks' sides on one shared area, each in a
thread, copying by process_vm_readv/writev to and from this very process (a process may read its own memory)."""
import os
from typing import List, Optional

import numpy as np
import pytest

from horovod.backends import cma
from horovod.backends.shm import FAST_SLOT_BYTES, fast_area_bytes
from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import RequestType, data_type_of
from horovod.core.controller.messages import make_request
from horovod.core.engine import fast_rounds
from horovod.core.engine.entry import Entry
from horovod.core.engine.handles import Handle
from tests.support.fast_rounds import RunningEngine, each_rank_in_a_thread


def _may_copy() -> bool:
    token = np.frombuffer(os.urandom(16), np.uint8).copy()
    return cma.probe(os.getpid(), cma.address(token), token.tobytes()) is None


pytestmark = pytest.mark.skipif(not fast_rounds.supported() or not _may_copy(),
                                reason="fast rounds need a futex and x86-64; direct ones, cross-memory copies")



def _sides(pids: Optional[List[int]], roomy=(True, True), size: int = 2) -> List[fast_rounds.FastRounds]:
    """``size`` ranks' sides (two by default); ``roomy``: whether each believes every rank has a core of its
    own."""
    area = np.zeros(fast_area_bytes(size), np.uint8)
    if pids is not None:
        pids = [pids[0]] * size
    sides = [fast_rounds.FastRounds(area, r, size, list(range(size)), pids) for r in range(size)]
    for side, own_core in zip(sides, roomy):
        side.roomy = own_core
    return sides


def _entry(rtype: RequestType, tensor: np.ndarray, output, root: int = -1, **scales) -> Entry:
    request = make_request("t", rtype, data_type_of(tensor.dtype), tensor.shape, root=root, **scales)
    return Entry(request, tensor, output, Handle("t"))


def _broadcasts(count: int):
    """Rank 0 broadcasts ``count`` floats to rank 1: (the source, rank 1's output, both ranks' entries)."""
    source = np.arange(count, dtype=np.float32)
    received = np.zeros(count, np.float32)
    return source, received, [_entry(RequestType.BROADCAST, source, source, root=0),
                              _entry(RequestType.BROADCAST, np.zeros(count, np.float32), received, root=0)]


def _round(sides, entries) -> List[object]:
    """Every rank posts and resolves one round, each in a thread; returns what each resolve gave or raised."""
    results: List[object] = [None] * len(sides)

    def run(r: int) -> None:
        side, entry = sides[r], entries[r]
        key = side.key(entry.request, entry.tensor.nbytes)
        assert key is not None
        k = side.post_fast(entry, key)
        side.ring()
        try:
            results[r] = side.resolve(k, key, entry, RunningEngine())
        except HorovodInternalError as exc:
            results[r] = exc

    each_rank_in_a_thread(len(sides), run, "a direct round")
    return results


@pytest.mark.parametrize("count", [fast_rounds.DIRECT_FROM[RequestType.BROADCAST] // 4, 3 * FAST_SLOT_BYTES // 4 + 3])
def test_broadcast_copies_straight_into_the_other_ranks_output(count):
    sides = _sides([os.getpid()] * 2)
    source, received, entries = _broadcasts(count)
    assert _round(sides, entries) == [True, True]
    np.testing.assert_array_equal(received, source)
    assert [s.direct for s in sides] == [1, 1]


def test_allgather_reads_each_peers_input():
    sides = _sides([os.getpid()] * 2)
    rows = fast_rounds.DIRECT_FROM[RequestType.ALLGATHER] // 16 + 1
    inputs = [np.full((rows, 2), r + 1.0) for r in range(2)]
    entries = [_entry(RequestType.ALLGATHER, x, None) for x in inputs]
    assert _round(sides, entries) == [True, True]
    for entry in entries:
        np.testing.assert_array_equal(entry.output, np.concatenate(inputs))


# Element counts that do not split evenly among the ranks; float32 beyond what the slots take at 2 to 8 ranks.
@pytest.mark.parametrize("size", [2, 3, 5, 8])
@pytest.mark.parametrize("count", [fast_rounds.REDUCE_TOTAL_BYTES // 4 // 2 + 1, FAST_SLOT_BYTES // 4 + 7])
def test_allreduce_reduces_its_segment_and_writes_it_into_every_peer(size, count):
    sides = _sides([os.getpid()], roomy=(True,) * size, size=size)
    inputs = [np.arange(count, dtype=np.float32) * (r + 1) + r for r in range(size)]
    outputs = [np.full(count, -1.0, np.float32) for _ in range(size)]
    entries = [_entry(RequestType.ALLREDUCE, x, out) for x, out in zip(inputs, outputs)]
    assert _round(sides, entries) == [True] * size
    expected = inputs[0] + inputs[1]
    for x in inputs[2:]:
        expected += x
    for out in outputs:
        np.testing.assert_array_equal(out, expected)
    assert [s.direct for s in sides] == [1] * size


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("prescale", [1.0, 0.5])
def test_allreduce_in_place_with_scale_factors(size, prescale):
    """The output is the input on every rank (each rank's segment is read only by the rank that reduces it) and
    the scale factors give the data plane's numbers; the third rank's own part must survive its own output."""
    sides = _sides([os.getpid()], roomy=(True,) * size, size=size)
    count = FAST_SLOT_BYTES // 8 + 5
    values = [r * r + 1.0 for r in range(size)]     # 1, 2, 5: no rank's value is the sum of the ones before
    buffers = [np.full(count, v) for v in values]
    entries = [_entry(RequestType.ALLREDUCE, x, x, prescale=prescale, postscale=3.0) for x in buffers]
    assert _round(sides, entries) == [True] * size
    for x in buffers:
        np.testing.assert_array_equal(x, np.full(count, 3.0 * prescale * sum(values)))


def test_allreduce_into_a_strided_output_goes_through_a_scratch_array():
    sides = _sides([os.getpid()])
    count = FAST_SLOT_BYTES // 4 + 1
    inputs = [np.full(count, r + 2.0, np.float32) for r in range(2)]
    outputs = [np.zeros(2 * count, np.float32)[::2] for _ in range(2)]
    assert _round(sides, [_entry(RequestType.ALLREDUCE, x, out) for x, out in zip(inputs, outputs)]) == [True, True]
    for out in outputs:
        np.testing.assert_array_equal(out, np.full(count, 5.0, np.float32))


@pytest.mark.parametrize("size", [2, 3, 5, 8])
def test_reducescatter_reads_its_rows_of_every_peer(size):
    """Rows that do not split evenly (upstream's split: the first ranks one row more), beyond a slot."""
    sides = _sides([os.getpid()], roomy=(True,) * size, size=size)
    rows = FAST_SLOT_BYTES // 24 + size + 1
    inputs = [np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) * (r + 1) for r in range(size)]
    entries = [_entry(RequestType.REDUCESCATTER, x, None, postscale=0.5) for x in inputs]
    assert _round(sides, entries) == [True] * size
    total = sum(inputs) * 0.5
    start = 0
    for r, entry in enumerate(entries):
        mine = rows // size + (1 if r < rows % size else 0)
        np.testing.assert_array_equal(entry.output, total[start:start + mine])
        start += mine
    assert [s.direct for s in sides] == [1] * size


@pytest.mark.parametrize("rtype", [RequestType.ALLREDUCE, RequestType.REDUCESCATTER, RequestType.ALLGATHER,
                                   RequestType.BROADCAST])
def test_every_size_past_the_slots_goes_direct(rtype):
    """No upper limit: a 1 GiB reduction or gather is as direct as one just past the slots (the data plane's
    chunks were slower at 64-256 MB, three times slower beside busy cores)."""
    sides = _sides([os.getpid()])
    for nbytes in [FAST_SLOT_BYTES + 4, 16 << 20, 1 << 30]:
        request = make_request("t", rtype, data_type_of(np.dtype(np.float32)), [nbytes // 4], root=0)
        key = sides[0].key(request, nbytes)
        assert key is not None and key.endswith(fast_rounds.DIRECT_MARK)


# Pieces of an odd number of bytes, so that none holds a whole number of elements of 8 bytes and the last is short.
@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("in_place", [False, True])
def test_a_direct_reduction_in_small_pieces_gives_the_same_numbers(monkeypatch, size, in_place):
    """A segment read, reduced and written piece by piece: every piece's elements reduced in rank order with
    the scale factors, in place too (where the third rank's own piece must survive its output), for an allreduce
    and a reducescatter whose rows do not divide among the ranks."""
    monkeypatch.setattr(fast_rounds, "DIRECT_PIECE_BYTES", 20_003)
    count = FAST_SLOT_BYTES // 8 + 5
    values = [np.arange(count, dtype=np.float64) * (r + 1) + r * r for r in range(size)]
    expected = 3.0 * 0.5 * sum(values)
    buffers = [v.copy() for v in values]
    outputs = buffers if in_place else [np.full(count, np.nan) for _ in range(size)]
    sides = _sides([os.getpid()], roomy=(True,) * size, size=size)
    entries = [_entry(RequestType.ALLREDUCE, x, out, prescale=0.5, postscale=3.0) for x, out in zip(buffers, outputs)]
    assert _round(sides, entries) == [True] * size
    for out in outputs:
        np.testing.assert_array_equal(out, expected)

    rows = count // 3
    inputs = [v[:rows * 3].reshape(rows, 3) for v in values]
    sides = _sides([os.getpid()], roomy=(True,) * size, size=size)
    entries = [_entry(RequestType.REDUCESCATTER, x, None, prescale=0.5, postscale=3.0) for x in inputs]
    assert _round(sides, entries) == [True] * size
    total, start = 3.0 * 0.5 * sum(inputs), 0
    for r, entry in enumerate(entries):
        mine = rows // size + (1 if r < rows % size else 0)
        np.testing.assert_array_equal(entry.output, total[start:start + mine])
        start += mine
    assert all(s.direct == 1 for s in sides)


@pytest.mark.parametrize("rtype, start", [(RequestType.ALLGATHER, fast_rounds.DIRECT_FROM[RequestType.ALLGATHER]),
                                          (RequestType.REDUCESCATTER, fast_rounds.DIRECT_ALLREDUCE_FROM),
                                          (RequestType.ALLREDUCE, fast_rounds.DIRECT_ALLREDUCE_FROM)])
def test_where_every_rank_has_a_core_the_middle_sizes_go_direct_from_their_threshold(rtype, start):
    """An allgather from DIRECT_FROM bytes per rank (the slots copy three times, a direct round twice), an
    allreduce and a reducescatter from DIRECT_ALLREDUCE_FROM; just below, or where the ranks share cores, the
    slots."""
    for size in (2, 3, 4):
        assert fast_rounds.goes_direct(rtype, start, size, True, roomy=True)
        assert not fast_rounds.goes_direct(rtype, start - 4, size, True, roomy=True)
        assert not fast_rounds.goes_direct(rtype, start, size, False, roomy=True)
    if rtype != RequestType.ALLREDUCE:      # beyond REDUCE_TOTAL_BYTES an allreduce goes direct on shared cores too
        assert not fast_rounds.goes_direct(rtype, start, 2, True, roomy=False)
    assert start < FAST_SLOT_BYTES


def test_below_the_threshold_the_slots_carry_the_data():
    sides = _sides([os.getpid()] * 2)
    small, out, entries = _broadcasts(16)
    assert _round(sides, entries) == [True, True]
    np.testing.assert_array_equal(out, small)
    assert [s.direct for s in sides] == [0, 0]


def test_with_more_ranks_than_cores_only_what_outgrows_a_slot_goes_direct():
    sides = _sides([os.getpid()] * 2, roomy=(False, False))
    for count, direct in [(fast_rounds.DIRECT_FROM[RequestType.BROADCAST] // 4, 0), (FAST_SLOT_BYTES // 4 + 1, 1)]:
        source, received, entries = _broadcasts(count)
        assert _round(sides, entries) == [True, True]
        np.testing.assert_array_equal(received, source)
        assert [s.direct for s in sides] == [direct, direct]


@pytest.mark.parametrize("size", [3, 4])
def test_with_more_ranks_than_cores_an_allreduce_past_the_slots_reduction_limit_is_split(size):
    """Its whole-slot round would have every rank reduce all ``size`` slots: while it fits a slot it is split
    instead (each rank reduces its segment: it reads the slots' bytes once), and beyond a slot it goes direct,
    whatever the cores; a broadcast of the same bytes takes the slots."""
    nbytes = (fast_rounds.REDUCE_TOTAL_BYTES // size // 4 + 1) * 4       # whole float32s
    assert fast_rounds.SPLIT_FROM <= nbytes <= FAST_SLOT_BYTES
    assert not fast_rounds.goes_direct(RequestType.ALLREDUCE, nbytes, size, True, roomy=False)
    assert fast_rounds.splits(RequestType.ALLREDUCE, nbytes, size, False)
    assert fast_rounds.goes_direct(RequestType.ALLREDUCE, FAST_SLOT_BYTES + 4, size, True, roomy=False)
    assert not fast_rounds.splits(RequestType.ALLREDUCE, FAST_SLOT_BYTES + 4, size, False)
    assert not fast_rounds.goes_direct(RequestType.BROADCAST, nbytes, size, True, roomy=False)
    for count, direct, split in [(nbytes // 4, 0, 1), (FAST_SLOT_BYTES // 4 + 1, 1, 0)]:
        sides = _sides([os.getpid()] * size, roomy=(False,) * size, size=size)
        tensors = [np.arange(count, dtype=np.float32) * (r + 1) for r in range(size)]
        entries = [_entry(RequestType.ALLREDUCE, t, np.empty_like(t)) for t in tensors]
        assert _round(sides, entries) == [True] * size
        assert [(s.direct, s.split) for s in sides] == [(direct, split)] * size
        for entry in entries:
            np.testing.assert_array_equal(entry.output,
                                          np.arange(count, dtype=np.float32) * sum(range(1, size + 1)))


@pytest.mark.parametrize("size", [2, 3, 4])
def test_only_three_ranks_and_more_split_and_only_from_split_from_to_a_slot(size):
    """A split round costs a second wait: at two ranks every rank's reduction is the whole buffer either way, and
    below SPLIT_FROM the wait costs more than the reading it saves. Split or not is part of the key."""
    at = fast_rounds.SPLIT_FROM
    expected = size >= 3
    assert fast_rounds.splits(RequestType.ALLREDUCE, at, size, False) == expected
    assert not fast_rounds.splits(RequestType.ALLREDUCE, at - 4, size, False)
    assert not fast_rounds.splits(RequestType.ALLREDUCE, at, size, True)
    assert not fast_rounds.splits(RequestType.REDUCESCATTER, at, size, False)
    request = make_request("t", RequestType.ALLREDUCE, data_type_of(np.dtype(np.float32)), (at // 4,))
    key = fast_rounds.key_of(request, at, list(range(size)))
    assert key.endswith(fast_rounds.SPLIT_MARK) == expected


def test_ranks_that_choose_different_paths_do_not_match():
    """One rank would copy directly, the other through the slots (their cores differ): the keys differ, so both
    hand the op to the coordinator rather than run two protocols against each other."""
    sides = _sides([os.getpid()] * 2, roomy=(True, False))
    _, _, entries = _broadcasts(fast_rounds.DIRECT_FROM[RequestType.BROADCAST] // 4)
    assert _round(sides, entries) == [False, False]
    assert [s.matched for s in sides] == [0, 0]


def test_without_cross_memory_a_large_broadcast_must_fit_a_slot():
    sides = _sides(None)
    request = make_request("t", RequestType.BROADCAST, data_type_of(np.dtype(np.float32)), [FAST_SLOT_BYTES], root=0)
    assert sides[0].key(request, FAST_SLOT_BYTES * 4) is None
    assert sides[0].key(request, FAST_SLOT_BYTES) is not None


def _missing_pid() -> int:
    """A process id that no process has."""
    missing = 4_194_000
    while True:
        try:
            os.kill(missing, 0)
            missing -= 1
        except ProcessLookupError:
            return missing
        except PermissionError:
            missing -= 1


def test_a_failed_copy_names_the_peer_and_the_tensor_and_the_round_still_closes():
    """Rank 0 (the root) cannot write into rank 1 (a process id that does not exist): its call fails with the
    peer's rank and the tensor; rank 1, which reads from a live process, completes, and neither hangs."""
    sides = _sides([os.getpid()] * 2)
    sides[0].pids = [os.getpid(), _missing_pid()]      # only rank 0 sees rank 1 as that process
    _, _, entries = _broadcasts(2 * fast_rounds.DIRECT_FROM[RequestType.BROADCAST] // 4)
    results = _round(sides, entries)
    assert isinstance(results[0], HorovodInternalError)
    assert "broadcast of tensor 't' could not copy to or from rank 1's memory" in str(results[0])
    assert results[1] is True


def test_a_failed_read_of_a_direct_allreduce_names_the_peer_and_the_round_still_closes():
    """Rank 0 cannot read rank 1's input (a process id that does not exist): its allreduce fails naming rank 1
    and the tensor; rank 1, whose peer is a live process, completes; neither hangs."""
    sides = _sides([os.getpid()] * 2)
    sides[0].pids = [os.getpid(), _missing_pid()]
    count = FAST_SLOT_BYTES // 4 + 1
    entries = [_entry(RequestType.ALLREDUCE, np.ones(count, np.float32), np.zeros(count, np.float32))
               for _ in range(2)]
    results = _round(sides, entries)
    assert isinstance(results[0], HorovodInternalError)
    assert "allreduce of tensor 't' could not copy to or from rank 1's memory" in str(results[0])
    assert results[1] is True


@pytest.mark.parametrize("size", [2, 3])
def test_where_every_rank_has_a_core_an_allreduce_goes_direct_from_its_threshold(size):
    """From DIRECT_ALLREDUCE_FROM an allreduce that the slots could take still goes direct where every rank has a
    core (it moves half their bytes), and gives every rank the sum; just below, or where the ranks outnumber the
    cores, it takes the slots."""
    at = fast_rounds.DIRECT_ALLREDUCE_FROM
    assert at * size <= fast_rounds.REDUCE_TOTAL_BYTES and at <= FAST_SLOT_BYTES     # the slots could take it
    assert fast_rounds.goes_direct(RequestType.ALLREDUCE, at, size, True, roomy=True)
    assert not fast_rounds.goes_direct(RequestType.ALLREDUCE, at - 4, size, True, roomy=True)
    assert not fast_rounds.goes_direct(RequestType.ALLREDUCE, at, size, True, roomy=False)
    assert not fast_rounds.goes_direct(RequestType.ALLREDUCE, at, size, False, roomy=True)
    for roomy, direct in [(True, 1), (False, 0)]:
        sides = _sides([os.getpid()] * size, roomy=(roomy,) * size, size=size)
        count = at // 4 + 3                                 # does not split evenly among 2 or 3 ranks
        tensors = [np.arange(count, dtype=np.float32) % 13 * (r + 1) for r in range(size)]
        entries = [_entry(RequestType.ALLREDUCE, t, np.empty_like(t)) for t in tensors]
        assert _round(sides, entries) == [True] * size
        assert [s.direct for s in sides] == [direct] * size
        for entry in entries:
            np.testing.assert_array_equal(entry.output, sum(tensors))
