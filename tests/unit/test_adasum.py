"""Adasum (horovod.backends.adasum): the tree weights, and the real data planes against a naive reference.

The reference below applies upstream's pairwise formula recursively to whole float64 vectors, tensor by
tensor, with no Gram matrix: it shares no code with the implementation. The data planes (tcp, shm,
hierarchical with the knob on and off) run in one process, one thread per rank, as in test_tcp_algorithms.
"""
import sys
import uuid
from types import SimpleNamespace

import numpy as np
import pytest
from test_tcp_algorithms import close_comms, make_comms, run_ranks

from horovod.backends.adasum import SQRT_DBL_MIN, plane_adasum, tensor_pieces, tree_weights
from horovod.backends.hierarchical import HierarchicalBackend
from horovod.backends.local import LocalBackend
from horovod.backends.shm import ShmBackend
from horovod.backends.tcp import TcpBackend
from horovod.common.types import DataType, ReduceOp, RequestType
from horovod.core.controller import fusion
from horovod.core.controller.messages import TensorResponse
from horovod.core.engine import executors

DTYPES = [np.float16, np.float32, np.float64]
FUSED = [5, 20_000, 1, 3, 0, 13_331]        # smaller than n, spanning several segments, empty


# ------------------------------------------------------------------------------------------------ reference
def ref_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Upstream's FusedPairwiseReduceWithComm for one tensor, in float64."""
    dot, anorm, bnorm = float(np.dot(a, b)), float(np.dot(a, a)), float(np.dot(b, b))
    acoeff = 1.0 - dot / anorm * 0.5 if anorm >= sys.float_info.min ** 0.5 else 1.0
    bcoeff = 1.0 - dot / bnorm * 0.5 if bnorm >= sys.float_info.min ** 0.5 else 1.0
    return acoeff * a + bcoeff * b


def ref_tree(vectors):
    """The binary tree of adjacent pairs over a power-of-two list, recursively."""
    if len(vectors) == 1:
        return vectors[0]
    half = len(vectors) // 2
    return ref_pair(ref_tree(vectors[:half]), ref_tree(vectors[half:]))


def ref_adasum(vectors):
    """Adasum of float64 vectors: fold the ranks past the largest power of two, then the tree."""
    p = 1
    while p * 2 <= len(vectors):
        p *= 2
    leaves = [ref_pair(vectors[i], vectors[i + p]) if i + p < len(vectors) else vectors[i] for i in range(p)]
    return ref_tree(leaves)


def prescaled(x: np.ndarray, factor: float) -> np.ndarray:
    """``x * factor`` with upstream's rounding (float16 goes through float32)."""
    if factor == 1.0:
        return x.copy()
    if x.dtype == np.float64:
        return x * factor
    return (x.astype(np.float32) * np.float32(factor)).astype(x.dtype)


def expected(per_rank, prescale=1.0, postscale=1.0, hosts=None):
    """Per tensor, the reference result; ``hosts`` (lists of ranks) sums inside hosts first (hierarchical)."""
    dtype = per_rank[0][0].dtype
    out = []
    for k in range(len(per_rank[0])):
        grads = [prescaled(per_rank[r][k], prescale) for r in range(len(per_rank))]
        divisor = 1.0
        if hosts:
            sums = []
            for members in hosts:
                acc = grads[members[0]].copy()
                for r in members[1:]:
                    acc += grads[r]                       # in the dtype, in rank order, as the data plane
                sums.append(acc)
            grads, divisor = sums, len(hosts[0])
        result = ref_adasum([g.astype(np.float64) for g in grads]) * (postscale / divisor)
        out.append(result.astype(dtype))
    return out


def assert_matches(got, want, rtol_ulps=1.0, atol=0.0):
    """Equal up to the one rounding to the dtype (both are float64 results cast once), plus ``atol``.

    float64 results are not rounded again, so they differ by the float64 noise of two summation orders.
    """
    eps = np.finfo(want.dtype).eps
    if want.dtype == np.float64:
        eps, atol = 1e-12, atol + 1e-13 * float(np.max(np.abs(want), initial=0.0))
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol_ulps * eps,
                               atol=atol + float(np.finfo(want.dtype).smallest_subnormal))


