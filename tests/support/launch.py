"""Run N ranks through the project's own launcher, with a hard timeout and stack dumps of hung ranks.

Multi-rank test bodies live in ``tests/parallel``. Each rank runs the same pytest file (mpi4py-style, written
once and run at 1, 2, 3 and 4 ranks); ``tests/parallel/conftest.py`` registers faulthandler on SIGUSR1, so
when the timeout fires we signal every rank, wait for their stacks to land in the captured output, then stop
the job's process group, which we started, by id.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import psutil

ROOT = Path(__file__).resolve().parents[2]
PARALLEL = ROOT / "tests" / "parallel"


class RanksHung(AssertionError):
    """The job outlived its timeout; the message carries every rank's stack dump and output."""


def horovodrun(np: int, command: Sequence[str], hosts: Optional[str] = None, extra_args: Sequence[str] = (),
               env: Optional[Dict[str, str]] = None, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """Launch ``command`` on ``np`` ranks with ``python -m horovod.runner`` and return its completed process.

    On timeout, dumps the stacks of all ranks (SIGUSR1 -> faulthandler), kills the job and raises RanksHung.
    """
    args = [sys.executable, "-m", "horovod.runner", "-np", str(np)]
    if hosts:
        args += ["-H", hosts]
    args += list(extra_args) + list(command)
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), full_env.get("PYTHONPATH")]))
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env, cwd=str(ROOT),
                            start_new_session=True, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(args, proc.returncode, out, "")
    except subprocess.TimeoutExpired:
        out = _dump_and_kill(proc)
        raise RanksHung(f"{np}-rank job did not finish within {timeout:.0f}s: {' '.join(command)}\n"
                        f"--- output and stack dumps of every rank ---\n{out}") from None


def _dump_and_kill(proc: subprocess.Popen) -> str:
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    for child in children:
        try:
            child.send_signal(signal.SIGUSR1)
        except psutil.NoSuchProcess:
            pass
    time.sleep(2.0)
    for pid in [proc.pid] + [c.pid for c in children]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    out, _ = proc.communicate(timeout=30)
    return out or ""


def run_parallel_tests(np: int, test_file: str, hosts: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                       timeout: float = 180.0, pytest_args: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """Run ``tests/parallel/<test_file>`` inside every rank of an ``np``-rank job; assert every rank passed."""
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-o", "addopts=",
               str(PARALLEL / test_file), *pytest_args]
    result = horovodrun(np, command, hosts=hosts, env=env, timeout=timeout)
    assert result.returncode == 0, (f"{test_file} failed at {np} ranks (exit {result.returncode}):\n"
                                    f"{result.stdout[-20000:]}")
    passed = [line for line in result.stdout.splitlines() if " passed" in line]
    assert len(passed) >= np, f"expected a pytest summary from each of {np} ranks:\n{result.stdout[-5000:]}"
    return result


def rank_lines(output: str, rank: int) -> List[str]:
    """The lines a given rank printed (launcher prefix stripped)."""
    prefixes = (f"[{rank}]<stdout>:", f"[{rank}]<stderr>:")
    return [line.split(":", 1)[1] for line in output.splitlines() if line.startswith(prefixes)]
