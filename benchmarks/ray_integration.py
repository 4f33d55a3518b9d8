"""Horovod on Ray against horovodrun on this machine, in one run, alternated: start-up and training throughput.

1. **Start-up** (2 workers): from ``RayExecutor.start()`` to the first allreduce done in the first ``run()``'s
   function (``hvd.init()`` of horovod.torch, then one allreduce), against ``horovodrun -np 2`` running the same
   function in a script, from the launch to the same point. The latest rank's clock is taken. Reported twice for
   Ray: with ``ray.init()`` (a local Ray started) **outside** the timed span (a cluster that already runs, the
   usual case) and **inside** it.
2. **Training throughput**: ``examples/ray/ray_digits.py``'s ``train`` (the digits network, batch 32 per worker,
   one torch thread per worker) under ``RayExecutor.run`` and under ``horovodrun -np 2``; samples/s summed over
   the workers, measured inside the training loop. Ray starts its worker processes at nice 15 (its
   ``worker_niceness``), so on a machine where other work competes for the cores its workers get less CPU than
   horovodrun's ranks at nice 0: Ray is measured as it comes and with ``RAY_worker_niceness=0``.

    python benchmarks/ray_integration.py [--repeats 5] [--train-repeats 3] [--epochs 30] [--json out.json]

Each repeat measures every variant once, in an order reversed on every other repeat. Prints medians (and
ranges), the ratio of the medians, and the median of the per-repeat ratios. Ray's files go to a private temporary directory, removed at the end.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "ray"))

log = logging.getLogger("benchmarks.ray_integration")


def first_allreduce() -> float:
    """A worker's start: ``hvd.init()`` and one allreduce; the wall-clock time when it is done."""
    import torch

    import horovod.torch as hvd

    hvd.init()
    hvd.allreduce(torch.ones(4), name="first")
    return time.time()


def _horovodrun(np: int, worker_args: List[str], timeout: float) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                                      os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "horovod.runner", "-np", str(np), sys.executable, __file__] + worker_args
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"horovodrun failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _records(out: str, tag: str) -> List[dict]:
    return [json.loads(line.split(tag, 1)[1]) for line in out.splitlines() if tag in line]


def startup_horovodrun(timeout: float) -> float:
    began = time.time()
    stamps = _records(_horovodrun(2, ["--worker", "startup"], timeout), "STARTUP ")
    return max(s["done"] for s in stamps) - began


def startup_ray(ray_init: Callable[[], None], inside: bool) -> float:
    import ray

    from horovod.ray import RayExecutor

    if not inside:
        ray_init()
    began = time.time()
    if inside:
        ray_init()
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2)
    try:
        executor.start()
        elapsed = max(executor.run(first_allreduce)) - began
    finally:
        executor.shutdown()
        ray.shutdown()
    return elapsed


def train_horovodrun(epochs: int, timeout: float) -> float:
    records = _records(_horovodrun(2, ["--worker", "train", "--epochs", str(epochs)], timeout), "TRAIN ")
    return sum(r["samples_per_s"] for r in records)


def train_ray(ray_init: Callable[[], None], epochs: int, niceness: Optional[int] = None) -> float:
    """The digits training under RayExecutor; ``niceness`` sets Ray's ``RAY_worker_niceness`` for the local Ray
    (Ray starts its workers at nice 15 by default)."""
    import ray
    import ray_digits

    from horovod.ray import RayExecutor

    if niceness is not None:
        os.environ["RAY_worker_niceness"] = str(niceness)
    try:
        ray_init()
    finally:
        os.environ.pop("RAY_worker_niceness", None)
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2)
    try:
        executor.start()
        results = executor.run(ray_digits.train, kwargs={"epochs": epochs, "batch_size": 32, "lr": 0.02})
    finally:
        executor.shutdown()
        ray.shutdown()
    return sum(r["samples_per_s"] for r in results)


def _worker(kind: str, epochs: int) -> None:
    """One rank under horovodrun: prints its record on a tagged line."""
    if kind == "startup":
        print("STARTUP " + json.dumps({"done": first_allreduce()}), flush=True)
    else:
        import ray_digits

        record = ray_digits.train(epochs=epochs, batch_size=32, lr=0.02)
        print("TRAIN " + json.dumps(record), flush=True)


