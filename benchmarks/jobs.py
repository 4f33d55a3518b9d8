"""Running one benchmark job under a time limit: the whole process group goes when it overruns.

``subprocess.run(timeout=...)`` kills only the launcher it started and raises; the ranks that ``torchrun`` or
``mpirun`` started may outlive it and load the machine for the next job. ``run_job`` starts the launcher in its
own session, and on timeout sends SIGTERM to the whole group (launchers stop their ranks on it), then SIGKILL.
``Deadline`` hands out per-job limits so that a series of jobs ends by a fixed time.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from typing import Dict, List, Optional, Tuple

log = logging.getLogger("benchmarks.jobs")
TIMED_OUT = 124


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_job(cmd: List[str], env: Optional[Dict[str, str]], cwd: str, timeout: float,
            grace: float = 5.0) -> Tuple[int, str]:
    """Run ``cmd`` (stdout and stderr together); returns (exit status, output). On timeout the job's process
    group gets SIGTERM, then SIGKILL after ``grace`` seconds, and the status is ``TIMED_OUT``."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=max(1.0, timeout))
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        log.error("timed out after %.0f s: %s", timeout, " ".join(cmd))
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        _signal_group(proc.pid, signal.SIGKILL)        # ranks that ignored SIGTERM while the launcher exited
        return TIMED_OUT, (out or "") + f"\n[timed out after {timeout:.0f} s]\n"


class Deadline:
    """A wall-clock time by which a series of jobs must end."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def limit(self, cap: float, minimum: float = 10.0) -> Optional[float]:
        """The time limit of the next job: ``cap``, or less to end by the deadline; None when under ``minimum``
        seconds are left (skip the job)."""
        left = self.left()
        return None if left < minimum else min(cap, left)