def gradients(size, sizes, dtype, seed=0, scale=1.0):
    """Correlated gradients (a shared direction plus noise), so that the coefficients are far from 1."""
    rng = np.random.default_rng(seed)
    shared = [rng.standard_normal(k) for k in sizes]
    return [[((shared[i] + 0.7 * rng.standard_normal(k)) * scale).astype(dtype) for i, k in enumerate(sizes)]
            for _ in range(size)]


# ------------------------------------------------------------------------------------------------ weights
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_orthogonal_gradients_are_summed(n):
    np.testing.assert_array_equal(tree_weights(np.diag(np.arange(1.0, n + 1))), np.ones(n))


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_equal_gradients_are_averaged_at_powers_of_two(n):
    g = np.full((n, 7), 3.0)
    np.testing.assert_allclose(tree_weights(g @ g.T), np.full(n, 1.0 / n))


@pytest.mark.parametrize("n", [3, 5, 6, 7])
def test_equal_gradients_give_the_gradient_at_other_sizes(n):
    g = np.full((n, 7), 3.0)
    w = tree_weights(g @ g.T)
    assert w.sum() == pytest.approx(1.0)
    if n == 3:                                   # the fold: Adasum(Adasum(g0, g2), g1)
        np.testing.assert_allclose(w, [0.25, 0.5, 0.25])


def test_two_rank_closed_form():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(50), rng.standard_normal(50)
    gram = np.array([[a @ a, a @ b], [a @ b, b @ b]])
    want = [1 - (a @ b) / (2 * (a @ a)), 1 - (a @ b) / (2 * (b @ b))]
    np.testing.assert_allclose(tree_weights(gram), want, rtol=1e-14)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 8])
def test_weights_reproduce_the_reference(n):
    rng = np.random.default_rng(n)
    g = rng.standard_normal((n, 40)) + rng.standard_normal(40)
    np.testing.assert_allclose(tree_weights(g @ g.T) @ g, ref_adasum(list(g)), rtol=1e-12, atol=1e-12)


def test_the_tree_pairs_adjacent_ranks():
    # Data on which the pairing matters: the reference with another pairing disagrees, the weights agree.
    rng = np.random.default_rng(11)
    g = rng.standard_normal((4, 30)) + 2 * rng.standard_normal(30)
    other = ref_pair(ref_pair(g[0], g[2]), ref_pair(g[1], g[3]))
    assert not np.allclose(ref_adasum(list(g)), other)
    np.testing.assert_allclose(tree_weights(g @ g.T) @ g, ref_adasum(list(g)), rtol=1e-12)


def test_weights_are_batched_over_tensors():
    rng = np.random.default_rng(5)
    grams = []
    for _ in range(3):
        g = rng.standard_normal((4, 10))
        grams.append(g @ g.T)
    np.testing.assert_array_equal(tree_weights(np.stack(grams)), np.stack([tree_weights(m) for m in grams]))


def test_zero_and_tiny_norms_keep_coefficient_one():
    assert SQRT_DBL_MIN == sys.float_info.min ** 0.5
    a = np.array([1.0, 2.0])
    gram = np.array([[a @ a, 0.0], [0.0, 0.0]])                      # b = 0
    np.testing.assert_array_equal(tree_weights(gram), [1.0, 1.0])
    np.testing.assert_array_equal(tree_weights(np.zeros((4, 4))), np.ones(4))
    below = SQRT_DBL_MIN / 2                                         # both norms below the threshold: a sum
    np.testing.assert_array_equal(tree_weights(np.full((2, 2), below)), [1.0, 1.0])


def test_non_square_gram_is_refused():
    with pytest.raises(ValueError, match="square"):
        tree_weights(np.zeros((2, 3)))


