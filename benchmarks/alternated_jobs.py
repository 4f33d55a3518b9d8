"""Benchmarks that compare jobs (ours, a peer's) run one after the other, several times in turn, so that the
machine's drift falls on every one of them alike: the runs, and the end of such a script (the table, the JSON)."""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Optional

from benchmarks.torch_scaling import _run

# name -> the command of its job writing its results to the path given (None: the job cannot run here)
Jobs = Dict[str, Callable[[Path], Optional[List[str]]]]


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options every such script takes: ranks, runs in turn, rounds inside a job, JSON, time limit."""
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="alternated runs of each job")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds inside a job")
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per job")


def alternate(jobs: Jobs, repeats: int, timeout: float) -> List[Dict[str, dict]]:
    """Run every job of ``jobs`` once per repeat, in turn; returns per repeat the results of the jobs that ran
    (what each one's rank 0 wrote)."""
    runs: List[Dict[str, dict]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            run: Dict[str, dict] = {}
            for name, command in jobs.items():
                out = Path(tmp) / f"{name}{i}.json"
                cmd = command(out)
                got = cmd and _run(cmd, out, timeout)
                if got:
                    run[name] = got
            runs.append(run)
    return runs


def finish(runs: List[Dict[str, dict]], lines: Callable[[List[Dict[str, dict]]], List[str]],
           options: dict, json_path: Optional[str]) -> int:
    """Print the table ``lines`` makes of ``runs`` and write everything to ``json_path``; 1 when no job ran."""
    if not any(runs):
        return 1
    print()
    print("\n".join(lines(runs)))
    if json_path:
        Path(json_path).write_text(json.dumps({"options": options, "runs": runs}, indent=1))
    return 0
