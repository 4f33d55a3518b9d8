"""A/B of two source trees on the ResNet-18-sized step, in one run: does a change cost anything?

Runs ``benchmarks/workers/torch_hvd_step.py`` (53 torch gradients, 46 MB, ``allreduce_async_`` each then
``synchronize``) under each tree's own launcher, ``--pairs`` times, alternating A and B so that drift in the
machine hits both alike, and prints each side's median step time and the ratio B / A. A tree is a folder that
holds ``horovod/`` (a checkout's ``src``); extra environment for one side goes in ``--env-a`` / ``--env-b``
(``KEY=VALUE``, repeatable), so the same tree can be compared with a knob on and off.

    python benchmarks/ab_step.py --a /tmp/old/src --b src [--np 2] [--pairs 6] [--env-b HOROVOD_X=0]
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
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.jobs import run_job  # noqa: E402

log = logging.getLogger("benchmarks.ab_step")


def step_seconds(tree: Path, np_: int, extra: Dict[str, str], timeout: float) -> Optional[float]:
    """One job of the step under ``tree``'s launcher: rank 0's median seconds per step, or None."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "step.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1", **extra,
               "PYTHONPATH": os.pathsep.join([str(tree.resolve()), str(ROOT)])}
        cmd = [sys.executable, "-m", "horovod.runner", "-np", str(np_), sys.executable, "-m",
               "benchmarks.workers.torch_hvd_step", str(out)]
        code, output = run_job(cmd, env, str(ROOT), timeout)
        if code != 0 or not out.exists():
            log.error("%s failed (exit %d):\n%s", tree, code, output[-3000:])
            return None
        return float(json.loads(out.read_text())["step_53"])


def _env_pairs(items: List[str]) -> Dict[str, str]:
    return dict(item.split("=", 1) for item in items)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", required=True, help="tree A (holds horovod/)")
    parser.add_argument("--b", required=True, help="tree B (holds horovod/)")
    parser.add_argument("--env-a", action="append", default=[], help="KEY=VALUE for A's jobs")
    parser.add_argument("--env-b", action="append", default=[], help="KEY=VALUE for B's jobs")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=300)
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sides = {"A": (Path(opts.a), _env_pairs(opts.env_a)), "B": (Path(opts.b), _env_pairs(opts.env_b))}
    times: Dict[str, List[float]] = {"A": [], "B": []}
    for pair in range(opts.pairs):
        for side in (("A", "B") if pair % 2 == 0 else ("B", "A")):
            tree, extra = sides[side]
            got = step_seconds(tree, opts.np, extra, opts.timeout)
            if got is not None:
                times[side].append(got)
                log.info("pair %d, %s: %.2f ms", pair + 1, side, got * 1e3)
    if not times["A"] or not times["B"]:
        return 1
    a, b = statistics.median(times["A"]), statistics.median(times["B"])
    print(f"\nResNet-18-sized step, {opts.np} ranks, {opts.pairs} alternated pairs: A {a * 1e3:.2f} ms "
          f"({opts.a} {' '.join(opts.env_a)}), B {b * 1e3:.2f} ms ({opts.b} {' '.join(opts.env_b)}), "
          f"B / A = {b / a:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
