"""DistributedOptimizer and the broadcast helpers, checked against single-process training on the global batch.

Every rank builds the same model (same seed) and the same global batches; rank r trains on its shard
(rows r*PER .. (r+1)*PER). With equal shards, averaging the per-rank gradients of a mean loss equals the
gradient of the mean loss on the concatenated batch, so after each step the distributed model must equal a
model trained in one process on the whole batch.
"""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import horovod.torch as hvd
from tests.support.fast_rounds import fast_round_count
from tests.support.two_branches import TwoBranches, reference_sgd_step

torch.set_num_threads(1)

PER = 3
TOL = dict(rtol=1e-9, atol=1e-10)


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).double()


def batches(steps, size, per=PER, seed=42):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(per * size, 4, generator=g, dtype=torch.float64),
             torch.randn(per * size, 2, generator=g, dtype=torch.float64)) for _ in range(steps)]


def shard(t, rank, per=PER):
    return t[rank * per:(rank + 1) * per]


def named(model, tag):
    return [(f"{tag}.{n}", p) for n, p in model.named_parameters()]


def train_reference(opt_cls, opt_kwargs, data, loss_of=None):
    model = make_model()
    opt = opt_cls(model.parameters(), **opt_kwargs)
    for x, y in data:
        opt.zero_grad()
        loss = loss_of(model, x, y) if loss_of else F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    return model


def train_distributed(tag, opt_cls, opt_kwargs, data, **dist_kwargs):
    rank = hvd.rank()
    model = make_model()
    opt = hvd.DistributedOptimizer(opt_cls(model.parameters(), **opt_kwargs),
                                   named_parameters=named(model, tag), **dist_kwargs)
    for x, y in data:
        opt.zero_grad()
        F.mse_loss(model(shard(x, rank)), shard(y, rank)).backward()
        opt.step()
    return model, opt


def assert_same_params(model, ref, **tol):
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), **(tol or TOL), msg=f"parameter {name} differs")


def assert_params_equal_across_ranks(model):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).reshape(1, -1)
    rows = hvd.allgather(flat, name="params.across.ranks")
    for r in range(rows.shape[0]):
        assert torch.equal(rows[r], rows[0]), f"rank {r}'s parameters differ from rank 0's"


@pytest.mark.parametrize("opt_name", ["SGD", "SGD_momentum", "Adam"])
def test_averaged_gradients_equal_single_process_on_the_global_batch(opt_name):
    size = hvd.size()
    opt_cls, kwargs = {"SGD": (torch.optim.SGD, dict(lr=0.1)),
                       "SGD_momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
                       "Adam": (torch.optim.Adam, dict(lr=0.01))}[opt_name]
    data = batches(3, size)
    model, opt = train_distributed(f"avg.{opt_name}", opt_cls, kwargs, data)
    assert isinstance(opt, opt_cls) and isinstance(opt, torch.optim.Optimizer)
    assert_same_params(model, train_reference(opt_cls, kwargs, data))
    assert_params_equal_across_ranks(model)


def test_one_step_sgd_gradients_are_the_global_average():
    rank, size = hvd.rank(), hvd.size()
    data = batches(1, size)
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=named(model, "one"))
    x, y = data[0]
    F.mse_loss(model(shard(x, rank)), shard(y, rank)).backward()
    opt.synchronize()
    ref = make_model()
    F.mse_loss(ref(x), y).backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL)
    with opt.skip_synchronize():
        opt.step()
    assert_same_params(model, train_reference(torch.optim.SGD, dict(lr=0.1), data))


def test_isinstance_of_the_wrapped_class():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=named(model, "isinstance"))
    assert isinstance(opt, torch.optim.SGD)
    assert type(opt).__name__ == "SGD"
    assert opt.param_groups[0]["lr"] == 0.1


