"""Horovod on Spark against horovodrun on this machine, in one run, alternated: start-up and training throughput.

Spark is ``local-cluster[2,1,1024]`` (two executor JVMs with one core each, ``tests/support/spark.py``), started
once before the measurements: the SparkSession is already running, as it is for a user of ``horovod.spark.run``
(its own start-up, reported once, is not in the ratio).

1. **Start-up** (2 ranks): from the call of ``horovod.spark.run`` to the first allreduce done in its function
   (``hvd.init()`` of horovod.torch, then one allreduce), against ``horovodrun -np 2`` running the same function
   in a script, from the launch to the same point. The latest rank's clock is taken.
2. **Training throughput**: the digits network of ``examples/pytorch/pytorch_digits.py`` (its ``Net`` and data;
   batch 32 per rank, one torch thread per rank, ``hvd.DistributedOptimizer``) under ``horovod.spark.run`` and
   under ``horovodrun -np 2``; samples/s summed over the ranks, measured inside the training loop.

    python benchmarks/spark_integration.py [--repeats 5] [--train-repeats 3] [--epochs 30] [--json out.json]

Prints medians (and ranges) and the ratios. Run it under the shared CPU lock.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "pytorch"
for _path in (str(ROOT), str(ROOT / "src"), str(EXAMPLES)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

log = logging.getLogger("benchmarks.spark_integration")


def first_allreduce() -> float:
    """A rank's start: ``hvd.init()`` and one allreduce; the wall-clock time when it is done."""
    import torch

    import horovod.torch as hvd

    hvd.init()
    hvd.allreduce(torch.ones(4), name="first")
    return time.time()


def train(epochs: int, batch_size: int = 32, lr: float = 0.02, seed: int = 42) -> float:
    """One rank's digits training (pytorch_digits' network and data); returns its samples/s."""
    import pytorch_digits
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    import horovod.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)
    torch.manual_seed(seed + rank)
    train_set, _ = pytorch_digits.load_data()
    sampler = DistributedSampler(train_set, num_replicas=size, rank=rank, shuffle=True, seed=seed)
    loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    model = pytorch_digits.Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr * size, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    samples, began = 0, time.perf_counter()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for data, target in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(data), target).backward()
            optimizer.step()
            samples += len(target)
    return samples / (time.perf_counter() - began)


def _horovodrun(worker_args: List[str], timeout: float) -> List[float]:
    """Run this script's worker mode on 2 ranks under horovodrun; each rank's printed figure."""
    cmd = [sys.executable, "-m", "horovod.runner", "-np", "2", sys.executable, __file__] + worker_args
    done = subprocess.run(cmd, env=dict(os.environ), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"horovodrun failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return [float(line.split("FIGURE ", 1)[1]) for line in done.stdout.splitlines() if "FIGURE " in line]


def startup_horovodrun(timeout: float) -> float:
    began = time.time()
    return max(_horovodrun(["--worker", "startup"], timeout)) - began


def startup_spark() -> float:
    import horovod.spark

    began = time.time()
    return max(horovod.spark.run(first_allreduce, num_proc=2, verbose=0)) - began


def train_horovodrun(epochs: int, timeout: float) -> float:
    return sum(_horovodrun(["--worker", "train", "--epochs", str(epochs)], timeout))


def train_spark(epochs: int) -> float:
    import horovod.spark

    return sum(horovod.spark.run(train, args=(epochs,), num_proc=2, verbose=0))


def _summary(values: List[float]) -> Dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}


def _measure(args: argparse.Namespace) -> Dict[str, dict]:
    from tests.support.spark import spark_session

    loads: List[float] = []
    began = time.time()
    with spark_session(app_name="horovod-spark-benchmark"):
        session_s = time.time() - began
        startup: Dict[str, List[float]] = {"horovodrun": [], "horovod.spark.run": []}
        for rep in range(args.repeats):
            loads.append(os.getloadavg()[0])
            startup["horovodrun"].append(startup_horovodrun(args.timeout))
            startup["horovod.spark.run"].append(startup_spark())
            log.info("start-up %d: %s", rep, {k: round(v[-1], 2) for k, v in startup.items()})
        train_figures: Dict[str, List[float]] = {"horovodrun": [], "horovod.spark.run": []}
        for rep in range(args.train_repeats):
            loads.append(os.getloadavg()[0])
            train_figures["horovodrun"].append(train_horovodrun(args.epochs, args.timeout))
            train_figures["horovod.spark.run"].append(train_spark(args.epochs))
            log.info("training %d: %s", rep, {k: round(v[-1]) for k, v in train_figures.items()})
    return {"spark_session_start_s": session_s,
            "startup_s": {k: _summary(v) for k, v in startup.items()},
            "samples_per_s": {k: _summary(v) for k, v in train_figures.items()},
            "load_1min": _summary(loads)}


def _report(result: Dict[str, dict]) -> None:
    print(f"1-minute load during the run: {result['load_1min']['min']:.2f}-{result['load_1min']['max']:.2f}")
    print(f"SparkSession start (local-cluster[2,1,1024], once, not in the ratio): "
          f"{result['spark_session_start_s']:.1f} s")
    base = result["startup_s"]["horovodrun"]["median"]
    print("start-up to the first allreduce, 2 ranks (median [min-max] s, ratio to horovodrun):")
    for name, s in result["startup_s"].items():
        print(f"  {name:20s} {s['median']:6.2f} [{s['min']:.2f}-{s['max']:.2f}]  x{s['median'] / base:.2f}")
    base = result["samples_per_s"]["horovodrun"]["median"]
    print("digits training throughput, 2 ranks (median [min-max] samples/s, ratio to horovodrun):")
    for name, s in result["samples_per_s"].items():
        print(f"  {name:20s} {s['median']:8.0f} [{s['min']:.0f}-{s['max']:.0f}]  x{s['median'] / base:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="alternated start-up measurements of each")
    parser.add_argument("--train-repeats", type=int, default=3, help="alternated training measurements of each")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--worker", choices=["startup", "train"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        figure = first_allreduce() if args.worker == "startup" else train(args.epochs)
        print(f"FIGURE {figure!r}", flush=True)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    # The ranks (under horovodrun and in the Spark executors) import horovod and pytorch_digits from here.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(EXAMPLES),
                                                             os.environ.get("PYTHONPATH")]))
    result = _measure(args)
    _report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
