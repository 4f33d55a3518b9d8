"""horovod.torch on CUDA tensors, at any number of ranks sharing one GPU (or several): every collective, the
DistributedOptimizer, the ZeroRedundancyOptimizer and SyncBatchNorm, each checked against the same call on CPU
tensors (the host planes, which the rest of the suite checks against references). Skipped, saying so, where torch
sees no GPU.

tests/integration/test_gpu_suite.py runs it with a small CUDA IPC window (several chunks per collective) and with
``HOROVOD_CUDA_IPC=0`` (host staging); docs/gpu.md gives the command.
"""
import os

import pytest
import torch
from torch import nn

import horovod.torch as hvd
from horovod.backends import device_ipc
from horovod.core import basics

if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device: the GPU suite runs on a machine with one (docs/gpu.md)",
                allow_module_level=True)

torch.set_num_threads(1)
# Collected before the suite's conftest runs hvd.init(): the launcher's variable says the local rank.
DEVICE = torch.device("cuda", int(os.environ.get("HOROVOD_LOCAL_RANK", "0")) % torch.cuda.device_count())
torch.cuda.set_device(DEVICE)
IPC = os.environ.get("HOROVOD_CUDA_IPC", "1") != "0"
REDUCE_DTYPES = [torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
                 torch.float64]
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
SIZES = [1, 7, 1000, 300_001]          # 300,001 float64 are 2.4 MB: several chunks of the suite's 1 MiB window


def contribution(numel, dtype, op, rank):
    i = torch.arange(numel, dtype=torch.int64)
    if dtype == torch.bool:
        return (i + rank) % 3 == 0
    values = 1 + (i + rank) % 2 if op == hvd.Product else (3 * i + rank) % 11
    return values.to(dtype)


def same(gpu, cpu, dtype):
    assert gpu.device == DEVICE, gpu.device
    if dtype.is_floating_point:
        torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6,
                                   atol=1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6)
    else:
        assert torch.equal(gpu.cpu(), cpu)


def test_the_build_says_what_it_does():
    assert hvd.cuda_built() is True and hvd.nccl_built() == 0


@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("dtype", REDUCE_DTYPES, ids=str)           # torch's allreduce takes no bool (upstream)
def test_allreduce_on_the_gpu_equals_the_host_result(dtype, op_name):
    op = OPS[op_name]
    for numel in SIZES:
        host = contribution(numel, dtype, op, hvd.rank())
        gpu = host.to(DEVICE)
        want = hvd.allreduce(host, op=op, name=f"cpu.{op_name}.{numel}")
        same(hvd.allreduce(gpu, op=op, name=f"gpu.{op_name}.{numel}"), want, dtype)
        same(gpu, host, dtype)                      # the input is untouched
        hvd.allreduce_(gpu, op=op, name=f"gpu_.{op_name}.{numel}")
        same(gpu, want, dtype)


def test_the_cuda_ipc_plane_carried_them():
    hvd.allreduce(torch.ones(3, device=DEVICE), name="which.plane")
    planes = basics.engine_for(None).devices._planes
    assert (device_ipc.CUDA in planes) == IPC, planes


def test_grouped_allreduce_with_scale_factors():
    shapes = [(5,), (130, 3), (1,), (70_000,)]
    host = [contribution(int(torch.tensor(s).prod()), torch.float32, hvd.Sum, hvd.rank()).reshape(s) for s in shapes]
    want = hvd.grouped_allreduce(host, op=hvd.Average, prescale_factor=0.5, postscale_factor=3.0, name="cpu.g")
    got = hvd.grouped_allreduce([t.to(DEVICE) for t in host], op=hvd.Average, prescale_factor=0.5,
                                postscale_factor=3.0, name="gpu.g")
    for g, w in zip(got, want):
        same(g, w, torch.float32)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float16, torch.float32, torch.int64, torch.bool], ids=str)