def test_backward_passes_per_step_accumulates_locally():
    rank, size = hvd.rank(), hvd.size()
    data = batches(2, size, per=2 * PER, seed=7)        # each step: two micro-batches of PER rows per rank
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=named(model, "bpps"), backward_passes_per_step=2)
    for x, y in data:
        opt.zero_grad()
        mine_x, mine_y = shard(x, rank, 2 * PER), shard(y, rank, 2 * PER)
        local = make_model()
        local.load_state_dict(model.state_dict())
        F.mse_loss(local(mine_x[:PER]), mine_y[:PER]).backward()
        F.mse_loss(model(mine_x[:PER]), mine_y[:PER]).backward()
        # After the first pass nothing was exchanged: the gradient is this rank's own.
        for p, q in zip(model.parameters(), local.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **TOL)
        F.mse_loss(model(mine_x[PER:]), mine_y[PER:]).backward()
        opt.step()

    def loss_of(m, x, y):                               # micro-batch k of every rank, concatenated
        xs = x.reshape(hvd.size(), 2, PER, 4)
        ys = y.reshape(hvd.size(), 2, PER, 2)
        return sum(F.mse_loss(m(xs[:, k].reshape(-1, 4)), ys[:, k].reshape(-1, 2)) for k in range(2))

    assert_same_params(model, train_reference(torch.optim.SGD, dict(lr=0.1), data, loss_of))
    assert_params_equal_across_ranks(model)


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_compression(compression):
    size = hvd.size()
    data = batches(2, size)
    model, _ = train_distributed(f"comp.{compression}", torch.optim.SGD, dict(lr=0.1), data,
                                 compression=getattr(hvd.Compression, compression))
    for p in model.parameters():
        assert p.dtype == torch.float64
    assert_same_params(model, train_reference(torch.optim.SGD, dict(lr=0.1), data), rtol=1e-2, atol=1e-2)
    assert_params_equal_across_ranks(model)


def test_op_sum():
    size = hvd.size()
    data = batches(2, size)
    model, _ = train_distributed("opsum", torch.optim.SGD, dict(lr=0.05), data, op=hvd.Sum)

    def loss_of(m, x, y):                               # summed per-rank mean losses
        return sum(F.mse_loss(m(shard(x, r)), shard(y, r)) for r in range(size))

    assert_same_params(model, train_reference(torch.optim.SGD, dict(lr=0.05), data, loss_of))


def test_gradient_predivide_factor():
    size = hvd.size()
    data = batches(2, size)
    model, _ = train_distributed("gpf", torch.optim.SGD, dict(lr=0.1), data, gradient_predivide_factor=2.0)
    assert_same_params(model, train_reference(torch.optim.SGD, dict(lr=0.1), data))
    with pytest.raises(ValueError):
        m = make_model()
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), op=hvd.Sum,
                                 gradient_predivide_factor=2.0)


@pytest.mark.parametrize("groups", ["int", "lists"])
def test_groups(groups, monkeypatch):
    """The numbers are one process's on the global batch. Where the ranks share a host, groups whose gradients
    fit one fast round together, each group whole, wait for ``step()`` and go in the small gradients' round: no
    group starts from its hooks, and a step is one round. (From their hooks, groups went through the coordinator:
    ``groups=2`` made a 2-rank MLP step 1.8x slower than none.)"""
    from horovod.core import ops
    from horovod.torch import optimizer as hvd_optimizer

    started = []
    grouped_async = hvd_optimizer.grouped_allreduce_async_
    monkeypatch.setattr(hvd_optimizer, "grouped_allreduce_async_",
                        lambda tensors, *a, **k: started.append(k["name"]) or grouped_async(tensors, *a, **k))
    size = hvd.size()
    data = batches(2, size)
    model = make_model()
    params = list(model.parameters())
    spec = 2 if groups == "int" else [[params[0], params[3]], [params[1]], [params[2]]]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=named(model, f"groups.{groups}"), groups=spec)
    matched, counting = fast_round_count()
    grouped = ops.has_fast_rounds()
    rank = hvd.rank()
    for x, y in data:
        opt.zero_grad()
        F.mse_loss(model(shard(x, rank)), shard(y, rank)).backward()
        opt.step()
    rounds = fast_round_count()[0] - matched
    assert_same_params(model, train_reference(torch.optim.SGD, dict(lr=0.1), data))
    assert_params_equal_across_ranks(model)
    if size == 1:
        return
    if grouped:
        assert started == [], started
        if counting:
            assert rounds == len(data), rounds           # per step: every gradient, and the flag
    else:
        assert len(started) == (2 if groups == "int" else 3) * len(data), started


