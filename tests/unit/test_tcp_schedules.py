"""The tcp data plane's schedules (backends/tcp_schedules.py), executed symbolically in one process.

Every rank's steps are matched with its peers' (a step can run only when the peer's next step names this rank
back: no deadlock), sizes agree on both sides, and each element ends with every rank's contribution exactly once,
on every rank; for 1 to 8 ranks and element counts that do not divide evenly.
"""
import numpy as np
import pytest

from horovod.backends import tcp_schedules as sch
from horovod.common import config

SIZES = range(1, 9)
COUNTS = [0, 1, 2, 5, 7, 13, 64, 101]
SCHEDULES = {"recursive_doubling": sch.recursive_doubling, "rabenseifner": sch.rabenseifner}


def simulate(size, count, schedule):
    """Run every rank's steps; values are bit ``rank`` (so sums show who contributed) plus a contribution count."""
    bits = [np.full(count, 1 << r, np.int64) for r in range(size)]
    seen = [np.ones(count, np.int64) for _ in range(size)]
    plans = [schedule(r, size, count) for r in range(size)]
    at = [0] * size
    while any(at[r] < len(plans[r]) for r in range(size)):
        progressed = False
        for a in range(size):
            if at[a] >= len(plans[a]):
                continue
            sa = plans[a][at[a]]
            b = sa.peer
            assert b != a and 0 <= b < size
            if at[b] >= len(plans[b]) or plans[b][at[b]].peer != a:
                continue
            sb = plans[b][at[b]]
            assert sa.send[1] - sa.send[0] == sb.recv[1] - sb.recv[0], (a, b, sa, sb)
            assert sb.send[1] - sb.send[0] == sa.recv[1] - sa.recv[0], (a, b, sa, sb)
            if sa.reduce and sb.reduce:
                assert sa.peer_first != sb.peer_first and sa.peer_first == (b < a)
            sent = {a: (bits[a][slice(*sa.send)].copy(), seen[a][slice(*sa.send)].copy()),
                    b: (bits[b][slice(*sb.send)].copy(), seen[b][slice(*sb.send)].copy())}
            for me, other, step in ((a, b, sa), (b, a, sb)):
                lo, hi = step.recv
                vals, counts = sent[other]
                if step.reduce:
                    bits[me][lo:hi] += vals
                    seen[me][lo:hi] += counts
                else:
                    bits[me][lo:hi] = vals
                    seen[me][lo:hi] = counts
            at[a] += 1
            at[b] += 1
            progressed = True
        assert progressed, f"deadlock at {at}"
    return bits, seen


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("size", SIZES)
def test_schedules_reduce_everything_exactly_once_on_every_rank(name, size):
    for count in COUNTS:
        bits, seen = simulate(size, count, SCHEDULES[name])
        for r in range(size):
            assert (bits[r] == (1 << size) - 1).all(), (name, size, count, r)
            assert (seen[r] == size).all(), (name, size, count, r)


@pytest.mark.parametrize("size", SIZES)
def test_recursive_doubling_takes_log_rounds(size):
    for r in range(size):
        steps = sch.recursive_doubling(r, size, 10)
        if sch.core_position(r, size) is None:
            assert len(steps) == 2
        else:
            assert len(steps) <= sch.doubling_rounds(size)
    assert sch.doubling_rounds(8) == 3 and sch.doubling_rounds(5) == 4 and sch.doubling_rounds(1) == 0


@pytest.mark.parametrize("size", SIZES)
def test_rabenseifner_sends_ring_volume_on_a_power_of_two(size):
    count = 1000
    p = sch.core_size(size)
    for r in range(size):
        if sch.core_position(r, size) is None:
            continue
        core_steps = [s for s in sch.rabenseifner(r, size, count) if s.send[1] > s.send[0] and s.recv[1] > s.recv[0]]
        sent = sum(s.send[1] - s.send[0] for s in core_steps)
        assert len(core_steps) == 2 * (p.bit_length() - 1)
        assert abs(sent - 2 * (p - 1) * count / p) <= 2 * p, (size, r, sent)


def test_core_positions_cover_the_core_once():
    for size in SIZES:
        positions = [sch.core_position(r, size) for r in range(size)]
        core = sorted(p for p in positions if p is not None)
        assert core == list(range(sch.core_size(size)))
        for r, p in enumerate(positions):
            if p is not None:
                assert sch.core_rank(p, size) == r


