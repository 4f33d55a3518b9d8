"""A/B inside one job: torch ``DistributedOptimizer``'s unused-parameter check in a small MLP's step, as a round of
its own (A: the rank masks summed in a blocking fast round after the gradients) or as one float32 that goes with
the small gradients' grouped allreduce (B: each rank's count of parameters without a gradient; the masks only
when it is not zero, docs/torch.md). Both sides are the same optimizer: the blocks alternate in lockstep on every
rank (the VM's drift between jobs moves a step by 20 % and more), switching the flag in the optimizer's plan.
Run it under ``horovodrun``; rank 0 prints, per model (MLP layer widths), the median step time of each side (µs)
and B / A:

    horovodrun -np 2 python benchmarks/unused_flag_ab.py [--models "784,128,10;256,64,64,10"] [--blocks 16]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.workers.small_model_step import build

MODELS = "784,128,10;256,64,64,10;784,256,128,10"
STEPS = 200         # timed steps per block
WARM = 20           # untimed steps after each switch


def compare(hvd, widths: List[int], blocks: int) -> Dict[bool, float]:
    """Median step time (µs) with the flag going with the gradients (True) and as a round of its own (False)."""
    torch.manual_seed(0)
    model = build(widths)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), 0)
    x, y = torch.randn(32, widths[0]), torch.randint(0, widths[-1], (32,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(100):
        step()                                  # the plan is made at the first step
    plan = opt._small_plan
    if not plan.flag:
        raise SystemExit(f"{widths}: the flag does not go with the gradients here (no fast rounds, or no room)")
    times: Dict[bool, List[float]] = {True: [], False: []}
    for block in range(blocks):
        flag = block % 2 == 0
        opt._small_plan = plan._replace(flag=flag)
        for _ in range(WARM):
            step()
        hvd.barrier()
        start = time.perf_counter()
        for _ in range(STEPS):
            step()
        times[flag].append((time.perf_counter() - start) / STEPS * 1e6)
    opt._small_plan = plan
    return {flag: statistics.median(values) for flag, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=MODELS, help="layer widths per model, models separated by ';'")
    parser.add_argument("--blocks", type=int, default=16, help="timed blocks, alternating between the sides")
    args = parser.parse_args()
    import horovod.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    if hvd.rank() == 0:
        print(f"# {hvd.size()} ranks; µs per step, medians of {args.blocks // 2} blocks of {STEPS} steps per side")
        print("| model (widths) | A: masks in a round of their own | B: the count with the gradients | B / A |")
        print("|---|---|---|---|")
    for spec in args.models.split(";"):
        got = compare(hvd, [int(w) for w in spec.split(",")], args.blocks)
        if hvd.rank() == 0:
            print(f"| {spec} | {got[False]:.0f} | {got[True]:.0f} | {got[True] / got[False]:.3f} |", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