class EmbeddingModel(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.emb = nn.Embedding(10, 3, sparse=True).double()
        self.fc = nn.Linear(3, 1).double()

    def forward(self, idx):
        return self.fc(self.emb(idx)).sum(1)


@pytest.mark.parametrize("sparse_as_dense", [True, False], ids=["dense", "sparse"])
def test_sparse_embedding(sparse_as_dense):
    rank, size = hvd.rank(), hvd.size()
    g = torch.Generator().manual_seed(5)
    idx = torch.randint(0, 10, (PER * size, 2), generator=g)
    target = torch.randn(PER * size, 1, generator=g, dtype=torch.float64)
    model = EmbeddingModel()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=[(f"emb.{sparse_as_dense}.{n}", p)
                                                     for n, p in model.named_parameters()],
                                   sparse_as_dense=sparse_as_dense)
    for _ in range(2):
        opt.zero_grad()
        F.mse_loss(model(shard(idx, rank)), shard(target, rank)).backward()
        opt.step()
    ref = EmbeddingModel()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    for _ in range(2):
        ref_opt.zero_grad()
        F.mse_loss(ref(idx), target).backward()
        ref_opt.step()
    assert_same_params(model, ref)
    assert_params_equal_across_ranks(model)


def test_parameter_without_gradient_on_some_ranks():
    rank, size = hvd.rank(), hvd.size()
    (x, y), = batches(1, size)
    model = TwoBranches()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=[(f"branch.{n}", p) for n, p in model.named_parameters()])
    F.mse_loss(model(shard(x, rank), use_b=(rank == 0)), shard(y, rank)).backward()
    opt.step()                                          # must not hang: b is reduced with zeros elsewhere
    ref = reference_sgd_step(x, y, size, PER)
    assert_same_params(model, ref)
    assert_params_equal_across_ranks(model)


def test_synchronize_then_skip_synchronize_and_the_warning():
    rank, size = hvd.rank(), hvd.size()
    data = batches(2, size)
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=named(model, "skipsync"))
    x, y = data[0]
    F.mse_loss(model(shard(x, rank)), shard(y, rank)).backward()
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()
    opt.zero_grad()
    x, y = data[1]
    F.mse_loss(model(shard(x, rank)), shard(y, rank)).backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()                                      # allowed, but warns
    assert_same_params(model, train_reference(torch.optim.SGD, dict(lr=0.1), data))


def needs_hooks():
    if hvd.size() == 1:
        pytest.skip("with one rank DistributedOptimizer registers no hooks (upstream behaviour)")


def test_zero_grad_between_backward_and_step_raises():
    needs_hooks()
    rank = hvd.rank()
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=named(model, "zg"))
    (x, y), = batches(1, hvd.size())
    F.mse_loss(model(shard(x, rank)), shard(y, rank)).backward()
    with pytest.raises(AssertionError):
        opt.zero_grad()
    opt.step()                                          # the job carries on
    opt.zero_grad()


def test_hook_firing_more_than_backward_passes_per_step_raises():
    needs_hooks()
    rank = hvd.rank()
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=named(model, "twice"))
    (x, y), = batches(1, hvd.size())
    F.mse_loss(model(shard(x, rank)), shard(y, rank)).backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        F.mse_loss(model(shard(x, rank)), shard(y, rank)).backward()
    opt.synchronize()                                   # drain what the first pass started
    opt.zero_grad()


def test_named_parameters_validation():
    model = make_model()
    params = list(model.named_parameters())
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=[("same", p) for _, p in params])
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=params[:2])
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=[p for _, p in params])
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), backward_passes_per_step=0)


def test_broadcast_parameters_state_dict_and_named_parameters():
    rank = hvd.rank()
    model = make_model(seed=100 + rank)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    assert_same_params(model, make_model(seed=100), rtol=0, atol=0)
    root = hvd.size() - 1
    model = make_model(seed=200 + rank)
    hvd.broadcast_parameters(model.named_parameters(), root_rank=root)
    assert_same_params(model, make_model(seed=200 + root), rtol=0, atol=0)
    tensors = [torch.full((3,), float(rank)), torch.arange(4) * rank]
    hvd.broadcast_parameters(tensors, root_rank=root)
    assert torch.equal(tensors[0], torch.full((3,), float(root)))
    assert torch.equal(tensors[1], torch.arange(4) * root)