def test_allgather_broadcast_alltoall_reducescatter_equal_the_host_results(dtype):
    rank, size = hvd.rank(), hvd.size()
    rows = contribution((rank + 1) * 2000, dtype, hvd.Sum, rank).reshape(rank + 1, 2000)
    same(hvd.allgather(rows.to(DEVICE), name="gpu.ag"), hvd.allgather(rows, name="cpu.ag"), dtype)
    grouped = hvd.grouped_allgather([rows.to(DEVICE), rows[:, :7].to(DEVICE)], name="gpu.gag")
    for g, w in zip(grouped, hvd.grouped_allgather([rows, rows[:, :7].contiguous()], name="cpu.gag")):
        same(g, w, dtype)
    for root in range(size):
        same(hvd.broadcast(rows[:1].to(DEVICE), root, name=f"gpu.bc{root}"),
             hvd.broadcast(rows[:1], root, name=f"cpu.bc{root}"), dtype)
    splits = torch.tensor([(rank + 2 * dst) % 3 for dst in range(size)], dtype=torch.int32)
    send = contribution(int(splits.sum()) * 300, dtype, hvd.Sum, rank).reshape(-1, 300)
    out, received = hvd.alltoall(send.to(DEVICE), splits=splits, name="gpu.a2a")
    want, want_received = hvd.alltoall(send, splits=splits, name="cpu.a2a")
    same(out, want, dtype)
    assert torch.equal(received, want_received)
    if dtype != torch.bool:
        block = contribution((2 * size + 1) * 500, dtype, hvd.Sum, rank).reshape(2 * size + 1, 500)
        same(hvd.reducescatter(block.to(DEVICE), op=hvd.Sum, name="gpu.rs"),
             hvd.reducescatter(block, op=hvd.Sum, name="cpu.rs"), dtype)


def test_a_tensor_made_on_another_stream_is_waited_for():
    side = torch.cuda.Stream(DEVICE)
    a = torch.randn(2048, 2048, device=DEVICE)
    torch.cuda.synchronize(DEVICE)
    for i in range(5):
        with torch.cuda.stream(side):
            t = (a @ a).sum(dim=0) * 0 + hvd.rank() + i     # slow to make, known value
            out = hvd.allreduce(t, op=hvd.Sum, name=f"side.{i}")
        want = sum(r + i for r in range(hvd.size()))
        torch.testing.assert_close(out.cpu(), torch.full((2048,), float(want)))


def _train(device, steps=4):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)).double().to(device)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=[(f"{device.type}.{n}", p) for n, p in model.named_parameters()])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(100 + hvd.rank())
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g, dtype=torch.float64).to(device)
        y = torch.randn(8, 4, generator=g, dtype=torch.float64).to(device)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().cpu() for p in model.parameters()]


def test_distributed_optimizer_on_cuda_equals_cpu():
    for gpu, cpu in zip(_train(DEVICE), _train(torch.device("cpu"))):
        torch.testing.assert_close(gpu, cpu, rtol=1e-9, atol=1e-10)


def _train_zero(device, steps=4):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)).double().to(device)
    opt = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=0.01, bucket_cap_bytes=1024,
                                      name=f"zero.{device.type}")
    g = torch.Generator().manual_seed(100 + hvd.rank())
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g, dtype=torch.float64).to(device)
        y = torch.randn(8, 4, generator=g, dtype=torch.float64).to(device)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    opt.consolidate_state_dict(to=0)
    state = opt.state_dict()["state"] if hvd.rank() == 0 else {}
    return [p.detach().cpu() for p in model.parameters()], state


def test_zero_redundancy_optimizer_on_cuda_equals_cpu():
    (gpu, gpu_state), (cpu, cpu_state) = _train_zero(DEVICE), _train_zero(torch.device("cpu"))
    for a, b in zip(gpu, cpu):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    assert sorted(gpu_state) == sorted(cpu_state)
    for i in gpu_state:
        torch.testing.assert_close(gpu_state[i]["exp_avg"], cpu_state[i]["exp_avg"], rtol=1e-9, atol=1e-10)


def test_sync_batch_norm_on_cuda_equals_cpu():
    g = torch.Generator().manual_seed(5 + hvd.rank())
    x = torch.randn(hvd.rank() + 2, 3, 4, generator=g, dtype=torch.float64)
    results = []
    for device in (torch.device("cpu"), DEVICE):
        bn = hvd.SyncBatchNorm(3).double().to(device)
        inp = x.detach().to(device).requires_grad_()
        out = bn(inp)
        (out * out).sum().backward()
        results.append((out.detach().cpu(), inp.grad.cpu(), bn.running_mean.cpu(), bn.running_var.cpu()))
    for cpu, gpu in zip(*results):
        torch.testing.assert_close(gpu, cpu, rtol=1e-9, atol=1e-9)
