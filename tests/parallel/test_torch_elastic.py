"""Elastic training's worker side in torch, at any number of ranks without the elastic driver: TorchState's
commit/restore/sync, ElasticSampler's partitioning across a reset, and ``hvd.elastic.run`` re-forming the job
in place after a failed collective (``shutdown()`` then ``init()`` on the same ranks)."""
import torch

import horovod.torch as hvd
from tests.support.elastic import run_failing_once


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 2)


def test_torch_state_commit_restore_and_sync_from_rank_0():
    rank = hvd.rank()
    model = make_model(seed=rank)                    # different weights on every rank
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = hvd.elastic.TorchState(model, optimizer, epoch=rank, batch=0)
    state.sync()                                     # rank 0's weights, optimizer state and attributes everywhere
    weights = hvd.allgather_object(model.weight.detach().clone())
    assert all(torch.equal(w, weights[0]) for w in weights)
    assert state.epoch == 0
    state.commit()
    with torch.no_grad():
        model.weight.add_(1.0)
    state.epoch = 7
    state.restore()
    assert torch.equal(model.weight.detach(), weights[0]) and state.epoch == 0


def test_a_second_restore_without_a_commit_gives_the_commit_again():
    """Two failures between commits: the optimizer steps taken after the first restore must not change what the
    second restores (torch's load_state_dict keeps the tensors it is given, so the saved state must not be
    them)."""
    model = make_model(seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)

    def step():
        optimizer.zero_grad()
        model(torch.ones(3, 4)).sum().backward()
        optimizer.step()

    step()
    state = hvd.elastic.TorchState(model, optimizer)
    state.commit()
    committed = {k: v.clone() for k, v in optimizer.state[model.weight].items()}
    weight = model.weight.detach().clone()
    for _ in range(2):                              # each: a failure, the restore and sync, then training on
        state.restore()
        state.sync()
        assert all(torch.equal(optimizer.state[model.weight][k], v) for k, v in committed.items())
        assert torch.equal(model.weight.detach(), weight)
        step()
        step()


def test_elastic_sampler_splits_what_is_left_of_the_epoch():
    size, rank = hvd.size(), hvd.rank()
    dataset = list(range(23))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=5)
    first = hvd.allgather_object(list(iter(sampler)))
    seen = [i for part in first for i in part]
    assert set(seen) == set(dataset) and len(sampler) == -(-23 // size)
    sampler.record_batch(0, 2)                       # every rank processed 2 samples
    state = sampler.state_dict()
    assert state == {"epoch": 0, "processed_num": 2 * size}
    sampler.load_state_dict(state)
    rest = [i for part in hvd.allgather_object(list(iter(sampler))) for i in part]
    order = list(range(23))
    import random
    random.Random(5).shuffle(order)
    assert set(rest) == set(order[2 * size:])         # nothing processed is handed out again
    sampler.set_epoch(1)
    assert sampler.processed_num == 0 and rank == sampler.rank


def test_run_restores_the_commit_and_re_forms_the_job_after_a_failed_collective():
    state = hvd.elastic.TorchState(make_model(seed=0), None, step=0)
    result, attempts = run_failing_once(
        hvd.elastic.run, state,
        lambda step: int(hvd.allreduce(torch.tensor([float(step)]), op=hvd.Sum, name="after.reset").item()))
    assert result == 2 * hvd.size()                  # restored to step 1, then one more step
    assert attempts == [0, 1] and hvd.is_initialized()
