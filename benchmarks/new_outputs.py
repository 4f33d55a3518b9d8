"""An allreduce that returns a new array (``hvd.allreduce(x)``) against one in place (``hvd.allreduce_(x)``),
64 MB float32 on 2 ranks, with the output pool (the default) and without it (``HOROVOD_OUTPUT_POOL_BYTES=0``,
every new output freshly allocated, as before the pool), alternating in one run.

    python benchmarks/new_outputs.py [--np 2] [--bytes 67108864] [--iterations 20] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]


def run(np_: int, nbytes: int, iterations: int, pool: bool) -> Dict[str, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")]))
    if not pool:
        env["HOROVOD_OUTPUT_POOL_BYTES"] = "0"
    cmd = [sys.executable, "-m", "horovod.runner", "-np", str(np_), sys.executable,
           str(ROOT / "benchmarks" / "workers" / "new_output.py"), str(nbytes), str(iterations)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=True).stdout
    return json.loads(next(ln for ln in out.splitlines() if "RESULT " in ln).split("RESULT ", 1)[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--bytes", type=int, default=64 << 20)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs: Dict[str, List[Dict[str, float]]] = {"pool": [], "no pool": []}
    for _ in range(args.repeats):
        for kind in runs:
            runs[kind].append(run(args.np, args.bytes, args.iterations, kind == "pool"))
    gb = args.bytes / 1e9
    print(f"{args.bytes >> 20} MB float32 allreduce, {args.np} ranks, medians of {args.repeats} jobs (GB/s algbw):")
    print("| output pool | new array | in place | new / in place |")
    print("|---|---|---|---|")
    for kind, results in runs.items():
        new = statistics.median(r["new"] for r in results)
        in_place = statistics.median(r["in_place"] for r in results)
        print(f"| {kind} | {gb / new:.2f} | {gb / in_place:.2f} | {in_place / new:.2f} |")


if __name__ == "__main__":
    main()
