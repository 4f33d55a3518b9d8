"""Elastic steady-state cost: training throughput under ``hvd.elastic.run`` (a commit every 10 steps) against the
same training without elastic, on the digits model at 2 ranks.

Both run ``benchmarks/workers/elastic_digits.py`` (the CNN of ``examples/pytorch/pytorch_digits.py``, batch 32
per rank, ``--steps`` steps) on the same two hosts of this machine (``localhost:1,127.0.0.1:1``, so both use the
same data plane):

- **plain**: ``horovodrun -np 2 -H localhost:1,127.0.0.1:1 ... --plain``: ``hvd.DistributedOptimizer``, a
  ``DistributedSampler``, parameters broadcast once;
- **elastic**: ``horovodrun -np 2 --min-np 2 -H localhost:1,127.0.0.1:1 ...``: the elastic driver, ``TorchState``
  with the model, optimizer and ``ElasticSampler``, ``state.commit()`` every ``--commit-every`` steps.

Rank 0 times the steps after ``--warmup`` (start-up excluded). The two alternate ``--repeats`` times; it prints
the median steps/s of each and the ratio elastic / plain (issue 14's target: >= 0.95), the ratio of the best runs
(on a shared machine the other jobs only ever slow a run down), and the share of the elastic window spent in
``state.commit()``, as rank 0 timed it.

    python benchmarks/elastic_throughput.py [--repeats 3] [--steps 300] [--commit-every 10] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "benchmarks" / "workers" / "elastic_digits.py"
sys.path.insert(0, str(ROOT))
from benchmarks.workers.elastic_common import launch  # noqa: E402

log = logging.getLogger("benchmarks.elastic_throughput")


def run_job(args: argparse.Namespace, elastic: bool) -> Dict[str, float]:
    """Steps per second of one job, from rank 0's clock, and the share of its timed window spent in commits."""
    launcher = ["-np", "2", "--min-np", "2"] if elastic else ["-np", "2"]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "horovod.runner", *launcher, "-H", args.hosts, sys.executable, str(WORKER), tmp,
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch-size", str(args.batch_size),
               "--commit-every", str(args.commit_every)] + ([] if elastic else ["--plain"])
        log.info("running: %s", " ".join(cmd))
        launch(cmd, args.timeout)
        stamp = json.loads((Path(tmp) / "throughput.json").read_text())
    window = stamp["time"] - stamp["start"]
    return {"steps_per_s": stamp["steps"] / window, "commit_share": stamp["commit_seconds"] / window,
            "commit_ms": 1e3 * stamp["commit_seconds"] / max(stamp["commits"], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each, alternated")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20, help="steps not timed (start-up)")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--commit-every", type=int, default=10)
    parser.add_argument("--hosts", default="localhost:1,127.0.0.1:1", help="-H of both jobs")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per job")
    parser.add_argument("--json", help="write the raw results here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    runs: Dict[str, List[Dict[str, float]]] = {"plain": [], "elastic": []}
    for i in range(args.repeats):
        for name in ("plain", "elastic"):
            runs[name].append(run_job(args, elastic=name == "elastic"))
            log.info("%s run %d: %.1f steps/s", name, i + 1, runs[name][-1]["steps_per_s"])
    samples = {name: [r["steps_per_s"] for r in results] for name, results in runs.items()}
    plain, elastic = statistics.median(samples["plain"]), statistics.median(samples["elastic"])
    print(f"\nDigits CNN, 2 ranks (-H {args.hosts}), batch {args.batch_size} per rank, steps {args.warmup}.."
          f"{args.steps} timed, median of {args.repeats} alternated runs, {os.cpu_count()} cores")
    print("| run | steps/s (median) | min | max |")
    print("|---|---|---|---|")
    print(f"| (a) plain hvd.DistributedOptimizer | {plain:.1f} | {min(samples['plain']):.1f} | "
          f"{max(samples['plain']):.1f} |")
    print(f"| (b) hvd.elastic.run, commit every {args.commit_every} steps | {elastic:.1f} | "
          f"{min(samples['elastic']):.1f} | {max(samples['elastic']):.1f} |")
    best = max(samples["elastic"]) / max(samples["plain"])
    print(f"\n(b) / (a): {elastic / plain:.3f} (target >= 0.95: {'met' if elastic / plain >= 0.95 else 'NOT met'}); "
          f"best run of each: {best:.3f} (other jobs on the machine only ever slow a run down)")
    share = statistics.median(r["commit_share"] for r in runs["elastic"])
    commit_ms = statistics.median(r["commit_ms"] for r in runs["elastic"])
    print(f"(b)'s commits: {commit_ms:.1f} ms each, {100 * share:.1f}% of its timed window (medians): the part of "
          "the cost that the load on the machine does not blur")
    print("all samples (steps/s): " + json.dumps(samples))
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
