"""ControlChannel.root_cause: which reason a rank reports when a peer's connection fails, and how long it listens
for a better-informed one. A rank that dies closes its control socket with no abort reason before the close; a
rank that aborts sends its reason first. Coordinator's view: one socketpair per worker."""
import socket
import threading
import time

import pytest

from horovod.common import wire
from horovod.core.engine import control
from horovod.core.engine.control import ControlChannel

OWN = "Rank 2 (host localhost) closed its connection unexpectedly"


@pytest.fixture
def channel():
    """Rank 0 of 3, the coordinator: (its channel, the workers' ends by position)."""
    pairs = {peer: socket.socketpair() for peer in (1, 2)}
    chan = ControlChannel(0, {peer: a for peer, (a, _) in pairs.items()}, None, 3)
    yield chan, {peer: b for peer, (_, b) in pairs.items()}
    for a, b in pairs.values():
        a.close()
        b.close()


def timed(fn):
    start = time.monotonic()
    out = fn()
    return out, time.monotonic() - start


def test_a_dead_rank_is_the_root_cause_at_once(channel):
    chan, workers = channel
    workers[2].close()                        # killed: no reason before the close
    reason, took = timed(lambda: chan.root_cause(OWN, lost_rank=2))
    assert reason == OWN
    assert took < control.ABORT_REASON_WAIT_SECONDS / 5, took


def test_the_lost_rank_s_own_reason_wins(channel):
    chan, workers = channel
    wire.send_msg(workers[2], ["A", "rank 2 ran out of memory"])
    workers[2].close()
    assert chan.root_cause(OWN, lost_rank=2) == "rank 2 ran out of memory"


def test_another_rank_s_reason_that_arrived_with_the_close_wins(channel):
    chan, workers = channel
    wire.send_msg(workers[1], ["A", "rank 1 saw rank 3 die"])
    workers[2].close()
    assert chan.root_cause(OWN, lost_rank=2) == "rank 1 saw rank 3 die"


def test_a_rank_that_aborted_is_not_blamed_when_the_reason_comes_late(channel):
    """The lost rank (1) is alive and aborting: its socket stays open until its reason comes."""
    chan, workers = channel
    timer = threading.Timer(0.1, lambda: wire.send_msg(workers[1], ["A", "rank 2 died first"]))
    timer.start()
    try:
        assert chan.root_cause(OWN, lost_rank=1) == "rank 2 died first"
    finally:
        timer.join()


def test_another_rank_closing_does_not_end_the_wait_early(channel, monkeypatch):
    monkeypatch.setattr(control, "ABORT_REASON_WAIT_SECONDS", 0.2)
    chan, workers = channel
    workers[1].close()
    reason, took = timed(lambda: chan.root_cause(OWN, lost_rank=2))
    assert reason == OWN
    assert took >= 0.2


def test_a_worker_stops_waiting_when_the_coordinator_dies():
    a, b = socket.socketpair()
    try:
        chan = ControlChannel(1, {0: a}, None, 3)
        b.close()
        reason, took = timed(lambda: chan.root_cause("Rank 0 closed", lost_rank=0))
        assert reason == "Rank 0 closed"
        assert took < control.ABORT_REASON_WAIT_SECONDS / 5, took
    finally:
        a.close()