def state_snapshot(opt):
    sd = opt.state_dict()
    state = {pid: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
             for pid, s in sd["state"].items()}
    options = [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
    return state, options


def assert_state_equal(a, b):
    state_a, opts_a = a
    state_b, opts_b = b
    assert opts_a == opts_b
    assert sorted(state_a) == sorted(state_b)
    for pid in state_a:
        assert sorted(state_a[pid]) == sorted(state_b[pid])
        for key, v in state_a[pid].items():
            w = state_b[pid][key]
            if torch.is_tensor(v):
                assert torch.equal(v, w), (pid, key)
            else:
                assert v == w, (pid, key)


def make_optimizer(kind, model, rank):
    lr = 0.01 * (rank + 1)
    if kind == "sgd_momentum":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.5 + 0.1 * rank)
    return torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.99 - 0.001 * rank))


def local_step(model, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 4, generator=g, dtype=torch.float64)
    opt.zero_grad()
    model(x).pow(2).sum().backward()
    opt.step()


@pytest.mark.parametrize("kind", ["sgd_momentum", "adam"])
@pytest.mark.parametrize("filled,wrapped", [(True, False), (False, False), (False, True)],
                         ids=["with_state", "empty_state", "empty_state_distributed"])
def test_broadcast_optimizer_state(kind, filled, wrapped):
    rank, size = hvd.rank(), hvd.size()
    root = size - 1

    def build(r):
        model = make_model(seed=300)
        opt = make_optimizer(kind, model, r)
        if filled:
            local_step(model, opt, seed=400 + r)        # rank-dependent state
        return model, opt

    model, opt = build(rank)
    before = [p.detach().clone() for p in model.parameters()]
    if wrapped:
        opt = hvd.DistributedOptimizer(opt, named_parameters=named(model, f"bos.{kind}.{filled}"))
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p.detach(), q), "broadcast_optimizer_state moved the parameters"
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01 * (root + 1))
    _, root_opt = build(root)
    if not filled:
        # The state was materialised by a zero-gradient step; compare with the root doing the same.
        root_model = make_model(seed=300)
        root_opt = make_optimizer(kind, root_model, root)
        for p in root_model.parameters():
            p.grad = torch.zeros_like(p)
        saved = [p.detach().clone() for p in root_model.parameters()]
        root_opt.step()
        with torch.no_grad():
            for p, s in zip(root_model.parameters(), saved):
                p.copy_(s)
        assert len(opt.state_dict()["state"]) == len(list(model.parameters()))
    assert_state_equal(state_snapshot(opt), state_snapshot(root_opt))
    gathered = hvd.allgather_object(repr(state_snapshot(opt)[1]))
    assert gathered == [gathered[0]] * size


def test_broadcast_optimizer_state_then_training_stays_in_sync():
    rank, size = hvd.rank(), hvd.size()
    model = make_model(seed=500 + rank)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01 * (rank + 1)),
                                   named_parameters=named(model, "bos.train"))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for x, y in batches(2, size, seed=9):
        opt.zero_grad()
        F.mse_loss(model(shard(x, rank)), shard(y, rank)).backward()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            opt.step()
    assert_params_equal_across_ranks(model)


class FrozenIndex(nn.Module):
    """Upstream's no-grad case: an integer parameter with requires_grad=False next to a trainable one."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.a = nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
        self.b = nn.Parameter(torch.rand(4, dtype=torch.float64))

    def forward(self, x):
        return torch.index_select(self.b, 0, self.a.long()) * x


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "distributed"])
def test_broadcast_optimizer_state_with_a_frozen_parameter(wrapped):
    rank, size = hvd.rank(), hvd.size()
    model = FrozenIndex(seed=600 + rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.001 * (rank + 1), weight_decay=1e-6, momentum=0.9, nesterov=True)
    if wrapped:
        opt = hvd.DistributedOptimizer(opt, named_parameters=[(f"frozen.{n}", p) for n, p in model.named_parameters()])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    before = model.b.detach().clone()
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    frozen, trainable = opt.param_groups[0]["params"]
    assert frozen.grad is None, "a parameter without requires_grad must get no gradient"
    assert frozen not in opt.state
    # As upstream: a trainable parameter that had no gradient keeps the zero gradient that made its state.
    assert trainable.grad is not None and torch.equal(trainable.grad, torch.zeros(4, dtype=torch.float64))
    assert torch.equal(hvd.broadcast(trainable.grad, root_rank=0, name=f"frozen.grad.{wrapped}"), trainable.grad)
    assert torch.equal(model.b.detach(), before), "materialising the state moved the parameters"
    assert opt.param_groups[0]["lr"] == pytest.approx(0.001)
    buffers = hvd.allgather(opt.state[trainable]["momentum_buffer"].reshape(1, -1), name=f"frozen.buf.{wrapped}")
    assert all(torch.equal(buffers[r], buffers[0]) for r in range(size))

    opt.zero_grad()
    model(torch.full((2,), float(rank + 1), dtype=torch.float64)).sum().backward()
    opt.step()
    assert frozen.grad is None
    if wrapped:                                          # averaged gradients: the ranks stay in step
        assert_params_equal_across_ranks(model)


def _wide(seed=0):
    """0.96 MB of gradient in its first weight, and four gradients of 480 KB together that fit one fast round."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 30000), nn.Tanh(), nn.Linear(30000, 1, bias=False), nn.Linear(1, 2)).double()


