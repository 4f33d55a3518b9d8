"""Sparse gradients: sparse_allreduce_async, and DistributedOptimizer with torch.optim.SparseAdam.

Upstream allreduces a sparse gradient as an allgather of its indices and one of its values, so the optimizer
steps on a sparse gradient (``sparse_as_dense=False``); ``sparse_as_dense=True`` allreduces the dense form and
turns the result back into a sparse gradient. SparseAdam accepts nothing but sparse gradients, so both must
end sparse, and training must match one process training on the global batch (each rank trains on its shard).
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import horovod.torch as hvd
import horovod.torch.optimizer as hvd_optimizer

torch.set_num_threads(1)

PER = 3


class Bag(nn.Module):
    """A sparse embedding whose rows are summed per sample: every parameter has a sparse gradient."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.emb = nn.Embedding(12, 4, sparse=True).double()

    def forward(self, idx):
        return self.emb(idx).sum(1)


def global_batches(steps, size):
    g = torch.Generator().manual_seed(8)
    return [(torch.randint(0, 12, (PER * size, 3), generator=g),
             torch.randn(PER * size, 4, generator=g, dtype=torch.float64)) for _ in range(steps)]


def shard(t, rank):
    return t[rank * PER:(rank + 1) * PER]


def spy(monkeypatch):
    """Record which allreduce path the optimizer takes for each gradient (a small dense one may go in the grouped
    allreduce of small gradients, see DistributedOptimizer._small_gradients)."""
    calls = []
    dense, sparse = hvd_optimizer.allreduce_async_, hvd_optimizer.sparse_allreduce_async
    grouped = hvd_optimizer.grouped_allreduce_

    def grouped_spy(tensors, *args, **kwargs):
        calls.extend(("dense", t.is_sparse) for t in tensors)
        return grouped(tensors, *args, **kwargs)

    def dense_spy(tensor, *args, **kwargs):
        calls.append(("dense", tensor.is_sparse))
        return dense(tensor, *args, **kwargs)

    def sparse_spy(tensor, *args, **kwargs):
        calls.append(("sparse", tensor.is_sparse))
        return sparse(tensor, *args, **kwargs)

    monkeypatch.setattr(hvd_optimizer, "allreduce_async_", dense_spy)
    monkeypatch.setattr(hvd_optimizer, "sparse_allreduce_async", sparse_spy)
    monkeypatch.setattr(hvd_optimizer, "grouped_allreduce_", grouped_spy)
    return calls


@pytest.mark.parametrize("sparse_as_dense", [False, True], ids=["sparse", "as_dense"])
def test_sparse_adam_matches_single_process_on_the_global_batch(sparse_as_dense, monkeypatch):
    rank, size = hvd.rank(), hvd.size()
    calls = spy(monkeypatch)
    data = global_batches(3, size)
    model = Bag()
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(model.parameters()), lr=0.1),
                                   named_parameters=[(f"sparse_adam.{sparse_as_dense}.{n}", p)
                                                     for n, p in model.named_parameters()],
                                   sparse_as_dense=sparse_as_dense)
    hvd.broadcast_optimizer_state(opt, root_rank=0, model=model)       # a fresh SparseAdam: state made first
    for idx, target in data:
        opt.zero_grad()
        F.mse_loss(model(shard(idx, rank)), shard(target, rank)).backward()
        opt.synchronize()
        grad = model.emb.weight.grad
        assert grad.is_sparse and grad.sparse_dim() == 1, "the optimizer must step on a sparse gradient"
        with opt.skip_synchronize():
            opt.step()

    ref = Bag()
    ref_opt = torch.optim.SparseAdam(list(ref.parameters()), lr=0.1)
    ref.emb.weight.grad = torch.zeros_like(ref.emb.weight).to_sparse(1)     # what materialising the state did
    ref_opt.step()
    for idx, target in data:
        ref_opt.zero_grad()
        F.mse_loss(ref(idx), target).backward()
        ref_opt.step()
    torch.testing.assert_close(model.emb.weight.detach(), ref.emb.weight.detach(), rtol=1e-9, atol=1e-10)
    rows = hvd.allgather(model.emb.weight.detach().reshape(1, -1), name=f"sparse_adam.same.{sparse_as_dense}")
    assert all(torch.equal(rows[r], rows[0]) for r in range(size))

    if size > 1:                        # one rank has no hooks and reduces nothing
        expected = ("dense", False) if sparse_as_dense else ("sparse", True)
        assert calls and set(calls) == {expected}, calls


