"""The data-plane algorithms, in one process: N Comms joined by socket pairs, one thread per rank.

TcpBackend (direct exchange below HOROVOD_TCP_SMALL_BYTES, ring above), ShmBackend (a /dev/shm segment shared
by the threads, one-barrier and pipelined paths) and the hierarchical composition, each checked against numpy
for 1 to 4 ranks, uneven sizes included.
"""
import socket
import threading
import uuid

import numpy as np
import pytest

from horovod.backends import hierarchical
from horovod.backends.comm import Comm, PeerLostError, enlarge_buffers
from horovod.backends.hierarchical import HierarchicalBackend
from horovod.backends.shm import ShmBackend
from horovod.backends.tcp import TcpBackend, split_counts
from horovod.common.types import ReduceOp

SIZES = [1, 2, 3, 4]
SMALL, LARGE = 1000, 100_003            # 4 KB (direct) and 400 KB (ring) of float32; LARGE is odd on purpose


def make_comms(n, hosts=None):
    socks = [[None] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            a, b = socket.socketpair()
            enlarge_buffers(a)
            enlarge_buffers(b)
            socks[i][j], socks[j][i] = a, b
    hosts = hosts or ["localhost"] * n
    return [Comm(r, list(range(n)), socks[r], hosts) for r in range(n)]


def close_comms(comms):
    for c in comms:
        c.close()
        for s in c.socks:
            if s is not None:
                s.close()


def run_ranks(n, fn, timeout=60):
    """Call fn(rank) in n threads; return the results by rank, re-raising the first error."""
    results, errors = [None] * n, [None] * n

    def body(r):
        try:
            results[r] = fn(r)
        except BaseException as exc:  # re-raised below
            errors[r] = exc

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    for e in errors:
        if e is not None:
            raise e
    return results


@pytest.fixture
def tcp_group():
    made = []

    def make(n):
        comms = make_comms(n)
        made.append(comms)
        return [TcpBackend(c) for c in comms]

    yield make
    for comms in made:
        close_comms(comms)


@pytest.fixture
def shm_group():
    made = []

    def make(n, chunk=64 * 1024):
        comms = make_comms(n)
        tag = f"test-{uuid.uuid4().hex[:12]}"
        backends = run_ranks(n, lambda r: ShmBackend(comms[r], tag, chunk))
        made.append((comms, backends))
        return backends

    yield make
    for comms, backends in made:
        for b in backends:
            b.seg.close()
        close_comms(comms)


def data(rank, n, dtype=np.float32, seed=0):
    return (np.random.default_rng(seed * 100 + rank).integers(-20, 20, n)).astype(dtype)


REF = {ReduceOp.SUM: np.add.reduce, ReduceOp.MIN: np.minimum.reduce, ReduceOp.MAX: np.maximum.reduce,
       ReduceOp.PRODUCT: np.multiply.reduce}


def check_allreduce(backends, n, op, dtype=np.float32):
    size = len(backends)
    ins = [data(r, n, dtype) if op != ReduceOp.PRODUCT else (1 + np.arange(n) % 2 + r % 2).astype(dtype)
           for r in range(size)]
    want = REF[op](np.stack(ins), axis=0)
    outs = run_ranks(size, lambda r: _allreduce(backends[r], ins[r].copy(), op))
    for r, out in enumerate(outs):
        np.testing.assert_array_equal(out, want, err_msg=f"rank {r}")


def _allreduce(backend, buf, op):
    backend.allreduce_buffer(buf, op)
    return buf


# ------------------------------------------------------------------------------------------------ tcp
@pytest.mark.parametrize("n", [SMALL, LARGE, 0, 1, 7])
@pytest.mark.parametrize("size", SIZES)
def test_tcp_allreduce(tcp_group, size, n):
    backends = tcp_group(size)
    for op in (ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT):
        check_allreduce(backends, n, op)
    check_allreduce(backends, n, ReduceOp.SUM, np.int64)


@pytest.mark.parametrize("size", SIZES)
def test_tcp_paths_are_the_ones_intended(tcp_group, size):
    backends = tcp_group(size)
    assert backends[0].small_bytes == 64 * 1024
    assert SMALL * 4 <= backends[0].small_bytes < LARGE * 4


@pytest.mark.parametrize("size", [2, 3, 4])
def test_tcp_every_algorithm_agrees_bitwise_across_ranks(tcp_group, size):
    backends = tcp_group(size)
    rng_in = [np.random.default_rng(r).standard_normal(LARGE).astype(np.float32) for r in range(size)]
    for algorithm in ("direct", "ring", "recursive_doubling", "rabenseifner"):
        for b in backends:
            b.allreduce_algorithm = algorithm
        outs = run_ranks(size, lambda r: _allreduce(backends[r], rng_in[r].copy(), ReduceOp.SUM))
        for out in outs[1:]:
            assert out.tobytes() == outs[0].tobytes()
        np.testing.assert_allclose(outs[0], np.sum(rng_in, axis=0, dtype=np.float64), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("size", [2, 3, 4])
def test_tcp_ring_pipelined_in_chunks_matches_whole_blocks_bitwise(tcp_group, size):
    # Chunks of 4100 B (not a multiple of 8: the chunk is rounded to whole elements) cut each block of the
    # 100_003-element ring into many chunks with a short last one; every rank must get bitwise the same
    # result, and the same as with one chunk per block (the chunking must not change the arithmetic).
    backends = tcp_group(size)
    for b in backends:
        b.allreduce_algorithm = "ring"
    for dtype in (np.float32, np.float64, np.float16):
        ins = [np.random.default_rng(r).standard_normal(LARGE).astype(dtype) for r in range(size)]
        results = []
        for chunk_bytes in (1 << 30, 4100):
            for b in backends:
                b.chunk_bytes = chunk_bytes
            outs = run_ranks(size, lambda r, ins=ins: _allreduce(backends[r], ins[r].copy(), ReduceOp.SUM))
            assert all(out.tobytes() == outs[0].tobytes() for out in outs[1:]), (dtype, chunk_bytes)
            results.append(outs[0])
        assert results[0].tobytes() == results[1].tobytes(), dtype
        np.testing.assert_allclose(results[1], np.sum(ins, axis=0, dtype=np.float64),
                                   rtol=1e-2 if dtype == np.float16 else 1e-4, atol=1e-2)


@pytest.mark.parametrize("size", [2, 3, 4])
def test_tcp_ring_with_small_chunks_every_op_and_collective(tcp_group, size):
    backends = tcp_group(size)
    for b in backends:
        b.chunk_bytes = 1000
        b.allreduce_algorithm = "ring"
    for op in (ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT):
        check_allreduce(backends, LARGE, op)
    check_allreduce(backends, LARGE, ReduceOp.SUM, np.int64)
    check_reducescatter(backends, LARGE)
    counts = [LARGE // size + (r == 0) * 5 for r in range(size)]
    counts[-1] = 0
    ins = [data(r, counts[r]) for r in range(size)]
    for out in run_ranks(size, lambda r: _allgather(backends[r], ins[r], counts)):
        np.testing.assert_array_equal(out, np.concatenate(ins))


def test_tcp_ring_raises_peer_lost_error_when_the_peer_is_gone(tcp_group):
    backends = tcp_group(2)
    backends[0].chunk_bytes = 4096
    backends[1].comm.socks[0].close()
    with pytest.raises(PeerLostError) as info:
        backends[0].allreduce_buffer(np.ones(LARGE, np.float32), ReduceOp.SUM)
    assert info.value.global_rank == 1


@pytest.mark.parametrize("size", SIZES)
def test_tcp_fused_allreduce_with_scaling(tcp_group, size):
    backends = tcp_group(size)
    sizes = [5, 20_000, 1, 33_333]
    ins = [[data(r, k, np.float64, seed=i) for i, k in enumerate(sizes)] for r in range(size)]

    def work(r):
        outs = [np.empty(k) for k in sizes]
        backends[r].allreduce(ins[r], outs, ReduceOp.SUM, prescale=0.5, postscale=4.0)
        return outs

    for outs in run_ranks(size, work):
        for i, out in enumerate(outs):
            np.testing.assert_allclose(out, np.sum([ins[q][i] for q in range(size)], axis=0) * 2.0)


@pytest.mark.parametrize("total", [SMALL, LARGE])
@pytest.mark.parametrize("size", SIZES)
def test_tcp_allgatherv_uneven_with_zero(tcp_group, size, total):
    backends = tcp_group(size)
    counts = [(total // size) * (r % 2) + r for r in range(size)]      # rank 0 sends nothing
    ins = [np.full(counts[r], r, np.int32) + np.arange(counts[r], dtype=np.int32) for r in range(size)]
    want = np.concatenate(ins)
    outs = run_ranks(size, lambda r: _allgather(backends[r], ins[r], counts))
    for out in outs:
        np.testing.assert_array_equal(out, want)


def _allgather(backend, inp, counts):
    out = np.empty(sum(counts), inp.dtype)
    backend.allgatherv(inp, out, counts)
    return out


@pytest.mark.parametrize("n", [SMALL, LARGE])
@pytest.mark.parametrize("size", SIZES)
def test_tcp_broadcast_from_every_root(tcp_group, size, n):
    backends = tcp_group(size)
    for root in range(size):
        bufs = [np.full(n, r, np.float64) for r in range(size)]
        run_ranks(size, lambda r, root=root, bufs=bufs: backends[r].broadcast(bufs[r], root))
        for buf in bufs:
            assert (buf == root).all()


@pytest.mark.parametrize("scale", [1, 20_000])
@pytest.mark.parametrize("size", SIZES)
def test_tcp_alltoallv(tcp_group, size, scale):
    backends = tcp_group(size)
    check_alltoallv(backends, scale)


def check_alltoallv(backends, scale):
    size = len(backends)
    send = [[((src + 2 * dst) % 3) * scale for dst in range(size)] for src in range(size)]
    ins = [np.concatenate([np.full(send[src][dst], src * 10 + dst, np.int16) for dst in range(size)])
           for src in range(size)]

    def work(r):
        recv = [send[src][r] for src in range(size)]
        out = np.empty(sum(recv), np.int16)
        backends[r].alltoallv(ins[r], send[r], out, recv, max_count=max(max(s) for s in send))
        return out

    for r, out in enumerate(run_ranks(size, work)):
        want = np.concatenate([np.full(send[src][r], src * 10 + r, np.int16) for src in range(size)])
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("total", [SMALL + 3, LARGE])
@pytest.mark.parametrize("size", SIZES)
def test_tcp_reducescatter(tcp_group, size, total):
    backends = tcp_group(size)
    check_reducescatter(backends, total)


def check_reducescatter(backends, total, op=ReduceOp.SUM):
    size = len(backends)
    counts = split_counts(total, size)
    ins = [data(r, total, np.float64) for r in range(size)]
    want = REF[op](np.stack(ins), axis=0)
    starts = np.cumsum([0] + counts)

    def work(r):
        out = np.empty(counts[r])
        backends[r].reducescatter(ins[r], out, counts, op)
        return out

    for r, out in enumerate(run_ranks(size, work)):
        np.testing.assert_array_equal(out, want[starts[r]:starts[r + 1]])


@pytest.mark.parametrize("size", SIZES)
def test_tcp_barrier(tcp_group, size):
    backends = tcp_group(size)
    order = []
    lock = threading.Lock()

    def work(r):
        if r == size - 1:
            import time
            time.sleep(0.2)
        with lock:
            order.append(("in", r))
        backends[r].barrier()
        with lock:
            order.append(("out", r))

    run_ranks(size, work)
    first_out = min(i for i, (kind, _) in enumerate(order) if kind == "out")
    assert all(kind == "in" for kind, _ in order[:first_out]) and first_out == size


def test_split_counts():
    assert split_counts(10, 3) == [4, 3, 3]
    assert split_counts(2, 4) == [1, 1, 0, 0]
    assert split_counts(0, 2) == [0, 0]


def test_a_lost_peer_raises_peer_lost_error_naming_it():
    comms = make_comms(2, hosts=["host-a", "host-b"])
    try:
        comms[1].socks[0].close()
        with pytest.raises(PeerLostError) as info:
            comms[0].recv_into(1, memoryview(bytearray(4)))
        assert info.value.global_rank == 1 and "Rank 1" in str(info.value) and "host-b" in str(info.value)
    finally:
        close_comms(comms)


# ------------------------------------------------------------------------------------------------ shm
@pytest.mark.parametrize("n", [SMALL, LARGE, 0, 5])
@pytest.mark.parametrize("size", SIZES)
def test_shm_allreduce(shm_group, size, n):
    backends = shm_group(size)
    for op in (ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT):
        check_allreduce(backends, n, op)
    check_allreduce(backends, n, ReduceOp.SUM, np.int8)


@pytest.mark.parametrize("size", SIZES)
def test_shm_fused_allreduce_across_chunks(shm_group, size):
    backends = shm_group(size, chunk=16 * 1024)
    sizes = [3, 10_000, 1, 7_777, 64]
    ins = [[data(r, k, np.float32, seed=i) for i, k in enumerate(sizes)] for r in range(size)]

    def work(r):
        outs = [np.empty(k, np.float32) for k in sizes]
        backends[r].allreduce(ins[r], outs, ReduceOp.SUM, prescale=2.0, postscale=0.5)
        return outs

    for outs in run_ranks(size, work):
        for i, out in enumerate(outs):
            np.testing.assert_array_equal(out, np.sum([ins[q][i] for q in range(size)], axis=0))


@pytest.mark.parametrize("total", [SMALL, LARGE])
@pytest.mark.parametrize("size", SIZES)
def test_shm_allgatherv_broadcast_alltoallv_reducescatter(shm_group, size, total):
    backends = shm_group(size)
    counts = [(total // size) * (r % 2) + r for r in range(size)]
    ins = [np.arange(counts[r], dtype=np.float32) + 1000 * r for r in range(size)]
    for out in run_ranks(size, lambda r: _allgather(backends[r], ins[r], counts)):
        np.testing.assert_array_equal(out, np.concatenate(ins))
    for root in range(size):
        bufs = [np.full(total, r, np.int32) for r in range(size)]
        run_ranks(size, lambda r, root=root, bufs=bufs: backends[r].broadcast(bufs[r], root))
        assert all((b == root).all() for b in bufs)
    check_alltoallv(backends, max(1, total // 50))
    check_reducescatter(backends, total)
    check_reducescatter(backends, total, ReduceOp.MAX)


@pytest.mark.parametrize("size", [2, 3, 4])
def test_shm_back_to_back_small_and_large_collectives(shm_group, size):
    # No negotiation between calls: a fast thread may start the next collective while a slow one still reads
    # the previous one's shared memory. Results must be exact anyway.
    backends = shm_group(size, chunk=64 * 1024)
    steps = 60

    def work(r):
        b = backends[r]
        bad = []
        for i in range(steps):
            small = np.full(100, r + i, np.float32)
            b.allreduce_buffer(small, ReduceOp.SUM)
            if not (small == size * i + size * (size - 1) / 2).all():
                bad.append(("small", i))
            kind = i % 4
            if kind == 0:
                big = np.full(50_000, r + 1.0, np.float64)
                b.allreduce_buffer(big, ReduceOp.SUM)
                ok = (big == size * (size + 1) / 2).all()
            elif kind == 1:
                buf = np.full(40_000, r, np.float32)
                b.broadcast(buf, size - 1)
                ok = (buf == size - 1).all()
            elif kind == 2:
                out = np.empty(3000 * size, np.float32)
                b.allgatherv(np.full(3000, r, np.float32), out, [3000] * size)
                ok = (out == np.repeat(np.arange(size), 3000)).all()
            else:
                out = np.empty(2000, np.float32)
                b.reducescatter(np.full(2000 * size, r, np.float32), out, [2000] * size, ReduceOp.SUM)
                ok = (out == size * (size - 1) / 2).all()
            if not ok:
                bad.append((kind, i))
        return bad

    assert run_ranks(size, work) == [[]] * size


# ------------------------------------------------------------------------------------------------ hierarchical
CROSS = ["leader", "all"]       # HOROVOD_HIERARCHICAL_CROSS: who crosses hosts in an allreduce


@pytest.mark.parametrize("mode", CROSS)
def test_hierarchical_two_hosts_of_two(monkeypatch, mode):
    monkeypatch.setenv("HOROVOD_HIERARCHICAL_CROSS", mode)
    comms = make_comms(4, hosts=["a", "a", "b", "b"])
    tag = uuid.uuid4().hex[:12]
    try:
        def build(r):
            local = [0, 1] if r < 2 else [2, 3]
            cross = [0, 2] if r % 2 == 0 else [1, 3]
            return HierarchicalBackend(TcpBackend(comms[r]), ShmBackend(comms[r].sub(local), f"{tag}-{r // 2}",
                                                                        64 * 1024),
                                       TcpBackend(comms[r].sub(cross)))

        backends = run_ranks(4, build)
        assert all(b.leader_crosses == (mode == "leader") for b in backends)
        for n in (SMALL, LARGE, 3):
            for op in (ReduceOp.SUM, ReduceOp.MAX):
                check_allreduce(backends, n, op)
        check_alltoallv(backends, 100)
        check_reducescatter(backends, LARGE)
        for b in backends:
            b.local.seg.close()
    finally:
        close_comms(comms)


def build_hierarchical(comms, hosts, tag):
    """Rank r's HierarchicalBackend for ranks on ``hosts`` (equal ranks per host, listed host by host)."""
    names = sorted(set(hosts), key=hosts.index)
    members = {h: [r for r in range(len(hosts)) if hosts[r] == h] for h in names}

    def build(r):
        local = members[hosts[r]]
        cross = [members[h][local.index(r)] for h in names]
        return HierarchicalBackend(TcpBackend(comms[r]), ShmBackend(comms[r].sub(local),
                                                                    f"{tag}-{names.index(hosts[r])}", 64 * 1024),
                                   TcpBackend(comms[r].sub(cross)))
    return build


@pytest.mark.parametrize("mode", CROSS)
@pytest.mark.parametrize("hosts", [["a", "a", "b", "b"], ["a", "a", "b", "b", "c", "c"], ["a", "b", "c"],
                                   ["a", "a", "a", "b", "b", "b"]], ids=["2x2", "3x2", "3x1", "2x3"])
def test_hierarchical_pipelined_in_pieces(monkeypatch, hosts, mode):
    # 24 KB pieces cut the 400 KB buffer into 17 pieces (the last one short), each summed in the host while
    # earlier pieces cross hosts (by the host's leader, or by every local rank with its block); with one rank per
    # host the cross-host ring runs alone. Every op, and bitwise the same result on every rank.
    monkeypatch.setenv("HOROVOD_HIERARCHICAL_CROSS", mode)
    monkeypatch.setattr(hierarchical, "PIECE_BYTES", 24 * 1024)
    n = len(hosts)
    comms = make_comms(n, hosts=hosts)
    try:
        backends = run_ranks(n, build_hierarchical(comms, hosts, uuid.uuid4().hex[:12]))
        for b in backends:
            b.cross.chunk_bytes = 5000
        for op in (ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT):
            check_allreduce(backends, LARGE, op)
        check_allreduce(backends, 2 * 24 * 1024 // 8 + 1, ReduceOp.SUM, np.int64)
        ins = [np.random.default_rng(r).standard_normal(LARGE).astype(np.float32) for r in range(n)]
        outs = run_ranks(n, lambda r: _allreduce(backends[r], ins[r].copy(), ReduceOp.SUM))
        assert all(out.tobytes() == outs[0].tobytes() for out in outs[1:])
        for b in backends:
            b.close()
    finally:
        close_comms(comms)