def test_tensor_pieces():
    bounds = np.array([0, 5, 5, 12, 20])
    assert tensor_pieces(bounds, 0, 20) == [(0, 0, 5), (2, 5, 12), (3, 12, 20)]
    assert tensor_pieces(bounds, 4, 13) == [(0, 0, 1), (2, 1, 8), (3, 8, 9)]
    assert tensor_pieces(bounds, 6, 6) == []
    assert tensor_pieces(bounds, 13, 20) == [(3, 0, 7)]


# ------------------------------------------------------------------------------------------------ data planes
def run_adasum(backends, per_rank, prescale=1.0, postscale=1.0, in_place=False):
    def work(r):
        inputs = [x.copy() for x in per_rank[r]]
        outputs = inputs if in_place else [np.full_like(x, np.nan) for x in inputs]
        plane_adasum(backends[r], inputs, outputs, prescale, postscale)
        return outputs

    return run_ranks(len(backends), work)


def check(backends, per_rank, prescale=1.0, postscale=1.0, hosts=None, in_place=False, atol=0.0):
    want = expected(per_rank, prescale, postscale, hosts)
    results = run_adasum(backends, per_rank, prescale, postscale, in_place)
    for r, outs in enumerate(results):
        for k, (got, w) in enumerate(zip(outs, want)):
            assert got.dtype == w.dtype
            assert_matches(got, w, atol=atol)
            assert got.tobytes() == results[0][k].tobytes(), f"rank {r} differs from rank 0 on tensor {k}"


@pytest.fixture
def planes():
    """``planes(kind, n)``: n backends of one kind (tcp, shm), closed after the test."""
    made = []

    def make(kind, n):
        comms = make_comms(n)
        if kind == "tcp":
            backends = [TcpBackend(c) for c in comms]
        else:
            tag = f"adasum-{uuid.uuid4().hex[:12]}"
            backends = run_ranks(n, lambda r: ShmBackend(comms[r], tag, 64 * 1024))
        made.append((comms, backends))
        return backends

    yield make
    for comms, backends in made:
        for b in backends:
            if isinstance(b, ShmBackend):
                b.seg.close()
        close_comms(comms)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", ["tcp", "shm"])
def test_fused_batch_matches_the_reference(planes, kind, size, dtype):
    backends = planes(kind, size)
    check(backends, gradients(size, FUSED, dtype, seed=size))
    check(backends, gradients(size, FUSED, dtype, seed=7), prescale=0.5, postscale=3.0)


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("kind", ["tcp", "shm"])
def test_single_tensors_in_place_and_shorter_than_the_group(planes, kind, size):
    backends = planes(kind, size)
    for n in (1, size - 1, 100_003):
        check(backends, gradients(size, [n], np.float32, seed=n), in_place=True)
    check(backends, gradients(size, [1000], np.float64), prescale=2.0, in_place=True)
    check(backends, gradients(size, [0], np.float32))


def test_mpi_plane_runs_the_default_algorithm():
    # MPI.COMM_SELF: one rank, but the MPI primitives (Alltoallv, float64 Allreduce, Allgatherv) all run.
    mpi = pytest.importorskip("mpi4py.MPI")
    from horovod.backends.mpi import MPIBackend

    backend = MPIBackend(mpi.COMM_SELF)
    for dtype in DTYPES:
        check([backend], gradients(1, FUSED, dtype), prescale=0.5, postscale=3.0)


def test_one_rank_is_a_scaled_copy():
    x = np.arange(10, dtype=np.float32)
    out = np.empty_like(x)
    LocalBackend().adasum([x], [out], 2.0, 0.25)
    np.testing.assert_array_equal(out, x * 0.5)


def test_integer_tensors_are_refused_with_advice(planes):
    with pytest.raises(TypeError, match="float16, float32 and float64.*int32.*op=Average or Sum"):
        LocalBackend().adasum([np.ones(3, np.int32)], [np.empty(3, np.int32)])
    backends = planes("tcp", 2)
    with pytest.raises(TypeError, match="bool"):
        run_adasum(backends, [[np.ones(3, bool)], [np.ones(3, bool)]])


