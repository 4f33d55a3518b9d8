"""Process-set benchmark: do disjoint process sets run as fast as jobs of their own?

In one run: a 2-rank job allreducing 64 MB (the baseline), a 4-rank job split into two disjoint 2-rank process
sets that allreduce 64 MB at the same time, and a 4-rank job allreducing 64 MB on the global set. Prints each
set's throughput against the 2-rank job (issue 13's target: >= 0.9x) and the two sets' aggregate against the
4-rank job. On a machine with fewer cores than 4 ranks need, the sets share the cores, so it also runs two
separate 2-rank jobs at the same time: what the sets would get if they were jobs of their own on this machine.
Runs are alternated and repeated so that all see the same load.

    python benchmarks/process_sets.py [--size 67108864] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("benchmarks.process_sets")


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_jobs(np_: int, mode: str, nbytes: int, jobs: int = 1, timeout: float = 600) -> List[dict]:
    """Seconds per allreduce reported by the first rank of every set, from ``jobs`` jobs started together."""
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for job in range(jobs):
            out = Path(tmp) / f"job{job}"
            cmd = [sys.executable, "-m", "horovod.runner", "-np", str(np_), sys.executable, "-m",
                   "benchmarks.workers.hvd_process_sets", str(out), mode, str(nbytes)]
            procs.append(subprocess.Popen(cmd, env=_env(), cwd=str(ROOT), stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        for proc in procs:
            output, _ = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                raise RuntimeError(f"{mode} job failed:\n{output[-3000:]}")
        return [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("job*.json"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64 << 20, help="bytes per allreduce (float32)")
    parser.add_argument("--repeats", type=int, default=3, help="alternations of the three jobs")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    samples: Dict[str, List[float]] = {"alone": [], "set": [], "global": [], "two_jobs": []}
    for _ in range(args.repeats):
        samples["alone"] += [r["seconds"] for r in run_jobs(2, "alone", args.size)]
        samples["set"] += [r["seconds"] for r in run_jobs(4, "sets", args.size)]
        samples["global"] += [r["seconds"] for r in run_jobs(4, "global", args.size)]
        samples["two_jobs"] += [r["seconds"] for r in run_jobs(2, "alone", args.size, jobs=2)]
    median = {k: statistics.median(v) for k, v in samples.items()}
    gb = args.size / 1e9
    alone, per_set, global_ = gb / median["alone"], gb / median["set"], gb / median["global"]
    two_jobs = gb / median["two_jobs"]
    print(f"\n64 MB float32 allreduce (median of {args.repeats} alternations, algbw GB/s)")
    print("| run | seconds per allreduce | algbw |")
    print("|---|---|---|")
    print(f"| 2-rank job alone | {median['alone'] * 1e3:.1f} ms | {alone:.2f} GB/s |")
    print(f"| each of 2 disjoint 2-rank sets, at once, in a 4-rank job | {median['set'] * 1e3:.1f} ms | "
          f"{per_set:.2f} GB/s |")
    print(f"| 4-rank job, global set | {median['global'] * 1e3:.1f} ms | {global_:.2f} GB/s |")
    print(f"| each of 2 separate 2-rank jobs, at once | {median['two_jobs'] * 1e3:.1f} ms | {two_jobs:.2f} GB/s |")
    print(f"\neach set / 2-rank job alone: {per_set / alone:.2f}x (target >= 0.9x; {os.cpu_count()} cores here)")
    print(f"each set / each of two separate 2-rank jobs at once (same cores shared): {per_set / two_jobs:.2f}x")
    print(f"both sets' aggregate ({2 * per_set:.2f} GB/s) / 4-rank job ({global_:.2f} GB/s): "
          f"{2 * per_set / global_:.2f}x")
    print("all samples (s): " + json.dumps(samples))


if __name__ == "__main__":
    main()