def _train_wide(monkeypatch, spied, prefix, groups_of=None):
    """Three steps of the wide model on every rank with ``DistributedOptimizer`` (``groups_of(model)``: its
    ``groups``), beside one process on
    the global batch (the same parameters are asserted); returns (the names that the optimizer's ``spied``
    functions started, the fast rounds taken meanwhile or None where they are not counted, whether the set has
    fast rounds, the steps)."""
    from horovod.core import ops
    from horovod.torch import optimizer as hvd_optimizer

    started = []
    for name in spied:
        original = getattr(hvd_optimizer, name)
        monkeypatch.setattr(hvd_optimizer, name, lambda tensors, *a, _original=original, **k:
                            started.append(k["name"]) or _original(tensors, *a, **k))
    model, ref = _wide(), _wide()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-4),
                                   named_parameters=named(model, prefix),
                                   groups=groups_of(model) if groups_of else None)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=1e-4)        # (the wide layer diverges at 0.1)
    matched, counting = fast_round_count()
    grouped = ops.has_fast_rounds()          # asked now: a peer done with the test may shut the job down before
    rank, size = hvd.rank(), hvd.size()
    steps = batches(3, size)
    for x, y in steps:
        opt.zero_grad()
        F.mse_loss(model(shard(x, rank)), shard(y, rank)).backward()
        opt.step()
        ref_opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ref_opt.step()
    assert_same_params(model, ref)
    return started, (fast_round_count()[0] - matched if counting else None), grouped, steps


def test_small_gradients_go_in_one_fast_round_and_a_large_one_from_its_hook(monkeypatch):
    """Where the ranks share a host, the gradients that fit one fast round together (smallest first) wait for
    ``step()`` and go in one blocking grouped allreduce, a fast round, with the unused-parameter flag (no
    parameter lacks a gradient, so no masks round follows); a gradient that does not fit with them (0.96 MB,
    where a round takes 1 MB at 2 ranks, 512 KB at 4) still starts from its hook. The numbers are one process's
    on the global batch."""
    started, rounds, grouped, steps = _train_wide(monkeypatch, ["allreduce_async_"], "wide")
    if hvd.size() == 1:
        return                                   # no hooks: nothing is exchanged
    if grouped:
        assert set(started) == {"wide.0.weight"}, started       # the rest (480 KB) fit one round together
        assert rounds in (None, len(steps)), rounds             # per step: the small gradients and the flag
    else:
        assert len(started) == 5 * len(steps), started          # every gradient from its hook


def test_a_group_too_large_for_the_round_still_starts_from_its_hooks(monkeypatch):
    """A group is never split: one that holds a 0.96 MB gradient (a round takes 1 MB at 2 ranks, 512 KB at 4)
    starts from its hooks as a whole, small member included, while the other gradients go in the round."""
    started, rounds, grouped, steps = _train_wide(monkeypatch, ["allreduce_async_", "grouped_allreduce_async_"],
                                                  "large_group", lambda m: [[m[0].weight, m[3].bias]])
    if hvd.size() == 1:
        return
    if grouped:
        assert started == ["grouped.0"] * len(steps), started
        assert rounds in (None, len(steps)), rounds
    else:
        assert sorted(set(started)) == ["grouped.0", "large_group.0.bias", "large_group.2.weight",
                                       "large_group.3.weight"], started
