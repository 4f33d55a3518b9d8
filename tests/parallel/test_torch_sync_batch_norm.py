"""SyncBatchNorm on CPU equals torch's BatchNorm on the concatenated global batch.

Rank r holds r + 2 samples of the global batch (ranks hold different batch sizes). Forward outputs, running
statistics, input gradients and (allreduce-summed) weight/bias gradients must equal BatchNorm run in one
process on all samples, for loss = sum_r sum(out_r * w_r). At one rank SyncBatchNorm is plain BatchNorm.
"""
import pytest
import torch
from torch import nn

import horovod.torch as hvd

torch.set_num_threads(1)

TOL = dict(rtol=1e-9, atol=1e-9)
SHAPES = {"1d_nc": (nn.BatchNorm1d, (3,)), "1d_ncl": (nn.BatchNorm1d, (3, 5)), "2d": (nn.BatchNorm2d, (3, 4, 2))}


def counts(size):
    return [r + 2 for r in range(size)]


def global_input(size, feature_shape, seed):
    g = torch.Generator().manual_seed(seed)
    n = sum(counts(size))
    return (torch.randn((n,) + feature_shape, generator=g, dtype=torch.float64) * 2 + 1,
            torch.randn((n,) + feature_shape, generator=g, dtype=torch.float64))


def rows(rank, size):
    start = sum(counts(size)[:rank])
    return slice(start, start + counts(size)[rank])


def make_pair(bn_cls, channels, momentum=0.1):
    ref = bn_cls(channels, momentum=momentum).double()
    sync = hvd.SyncBatchNorm(channels, momentum=momentum).double()
    g = torch.Generator().manual_seed(77)
    with torch.no_grad():
        ref.weight.copy_(torch.rand(channels, generator=g, dtype=torch.float64) + 0.5)
        ref.bias.copy_(torch.randn(channels, generator=g, dtype=torch.float64))
    sync.load_state_dict(ref.state_dict())
    return sync, ref


@pytest.mark.parametrize("kind", list(SHAPES))
@pytest.mark.parametrize("momentum", [0.1, None], ids=["momentum", "cumulative"])
def test_sync_batch_norm_matches_batch_norm_on_the_global_batch(kind, momentum):
    rank, size = hvd.rank(), hvd.size()
    bn_cls, feature_shape = SHAPES[kind]
    channels = feature_shape[0]
    sync, ref = make_pair(bn_cls, channels, momentum)
    assert isinstance(sync, torch.nn.modules.batchnorm._BatchNorm)
    mine = rows(rank, size)
    for step in range(3):
        x_all, w_all = global_input(size, feature_shape, seed=10 + step)
        x = x_all[mine].clone().requires_grad_(True)
        out = sync(x)
        (out * w_all[mine]).sum().backward()

        x_ref = x_all.clone().requires_grad_(True)
        out_ref = ref(x_ref)
        (out_ref * w_all).sum().backward()

        torch.testing.assert_close(out.detach(), out_ref[mine].detach(), **TOL)
        torch.testing.assert_close(x.grad, x_ref.grad[mine], **TOL)
        weight_grad = hvd.allreduce(sync.weight.grad, op=hvd.Sum, name=f"sbn.wgrad.{kind}.{momentum}.{step}")
        bias_grad = hvd.allreduce(sync.bias.grad, op=hvd.Sum, name=f"sbn.bgrad.{kind}.{momentum}.{step}")
        torch.testing.assert_close(weight_grad, ref.weight.grad, **TOL)
        torch.testing.assert_close(bias_grad, ref.bias.grad, **TOL)
        torch.testing.assert_close(sync.running_mean, ref.running_mean, **TOL)
        torch.testing.assert_close(sync.running_var, ref.running_var, **TOL)
        assert int(sync.num_batches_tracked) == int(ref.num_batches_tracked) == step + 1
        sync.zero_grad()
        ref.zero_grad()

    # Eval mode normalizes with the running statistics, locally (no collective needed).
    sync.eval()
    ref.eval()
    x_all, _ = global_input(size, feature_shape, seed=99)
    torch.testing.assert_close(sync(x_all[mine]), ref(x_all[mine]), **TOL)
    before = sync.running_mean.clone()
    sync(x_all[mine])
    assert torch.equal(sync.running_mean, before), "eval mode must not update the running statistics"


def test_sync_batch_norm_as_a_layer_in_a_model():
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(1)
    lin = nn.Linear(4, 3).double()
    sync, ref = make_pair(nn.BatchNorm1d, 3)
    x_all, _ = global_input(size, (4,), seed=5)
    out = sync(lin(x_all[rows(rank, size)]))
    out.pow(2).sum().backward()
    grad = hvd.allreduce(lin.weight.grad, op=hvd.Sum, name="sbn.model.lin")
    lin_ref = nn.Linear(4, 3).double()
    lin_ref.load_state_dict(lin.state_dict())
    ref(lin_ref(x_all)).pow(2).sum().backward()
    torch.testing.assert_close(grad, lin_ref.weight.grad, **TOL)


def test_at_one_rank_it_behaves_like_batch_norm():
    if hvd.size() != 1:
        pytest.skip("the single-rank fallback")
    sync, ref = make_pair(nn.BatchNorm2d, 3)
    x_all, _ = global_input(1, (3, 4, 2), seed=3)
    torch.testing.assert_close(sync(x_all), ref(x_all), **TOL)
    torch.testing.assert_close(sync.running_var, ref.running_var, **TOL)


def test_rejects_1d_input():
    sync = hvd.SyncBatchNorm(3)
    with pytest.raises(ValueError):
        sync(torch.ones(3))