# ------------------------------------------------------------------------------------------------ stability
def _cases(dtype):
    rng = np.random.default_rng(1)
    v = rng.standard_normal(3000)
    tiny = {np.float16: 1e-4, np.float32: 1e-30, np.float64: 1e-200}[dtype]
    huge = {np.float16: 100.0, np.float32: 1e30, np.float64: 1e150}[dtype]
    return {
        "nearly_parallel": [v, v + 1e-3 * rng.standard_normal(3000), v * 1.001, v - 1e-3 * rng.standard_normal(3000)],
        "nearly_opposite": [v, -v + 1e-3 * rng.standard_normal(3000), v * 0.999, -v],
        "exactly_opposite": [v, -v, 2 * v, -2 * v],
        "one_zero": [v, np.zeros(3000), rng.standard_normal(3000), v],
        "all_zero": [np.zeros(3000)] * 4,
        "tiny": [tiny * rng.standard_normal(3000) for _ in range(4)],
        "huge": [huge * rng.standard_normal(3000) for _ in range(4)],
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["nearly_parallel", "nearly_opposite", "exactly_opposite", "one_zero", "all_zero",
                                  "tiny", "huge"])
def test_stability(planes, case, dtype):
    vectors = [v.astype(dtype) for v in _cases(dtype)[case]]
    backends = planes("tcp", 4)
    scale = float(np.max(np.abs(np.stack(vectors).astype(np.float64))))
    # Nearly opposite vectors cancel: the Gram route and the direct one differ by float64 noise of the inputs.
    check(backends, [[v] for v in vectors], atol=1e-12 * scale)
    results = run_adasum(backends, [[v] for v in vectors])
    assert all(np.isfinite(out[0]).all() for out in results)
    if case in ("exactly_opposite", "all_zero"):
        # Zero once rounded to float16/32; float64 keeps BLAS's last-bit noise (the Gram entries of g and -g
        # need not be exact negatives of each other).
        limit = 8 * np.finfo(np.float64).eps * scale if dtype == np.float64 else 0.0
        assert np.max(np.abs(results[0][0])) <= limit


