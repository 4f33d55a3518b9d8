"""Every tcp allreduce and broadcast algorithm, forced, on 1 to 8 ranks in one process (threads joined by socket
pairs): results equal numpy's and are bitwise identical on every rank, for odd sizes, several dtypes and every op.
"""
import numpy as np
import pytest

from horovod.backends import tcp as tcp_module
from horovod.backends import tcp_schedules as schedules
from horovod.backends.comm import PeerLostError
from horovod.backends.tcp import TcpBackend
from horovod.common.types import ReduceOp
from tests.unit.test_tcp_algorithms import close_comms, make_comms, run_ranks

SIZES = range(1, 9)
ALGORITHMS = ["ring", "direct", "recursive_doubling", "rabenseifner"]
COUNTS = [0, 1, 7, 30_011]
EXACT = {ReduceOp.SUM: np.add.reduce, ReduceOp.MIN: np.minimum.reduce, ReduceOp.MAX: np.maximum.reduce,
         ReduceOp.PRODUCT: np.multiply.reduce}


@pytest.fixture
def group():
    made = []

    def make(n, **attrs):
        comms = make_comms(n)
        made.append(comms)
        backends = [TcpBackend(c) for c in comms]
        for b in backends:
            b.chunk_bytes = 4096                     # many ring chunks, a short last one
            for key, value in attrs.items():
                setattr(b, key, value)
        return backends

    yield make
    for comms in made:
        close_comms(comms)


def allreduce_all(backends, ins, op, postscale=1.0):
    def work(r):
        out = np.empty_like(ins[r])
        backends[r].allreduce([ins[r]], [out], op, postscale=postscale)
        return out

    outs = run_ranks(len(backends), work)
    for r, out in enumerate(outs[1:], 1):
        assert out.tobytes() == outs[0].tobytes(), f"rank {r} differs from rank 0"
    return outs[0]


def exact_inputs(size, count, op, dtype, seed):
    rng = np.random.default_rng(seed)
    if op == ReduceOp.PRODUCT:
        return [rng.choice(np.array([1, 2, -1], dtype), count) for _ in range(size)]
    return [rng.integers(-50, 50, count).astype(dtype) for _ in range(size)]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("size", SIZES)
def test_allreduce_every_algorithm_op_and_dtype(group, algorithm, size):
    backends = group(size, allreduce_algorithm=algorithm)
    for count in COUNTS:
        for op in EXACT:
            for dtype in (np.float32, np.int32):
                ins = exact_inputs(size, count, op, dtype, seed=count + int(op))
                np.testing.assert_array_equal(allreduce_all(backends, ins, op), EXACT[op](np.stack(ins), axis=0),
                                              err_msg=f"{algorithm} {size} {count} {op.name} {dtype}")
        rng = np.random.default_rng(count)
        ins = [rng.standard_normal(count) for _ in range(size)]         # float64, not exact: bitwise across ranks
        np.testing.assert_allclose(allreduce_all(backends, ins, ReduceOp.SUM), np.sum(ins, axis=0), atol=1e-12)
        average = allreduce_all(backends, [a.astype(np.float32) for a in ins], ReduceOp.SUM, postscale=1 / size)
        np.testing.assert_allclose(average, np.mean(ins, axis=0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("algorithm", ["recursive_doubling", "rabenseifner"])
@pytest.mark.parametrize("size", [3, 4, 6, 8])
def test_order_sensitive_bits_agree_on_every_rank(group, algorithm, size):
    # Min of +0.0 and -0.0 returns its first operand, so the two partners must combine in the same order.
    backends = group(size, allreduce_algorithm=algorithm)
    for op in (ReduceOp.MIN, ReduceOp.MAX):
        ins = [np.full(301, -0.0 if r % 2 else 0.0, np.float32) for r in range(size)]
        allreduce_all(backends, ins, op)


@pytest.mark.parametrize("algorithm", ["binomial", "pipeline"])
@pytest.mark.parametrize("size", SIZES)
def test_broadcast_every_algorithm_and_root(group, algorithm, size):
    backends = group(size, broadcast_algorithm=algorithm, chunk_bytes=1000)
    for nbytes in (0, 1, 10_001):
        for root in range(size):
            bufs = [np.full(nbytes, r, np.uint8) for r in range(size)]
            bufs[root] = np.arange(nbytes).astype(np.uint8)
            run_ranks(size, lambda r, root=root, bufs=bufs: backends[r].broadcast(bufs[r], root))
            for buf in bufs:
                np.testing.assert_array_equal(buf, np.arange(nbytes).astype(np.uint8))


def test_auto_choice_is_named_in_the_timeline(group, monkeypatch):
    labels = []

    class Recorder:
        def __init__(self, label):
            labels.append(label)

        def __enter__(self):
            return None

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(tcp_module, "activity", Recorder)
    backends = group(8)
    for count in (1000, 100_000, 1_000_000):                             # 4 KB, 400 KB, 4 MB of float32
        allreduce_all(backends, [np.ones(count, np.float32) for _ in range(8)], ReduceOp.SUM)
    run_ranks(8, lambda r: backends[r].broadcast(np.zeros(1 << 23, np.uint8), 0))
    assert labels[::8] == ["TCP_RECURSIVE_DOUBLING", "TCP_RABENSEIFNER", "TCP_RING", "TCP_PIPELINE"]


@pytest.mark.parametrize("algorithm", ["recursive_doubling", "rabenseifner"])
def test_a_lost_peer_raises_peer_lost_error(group, algorithm):
    # Rank 0 alone runs the collective; the peer of its first exchange is gone.
    backends = group(4, allreduce_algorithm=algorithm)
    first = getattr(schedules, algorithm)(0, 4, 50_000)[0].peer
    backends[first].comm.socks[0].close()
    with pytest.raises(PeerLostError) as info:
        backends[0].allreduce_buffer(np.ones(50_000, np.float32), ReduceOp.SUM)
    assert info.value.global_rank == first
