"""hvd.join() with uneven numbers of batches under DistributedOptimizer (contract 2.10).

Rank r trains on BASE + r + 1 batches: the last ranks keep training after the others joined, and the joined
ranks contribute zero gradients to the averages. Training must finish everywhere, join() must return the
same last rank everywhere, and the models must be identical across ranks at the end.
"""
import torch
import torch.nn.functional as F
from torch import nn

import horovod.torch as hvd

torch.set_num_threads(1)

BASE = 2


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1)).double()


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(4, 3, generator=g, dtype=torch.float64), torch.randn(4, 1, generator=g, dtype=torch.float64)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def reference(size):
    """Single-process replay: at step k the averaged gradient is sum over active ranks / size."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    history = []
    for step in range(BASE + size):
        active = [r for r in range(size) if step < BASE + r + 1]
        opt.zero_grad()
        loss = sum(F.mse_loss(model(batch(r, step)[0]), batch(r, step)[1]) for r in active) / size
        loss.backward()
        opt.step()
        history.append(flat(model).clone())
    return history


def test_uneven_batches_then_join():
    rank, size = hvd.rank(), hvd.size()
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    expected = reference(size)
    steps = BASE + rank + 1
    for step in range(steps):
        x, y = batch(rank, step)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        # Every rank still training agrees with the single-process replay after every step.
        torch.testing.assert_close(flat(model), expected[step], rtol=1e-9, atol=1e-10)
    last = hvd.join()
    assert last == size - 1, f"rank {rank}: join() returned {last}"
    assert hvd.allgather(torch.tensor([last])).tolist() == [size - 1] * size
    # The ranks that joined early stopped at their own step; the full run is the last one's. Each rank is
    # checked against its own step above; after everyone joined, bring everyone to the final model and check.
    hvd.broadcast_parameters(model.state_dict(), root_rank=size - 1)
    rows = hvd.allgather(flat(model).reshape(1, -1))
    for r in range(size):
        assert torch.equal(rows[r], rows[0])
    torch.testing.assert_close(rows[0], expected[-1], rtol=1e-9, atol=1e-10)


def test_identical_models_after_every_shared_step_then_join():
    rank, size = hvd.rank(), hvd.size()
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=[(f"j2.{n}", p) for n, p in model.named_parameters()])
    shared = BASE + 1                                   # every rank runs at least this many steps
    for step in range(BASE + rank + 1):
        x, y = batch(rank, 50 + step)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        if step < shared:                               # nobody has joined yet: allgather is allowed
            rows = hvd.allgather(flat(model).reshape(1, -1), name=f"j2.step.{step}")
            for r in range(size):
                assert torch.equal(rows[r], rows[0]), f"step {step}: rank {r}'s model differs from rank 0's"
    assert hvd.join() == size - 1
    out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="j2.after")
    assert torch.equal(out, torch.full((2,), float(size)))