def test_a_zero_gradient_leaves_the_other_unchanged(planes):
    rng = np.random.default_rng(2)
    g = [rng.standard_normal(500) for _ in range(4)]
    backends = planes("shm", 2)
    out = run_adasum(backends, [[g[0]], [np.zeros(500)]])
    np.testing.assert_array_equal(out[0][0], g[0])
    backends = planes("tcp", 4)                           # a joined rank 2: Adasum(Adasum(g0, g1), g3)
    out = run_adasum(backends, [[g[0]], [g[1]], [np.zeros(500)], [g[3]]])
    np.testing.assert_allclose(out[0][0], ref_pair(ref_pair(g[0], g[1]), g[3]), rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------------ hierarchical
def hierarchical_group(hosts, monkeypatch, knob):
    """HierarchicalBackends over fake hosts (a list of host names by rank), as the factory builds them."""
    monkeypatch.setenv("HOROVOD_HIERARCHICAL_ALLREDUCE", "1" if knob else "0")
    n = len(hosts)
    comms = make_comms(n, hosts=hosts)
    tag = uuid.uuid4().hex[:12]
    by_host = {}
    for r, h in enumerate(hosts):
        by_host.setdefault(h, []).append(r)

    def build(r):
        local = by_host[hosts[r]]
        cross = sorted(members[local.index(r)] for members in by_host.values())
        return HierarchicalBackend(TcpBackend(comms[r]), ShmBackend(comms[r].sub(local), f"{tag}-{hosts[r]}",
                                                                    64 * 1024),
                                   TcpBackend(comms[r].sub(cross)))

    return comms, run_ranks(n, build), list(by_host.values())


@pytest.mark.parametrize("knob", [True, False])
@pytest.mark.parametrize("hosts", [["a", "a", "b", "b"], ["a", "a", "b", "b", "c", "c"], ["a", "b", "c", "d"]],
                         ids=["2x2", "3x2", "4x1"])
def test_hierarchical(monkeypatch, hosts, knob):
    comms, backends, members = hierarchical_group(hosts, monkeypatch, knob)
    try:
        assert all(b.hierarchical_adasum is knob for b in backends)
        for dtype in DTYPES:
            per_rank = gradients(len(hosts), FUSED, dtype, seed=len(hosts))
            check(backends, per_rank, prescale=0.5, postscale=2.0, hosts=members if knob else None)
        single = gradients(len(hosts), [70_001], np.float32, seed=9)
        check(backends, single, hosts=members if knob else None, in_place=True)
    finally:
        for b in backends:
            b.local.seg.close()
        close_comms(comms)


def test_hierarchical_differs_from_flat_where_hosts_hold_several_ranks(monkeypatch):
    # Guards the test above: on this data the two semantics give different numbers.
    per_rank = gradients(4, [300], np.float64, seed=4)
    hosts = [[0, 1], [2, 3]]
    assert not np.allclose(expected(per_rank, hosts=hosts)[0], expected(per_rank)[0])


# ------------------------------------------------------------------------------------------------ engine
class _Spy(LocalBackend):
    def __init__(self):
        super().__init__()
        self.calls = []

    def adasum(self, inputs, outputs, prescale=1.0, postscale=1.0):
        self.calls.append(("adasum", prescale, postscale, [a.copy() for a in inputs]))
        super().adasum(inputs, outputs, prescale, postscale)

    def allreduce(self, inputs, outputs, op, prescale=1.0, postscale=1.0):
        self.calls.append(("allreduce", op))
        super().allreduce(inputs, outputs, op, prescale, postscale)


def _entry(tensor, index, done):
    handle = SimpleNamespace(set_result=lambda i, value: done.append((i, value)))
    return SimpleNamespace(tensor=tensor, output=np.empty_like(tensor), handle=handle, index=index)


def test_executor_runs_adasum_without_the_average_rewrite():
    spy = _Spy()
    ctx = SimpleNamespace(rank=0, size=4, ranks=[0], backend=spy)
    batch = [TensorResponse(f"t{i}", RequestType.ALLREDUCE, DataType.FLOAT32, [3], ReduceOp.ADASUM, 2.0, 0.5, -1,
                            None) for i in range(2)]
    done = []
    entries = [_entry(np.arange(3, dtype=np.float32), 0, done), None]     # the second tensor's rank joined
    executors.allreduce(ctx, batch, entries)
    assert [c[:3] for c in spy.calls] == [("adasum", 2.0, 0.5)]
    assert not spy.calls[0][3][1].any()                                      # the joined rank's zeros
    np.testing.assert_array_equal(done[0][1], np.arange(3, dtype=np.float32))


def test_adasum_is_never_fused_with_sum():
    responses = [TensorResponse(f"t{i}", RequestType.ALLREDUCE, DataType.FLOAT32, [10],
                                ReduceOp.ADASUM if i % 2 else ReduceOp.SUM, 1.0, 1.0, -1, None) for i in range(4)]
    batches = fusion.plan(responses, 1 << 20)
    assert [[r.name for r in b] for b in batches] == [["t0", "t2"], ["t1", "t3"]]


@pytest.mark.parametrize("n", [3, 20])                 # pairwise dots, and one matmul per chunk
def test_partial_gram_both_routes(n):
    from horovod.backends.adasum import chunk_columns, partial_gram

    rng = np.random.default_rng(n)
    columns = chunk_columns(n)
    rows = rng.standard_normal((n, 2 * columns + 500)).astype(np.float32)
    pieces = [(0, 0, 10), (2, 10, 2 * columns + 500)]
    gram = partial_gram(rows, pieces, 3, np.empty((n, columns)))
    wide = rows.astype(np.float64)
    np.testing.assert_allclose(gram[0], wide[:, :10] @ wide[:, :10].T, rtol=1e-12)
    assert not gram[1].any()
    np.testing.assert_allclose(gram[2], wide[:, 10:] @ wide[:, 10:].T, rtol=1e-12)
