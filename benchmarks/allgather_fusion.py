"""Allgather fusion: a burst of async allgathers (submitted together, then waited), fused against unfused.

Fusion is on by default (``HOROVOD_FUSION_THRESHOLD``); ``HOROVOD_FUSION_THRESHOLD=0`` turns it off, so the two
runs differ in that alone. They alternate ``--repeats`` times; the script prints the median burst time of each
and the speed-up.

    python benchmarks/allgather_fusion.py [--np 2] [--count 50] [--bytes 4096] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict

ROOT = Path(__file__).resolve().parents[1]


def run(np_: int, count: int, nbytes: int, iterations: int, fused: bool) -> float:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")]))
    if not fused:
        env["HOROVOD_FUSION_THRESHOLD"] = "0"
    cmd = [sys.executable, "-m", "horovod.runner", "-np", str(np_), sys.executable,
           str(ROOT / "benchmarks" / "workers" / "allgather_burst.py"), str(count), str(nbytes), str(iterations)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=True).stdout
    line = next(ln for ln in out.splitlines() if "RESULT " in ln)
    return json.loads(line.split("RESULT ", 1)[1])["median_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--count", type=int, default=50, help="allgathers per burst")
    parser.add_argument("--bytes", type=int, default=4096, help="bytes each rank contributes to each allgather")
    parser.add_argument("--iterations", type=int, default=50, help="timed bursts per job")
    parser.add_argument("--repeats", type=int, default=3, help="alternations of the two jobs")
    args = parser.parse_args()
    results: Dict[str, list] = {"fused": [], "unfused": []}
    for _ in range(args.repeats):
        for kind in ("unfused", "fused"):
            results[kind].append(run(args.np, args.count, args.bytes, args.iterations, kind == "fused"))
    fused, unfused = statistics.median(results["fused"]), statistics.median(results["unfused"])
    print(f"{args.count} allgathers of {args.bytes} B per rank, {args.np} ranks, medians of {args.repeats} jobs:")
    print(f"  unfused (HOROVOD_FUSION_THRESHOLD=0): {unfused * 1e3:8.2f} ms per burst")
    print(f"  fused (default):                      {fused * 1e3:8.2f} ms per burst")
    print(f"  speed-up: {unfused / fused:.2f} x")


if __name__ == "__main__":
    main()
