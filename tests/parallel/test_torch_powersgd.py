"""``Compression.powersgd`` in torch's DistributedOptimizer, against the single-process reference of
tests/support/powersgd_reference.py (which simulates every rank's PowerSGD on its shard of the global batch).

Every rank builds the same model (same seed) and the same global batches and trains on its shard; the reference,
run inside every rank, computes each rank's gradient on its shard, reduces them as PowerSGD would, and steps. The
models must agree to rounding. On one rank the optimizer exchanges nothing (no hooks), so gradients stay exact:
the reference is then plain training.
"""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import horovod.torch as hvd
from tests.support.powersgd_reference import PowerSGDReference
from tests.support.process_sets import even_odd_sets

torch.set_num_threads(1)

PER = 2
TOL = dict(rtol=1e-8, atol=1e-10)


def make_model():
    """conv 6x2x3x3 and fc1 10x96 are compressed at rank 2; fc2 (3x10) and the biases are not."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 6, 3), nn.Tanh(), nn.Flatten(), nn.Linear(96, 10), nn.Tanh(),
                         nn.Linear(10, 3)).double()


def batches(steps, ranks, per=PER, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(ranks * per, 2, 6, 6, generator=g, dtype=torch.float64),
             torch.randn(ranks * per, 3, generator=g, dtype=torch.float64)) for _ in range(steps)]


def shard(t, rank, per):
    return t[rank * per:(rank + 1) * per]


def named(model, tag):
    return [(f"{tag}.{n}", p) for n, p in model.named_parameters()]


def train_distributed(tag, data, compression, micro=1, rank=None, model=None, opt=None, lr=0.1, **kwargs):
    """Train on this rank's shard of each batch (``micro`` backward passes per step); (model, optimizer)."""
    rank = hvd.rank() if rank is None else rank
    if model is None:
        model = make_model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                                       named_parameters=named(model, tag), compression=compression,
                                       backward_passes_per_step=micro, **kwargs)
    for x, y in data:
        opt.zero_grad()
        xs, ys = shard(x, rank, PER * micro), shard(y, rank, PER * micro)
        for k in range(micro):
            F.mse_loss(model(xs[k * PER:(k + 1) * PER]), ys[k * PER:(k + 1) * PER]).backward()
        opt.step()
    return model, opt


