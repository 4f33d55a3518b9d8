"""horovod.torch with op=hvd.Adasum: the collectives (plain, in-place, async, grouped, on a process set, their
gradient) against a single-process reference of the formula (tests/support/adasum_reference.py), the stability
cases, DistributedOptimizer's delta algorithm, and a training run on the digits data that converges.

Every rank builds every rank's input from fixed seeds, so each rank computes the whole job's expected result.
At 1 rank Adasum is the identity; at 3 ranks the documented fold applies (upstream refuses that size).
"""
import numpy as np
import pytest
import torch

import horovod.torch as hvd
from tests.support.adasum_reference import adasum, tolerance
from tests.support.process_sets import even_odd_sets  # (turns dynamic process sets on)

torch.set_num_threads(1)

DTYPES = [torch.float16, torch.float32, torch.float64]


def gradient(rank, shape, dtype, salt=0):
    rng = np.random.default_rng(100 * salt + rank)
    return torch.from_numpy(rng.normal(size=shape)).to(dtype)


def reference(per_rank):
    """The reference for a list of torch tensors (one per rank)."""
    return torch.from_numpy(adasum([t.numpy() for t in per_rank]))


def assert_adasum(got, per_rank):
    want = reference(per_rank)
    assert got.dtype == per_rank[0].dtype and got.shape == per_rank[0].shape
    np.testing.assert_allclose(got.double().numpy(), want.double().numpy(), **tolerance(want.numpy().dtype))


# ---------------------------------------------------------------------------------------------- collectives
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(17,), (4, 5, 3)], ids=["vector", "tensor"])
def test_allreduce_matches_the_reference(dtype, shape):
    rank, size = hvd.rank(), hvd.size()
    per_rank = [gradient(r, shape, dtype) for r in range(size)]
    assert_adasum(hvd.allreduce(per_rank[rank], op=hvd.Adasum, name=f"adasum.{dtype}.{len(shape)}"), per_rank)
    inplace = per_rank[rank].clone()
    hvd.allreduce_(inplace, op=hvd.Adasum, name=f"adasum_.{dtype}.{len(shape)}")
    assert_adasum(inplace, per_rank)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_async_and_grouped_forms_reduce_each_tensor_on_its_own(dtype):
    """A group is fused into one buffer, but dot products and norms stay per tensor (the result of each tensor
    equals the reference of that tensor alone)."""
    rank, size = hvd.rank(), hvd.size()
    shapes = [(7,), (3, 4), (1,)]
    per_rank = [[gradient(r, shape, dtype, salt=i) * (i + 1) for r in range(size)] for i, shape in enumerate(shapes)]
    mine = [tensors[rank] for tensors in per_rank]
    handle = hvd.allreduce_async(mine[0], op=hvd.Adasum, name="adasum.async")
    assert_adasum(hvd.synchronize(handle), per_rank[0])
    inplace = mine[1].clone()
    hvd.synchronize(hvd.allreduce_async_(inplace, op=hvd.Adasum, name="adasum.async_"))
    assert_adasum(inplace, per_rank[1])
    for got, tensors in zip(hvd.grouped_allreduce(mine, op=hvd.Adasum, name="adasum.grouped"), per_rank):
        assert_adasum(got, tensors)
    copies = [t.clone() for t in mine]
    hvd.synchronize(hvd.grouped_allreduce_async_(copies, op=hvd.Adasum, name="adasum.grouped_"))
    for got, tensors in zip(copies, per_rank):
        assert_adasum(got, tensors)


def test_scale_factors_apply_around_adasum():
    """Adasum is homogeneous: prescale and postscale multiply the result."""
    rank, size = hvd.rank(), hvd.size()
    per_rank = [gradient(r, (9,), torch.float64) for r in range(size)]
    out = hvd.allreduce(per_rank[rank], op=hvd.Adasum, prescale_factor=2.0, postscale_factor=0.25,
                        name="adasum.scaled")
    torch.testing.assert_close(out, reference(per_rank) * 0.5)


@pytest.mark.parametrize("case", ["zeros", "one_nonzero", "parallel", "nearly_parallel", "nearly_opposite"])
def test_stability_cases(case):
    rank, size = hvd.rank(), hvd.size()
    v = gradient(999, (33,), torch.float64)
    w = gradient(998, (33,), torch.float64)
    make = {"zeros": lambda r: torch.zeros(33, dtype=torch.float64),
            "one_nonzero": lambda r: v if r == size - 1 else torch.zeros(33, dtype=torch.float64),
            "parallel": lambda r: v.clone(),
            "nearly_parallel": lambda r: v + 1e-7 * r * w,
            "nearly_opposite": lambda r: (-1) ** r * v + 1e-7 * w}[case]
    per_rank = [make(r) for r in range(size)]
    out = hvd.allreduce(per_rank[rank], op=hvd.Adasum, name=f"adasum.{case}")
    assert torch.isfinite(out).all()
    assert_adasum(out, per_rank)
    if case in ("zeros", "one_nonzero", "parallel"):          # exact properties of the formula
        torch.testing.assert_close(out, per_rank[-1] if case == "one_nonzero" else per_rank[0])


