"""ZeroRedundancyOptimizer (ZeRO-1) against hvd.DistributedOptimizer and single-process training.

Every rank builds the same model (same seed) and the same global batches; rank r trains on its shard. With
equal shards, averaging the per-rank gradients of a mean loss equals the gradient of the mean loss on the whole
batch, so after each step the sharded optimizer must reach the parameters hvd.DistributedOptimizer (and a
single process on the whole batch) reaches. Tolerance: float64 parameters, rtol 1e-9 / atol 1e-11 (the
reductions sum in the same order, so the runs are in practice equal to the last bits).

The model's parameters have uneven sizes (35, 5, 15, 3, 1 elements and a frozen int32 one), so owners get
unequal shares, buckets pad, and at 3 ranks nothing divides evenly.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import horovod.torch as hvd
from tests.support.process_sets import temporary_sets  # (turns dynamic process sets on)
from tests.support.two_branches import TwoBranches, reference_sgd_step

torch.set_num_threads(1)

PER = 3
TOL = dict(rtol=1e-9, atol=1e-11)


class Uneven(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.a = nn.Linear(7, 5).double()           # 35 + 5
        self.b = nn.Linear(5, 3).double()           # 15 + 3
        self.scale = nn.Parameter(torch.ones(1, dtype=torch.float64))
        self.index = nn.Parameter(torch.tensor([0, 2], dtype=torch.int32), requires_grad=False)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x))).index_select(1, self.index.long()) * self.scale


TRAINABLE = [i for i, p in enumerate(Uneven().parameters()) if p.requires_grad]     # whole-state ids


def batches(steps, size, per=PER, seed=42):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(per * size, 7, generator=g, dtype=torch.float64),
             torch.randn(per * size, 2, generator=g, dtype=torch.float64)) for _ in range(steps)]


def shard(t, rank, per=PER):
    return t[rank * per:(rank + 1) * per]


def train(model, opt, data, rank, scheduler=None):
    for x, y in data:
        opt.zero_grad()
        F.mse_loss(model(shard(x, rank)), shard(y, rank)).backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()
    return model


def assert_same_params(model, ref, **tol):
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), **(tol or TOL), msg=f"parameter {name} differs")


def assert_params_equal_across_ranks(model, process_set=hvd.global_process_set):
    flat = torch.cat([p.detach().double().reshape(-1) for p in model.parameters()]).reshape(1, -1)
    rows = hvd.allgather(flat, name="zero.params.across.ranks", process_set=process_set)
    for r in range(rows.shape[0]):
        assert torch.equal(rows[r], rows[0]), f"rank {r}'s parameters differ from the first's"


def state_numel(optimizer):
    return sum(v.numel() for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim())


@pytest.mark.parametrize("bucket_cap_bytes", [None, 64], ids=["one_bucket", "small_buckets"])
def test_twenty_adam_steps_equal_distributed_optimizer(bucket_cap_bytes):
    rank, size = hvd.rank(), hvd.size()
    data = batches(20, size)
    model = Uneven()
    zero = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=0.01,
                                       bucket_cap_bytes=bucket_cap_bytes)
    assert isinstance(zero, torch.optim.Optimizer) and isinstance(zero.optim, torch.optim.Adam)
    train(model, zero, data, rank)
    ref = Uneven()
    dist = hvd.DistributedOptimizer(torch.optim.Adam(ref.parameters(), lr=0.01),
                                    named_parameters=[(f"zero.ref.{bucket_cap_bytes}.{n}", p)
                                                      for n, p in ref.named_parameters()])
    train(ref, dist, data, rank)
    assert_same_params(model, ref)
    assert_params_equal_across_ranks(model)
    if size > 1:                                        # the buckets that held the gradients carried the parameters
        assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters() if p.grad is not None)
    # The state is sharded: every trainable element has state on exactly one rank.
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    counts = hvd.allgather(torch.tensor([state_numel(zero.optim)]), name=f"zero.state.{bucket_cap_bytes}")
    assert counts.sum().item() == 2 * trainable                     # exp_avg and exp_avg_sq
    if size > 1:
        assert counts.max().item() < 2 * trainable


def test_state_dict_round_trip_and_continuing():
    rank, size = hvd.rank(), hvd.size()
    to = size - 1
    data = batches(6, size, seed=3)
    straight = Uneven()
    train(straight, hvd.ZeroRedundancyOptimizer(straight.parameters(), torch.optim.Adam, lr=0.02), data, rank)

    model = Uneven()
    zero = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=0.02)
    train(model, zero, data[:3], rank)
    zero.consolidate_state_dict(to=to)
    if rank == to:
        saved = zero.state_dict()
        plain = torch.optim.Adam(Uneven().parameters(), lr=0.5)
        plain.load_state_dict(saved)                                  # the plain layout
        assert plain.param_groups[0]["lr"] == 0.02
        assert sorted(saved["state"]) == TRAINABLE               # every trainable parameter
    else:
        saved = None
        with pytest.raises(RuntimeError, match=f"consolidate_state_dict\\(to={rank}\\)"):
            zero.state_dict()
    saved = hvd.broadcast_object(saved, root_rank=to, name="zero.saved")

    resumed = Uneven()
    resumed.load_state_dict(model.state_dict())
    again = hvd.ZeroRedundancyOptimizer(resumed.parameters(), torch.optim.Adam, lr=0.5)
    again.load_state_dict(saved)
    assert again.param_groups[0]["lr"] == 0.02 and again.optim.param_groups[0]["lr"] == 0.02
    train(resumed, again, data[3:], rank)
    assert_same_params(resumed, straight)

    again.consolidate_state_dict(to=None)                             # every rank
    assert sorted(again.state_dict()["state"]) == TRAINABLE


def test_parameter_without_gradient_on_some_ranks():
    rank, size = hvd.rank(), hvd.size()
    g = torch.Generator().manual_seed(8)
    x, y = torch.randn(PER * size, 4, generator=g, dtype=torch.float64), torch.randn(PER * size, 2, generator=g,
                                                                                  dtype=torch.float64)
    model = TwoBranches()
    opt = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    F.mse_loss(model(shard(x, rank), use_b=(rank == 0)), shard(y, rank)).backward()
    opt.step()                                          # must not hang: b is reduced with zeros elsewhere
    ref = reference_sgd_step(x, y, size, PER)
    assert_same_params(model, ref)
    assert_params_equal_across_ranks(model)


def test_backward_passes_per_step_accumulates_locally():
    rank, size = hvd.rank(), hvd.size()
    data = batches(3, size, per=2 * PER, seed=7)
    model, ref = Uneven(), Uneven()
    zero = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=0.01, backward_passes_per_step=2)
    dist = hvd.DistributedOptimizer(torch.optim.Adam(ref.parameters(), lr=0.01), backward_passes_per_step=2,
                                    named_parameters=[(f"zero.bpps.{n}", p) for n, p in ref.named_parameters()])
    for x, y in data:
        for m, opt in ((model, zero), (ref, dist)):
            opt.zero_grad()
            mine_x, mine_y = shard(x, rank, 2 * PER), shard(y, rank, 2 * PER)
            F.mse_loss(m(mine_x[:PER]), mine_y[:PER]).backward()
            F.mse_loss(m(mine_x[PER:]), mine_y[PER:]).backward()
            opt.step()
    assert_same_params(model, ref)
    if size > 1:                                        # a third pass before step() is refused, as upstream
        zero.zero_grad()
        x, y = data[0]
        for _ in range(2):
            F.mse_loss(model(shard(x, rank)), shard(y, rank)).backward()
        with pytest.raises(AssertionError, match="backward_passes_per_step"):
            F.mse_loss(model(shard(x, rank)), shard(y, rank)).backward()
        with pytest.raises(AssertionError, match="zero_grad"):
            zero.zero_grad()
        zero.step()                                     # the job carries on
        assert_params_equal_across_ranks(model)


def test_add_param_group_and_lr_scheduler_equal_single_process():
    rank, size = hvd.rank(), hvd.size()
    data = batches(4, size, seed=5)

    def run(model, opt, first, second, data_rank, shard_rows):
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        for step, (x, y) in enumerate(data):
            if step == 2:
                opt.add_param_group({"params": second, "lr": 0.05})
            opt.zero_grad()
            F.mse_loss(model(shard_rows(x, data_rank)), shard_rows(y, data_rank)).backward()
            opt.step()
            sched.step()
        return opt

    model = Uneven()
    params = list(model.parameters())
    zero = hvd.ZeroRedundancyOptimizer(params[:2], torch.optim.Adam, lr=0.02)
    run(model, zero, params[:2], params[2:], rank, shard)
    ref = Uneven()
    ref_params = list(ref.parameters())
    plain = torch.optim.Adam(ref_params[:2], lr=0.02)
    run(ref, plain, ref_params[:2], ref_params[2:], None, lambda t, _: t)
    assert_same_params(model, ref)
    assert_params_equal_across_ranks(model)
    assert [g["lr"] for g in zero.param_groups] == [g["lr"] for g in plain.param_groups]
    zero.step()                                         # (one more step: .optim takes the scheduler's lrs)
    assert [g["lr"] for g in zero.optim.param_groups] == [g["lr"] for g in plain.param_groups]


def test_process_set_and_a_rank_outside_it():
    rank, size = hvd.rank(), hvd.size()
    if size < 2:
        pytest.skip("needs 2 ranks for a set that leaves one out")
    members = list(range(size - 1))
    data = batches(3, size, seed=13)
    with temporary_sets(members) as (ps,):
        model = Uneven()
        opt = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, process_set=ps, lr=0.01)
        train(model, opt, data, rank)                  # the rank outside steps alone, on its own shard
        ref = Uneven()
        plain = torch.optim.Adam(ref.parameters(), lr=0.01)
        for x, y in data:
            plain.zero_grad()
            rows = members if rank in members else [rank]
            F.mse_loss(ref(torch.cat([shard(x, r) for r in rows])), torch.cat([shard(y, r) for r in rows])).backward()
            plain.step()
        assert_same_params(model, ref)
        if rank in members:
            assert_params_equal_across_ranks(model, process_set=ps)
            opt.consolidate_state_dict(to=0)
            if rank == 0:
                assert sorted(opt.state_dict()["state"]) == TRAINABLE
            with pytest.raises(ValueError, match="not in"):
                opt.consolidate_state_dict(to=size - 1)


def test_elastic_torch_state_commits_restores_and_syncs():
    rank, size = hvd.rank(), hvd.size()
    data = batches(3, size, seed=17)
    straight = Uneven()
    train(straight, hvd.ZeroRedundancyOptimizer(straight.parameters(), torch.optim.Adam, lr=0.02), data, rank)
    model = Uneven()
    zero = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=0.02)
    state = hvd.elastic.TorchState(model, zero, step=0)      # no collective here (a new worker runs this alone)
    state.sync()
    train(model, zero, data[:2], rank)
    state.commit()                                      # the whole optimizer state, on every rank
    train(model, zero, data[2:], rank)                  # lost: restored below
    state.restore()
    state.sync()                                        # as after a reset: re-partitioned, rank 0's copy loaded
    train(model, zero, data[2:], rank)
    assert_same_params(model, straight)


def test_errors_say_what_to_do():
    model = Uneven()
    with pytest.raises(ValueError, match="op=Average or op=Sum"):
        hvd.ZeroRedundancyOptimizer(model.parameters(), op=hvd.Adasum)
    with pytest.raises(ValueError, match="no DDP"):
        hvd.ZeroRedundancyOptimizer(model.parameters(), overlap_with_ddp=True)
    with pytest.raises(TypeError, match="optimizer class"):
        hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam(model.parameters()))
    emb = nn.Embedding(5, 2, sparse=True)
    opt = hvd.ZeroRedundancyOptimizer(emb.parameters(), torch.optim.SGD, lr=0.1)
    if hvd.size() > 1:                                  # (one rank steps torch's SGD, which takes them)
        with pytest.raises(ValueError, match="dense gradients"):
            emb(torch.tensor([1, 2])).sum().backward()  # the bucket starts in backward: refused there
            opt.step()