@pytest.mark.parametrize("size", SIZES)
def test_ring_and_direct_schedules(size):
    for r in range(size):
        steps = sch.ring(r, size, True, True)
        assert len(steps) == sch.ring_rounds(size)
        for i in range(1, len(steps)):
            assert steps[i][0] == steps[i - 1][1]          # each step forwards what the step before received
        if size > 1:
            assert steps[size - 2][1] == r                 # the reduce-scatter ends with block r, reduced
        rounds = sch.direct(r, size)
        assert sorted(d for d, _ in rounds) == sorted(set(range(size)) - {r})
        assert sorted(s for _, s in rounds) == sorted(set(range(size)) - {r})


@pytest.mark.parametrize("size", SIZES)
def test_binomial_tree_and_chain_reach_every_rank_once(size):
    for root in range(size):
        parents = {}
        for r in range(size):
            parent, children = sch.binomial_tree(r, size, root)
            for c in children:
                assert sch.binomial_tree(c, size, root)[0] == r
            parents[r] = parent
        assert parents[root] is None and all(parents[r] is not None for r in range(size) if r != root)
        arrival, todo = {root: 0}, [root]                  # one whole-buffer send per round from each sender
        while todo:
            r = todo.pop()
            for i, c in enumerate(sch.binomial_tree(r, size, root)[1]):
                arrival[c] = arrival[r] + i + 1
                todo.append(c)
        assert sorted(arrival) == list(range(size)) and max(arrival.values()) == sch.binomial_rounds(size)
        order, x = [root], sch.chain(root, size, root)[1]
        while x is not None:
            assert sch.chain(x, size, root)[0] == order[-1]
            order.append(x)
            x = sch.chain(x, size, root)[1]
        assert sorted(order) == list(range(size))


def test_choose_allreduce():
    small, ring = 64 * 1024, 1024 * 1024
    choose = sch.choose_allreduce
    assert [choose(n, 4096, small, ring) for n in (2, 3, 4, 5, 6, 8)] == [
        "direct", "direct", "recursive_doubling", "direct", "recursive_doubling", "recursive_doubling"]
    assert choose(8, 256 * 1024, small, ring) == "rabenseifner"
    assert choose(4, 256 * 1024, small, ring) == "rabenseifner"
    assert choose(6, 256 * 1024, small, ring) == "ring"       # not a power of two: the fold costs more
    assert choose(2, 256 * 1024, small, ring) == "ring"
    assert choose(8, 64 << 20, small, ring) == "ring"
    assert choose(8, 64 << 20, small, ring, "recursive_doubling") == "recursive_doubling"


def test_choose_broadcast():
    chunk = 1 << 20
    assert sch.choose_broadcast(8, 4096, chunk) == "binomial"
    assert sch.choose_broadcast(8, 64 << 20, chunk) == "pipeline"
    assert sch.choose_broadcast(2, 64 << 20, chunk) == "binomial"
    assert sch.choose_broadcast(8, 64 << 20, 0) == "binomial"
    assert sch.choose_broadcast(3, 4096, chunk, "pipeline") == "pipeline"


def test_knobs_accept_the_schedules_names_only():
    for name in sch.ALLREDUCE_ALGORITHMS:
        assert config.get("HOROVOD_TCP_ALLREDUCE_ALGORITHM", {"HOROVOD_TCP_ALLREDUCE_ALGORITHM": name}) == name
    for name in sch.BROADCAST_ALGORITHMS:
        assert config.get("HOROVOD_TCP_BROADCAST_ALGORITHM", {"HOROVOD_TCP_BROADCAST_ALGORITHM": name}) == name
    assert config.get("HOROVOD_TCP_ALLREDUCE_ALGORITHM", {"HOROVOD_TCP_ALLREDUCE_ALGORITHM": " Ring "}) == "ring"
    with pytest.raises(ValueError, match="HOROVOD_TCP_ALLREDUCE_ALGORITHM"):
        config.get("HOROVOD_TCP_ALLREDUCE_ALGORITHM", {"HOROVOD_TCP_ALLREDUCE_ALGORITHM": "tree"})
    assert config.get("HOROVOD_TCP_ALLREDUCE_ALGORITHM", {}) == "auto"