def test_allreduce_grad_is_the_adasum_of_the_gradients():
    rank, size = hvd.rank(), hvd.size()
    x = gradient(rank, (6,), torch.float64).requires_grad_(True)
    upstream = [gradient(r, (6,), torch.float64, salt=5) for r in range(size)]
    hvd.allreduce(x, op=hvd.Adasum, name="adasum.grad").backward(upstream[rank])
    assert_adasum(x.grad, upstream)


@pytest.fixture
def sets():
    yield from even_odd_sets()


def test_adasum_on_a_process_set(sets):
    """Upstream refuses non-global sets; here the algorithm runs on the set's own data plane, and so does the
    delta optimizer."""
    ps, _ = sets
    per_rank = {r: gradient(r, (10,), torch.float32) for r in ps.ranks}
    out = hvd.allreduce(per_rank[hvd.rank()], op=hvd.Adasum, name="adasum.set", process_set=ps)
    assert_adasum(out, [per_rank[r] for r in ps.ranks])
    w = torch.nn.Parameter(torch.zeros(10, dtype=torch.float32))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)],
                                         op=hvd.Adasum, process_set=ps)
    (w * per_rank[hvd.rank()]).sum().backward()
    optimizer.step()
    assert_adasum(w.detach(), [-per_rank[r] for r in ps.ranks])


def test_integer_tensors_and_reducescatter_are_refused():
    with pytest.raises(ValueError, match="Adasum needs float16, float32 or float64"):
        hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum)
    with pytest.raises(RuntimeError, match="reducescatter supports op=Sum and op=Average, not op=Adasum"):
        hvd.reducescatter(torch.ones(2 * hvd.size()), op=hvd.Adasum)


# ---------------------------------------------------------------------------------------------- optimizer
def test_distributed_optimizer_combines_weight_deltas_with_adasum():
    """SGD(lr): each rank's local delta is -lr * g_r; the weights become w0 + Adasum(-lr * g_r) on every rank
    (at 1 rank the plain optimizer, as upstream)."""
    rank, size = hvd.rank(), hvd.size()
    w0 = gradient(7, (5,), torch.float64)
    w = torch.nn.Parameter(w0.clone())
    b = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD([w, b], lr=0.1), named_parameters=[("w", w), ("b", b)],
                                         op=hvd.Adasum)
    xs = [gradient(r, (5,), torch.float64, salt=3) for r in range(size)]
    for step in range(2):
        optimizer.zero_grad()
        ((w * xs[rank]).sum() * (step + 1) + b.sum()).backward()
        optimizer.step()
        w0 = w0 + reference([-0.1 * (step + 1) * x for x in xs])
        torch.testing.assert_close(w.detach(), w0)
        torch.testing.assert_close(b.detach(), torch.full((2,), -0.1 * (step + 1), dtype=torch.float64))
    if size > 1:
        with pytest.raises(AssertionError, match="Skipping synchronization is not supported"):
            optimizer.skip_synchronize()


def test_adasum_optimizer_with_adam_state_broadcast_and_accumulation():
    rank = hvd.rank()
    torch.manual_seed(rank)
    model = torch.nn.Linear(4, 3)
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters(), op=hvd.Adasum,
                                         backward_passes_per_step=2)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for _ in range(3):
        optimizer.zero_grad()
        for half in range(2):
            model(gradient(rank, (8, 4), torch.float32, salt=half)).pow(2).mean().backward()
        optimizer.step()
    assert_same_on_every_rank(model.parameters(), "adasum.adam.check")     # the same combined delta everywhere


def assert_same_on_every_rank(parameters, name):
    for p in parameters:
        gathered = hvd.allgather(p.detach().reshape(1, -1), name=name)
        torch.testing.assert_close(gathered, gathered[:1].expand_as(gathered))


def test_adasum_training_converges_on_digits():
    """A small network trained with DistributedOptimizer(op=Adasum) on each rank's shard of the digits."""
    from sklearn.datasets import load_digits

    rank, size = hvd.rank(), hvd.size()
    digits = load_digits()
    x = torch.from_numpy((digits.data / 16.0).astype(np.float32))[rank::size]
    y = torch.from_numpy(digits.target).long()[rank::size]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=model.named_parameters(), op=hvd.Adasum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    losses = []
    for step in range(120):
        batch = slice((step * 64) % len(x), (step * 64) % len(x) + 64)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
        loss.backward()
        optimizer.step()
        losses.append(float(hvd.allreduce(loss.detach(), name="adasum.digits.loss")))
    with torch.no_grad():
        final = float(hvd.allreduce(torch.nn.functional.cross_entropy(model(x), y), name="adasum.digits.final"))
    # Seeded (seed 0), the final loss is 0.24, 0.25, 0.10 and 0.05 at 1-4 ranks on the reference VM, from a
    # first loss of 2.32-2.34; seeds 0-9 end at 0.27 at worst and start at 2.29 at least. The bound is 1.5
    # times the worst, rounded up: still far below the untrained loss (ln 10 = 2.3).
    assert losses[0] > 2.0 and final < 0.45, (losses[::20], final)
    assert_same_on_every_rank(model.parameters(), "adasum.digits.check")