def _summary(values: List[float]) -> Dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}


def _alternate(rep: int, runs: Dict[str, Callable[[], float]], into: Dict[str, List[float]]) -> None:
    """One measurement of each; the order is reversed on every other repeat, so that drift in the machine's
    load falls on both sides."""
    names = list(runs) if rep % 2 == 0 else list(reversed(runs))
    for name in names:
        into[name].append(runs[name]())


def _paired_ratios(values: Dict[str, List[float]]) -> Dict[str, dict]:
    """Each variant's value over horovodrun's in the same repeat: the median of these is robust to drift."""
    base = values["horovodrun"]
    return {name: _summary([v / b for v, b in zip(series, base)]) for name, series in values.items()
            if name != "horovodrun" and series}


def _measure(args: argparse.Namespace, ray_init: Callable[[], None]) -> Dict[str, dict]:
    startup_runs = {"horovodrun": lambda: startup_horovodrun(args.timeout),
                    "ray (ray.init outside)": lambda: startup_ray(ray_init, inside=False),
                    "ray (ray.init inside)": lambda: startup_ray(ray_init, inside=True)}
    train_runs = {"horovodrun": lambda: train_horovodrun(args.epochs, args.timeout),
                  "ray": lambda: train_ray(ray_init, args.epochs),
                  "ray (workers at nice 0)": lambda: train_ray(ray_init, args.epochs, niceness=0)}
    startup: Dict[str, List[float]] = {name: [] for name in startup_runs}
    train: Dict[str, List[float]] = {name: [] for name in train_runs}
    loads = []
    for rep in range(args.repeats):
        loads.append(os.getloadavg()[0])
        _alternate(rep, startup_runs, startup)
        log.info("start-up %d: %s", rep, {k: round(v[-1], 2) for k, v in startup.items()})
    for rep in range(args.train_repeats):
        loads.append(os.getloadavg()[0])
        _alternate(rep, train_runs, train)
        log.info("training %d: %s", rep, {k: round(v[-1]) for k, v in train.items()})
    return {"startup_s": {k: _summary(v) for k, v in startup.items() if v},
            "startup_ratio": _paired_ratios(startup) if args.repeats else {},
            "samples_per_s": {k: _summary(v) for k, v in train.items() if v},
            "samples_ratio": _paired_ratios(train) if args.train_repeats else {},
            "load_1min": _summary(loads)}


def _report(result: Dict[str, dict]) -> None:
    print(f"1-minute load during the run: {result['load_1min']['min']:.2f}-{result['load_1min']['max']:.2f}")
    tables = [("startup_s", "startup_ratio", "start-up to the first allreduce, 2 workers, s", "{:8.2f}"),
              ("samples_per_s", "samples_ratio", "digits training throughput, 2 workers, samples/s", "{:8.0f}")]
    for key, ratio_key, title, fmt in tables:
        if not result[key]:
            continue
        print(f"{title}: median [min-max]; ratio to horovodrun: of the medians, and median [min-max] of the "
              "per-repeat ratios")
        base = result[key]["horovodrun"]["median"]
        for name, s in result[key].items():
            line = f"  {name:24s} {fmt.format(s['median'])} [{fmt.format(s['min']).strip()}-" \
                   f"{fmt.format(s['max']).strip()}]  x{s['median'] / base:.3f}"
            if name in result[ratio_key]:
                r = result[ratio_key][name]
                line += f"  paired x{r['median']:.3f} [{r['min']:.3f}-{r['max']:.3f}]"
            print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="alternated start-up measurements of each (0: none)")
    parser.add_argument("--train-repeats", type=int, default=3, help="alternated training measurements of each")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--worker", choices=["startup", "train"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.epochs)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    tmp = Path(tempfile.mkdtemp(prefix="hvdray-bench-"))
    (tmp / "ray").mkdir()
    os.environ["RAY_TMPDIR"] = str(tmp)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT / "examples" / "ray"),
                                                             os.environ.get("PYTHONPATH")]))

    def ray_init() -> None:
        import ray

        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)

    try:
        result = _measure(args, ray_init)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
