"""Fast rounds wake only sleepers (core/engine/fast_rounds.py, ``FastRounds.ring``): two ranks' sides on one shared
area in one process. A rank that polls costs its peers no futex wake; a rank asleep on the doorbell says so in its
SLEEPING word and is woken by the peer's post, long before its slice would have ended the sleep."""
import threading
import time

import numpy as np
import pytest

from horovod.backends.shm import fast_area_bytes
from horovod.common.types import RequestType, data_type_of
from horovod.core.controller.messages import make_request
from horovod.core.engine import fast_rounds
from horovod.core.engine.entry import Entry
from horovod.core.engine.handles import Handle
from tests.support.fast_rounds import RunningEngine
from tests.support.timing import SLACK_S

pytestmark = pytest.mark.skipif(not fast_rounds.supported(), reason="fast rounds need a futex and x86-64")



def _sides():
    area = np.zeros(fast_area_bytes(2), np.uint8)
    return [fast_rounds.FastRounds(area, r, 2, [0, 1]) for r in range(2)]


def _allreduce(value: float) -> Entry:
    tensor = np.full(4, value, np.float32)
    request = make_request("t", RequestType.ALLREDUCE, data_type_of(tensor.dtype), tensor.shape)
    return Entry(request, tensor, np.empty_like(tensor), Handle("t"))


def _count_wakes(side, monkeypatch):
    wakes = []
    real = side.bell.wake
    monkeypatch.setattr(side.bell, "wake", lambda: (wakes.append(1), real()))
    return wakes


def test_a_ring_with_nobody_asleep_makes_no_wake_call(monkeypatch):
    sides = _sides()
    wakes = _count_wakes(sides[0], monkeypatch)
    before = sides[0].bell.value()
    sides[0].ring()
    assert sides[0].bell.value() == (before + 1) & 0xFFFFFFFF     # the count moves: a waiter's stale read returns
    assert wakes == []


def test_a_sleeping_rank_is_marked_and_woken_by_its_peers_post(monkeypatch):
    monkeypatch.setattr(fast_rounds, "SLICE_SECONDS", 60.0)      # a missed wake would sleep a minute
    sides = _sides()
    wakes = _count_wakes(sides[1], monkeypatch)
    entries = [_allreduce(1.0), _allreduce(2.0)]
    keys = [side.key(entry.request, entry.tensor.nbytes) for side, entry in zip(sides, entries)]
    k = sides[0].post_fast(entries[0], keys[0])
    done = []
    waiter = threading.Thread(target=lambda: done.append(sides[0].resolve(k, keys[0], entries[0], RunningEngine())),
                              daemon=True)
    waiter.start()
    deadline = time.monotonic() + 10
    while not sides[0].words[0][fast_rounds.SLEEPING] and time.monotonic() < deadline:
        time.sleep(0.001)
    assert sides[0].words[0][fast_rounds.SLEEPING] == 1, "the waiting rank never said it sleeps"
    posted = time.monotonic()
    assert sides[1].post_fast(entries[1], keys[1]) == k
    sides[1].ring()
    waiter.join(SLACK_S + 1.0)
    assert done == [True] and time.monotonic() - posted < SLACK_S + 1.0
    assert wakes == [1]
    assert sides[0].words[0][fast_rounds.SLEEPING] == 0
    np.testing.assert_array_equal(entries[0].output, np.full(4, 3.0, np.float32))
    assert sides[1].resolve(k, keys[1], entries[1], RunningEngine())   # the peer finds rank 0's record at once