def train_reference(tag, data, compression, ranks, compressed=True, micro=1, average=True, lr=0.1):
    """The same training in this process: every rank's gradient on its shard, reduced by the reference."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    params = named(model, tag)
    reference = PowerSGDReference(
        {n: p.shape for n, p in params}, ranks, rank=compression.matrix_approximation_rank,
        start=compression.start_powerSGD_iter if compressed else 10 ** 9,
        min_rate=compression.min_compression_rate, error_feedback=compression.use_error_feedback,
        warm_start=compression.warm_start, average=average)
    for x, y in data:
        per_rank = []
        for r in range(ranks):
            model.zero_grad()
            xs, ys = shard(x, r, PER * micro), shard(y, r, PER * micro)
            for k in range(micro):
                F.mse_loss(model(xs[k * PER:(k + 1) * PER]), ys[k * PER:(k + 1) * PER]).backward()
            per_rank.append({n: p.grad.numpy().copy() for n, p in params})
        reduced = reference.step(per_rank)
        for n, p in params:
            p.grad = torch.from_numpy(reduced[n])
        opt.step()
    return model


def assert_same_params(model, ref):
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), **TOL, msg=f"parameter {name} differs")


def assert_params_equal_across_ranks(model, process_set=hvd.global_process_set):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    rows = hvd.allgather_object(flat, process_set=process_set)
    for r, row in enumerate(rows):
        assert torch.equal(row, rows[0]), f"rank {r}'s parameters differ from the first rank's"


SETTINGS = {
    "default": dict(matrix_approximation_rank=2, start_powerSGD_iter=1),
    "cold": dict(matrix_approximation_rank=1, start_powerSGD_iter=0, warm_start=False),
    "no_feedback": dict(matrix_approximation_rank=2, start_powerSGD_iter=2, use_error_feedback=False),
}


@pytest.mark.parametrize("settings", sorted(SETTINGS))
def test_training_matches_the_reference(settings):
    size = hvd.size()
    compression = hvd.Compression.powersgd(**SETTINGS[settings])
    data = batches(4, size)
    model, opt = train_distributed(f"psgd.{settings}", data, compression)
    assert_same_params(model, train_reference(f"psgd.{settings}", data, compression, size, size > 1))
    assert_params_equal_across_ranks(model)
    assert opt.state_dict()["powersgd"]["step"] == 4


def test_op_sum_backward_passes_and_groups():
    size = hvd.size()
    compression = hvd.Compression.powersgd(matrix_approximation_rank=2, start_powerSGD_iter=1)
    data = batches(3, size, per=2 * PER, seed=8)

    model = make_model()
    params = list(model.parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9),
                                   named_parameters=named(model, "psgd.sum"), compression=compression,
                                   backward_passes_per_step=2, op=hvd.Sum, groups=[[params[1], params[2]]])
    assert opt._groups == [[params[1]]]                     # fc1's matrix goes through PowerSGD, not the group
    train_distributed("psgd.sum", data, compression, micro=2, model=model, opt=opt)
    ref = train_reference("psgd.sum", data, compression, size, size > 1, micro=2, average=False, lr=0.02)
    assert_same_params(model, ref)
    assert_params_equal_across_ranks(model)


@pytest.fixture(params=[0, 256])
def fusion_threshold(request):
    """Rank 0's coordinator plans this test's fusion with a tiny threshold (0: no fusion at all)."""
    from horovod.core import basics

    engine = basics._state.engine
    coordinator = getattr(engine, "coordinator", None)
    if coordinator is None:
        yield request.param
        return
    saved = coordinator.fusion_threshold
    coordinator.fusion_threshold = request.param
    try:
        yield request.param
    finally:
        coordinator.fusion_threshold = saved


def test_any_fusion_threshold(fusion_threshold):
    size = hvd.size()
    compression = hvd.Compression.powersgd(matrix_approximation_rank=2, start_powerSGD_iter=1)
    data = batches(3, size)
    tag = f"psgd.fusion{fusion_threshold}"
    model, _ = train_distributed(tag, data, compression)
    assert_same_params(model, train_reference(tag, data, compression, size, size > 1))


def test_process_sets():
    for mine, _other in even_odd_sets():
        compression = hvd.Compression.powersgd(matrix_approximation_rank=2, start_powerSGD_iter=1)
        data = batches(3, mine.size(), seed=11)
        tag = f"psgd.set{mine.process_set_id}"
        model, _ = train_distributed(tag, data, compression, rank=mine.rank(), process_set=mine)
        assert_same_params(model, train_reference(tag, data, compression, mine.size()))
        assert_params_equal_across_ranks(model, mine)


def test_checkpoint_resume_is_the_same_training():
    size = hvd.size()
    data = batches(4, size, seed=13)
    compression = hvd.Compression.powersgd(matrix_approximation_rank=2, start_powerSGD_iter=1)
    straight, _ = train_distributed("psgd.resume", data, compression)
    first, opt = train_distributed("psgd.resume", data[:2], compression)
    checkpoint = copy.deepcopy({"model": first.state_dict(), "optimizer": opt.state_dict()})
    saved = checkpoint["optimizer"]["powersgd"]
    assert saved["step"] == 2
    if size > 1:
        assert sorted(saved["q"]) == sorted(saved["error"]) == ["psgd.resume.0.weight", "psgd.resume.3.weight"]
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=named(model, "psgd.resume"), compression=compression)
    model.load_state_dict(checkpoint["model"])
    opt.load_state_dict(checkpoint["optimizer"])
    train_distributed("psgd.resume", data[2:], compression, model=model, opt=opt)
    for p, q in zip(model.parameters(), straight.parameters()):
        assert torch.equal(p, q)


def test_broadcast_optimizer_state_and_elastic_torch_state():
    rank, size = hvd.rank(), hvd.size()
    data = batches(4, size, seed=17)
    compression = hvd.Compression.powersgd(matrix_approximation_rank=2, start_powerSGD_iter=1)
    model, opt = train_distributed("psgd.elastic", data[:2], compression)
    state = hvd.elastic.TorchState(model, opt, batch=2)
    committed = copy.deepcopy(opt.state_dict()["powersgd"])
    train_distributed("psgd.elastic", data[2:3], compression, model=model, opt=opt)
    assert opt.state_dict()["powersgd"]["step"] == 3
    state.restore()                                          # back to the commit, error feedback included
    restored = opt.state_dict()["powersgd"]
    assert restored["step"] == 2
    for key in ("q", "error"):
        assert sorted(restored[key]) == sorted(committed[key])
        assert all(torch.equal(restored[key][n], committed[key][n]) for n in committed[key])
    if rank != 0:
        opt._powersgd.load_state_dict(None)                  # as a new worker: no PowerSGD state at all
    state.sync()                                             # broadcast_optimizer_state: rank 0's step and Qs
    mine = opt.state_dict()["powersgd"]
    everyone = hvd.allgather_object((mine["step"], {n: q.tolist() for n, q in mine["q"].items()}))
    assert all(e == everyone[0] for e in everyone) and everyone[0][0] == 2
    assert (len(mine["error"]) == len(committed["error"])) if rank == 0 else not mine["error"]
    train_distributed("psgd.elastic", data[3:], compression, model=model, opt=opt)
    assert_params_equal_across_ranks(model)


def test_adasum_and_sparse_gradients_are_refused_with_what_to_do():
    model = make_model()
    with pytest.raises(ValueError, match="cannot be combined with op=hvd.Adasum"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum,
                                 named_parameters=named(model, "psgd.adasum"),
                                 compression=hvd.Compression.powersgd())
    if hvd.size() == 1:
        return                                               # no hooks on one rank: nothing is exchanged
    torch.manual_seed(0)
    embedding = nn.Embedding(20, 8, sparse=True).double()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(embedding.parameters(), lr=0.1),
                                   named_parameters=[("psgd.sparse.weight", embedding.weight)],
                                   compression=hvd.Compression.powersgd(start_powerSGD_iter=5))
    with pytest.raises(ValueError, match="pass sparse_as_dense=True|Pass sparse_as_dense=True"):
        embedding(torch.tensor([1, 2, 3])).sum().backward()
    opt._handles.clear()


def test_sparse_as_dense_compresses_the_dense_form():
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    embedding = nn.Embedding(20, 8, sparse=True).double()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(embedding.parameters(), lr=0.1),
                                   named_parameters=[("psgd.dense.weight", embedding.weight)], sparse_as_dense=True,
                                   compression=hvd.Compression.powersgd(start_powerSGD_iter=0))
    for step in range(2):
        opt.zero_grad()
        embedding(torch.tensor([rank % 20, (rank + step) % 20, 7])).sum().backward()
        opt.step()
        assert embedding.weight.grad.is_sparse
    assert_params_equal_across_ranks(embedding)
    assert opt.state_dict()["powersgd"]["step"] == 2 and (size == 1 or opt.state_dict()["powersgd"]["q"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device (the GPU check runs on one)")
def test_cuda_gradients_match_the_reference():
    """P, Q, the error feedback and the allreduces on CUDA tensors (the device plane, or host staging)."""
    import os

    size = hvd.size()
    device = torch.device("cuda", int(os.environ.get("HOROVOD_LOCAL_RANK", "0")) % torch.cuda.device_count())
    compression = hvd.Compression.powersgd(matrix_approximation_rank=2, start_powerSGD_iter=1)
    data = batches(4, size, seed=23)
    model = make_model().to(device)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=named(model, "psgd.cuda"), compression=compression)
    train_distributed("psgd.cuda", [(x.to(device), y.to(device)) for x, y in data], compression, model=model,
                      opt=opt)
    assert all(q.is_cuda for q in opt.state_dict()["powersgd"]["q"].values())
    assert_same_params(model.cpu(), train_reference("psgd.cuda", data, compression, size, size > 1))
    assert_params_equal_across_ranks(model)