def test_sparse_as_dense_with_sgd_steps_on_a_sparse_gradient():
    rank, size = hvd.rank(), hvd.size()
    model = Bag()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=[("sgd.as_dense.emb", model.emb.weight)], sparse_as_dense=True)
    (idx, target), = global_batches(1, size)
    F.mse_loss(model(shard(idx, rank)), shard(target, rank)).backward()
    opt.synchronize()
    assert model.emb.weight.grad.is_sparse
    dense = model.emb.weight.grad.to_dense()
    ref = Bag()
    F.mse_loss(ref(idx), target).backward()
    torch.testing.assert_close(dense, ref.emb.weight.grad.to_dense(), rtol=1e-12, atol=1e-12)
    with opt.skip_synchronize():
        opt.step()


def test_broadcast_optimizer_state_of_a_fresh_sparse_adam():
    rank = hvd.rank()
    model = Bag()
    opt = torch.optim.SparseAdam(list(model.parameters()), lr=0.01 * (rank + 1), betas=(0.9, 0.99 - 0.01 * rank))
    before = model.emb.weight.detach().clone()
    hvd.broadcast_optimizer_state(opt, root_rank=0, model=model)
    assert torch.equal(model.emb.weight.detach(), before), "materialising the state moved the parameters"
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01) and opt.param_groups[0]["betas"] == (0.9, 0.99)
    state = opt.state[model.emb.weight]
    assert set(state) >= {"step", "exp_avg", "exp_avg_sq"}
    assert model.emb.weight.grad is not None and model.emb.weight.grad.is_sparse


def sparse_rows(rank, rows):
    """A (10, 3) sparse tensor with values in ``rows`` (sparse_dim 1, dense values), rank-dependent."""
    index = torch.tensor([rows], dtype=torch.int64)
    values = torch.arange(len(rows) * 3, dtype=torch.float64).reshape(len(rows), 3) + 10 * rank
    return torch.sparse_coo_tensor(index, values, size=(10, 3), check_invariants=True)


@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_sparse_allreduce_async_with_empty_ranks_and_repeated_rows(op_name):
    rank, size, op = hvd.rank(), hvd.size(), getattr(hvd, op_name)

    def rows(r):
        return [] if r % 2 == 1 else [r % 10, 9, r % 10]          # odd ranks send nothing; rows repeat

    result = hvd.sparse_allreduce_async(sparse_rows(rank, rows(rank)), name=f"sparse.empty.{op_name}", op=op)
    out = result()
    assert out.is_sparse and out.shape == (10, 3)
    expected = sum(sparse_rows(r, rows(r)).to_dense() for r in range(size))
    if op == hvd.Average:
        expected = expected / size
    torch.testing.assert_close(out.to_dense(), expected)


def test_sparse_allreduce_async_rejects_other_ops_before_communicating():
    t = sparse_rows(hvd.rank(), [1])
    for op in (hvd.Max, hvd.Min, hvd.Product):
        with pytest.raises(NotImplementedError, match="op=Average and op=Sum"):
            hvd.sparse_allreduce_async(t, name="sparse.bad", op=op)
    out = hvd.sparse_allreduce_async(t, name="sparse.bad", op=hvd.Sum)()
    assert out.to_dense()[1].tolist() == [sum(float(10 * r + k) for r in range(hvd.size())) for k in range(3)]
