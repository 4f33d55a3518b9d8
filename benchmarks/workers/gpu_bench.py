"""One rank of benchmarks/gpu_collectives.py (run under this project's launcher, every rank on the machine's GPU):
times CUDA allreduces on the CUDA IPC plane, staged through host memory (HOROVOD_CUDA_IPC=0, switched on every rank
at the same point), and through torch.distributed Gloo on the same CUDA tensors, then a synthetic MLP training step
with hvd.DistributedOptimizer against DistributedDataParallel over Gloo (NCCL refuses two ranks on one GPU).
Rank 0 writes the figures as JSON to the path given."""
from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

import horovod.torch as hvd


def timed(fn, repeats: int, warmup: int = 3) -> float:
    """Median seconds of ``fn()`` (which must leave the GPU idle when it returns)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def use_ipc(on: bool) -> None:
    os.environ["HOROVOD_CUDA_IPC"] = "1" if on else "0"
    hvd.barrier()


def model(device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024), nn.ReLU(),
                         nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(device)


def step_time(net, opt, device, repeats: int) -> float:
    g = torch.Generator(device=device).manual_seed(hvd.rank())
    x = torch.randn(256, 1024, device=device, generator=g)
    y = torch.randint(0, 10, (256,), device=device, generator=g)

    def step():
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        torch.cuda.synchronize(device)

    return timed(step, repeats)


def main(out_path: str) -> None:
    hvd.init()
    device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(device)
    port = 0                        # the same type on every rank: broadcast_object names itself by it
    if hvd.rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = hvd.broadcast_object(port, 0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(),
                            world_size=hvd.size())
    results = {"ranks": hvd.size(), "gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
               "allreduce": []}
    for nbytes in (4 << 10, 1 << 20, 16 << 20, 64 << 20):
        t = torch.ones(nbytes // 4, device=device)
        repeats = 30 if nbytes >= (16 << 20) else 200
        row = {"bytes": nbytes}
        use_ipc(True)
        row["ipc_s"] = timed(lambda t=t, n=nbytes: hvd.allreduce(t, name=f"ipc.{n}"), repeats)
        use_ipc(False)
        row["staged_s"] = timed(lambda t=t, n=nbytes: hvd.allreduce(t, name=f"staged.{n}"), repeats)
        row["gloo_s"] = timed(lambda t=t: (dist.all_reduce(t), torch.cuda.synchronize(device)), repeats)
        results["allreduce"].append(row)
    steps = {}
    for label, ipc in (("hvd_ipc", True), ("hvd_staged", False)):
        use_ipc(ipc)
        net = model(device)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.01),
                                       named_parameters=[(f"{label}.{n}", p) for n, p in net.named_parameters()])
        hvd.broadcast_parameters(net.state_dict(), root_rank=0)
        steps[label] = step_time(net, opt, device, 20)
    net = nn.parallel.DistributedDataParallel(model(device), device_ids=[device.index])
    steps["ddp_gloo"] = step_time(net, torch.optim.SGD(net.parameters(), lr=0.01), device, 20)
    results["step_s"] = steps
    results["params"] = sum(p.numel() for p in model("cpu").parameters())
    dist.destroy_process_group()
    if hvd.rank() == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
