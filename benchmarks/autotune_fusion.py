"""Autotune benchmark: the many-small-tensors workload, mistuned vs hand-tuned vs autotuned, in one run.

Runs ``benchmarks.workers.small_tensors`` (64 float32 tensors of 256 KB allreduced asynchronously per step, as
gradient hooks do) under this project's ``horovodrun``:

first autotuned (HOROVOD_AUTOTUNE=1) from the mistuned start (fusion threshold 1 MiB, cycle time 20 ms) with
upstream's sample budget (3 warmup samples, 10 steps per sample, 5 samples per point, 20 Bayesian points,
then the response cache on/off). The same processes then time, in alternating rounds, the mistuned values,
a hand-tuned grid of thresholds and cycle times, and the autotuned values.

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
    parser.add_argument("--steps", type=int, default=150, help="timed steps per configuration per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the numbers here")
    parser.add_argument("--autotune-log", help="keep the autotuner's CSV log here")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        csv = args.autotune_log or str(Path(tmp) / "autotune.csv")
        got = _job(args.np, Path(tmp) / "result.json", {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": csv},
                   ["--steps", str(args.steps), "--rounds", str(args.rounds)], args.timeout)
    if got is None:
        return 1
    configs = got["configs"]
    for name, row in configs.items():
        p = row["params"]
        print(f"  {name:<22} {row['steps_per_s']:7.1f} steps/s  (threshold {p['fusion_threshold'] / MIB:.1f} MB, "
              f"cycle {p['cycle_time_ms']:.1f} ms, cache {'on' if p['cache_enabled'] else 'off'}; rounds "
              f"{', '.join(f'{x:.1f}' for x in row['rounds'])})")
    hand = {k: v for k, v in configs.items() if k.startswith("hand")}
    best_label = max(hand, key=lambda k: hand[k]["steps_per_s"])
    best = hand[best_label]["steps_per_s"]
    auto, mis = configs["autotuned"]["steps_per_s"], configs["mistuned"]["steps_per_s"]
    print(f"\nmany small tensors ({got['tensors']} x {got['size'] * 4 // 1024} KB per step, {args.np} ranks), "
          f"autotuned in {got['tuning_steps']} steps from the mistuned start:")
    print(f"  mistuned {mis:.1f}, best hand-tuned ({best_label[5:]}) {best:.1f}, autotuned {auto:.1f} steps/s")
    print(f"  autotuned / best hand-tuned = {auto / best:.2f} (target >= 0.9); mistuned / best = {mis / best:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(got, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
