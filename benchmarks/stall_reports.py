"""How long a frozen rank goes unreported: time from the freeze to the first report, and to the end of the job.

Runs ``tests/integration/workers/freeze.py`` under this project's launcher: every rank streams allreduces, and
rank 1 stops itself with SIGSTOP inside a collective (the data-plane watchdog must notice), with the stall
inspector's knobs at ``--check`` and ``--shutdown`` seconds (the issue's figures: 5 and 10). For each plane and
run it prints the seconds from rank 1's stop to the first "Data plane stalled" report of any rank (its log
line's time) and to the launcher's exit, then the medians.

    python benchmarks/stall_reports.py [--np 2] [--runs 3] [--check 5] [--shutdown 10] [--planes shm,tcp]
"""
from __future__ import annotations

import argparse
import datetime
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "integration" / "workers" / "freeze.py"
PLANES = {"shm": {}, "tcp": {"HOROVOD_CPU_OPERATIONS": "tcp"}}
REPORT = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \[horovod WARNING rank \d+\] Data plane stalled")
log = logging.getLogger("benchmarks.stall_reports")


def one_run(np_: int, plane: str, check: float, shutdown: float, timeout: float) -> Optional[Tuple[float, float]]:
    """(seconds from the stop to the first report, seconds from the stop to the launcher's exit), or None."""
    with tempfile.TemporaryDirectory() as tmp:
        stop_file = Path(tmp) / "stopped"
        env = {**os.environ, **PLANES[plane], "STOP_FILE": str(stop_file),
               "HOROVOD_SHM_CHUNK_BYTES": "65536", "HOROVOD_TCP_CHUNK_BYTES": "65536",
               "HOROVOD_STALL_CHECK_TIME_SECONDS": str(check), "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(shutdown),
               "HOROVOD_FLIGHT_RECORDER_DIR": tmp,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, "-m", "horovod.runner", "-np", str(np_), sys.executable, str(WORKER), "16", "2", "120"]
        proc = subprocess.run(cmd, env=env, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
        ended = time.time()
        if not stop_file.exists():
            log.error("rank 1 never stopped:\n%s", proc.stdout[-3000:])
            return None
        stopped = float(stop_file.read_text().split()[0])
        reports = [datetime.datetime.strptime(m, "%Y-%m-%d %H:%M:%S,%f").timestamp() for m in REPORT.findall(proc.stdout)]
        if not reports:
            log.error("no report:\n%s", proc.stdout[-3000:])
            return None
        return min(reports) - stopped, ended - stopped


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--check", type=float, default=5.0)
    parser.add_argument("--shutdown", type=float, default=10.0)
    parser.add_argument("--planes", default="shm,tcp")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results: Dict[str, List[Tuple[float, float]]] = {}
    for run in range(opts.runs):
        for plane in opts.planes.split(","):
            got = one_run(opts.np, plane, opts.check, opts.shutdown, timeout=opts.shutdown + 120)
            if got is not None:
                results.setdefault(plane, []).append(got)
                log.info("run %d, %s: report %.2f s after the freeze, job ended %.2f s after it", run + 1, plane, *got)
    print(f"\nrank 1 frozen (SIGSTOP) inside a collective, {opts.np} ranks, stall check {opts.check:g} s, "
          f"shutdown {opts.shutdown:g} s:")
    print("| plane | freeze to report (s), median | freeze to job end (s), median | runs |")
    print("|---|---|---|---|")
    for plane, rows in results.items():
        print(f"| {plane} | {statistics.median(r[0] for r in rows):.2f} | {statistics.median(r[1] for r in rows):.2f} "
              f"| {len(rows)} |")
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
