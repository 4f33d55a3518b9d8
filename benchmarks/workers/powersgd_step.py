"""One side of benchmarks/powersgd_links.py: the training step time of a ~10 M-parameter MLP, and the bytes its
host's ``eth0`` sent and received per step (``/proc/net/dev`` of the rank's own network namespace).

    python -m benchmarks.workers.powersgd_step hvd COMPRESSION RANK WARMUP STEPS     (under horovodrun)
    python -m torch.distributed.run ... -m benchmarks.workers.powersgd_step ddp HOOK RANK WARMUP STEPS

``COMPRESSION`` is ``none``, ``fp16``, ``bf16`` or ``powersgd`` (ours: ``hvd.DistributedOptimizer(compression=
hvd.Compression.powersgd(RANK, start_powerSGD_iter=START))``); ``HOOK`` is ``none`` (DDP's defaults) or
``powersgd`` (DDP's ``powerSGD_hook`` at the same rank and start, with one bucket: ``bucket_cap_mb`` above the
model's size, since torch's Gloo hook aborts with several). Rank 0 prints ``RESULT {json}``: every timed step's
seconds and every rank's bytes per step.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

BATCH = 32
START = 2                      # start_powerSGD_iter for ours and DDP's: the timed steps are compressed
LAYERS = (1024, 2048, 2048, 1792, 10)


def make_model() -> nn.Module:
    """An MLP of 9.99 M parameters (float32, 40 MB of gradients per step)."""
    torch.manual_seed(0)
    layers: List[nn.Module] = []
    for i, (a, b) in enumerate(zip(LAYERS[:-1], LAYERS[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(LAYERS) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def payload_bytes(model: nn.Module, compression: str, rank: int) -> int:
    """The bytes one rank allreduces per step: every gradient (2 bytes each with fp16 and bf16, else 4), or with
    PowerSGD its P and Q for the matrices it compresses (DDP's rule, min_compression_rate 2) and the rest as it
    is."""
    total = 0
    for p in model.parameters():
        n, m = p.shape[0], p.numel() // p.shape[0]
        r = min(n, m, rank)
        compressed = compression == "powersgd" and (n + m) * r * 2 < n * m
        total += (n + m) * r * 4 if compressed else p.numel() * (2 if compression in ("fp16", "bf16") else 4)
    return total


def net_bytes(interface: str = "eth0") -> Tuple[int, int]:
    """(received, sent) bytes of ``interface`` in this process's network namespace."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == interface:
                fields = rest.split()
                return int(fields[0]), int(fields[8])
    return 0, 0


def run_steps(step: Callable[[], None], warmup: int, steps: int) -> Tuple[List[float], Dict[str, float]]:
    """Seconds of each timed step (after ``warmup``), and the bytes per timed step on ``eth0``."""
    for _ in range(warmup):
        step()
    rx0, tx0 = net_bytes()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    rx1, tx1 = net_bytes()
    return times, {"rx": (rx1 - rx0) / steps, "tx": (tx1 - tx0) / steps}


def batch(rank: int) -> Tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(BATCH, LAYERS[0], generator=g), torch.randint(0, LAYERS[-1], (BATCH,), generator=g)


def horovod(compression: str, rank: int, warmup: int, steps: int) -> None:
    import horovod.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    model = make_model()
    x, y = batch(hvd.rank())
    chosen = (hvd.Compression.powersgd(matrix_approximation_rank=rank, start_powerSGD_iter=START)
              if compression == "powersgd" else getattr(hvd.Compression, compression))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                   named_parameters=model.named_parameters(), compression=chosen)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    times, wire = run_steps(step, warmup, steps)
    wires = hvd.allgather_object(wire)
    if hvd.rank() == 0:
        report("ours", compression, rank, hvd.size(), times, wires, model)
    hvd.shutdown()


def ddp(hook: str, rank: int, warmup: int, steps: int) -> None:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    model = make_model()
    size_mb = sum(p.numel() * 4 for p in model.parameters()) / 2 ** 20
    # One bucket for the hook (above the model's size); DDP's default (25 MB buckets) without it.
    module = DistributedDataParallel(model, bucket_cap_mb=int(size_mb) + 8 if hook == "powersgd" else None)
    if hook == "powersgd":
        state = PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=START,
                              min_compression_rate=2, use_error_feedback=True, warm_start=True)
        module.register_comm_hook(state, powerSGD_hook)
    x, y = batch(dist.get_rank())
    opt = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(module(x), y).backward()
        opt.step()

    times, wire = run_steps(step, warmup, steps)
    wires: List[dict] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(wires, wire)
    if dist.get_rank() == 0:
        report("ddp", hook, rank, dist.get_world_size(), times, wires, model)
    dist.destroy_process_group()


def report(who: str, compression: str, rank: int, size: int, times: List[float], wires: List[dict],
           model: nn.Module) -> None:
    """The one line the driver reads."""
    compressed = compression == "powersgd"
    print("RESULT " + json.dumps({
        "who": who, "compression": compression, "rank": rank if compressed else 0, "size": size, "times": times,
        "wire": wires, "payload": payload_bytes(model, compression, rank),
        "params": sum(p.numel() for p in model.parameters())}), flush=True)


def main(argv: List[str]) -> None:
    mode, compression, rank, warmup, steps = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    (horovod if mode == "hvd" else ddp)(compression, rank, warmup, steps)


if __name__ == "__main__":
    main(sys.argv[1:])
