"""One training step of a small MLP with horovod.torch's DistributedOptimizer or torch's DDP; run under horovodrun
(``hvd``) or torchrun (``ddp``).

    python -m benchmarks.workers.small_model_step hvd|ddp OUT.json MODELS [ROUNDS] [STEPS]

MODELS is a ``;``-separated list of layer widths (``784,128,10;256,64,64,10``): Linear layers with ReLU between,
float32, a batch of 32 random rows and cross-entropy, SGD; one torch thread per rank. Per model, ``ROUNDS`` rounds
of ``STEPS`` timed steps alternate between the distributed step and the same step on a local copy of the model
with a plain optimizer (no collective: what sharing the cores costs), so that the machine's drift falls on both;
rank 0 writes each one's median step time (seconds) and the model's parameter count and tensors.
"""
from __future__ import annotations

import copy
import statistics
import sys
import time
from typing import Callable, Dict, List, Tuple

import torch

from benchmarks.workers.timing import finish_job


def build(widths: List[int]) -> torch.nn.Module:
    layers: List[torch.nn.Module] = []
    for a, b in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def _timed(step: Callable[[], None], barrier: Callable[[], None], steps: int) -> float:
    for _ in range(max(10, steps // 10)):
        step()
    barrier()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def steps(widths: List[int], mode: str) -> Tuple[Callable[[], None], Callable[[], None], torch.nn.Module]:
    """The distributed step (``mode``: DistributedOptimizer or DDP) and the local one, on copies of one model."""
    torch.manual_seed(0)
    model = build(widths)
    local = copy.deepcopy(model)
    x, y = torch.randn(32, widths[0]), torch.randint(0, widths[-1], (32,))
    loss_fn = torch.nn.CrossEntropyLoss()
    if mode == "hvd":
        import horovod.torch as hvd
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                       named_parameters=model.named_parameters())
        dist_model = model
    else:
        dist_model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(dist_model.parameters(), lr=0.01)
    plain = torch.optim.SGD(local.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad()
        loss_fn(dist_model(x), y).backward()
        opt.step()

    def local_step() -> None:
        plain.zero_grad()
        loss_fn(local(x), y).backward()
        plain.step()

    return step, local_step, model


def main() -> None:
    mode, out, models = sys.argv[1], sys.argv[2], [[int(w) for w in m.split(",")] for m in sys.argv[3].split(";")]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    steps_per_round = int(sys.argv[5]) if len(sys.argv) > 5 else 300
    torch.set_num_threads(1)
    if mode == "hvd":
        import horovod.torch as hvd
        hvd.init()
        rank, barrier = hvd.rank(), hvd.barrier
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank, barrier = dist.get_rank(), dist.barrier
    results: Dict[str, dict] = {}
    for widths in models:
        step, local_step, model = steps(widths, mode)
        samples: Dict[str, List[float]] = {"step": [], "local": []}
        for _ in range(rounds):
            samples["step"].append(_timed(step, barrier, steps_per_round))
            samples["local"].append(_timed(local_step, barrier, steps_per_round))
        label = ",".join(str(w) for w in widths)
        results[label] = {"parameters": sum(p.numel() for p in model.parameters()),
                          "tensors": len(list(model.parameters())),
                          **{k: statistics.median(v) for k, v in samples.items()}}
        if rank == 0:
            print(f"{mode} {label}: step {results[label]['step'] * 1e6:.0f} us, local "
                  f"{results[label]['local'] * 1e6:.0f} us", flush=True)
    finish_job(out, {"mode": mode, "results": results}, rank, hvd.shutdown if mode == "hvd" else None)


if __name__ == "__main__":
    main()
