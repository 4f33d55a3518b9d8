"""The flight recorder inside every rank: each collective this rank submits is numbered per process set, alike on
every rank, and its record moves through the states with the data plane that ran it; the records every rank
writes compare as "all agree" when nothing went wrong. (Failures, stalls and SIGUSR1 are the integration test's.)
"""
import json
import os
import shutil
import tempfile
import time

import numpy as np
import pytest

import horovod.numpy as hvd
from horovod.core.engine import flight
from horovod.core.observers import flight_recorder
from horovod.timeline import flight as analysis
from tests.support.fast_rounds import fast_round_count
from tests.support.process_sets import even_odd_sets  # turns dynamic process sets on

PLANES = {"local", "shm", "tcp", "hierarchical", "mpi", flight.FAST_ROUND}


def ring_of(set_id=0):
    return next(r for r in flight.rings() if r.process_set_id == set_id)


def settled(ring, after, count):
    """The ``count`` records after number ``after``, once each is done (the engine marks a collective done just
    after its handle completes)."""
    deadline = time.monotonic() + 5
    while True:
        records = [r for r in ring.snapshot() if r[flight.SEQ] > after]
        if len(records) == count and all(r[flight.DONE] is not None for r in records):
            return [flight_recorder.entry_record(ring, r) for r in records]
        assert time.monotonic() < deadline, records
        time.sleep(0.005)


def test_each_collective_is_numbered_and_recorded_through_its_states():
    ring = ring_of(0)
    assert ring.capacity == 2000 and ring.global_rank == hvd.rank() and ring.ranks == list(range(hvd.size()))
    before = ring.count
    hvd.allreduce(np.ones(4, np.float32), name="flight.sum", op=hvd.Sum)
    hvd.allgather(np.ones((hvd.rank() + 1, 2)), name="flight.gather")
    hvd.broadcast(np.zeros(5, np.int32), 0, name="flight.bcast")
    hvd.synchronize(hvd.allreduce_async(np.ones(300_000, np.float32), name="flight.big"))
    hvd.barrier()
    entries = settled(ring, before, 5)
    assert [x["seq"] for x in entries] == list(range(before + 1, before + 6))
    assert [x["name"] for x in entries] == ["allreduce.flight.sum", "allgather.flight.gather",
                                            "broadcast.flight.bcast", "allreduce.flight.big", "barrier.noname"]
    assert [x["op"] for x in entries] == ["ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLREDUCE", "BARRIER"]
    assert entries[0]["reduce_op"] == "SUM" and entries[0]["dtype"] == "float32" and entries[0]["bytes"] == 16
    assert entries[1]["shape"] == [hvd.rank() + 1, 2] and entries[1]["bytes"] == 16 * (hvd.rank() + 1)
    assert entries[2]["root_rank"] == 0 and entries[3]["bytes"] == 1_200_000
    for x in entries:
        assert x["state"] == "done" and x["failed_at"] is None, x
        times = [x[f"{s}_at"] for s in ("submitted", "negotiated", "started", "done")]
        assert times == sorted(times), x
    assert entries[4]["plane"] == "coordinator"
    planes = {x["plane"] for x in entries[:4]}
    assert planes <= PLANES, planes
    if hvd.size() == 1:     # the blocking calls take the set's own fast rounds (when on), the async one the plane
        blocking = flight.FAST_ROUND if fast_round_count()[1] else "local"
        assert [x["plane"] for x in entries[:4]] == [blocking] * 3 + ["local"]
    assert entries[3]["plane"] != flight.FAST_ROUND           # async, and too big: never a fast round
    # Every rank numbered them alike.
    everyone = hvd.allgather_object([(x["seq"], x["name"]) for x in entries], name="flight.numbers")
    assert all(theirs == everyone[0] for theirs in everyone), everyone


@pytest.fixture
def my_set():
    yield from even_odd_sets()


def test_each_process_set_numbers_its_own_collectives(my_set):
    mine, _ = my_set
    ring = ring_of(mine.process_set_id)
    assert ring.ranks == mine.ranks and ring.rank == mine.rank() and ring.count == 0
    global_count = ring_of(0).count
    for step in range(3):
        hvd.allreduce(np.ones(2), name=f"flight.in.set.{step}", process_set=mine)
    entries = settled(ring, 0, 3)
    assert [x["seq"] for x in entries] == [1, 2, 3]
    assert [x["name"] for x in entries] == [f"allreduce.flight.in.set.{s}" for s in range(3)]
    assert ring_of(0).count == global_count           # nothing went to the global set's record


def test_the_records_every_rank_writes_compare_as_agreeing(monkeypatch):
    folder = hvd.broadcast_object(tempfile.mkdtemp(prefix="flight-parallel-") if hvd.rank() == 0 else None,
                                  name="flight.folder")
    monkeypatch.setenv("HOROVOD_FLIGHT_RECORDER_DIR", folder)
    hvd.allreduce(np.ones(3), name="flight.last")
    ring = ring_of(0)
    settled(ring, ring.count - 1, 1)
    assert flight_recorder.dump_all(f"parallel test {time.monotonic()}") == folder
    mine = json.loads(open(os.path.join(folder, f"rank.{hvd.rank()}.json")).read())
    assert mine["rank"] == hvd.rank() and mine["size"] == hvd.size() and mine["pid"] == os.getpid()
    assert mine["process_sets"][0]["entries"][-1]["name"] == "allreduce.flight.last"
    hvd.barrier()                       # every rank wrote
    if hvd.rank() == 0:
        text, data = analysis.compare_folder(folder)
        assert data["ranks"] == list(range(hvd.size()))
        assert "every rank agrees up to" in text and "allreduce.flight.last, is done on each" in text, text
    hvd.barrier()
    if hvd.rank() == 0:
        shutil.rmtree(folder, ignore_errors=True)
