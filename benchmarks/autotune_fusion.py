"""Autotune benchmark: the many-small-tensors workload, mistuned vs hand-tuned vs autotuned, in one run.

Runs ``benchmarks.workers.small_tensors`` (64 float32 tensors of 256 KB allreduced asynchronously per step, as
gradient hooks do) under this project's ``horovodrun``:

1. mistuned: HOROVOD_FUSION_THRESHOLD = 1 MiB, HOROVOD_CYCLE_TIME = 20 ms;
2. hand-tuned: a grid of thresholds and cycle times, each its own job; the best is the reference;
3. autotuned: HOROVOD_AUTOTUNE=1 starting from the mistuned values, with upstream's sample budget (3 warmup
   samples, 10 steps per sample, 5 samples per point, 20 Bayesian points, then the response cache on/off);
   once the tuner is done, the same timed steps as the others.

It prints the throughput of each and the figure: autotuned ÷ best hand-tuned (target ≥ 0.9), and writes
the autotuner's CSV log when ``--autotune-log`` is given.

    python benchmarks/autotune_fusion.py [--np 2] [--json out.json] [--autotune-log autotune.csv]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("benchmarks.autotune_fusion")
MIB = 1 << 20
GRID = [(4 * MIB, 1.0), (16 * MIB, 1.0), (64 * MIB, 1.0), (4 * MIB, 5.0), (16 * MIB, 5.0), (64 * MIB, 5.0)]


def _job(np: int, out: Path, env: Dict[str, str], args: List[str], timeout: float) -> Optional[dict]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    full.update(env)
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), full.get("PYTHONPATH")]))
    full.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "horovod.runner", "-np", str(np), sys.executable, "-m",
           "benchmarks.workers.small_tensors", str(out), *args]
    proc = subprocess.run(cmd, env=full, cwd=str(ROOT), timeout=timeout, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0 or not out.exists():
        log.error("job failed (exit %d):\n%s", proc.returncode, proc.stdout[-4000:])
        return None
    return json.loads(out.read_text())


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--json", help="write the numbers here")
    parser.add_argument("--autotune-log", help="keep the autotuner's CSV log here")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    steps = ["--steps", str(args.steps)]
    results: Dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        def fixed(label: str, threshold: int, cycle: float) -> Optional[dict]:
            got = _job(args.np, Path(tmp) / f"{label}.json", {"HOROVOD_FUSION_THRESHOLD": str(threshold),
                                                               "HOROVOD_CYCLE_TIME": str(cycle)}, steps, args.timeout)
            if got:
                got.update(threshold=threshold, cycle_ms=cycle)
                results[label] = got
                log.info("%-22s %7.1f steps/s", label, got["steps_per_s"])
            return got

        fixed("mistuned 1MB/20ms", MIB, 20.0)
        for threshold, cycle in GRID:
            fixed(f"hand {threshold // MIB}MB/{cycle:g}ms", threshold, cycle)
        csv = args.autotune_log or str(Path(tmp) / "autotune.csv")
        got = _job(args.np, Path(tmp) / "auto.json", {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": csv},
                   ["--mode", "autotune", "--start-threshold", str(MIB), "--start-cycle", "20", *steps],
                   args.timeout)
        if got is None:
            return 1
        results["autotuned"] = got
        log.info("%-22s %7.1f steps/s after %d tuning steps, tuned to %s", "autotuned", got["steps_per_s"],
                 got["tuning_steps"], got["tuned"])
    hand = {k: v for k, v in results.items() if k.startswith("hand")}
    best_label = max(hand, key=lambda k: hand[k]["steps_per_s"])
    best = hand[best_label]["steps_per_s"]
    auto = results["autotuned"]["steps_per_s"]
    mis = results["mistuned 1MB/20ms"]["steps_per_s"]
    tuned = results["autotuned"]["tuned"]
    print(f"\nmany small tensors (64 x 256 KB per step, {args.np} ranks):")
    print(f"  mistuned (1 MB, 20 ms): {mis:.1f} steps/s ({mis / best:.2f} x best hand-tuned)")
    print(f"  best hand-tuned ({best_label[5:]}): {best:.1f} steps/s")
    print(f"  autotuned from the mistuned start, after {results['autotuned']['tuning_steps']} steps "
          f"(threshold {tuned['fusion_threshold'] / MIB:.1f} MB, cycle {tuned['cycle_time_ms']:.1f} ms, "
          f"cache {'on' if tuned['cache_enabled'] else 'off'}): {auto:.1f} steps/s = {auto / best:.2f} x best "
          f"hand-tuned (target >= 0.9)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
