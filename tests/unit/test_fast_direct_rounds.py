"""Direct fast rounds (core/engine/fast_rounds.py) in one process: two ranks' sides on one shared area, each in a
thread, copying by process_vm_readv/writev to and from this very process (a process may read its own memory)."""
import os
import threading
from typing import List, Optional

import numpy as np
import pytest

from horovod.backends import cma
from horovod.backends.shm import FAST_HEADER_BYTES, FAST_LINE_BYTES, FAST_SLOT_BYTES
from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import RequestType, data_type_of
from horovod.core.controller.messages import make_request
from horovod.core.engine import fast_rounds
from horovod.core.engine.entry import Entry
from horovod.core.engine.handles import Handle
from tests.support.fast_rounds import RunningEngine


def _may_copy() -> bool:
    token = np.frombuffer(os.urandom(16), np.uint8).copy()
    return cma.probe(os.getpid(), cma.address(token), token.tobytes()) is None


pytestmark = pytest.mark.skipif(not fast_rounds.supported() or not _may_copy(),
                                reason="fast rounds need a futex and x86-64; direct ones, cross-memory copies")



def _sides(pids: Optional[List[int]], roomy=(True, True)) -> List[fast_rounds.FastRounds]:
    """Two ranks' sides; ``roomy``: whether each believes every rank has a core of its own."""
    area = np.zeros(FAST_LINE_BYTES + 2 * (FAST_HEADER_BYTES + 2 * FAST_SLOT_BYTES), np.uint8)
    sides = [fast_rounds.FastRounds(area, r, 2, [0, 1], pids) for r in range(2)]
    for side, own_core in zip(sides, roomy):
        side.roomy = own_core
    return sides


def _entry(rtype: RequestType, tensor: np.ndarray, output, root: int = -1) -> Entry:
    request = make_request("t", rtype, data_type_of(tensor.dtype), tensor.shape, root=root)
    return Entry(request, tensor, output, Handle("t"))


def _broadcasts(count: int):
    """Rank 0 broadcasts ``count`` floats to rank 1: (the source, rank 1's output, both ranks' entries)."""
    source = np.arange(count, dtype=np.float32)
    received = np.zeros(count, np.float32)
    return source, received, [_entry(RequestType.BROADCAST, source, source, root=0),
                              _entry(RequestType.BROADCAST, np.zeros(count, np.float32), received, root=0)]


def _round(sides, entries) -> List[object]:
    """Both ranks post and resolve one round, each in a thread; returns what each resolve gave or raised."""
    results: List[object] = [None, None]

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

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads), "a direct round did not close"
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


def test_a_failed_copy_names_the_peer_and_the_tensor_and_the_round_still_closes():
    """Rank 0 (the root) cannot write into rank 1 (a process id that does not exist): its call fails with the
    peer's rank and the tensor; rank 1, which reads from a live process, completes, and neither hangs."""
    missing = 4_194_000
    while True:
        try:
            os.kill(missing, 0)
            missing -= 1
        except ProcessLookupError:
            break
        except PermissionError:
            missing -= 1
    sides = _sides([os.getpid()] * 2)
    sides[0].pids = [os.getpid(), missing]      # only rank 0 sees rank 1 as that process
    _, _, entries = _broadcasts(2 * fast_rounds.DIRECT_FROM[RequestType.BROADCAST] // 4)
    results = _round(sides, entries)
    assert isinstance(results[0], HorovodInternalError)
    assert "broadcast of tensor 't' could not copy to or from rank 1's memory" in str(results[0])
    assert results[1] is True
