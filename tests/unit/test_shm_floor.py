"""The plain-Python floor of the one-host collectives (benchmarks/workers/shm_floor.py): every op gives every
rank the right result at 1-4 ranks, round after round (the slots are reused every second round, so a stale or
overwritten slot shows), one thread per rank on one shared file; the worker runs under the project's launcher;
and benchmarks/collectives.py's table of ours against the floor."""
import json
import sys
import time

import numpy as np
import pytest

from benchmarks.collectives import floor_table
from benchmarks.workers import shm_floor
from tests.support.launch import horovodrun
from tests.support.thread_ranks import on_threads

ROUNDS = 5


def _on_ranks(size, tmp_path, body):
    """``body(floor, rank)`` on ``size`` threads, each its own rank of one shared segment; what each returned,
    in rank order."""
    def rank_main(rank):
        seg = shm_floor.Segment(tmp_path / "segment", rank, size, 1024)
        return body(shm_floor.ShmFloor(seg, oversubscribed=True), rank)

    return on_threads(size, rank_main, 60)


def _input(rank, k, count):
    """What ``rank`` contributes in round ``k``: different on every rank and in every round."""
    return (np.arange(count, dtype=np.float32) + 100 * rank + 1000 * k).astype(np.float32)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_allreduce_allgather_reducescatter(size, tmp_path):
    count = 7                                   # elements per rank's allgather part: odd, not a power of two

    def body(floor, rank):
        got = []
        for k in range(ROUNDS):
            x = _input(rank, k, count * size)
            out = np.empty_like(x)
            floor.allreduce(x, out)
            gathered = np.empty(count * size, np.float32)
            floor.allgather(x[:count], gathered)
            block = np.empty(count, np.float32)
            floor.reducescatter(x, block)
            got.append((out, gathered, block))
        return got

    results = _on_ranks(size, tmp_path, body)
    for k in range(ROUNDS):
        inputs = [_input(r, k, count * size) for r in range(size)]
        total = np.sum(inputs, axis=0, dtype=np.float32)
        for rank in range(size):
            out, gathered, block = results[rank][k]
            np.testing.assert_array_equal(out, total)
            np.testing.assert_array_equal(gathered, np.concatenate([x[:count] for x in inputs]))
            np.testing.assert_array_equal(block, total[rank * count:(rank + 1) * count])


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_broadcast_from_every_root(size, tmp_path):
    def body(floor, rank):
        got = []
        for k in range(ROUNDS):
            for root in range(size):
                x = _input(rank, k, 5)
                floor.broadcast(x, root)
                got.append(x)
        floor.barrier()
        return got

    results = _on_ranks(size, tmp_path, body)
    for rank in range(size):
        expected = [_input(root, k, 5) for k in range(ROUNDS) for root in range(size)]
        for got, want in zip(results[rank], expected):
            np.testing.assert_array_equal(got, want)


def test_the_worker_under_the_launcher(tmp_path):
    """Three ranks (not a power of two, more than this machine's two cores: they yield while they spin) time
    every op at two sizes and rank 0 writes them, as benchmarks/collectives.py reads them."""
    out = tmp_path / "pyshm.json"
    segments = tmp_path / "segments"
    segments.mkdir()
    proc = horovodrun(3, [sys.executable, "-m", "benchmarks.workers.shm_floor", str(out), "4,4096", str(segments)],
                      timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())
    assert rows["peer"] == "pyshm" and rows["size"] == 3
    for op in ("allreduce", "allgather", "broadcast", "reducescatter"):
        assert set(rows["results"][op]) == {"4", "4096"}
        assert all(0 < t < 0.1 for t in rows["results"][op].values())
    assert [p.name for p in segments.iterdir()] == ["control"]     # each size's data file went with its size


def test_floor_table():
    results = {"horovod": {"results": {"allreduce": {"4096": 28e-6, "65536": 40e-6}}},
               "pyshm": {"results": {"allreduce": {"4096": 5e-6, "65536": 20e-6}}},
               "mpi4py": {"results": {"allreduce": {"4096": 4e-6}}}}
    lines = floor_table(results).splitlines()
    assert "| op | size | horovod ÷ mpi4py | pyshm ÷ mpi4py | horovod − pyshm (µs) |" in lines
    assert "| allreduce | 4 KB | 7.00 | 1.25 | 23.0 |" in lines
    assert not any("64 KB" in line for line in lines)       # no reference figure at that size
    del results["mpi4py"]
    lines = floor_table(results).splitlines()
    assert "| allreduce | 4 KB | 5.60 | 23.0 |" in lines
    assert "| allreduce | 64 KB | 2.00 | 20.0 |" in lines
    del results["pyshm"]
    assert floor_table(results) == ""


def test_a_broadcast_root_waits_before_it_reuses_a_slot(tmp_path):
    """The root reads nobody, so nothing else holds it back: a late rank must still get round 1's data after the
    root has gone on to round 3, which writes the same slot."""
    def body(floor, rank):
        if rank == 1:
            time.sleep(0.3)
        got = []
        for k in range(3):
            x = _input(rank, k, 5)
            floor.broadcast(x, 0)
            got.append(x)
        return got

    results = _on_ranks(2, tmp_path, body)
    for k, got in enumerate(results[1]):
        np.testing.assert_array_equal(got, _input(0, k, 5))
