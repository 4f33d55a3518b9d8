"""Adasum through the numpy binding at any number of ranks: equal to the single-process reference of upstream's
formula (tests/support/adasum_reference.py; at sizes that are not a power of two, the documented fold), per
tensor inside a fused or grouped batch, on process sets, and with a rank that joined.

Run on several hosts with HOROVOD_HIERARCHICAL_ALLREDUCE=1 (test_parallel_suite.py does), the expected value is
the hierarchical variant's: Adasum across hosts of each host's average (ranks fill hosts in order).
"""
import os

import numpy as np
import pytest

import horovod.numpy as hvd
from tests.support.adasum_reference import adasum as flat_adasum
from tests.support.adasum_reference import tolerance
from tests.support.process_sets import temporary_sets

HIERARCHICAL = os.environ.get("HOROVOD_HIERARCHICAL_ALLREDUCE") == "1"


def adasum(per_rank, ranks=None):
    """The expected result for these ranks' tensors (``ranks``: their global ranks, default 0..n-1)."""
    ranks = list(range(len(per_rank))) if ranks is None else ranks
    local = hvd.local_size()
    if not HIERARCHICAL or hvd.size() == local:
        return flat_adasum(per_rank)
    hosts = {}
    for r, g in zip(ranks, per_rank):
        hosts.setdefault(r // local, []).append(np.asarray(g))
    if len({len(v) for v in hosts.values()}) != 1:
        return flat_adasum(per_rank)         # hosts with unequal shares: the plane is not hierarchical
    # Each host sums in the tensor's dtype (as its shm plane does), Adasum combines the host sums, and the result
    # is divided by the ranks per host: the Adasum of the host averages, Adasum being scale-invariant.
    per_host = len(next(iter(hosts.values())))
    sums = [np.sum(v, axis=0, dtype=v[0].dtype) for _, v in sorted(hosts.items())]
    return flat_adasum(sums) / np.asarray(per_host, sums[0].dtype)


def gradient(rank: int, n: int, dtype, seed: int = 0) -> np.ndarray:
    """Rank ``rank``'s tensor: a shared direction plus a part of its own, so no pair is parallel or orthogonal."""
    rng = np.random.default_rng(seed)
    shared = rng.standard_normal(n)
    own = np.random.default_rng(seed + 1 + rank).standard_normal(n)
    return (shared + (rank + 1) * own).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=str)
def test_adasum_equals_the_reference(dtype):
    rank, size = hvd.rank(), hvd.size()
    for n in (1, 3, 1000, 100_003):
        got = hvd.allreduce(gradient(rank, n, dtype), op=hvd.Adasum, name=f"adasum.{n}")
        expected = adasum([gradient(r, n, dtype) for r in range(size)])
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), **tolerance(dtype))


def test_each_tensor_of_a_group_is_reduced_on_its_own():
    rank, size = hvd.rank(), hvd.size()
    shapes = [(7,), (300, 2), (1,), (5000,)]
    tensors = [gradient(rank, int(np.prod(s)), np.float32, seed=10 * i).reshape(s) for i, s in enumerate(shapes)]
    got = hvd.grouped_allreduce(tensors, op=hvd.Adasum, name="adasum.group")
    for i, (shape, out) in enumerate(zip(shapes, got)):
        expected = adasum([gradient(r, int(np.prod(shape)), np.float32, seed=10 * i).reshape(shape)
                           for r in range(size)])
        np.testing.assert_allclose(out, expected, **tolerance(np.float32))
    # Scaling one tensor on every rank scales its result and leaves the others alone (per-tensor dot products).
    scaled = [t * (100.0 if i == 3 else 1.0) for i, t in enumerate(tensors)]
    again = hvd.grouped_allreduce(scaled, op=hvd.Adasum, name="adasum.group.scaled")
    np.testing.assert_allclose(again[3], got[3] * 100.0, rtol=1e-5, atol=1e-6 * np.abs(again[3]).max())
    np.testing.assert_allclose(again[0], got[0], **tolerance(np.float32))


def test_scale_factors_apply_before_and_after():
    rank, size = hvd.rank(), hvd.size()
    x = gradient(rank, 64, np.float64)
    got = hvd.allreduce(x, op=hvd.Adasum, prescale_factor=2.0, postscale_factor=0.25, name="adasum.scaled")
    expected = adasum([2.0 * gradient(r, 64, np.float64) for r in range(size)]) * 0.25
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_adasum_on_a_process_set():
    rank, size = hvd.rank(), hvd.size()
    if size < 3:
        pytest.skip("needs 3 ranks for a set of 2 that is not the global set")
    with temporary_sets([0, size - 1]) as (ps,):
        if ps.included():
            got = hvd.allreduce(gradient(rank, 500, np.float32), op=hvd.Adasum, name="adasum.set", process_set=ps)
            expected = adasum([gradient(r, 500, np.float32) for r in ps.ranks], ps.ranks)
            np.testing.assert_allclose(got, expected, **tolerance(np.float32))


def test_a_rank_that_joined_contributes_a_zero_vector():
    rank, size = hvd.rank(), hvd.size()
    if size < 2:
        pytest.skip("needs 2 ranks")
    if rank == size - 1:
        hvd.join()
        return
    got = hvd.allreduce(gradient(rank, 40, np.float64), op=hvd.Adasum, name="adasum.joined")
    expected = adasum([gradient(r, 40, np.float64) for r in range(size - 1)] + [np.zeros(40)])
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    hvd.join()
