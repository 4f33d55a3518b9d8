"""Measure flakiness instead of guessing it: repeat tests, and sweep a training example's seed.

``repeat`` runs pytest on the given node ids ``--runs`` times, each run in a fresh pytest process, and counts the
failures of every test (with the first lines of each failure), so that a test that fails one time in twenty shows
up as 1/20 rather than as luck::

    python -m tests.support.reliability repeat --runs 20 tests/integration/test_torch_examples.py

With ``--np N`` the node ids are bodies in ``tests/parallel`` and every run is one N-rank job of them (each rank
runs pytest; a failure on any rank fails the run)::

    python -m tests.support.reliability repeat --runs 20 --np 3 \\
        tests/parallel/test_torch_adasum.py::test_adasum_training_converges_on_digits

``seeds`` runs a training command once per seed (``{seed}`` in the command is replaced) and prints the held-out
accuracy each run reports ("test accuracy ...: X%"), with the minimum, median and maximum. The
spread over seeds stands in for what a different CPU (other kernels, other summation orders) does to one seed's
run, so a test's threshold goes below the minimum, with a stated margin::

    python -m tests.support.reliability seeds --runs 10 -- \\
        python -m horovod.runner -np 2 python examples/pytorch/pytorch_digits.py --epochs 20 --seed {seed}
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]
# "test accuracy on 450 held-out digits: 97.56% (2 ranks)", "test accuracy on the held-out digits: 95.1% ...",
# "test accuracy: 96.2% with 2 workers": every digits example's report.
ACCURACY = re.compile(r"test accuracy[^:%\n]*: ([\d.]+)%")
FAILED = re.compile(r"^(?:\[\d+\]<std\w+>:)?(?:FAILED|ERROR) (\S+)(?: - (.*))?$", re.M)    # a rank's lines are prefixed
log = logging.getLogger("tests.support.reliability")


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")]))
    return env


def repeat(node_ids: Sequence[str], runs: int, np: int = 0) -> Counter:
    """Run pytest on ``node_ids`` ``runs`` times (with ``np``, inside every rank of an ``np``-rank job); returns how
    often each test failed (and logs each failure)."""
    failures: Counter = Counter()
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE"]
    if np:
        pytest = [sys.executable, "-m", "horovod.runner", "-np", str(np), *pytest, "-o", "addopts="]
    for run in range(1, runs + 1):
        start = time.perf_counter()
        proc = subprocess.run([*pytest, *node_ids], cwd=str(ROOT), env=_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        found = FAILED.findall(proc.stdout)
        for test, why in found:
            failures[test] += 1
            log.warning("run %d: %s failed: %s", run, test, (why or "")[:300])
        if proc.returncode not in (0, 1) or (proc.returncode == 1 and not found):
            failures[f"<pytest exit {proc.returncode}>"] += 1
            log.warning("run %d: pytest exited %d:\n%s", run, proc.returncode, proc.stdout[-2000:])
        summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "(no output)"
        log.info("run %d/%d in %.0f s: %s", run, runs, time.perf_counter() - start, summary)
    return failures


def accuracy_of(output: str) -> Optional[float]:
    """The last held-out accuracy (in %) a digits example printed, or None."""
    found = ACCURACY.findall(output)
    return float(found[-1]) if found else None


def seeds(command: Sequence[str], runs: int, first: int = 0, timeout: float = 600) -> List[Optional[float]]:
    """Run ``command`` with ``{seed}`` replaced by ``first``, ``first + 1``, ...; the accuracy of each run."""
    results: List[Optional[float]] = []
    for seed in range(first, first + runs):
        cmd = [part.replace("{seed}", str(seed)) for part in command]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=str(ROOT), env=_env(), capture_output=True, text=True, timeout=timeout)
        accuracy = accuracy_of(proc.stdout + proc.stderr)
        results.append(accuracy)
        log.info("seed %d: %s in %.0f s (exit %d)", seed, "no accuracy line" if accuracy is None else f"{accuracy}%",
                 time.perf_counter() - start, proc.returncode)
        if accuracy is None:
            log.warning("seed %d printed:\n%s", seed, (proc.stdout + proc.stderr)[-2000:])
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    rep = sub.add_parser("repeat", help="run pytest node ids N times and count failures")
    rep.add_argument("--runs", type=int, default=20)
    rep.add_argument("--np", type=int, default=0, help="run tests/parallel bodies in an N-rank job")
    rep.add_argument("node_ids", nargs="+")
    sweep = sub.add_parser("seeds", help="run a training command once per seed ({seed} in it)")
    sweep.add_argument("--runs", type=int, default=10)
    sweep.add_argument("--first", type=int, default=0)
    sweep.add_argument("command", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if opts.what == "repeat":
        failures = repeat(opts.node_ids, opts.runs, opts.np)
        for test, count in failures.most_common():
            print(f"{count}/{opts.runs} failed: {test}")
        print(f"{sum(failures.values())} failure(s) in {opts.runs} runs of {' '.join(opts.node_ids)}")
        return 1 if failures else 0
    command = opts.command[1:] if opts.command[:1] == ["--"] else opts.command
    found = seeds(command, opts.runs, opts.first)
    values = [v for v in found if v is not None]
    print("accuracies: " + ", ".join("-" if v is None else f"{v:.2f}" for v in found))
    if values:
        print(f"min {min(values):.2f}  median {statistics.median(values):.2f}  max {max(values):.2f}  "
              f"({len(values)} of {len(found)} runs reported)")
    return 0 if len(values) == len(found) else 1


if __name__ == "__main__":
    sys.exit(main())
