"""What the elastic-training benchmarks and their workers share: the digits model and data of
``examples/pytorch/pytorch_digits.py`` (loaded from the example itself, so every peer trains the same network),
the timestamp files through which the workers tell the benchmark when things happened, and how the benchmarks
launch a job."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[2]
DIGITS_EXAMPLE = ROOT / "examples" / "pytorch" / "pytorch_digits.py"


def job_env() -> Dict[str, str]:
    """The environment of a benchmark job: this checkout importable, one thread per rank."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    # torchrun's default shares its agent's TCP store with the workers without a per-attempt key prefix, so the
    # restarted workers read the dead attempt's Gloo addresses and fail (torch 2.13); a store per attempt works.
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return env


def launch(cmd: List[str], timeout: float) -> None:
    """Run one job to its end; RuntimeError with the end of its output when it fails."""
    proc = subprocess.run(cmd, env=job_env(), cwd=str(ROOT), timeout=timeout, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"job failed (exit {proc.returncode}):\n{proc.stdout[-5000:]}")


def digits_example() -> ModuleType:
    """The digits example as a module: its ``Net`` and ``load_data`` (importing it starts nothing)."""
    spec = importlib.util.spec_from_file_location("pytorch_digits", DIGITS_EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def add_training_args(parser: argparse.ArgumentParser, steps: int, interval: str) -> None:
    """The options every digits worker takes: where to write, how long to train, when to save and to die."""
    parser.add_argument("out", help="directory for the timestamp files")
    parser.add_argument("--steps", type=int, default=steps, help="optimizer steps in all")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.02, help="for one rank (scaled by size)")
    parser.add_argument(interval, type=int, default=10, help="steps between two saves of the state")
    parser.add_argument("--kill-step", type=int, default=0, help="0: nobody is killed")


def stamp(out_dir: str, name: str, **fields: Any) -> None:
    """Write ``{"time": time.time(), **fields}`` to ``<out_dir>/<name>.json`` (atomically: readers never see half
    a file). Wall-clock time, so that stamps written by different processes compare."""
    fields.setdefault("time", time.time())
    path = Path(out_dir) / f"{name}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(fields))
    os.replace(tmp, path)


def kill_self(out_dir: str, **fields: Any) -> None:
    """Record the kill time, then SIGKILL this process (no clean-up runs: a crashed worker)."""
    stamp(out_dir, "kill", pid=os.getpid(), **fields)
    os.kill(os.getpid(), signal.SIGKILL)
