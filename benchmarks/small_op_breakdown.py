"""Where a small allreduce's time goes (issue 15): a 4 KB float32 allreduce at 2 ranks on one host.

Runs ``benchmarks/workers/small_op_timeline.py`` under ``horovodrun -np 2`` (shm plane) in several
configurations (the defaults, ``HOROVOD_SPIN_MICROSECONDS``, ``HOROVOD_CYCLE_TIME``, the ranks pinned to
cores), and ``benchmarks/workers/small_op_raw.py`` for the pieces alone (socket round trips between processes,
thread hand-offs). Prints, per configuration, the latency distribution of each call path and the median of each
stage of one op, taken from stamps on both ranks' shared clock; writes everything as JSON with ``--json``.

    python benchmarks/small_op_breakdown.py [--iters 3000] [--runs 3] [--configs default,spin0] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("benchmarks.small_op_breakdown")

# name -> (environment overrides, worker --pin)
CONFIGS: Dict[str, Tuple[Dict[str, str], str]] = {
    "default": ({}, "none"),
    "spin0": ({"HOROVOD_SPIN_MICROSECONDS": "0"}, "none"),
    "spin1000": ({"HOROVOD_SPIN_MICROSECONDS": "1000"}, "none"),
    "cycle0": ({"HOROVOD_CYCLE_TIME": "0"}, "none"),
    "cycle5": ({"HOROVOD_CYCLE_TIME": "5"}, "none"),
    "pin-split": ({}, "split"),
    "pin-same": ({}, "same"),
    "pin-split-spin0": ({"HOROVOD_SPIN_MICROSECONDS": "0"}, "split"),
}
ONCE = {0: ["call", "enqueue", "enqueued", "request_0", "request_1", "send_L", "sent_L", "apply", "plane",
            "barrier", "barrier_done", "plane_done", "completed", "return"],
        1: ["call", "enqueue", "send_R", "sent_R", "enqueued", "apply", "plane", "barrier", "barrier_done",
            "plane_done", "completed", "return"]}
WAKES = ("unblock", "poll_hit")
TAIL_ONLY = 10


def pct(values: List[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def dist(ns: List[int]) -> str:
    us = [v / 1e3 for v in ns]
    return " / ".join(f"{pct(us, q):6.1f}" for q in (0.1, 0.5, 0.9, 0.99))


def _env(extra: Dict[str, str]) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    for key in ("HOROVOD_SPIN_MICROSECONDS", "HOROVOD_CYCLE_TIME"):
        env.pop(key, None)
    env.update(extra)
    return env


def run_job(name: str, iters: int, torch: bool, tmp: Path) -> Optional[List[dict]]:
    """One ``horovodrun -np 2`` job of the timeline worker; both ranks' results."""
    extra, pin = CONFIGS[name]
    prefix = tmp / name
    cmd = [sys.executable, "-m", "horovod.runner", "-np", "2", sys.executable, "-m",
           "benchmarks.workers.small_op_timeline", str(prefix), "--iters", str(iters), "--pin", pin]
    if torch:
        cmd.append("--torch")
    proc = subprocess.run(cmd, env=_env(extra), cwd=str(ROOT), timeout=600, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    paths = [Path(f"{prefix}.{r}.json") for r in (0, 1)]
    if proc.returncode != 0 or not all(p.exists() for p in paths):
        log.error("%s failed (exit %d):\n%s", name, proc.returncode, proc.stdout[-3000:])
        return None
    ranks = [json.loads(p.read_text()) for p in paths]
    for p in paths:
        p.unlink()
    return ranks


def _last(events: List[list], tag: str, n: int) -> Optional[List[int]]:
    times = [t for e, t in events if e == tag]
    return times[-n:] if len(times) >= n else None


def _wake(events: List[list], lo: int, hi: int) -> Tuple[str, int]:
    """How an engine thread learned of a message sent at ``lo`` and acted on at ``hi``: the first wake-up in
    between (``unblock``: it slept in the kernel; ``poll_hit``: it was polling), else ``busy``."""
    for e, t in events:
        if lo <= t <= hi and e in WAKES:
            return e, t
    return "busy", hi


def stages(ranks: List[dict], n: int) -> Tuple[Dict[str, List[float]], Dict[str, int]]:
    """Per-op stage durations (µs) from both ranks' stamps, and how each engine thread woke."""
    ev = [r["stamped"] for r in ranks]
    n -= TAIL_ONLY          # the first ops' earliest stamps may predate the clear on the other rank
    t = [{tag: _last(ev[r], tag, n) for tag in ONCE[r]} for r in (0, 1)]
    missing = [f"rank {r} {tag}" for r in (0, 1) for tag, v in t[r].items() if v is None]
    if missing:
        raise RuntimeError(f"stamps missing: {missing}")
    out: Dict[str, List[float]] = {}
    wakes: Dict[str, int] = {}

    def add(label: str, value: float) -> None:
        out.setdefault(label, []).append(value / 1e3)

    t0, t1 = t
    for k in range(n):
        start = max(t0["call"][k], t1["call"][k])
        add("e2e rank 0 (call to return)", t0["return"][k] - t0["call"][k])
        add("e2e rank 1 (call to return)", t1["return"][k] - t1["call"][k])
        add("op e2e (later call to later return)", max(t0["return"][k], t1["return"][k]) - start)
        add("ranks' call skew (|call0 - call1|)", abs(t0["call"][k] - t1["call"][k]))
        for r, tr in ((0, t0), (1, t1)):
            add(f"r{r} op layer: call -> enqueue", tr["enqueue"][k] - tr["call"][k])
        add("r1 send R (user thread, sendall)", t1["sent_R"][k] - t1["send_R"][k])
        how, woke = _wake(ev[0], t1["sent_R"][k], t0["request_1"][k])
        wakes[f"r0 engine on R: {how}"] = wakes.get(f"r0 engine on R: {how}", 0) + 1
        add("r0 engine wake after R sent", woke - t1["sent_R"][k])
        add("r0 recv + decode R", t0["request_1"][k] - woke)
        add("r0 own request: enqueued -> taken by engine", t0["request_0"][k] - t0["enqueued"][k])
        ready = max(t0["request_0"][k], t1["sent_R"][k], t0["request_1"][k])
        add("r0 both requests in -> send L (negotiate, plan)", t0["send_L"][k] - ready)
        add("r0 send L (pack + sendall)", t0["sent_L"][k] - t0["send_L"][k])
        how, woke = _wake(ev[1], t0["sent_L"][k], t1["apply"][k])
        wakes[f"r1 engine on L: {how}"] = wakes.get(f"r1 engine on L: {how}", 0) + 1
        add("r1 engine wake after L sent", woke - t0["sent_L"][k])
        add("r1 recv + decode L", t1["apply"][k] - woke)
        for r, tr in ((0, t0), (1, t1)):
            add(f"r{r} apply -> plane (decode, cache, executor)", tr["plane"][k] - tr["apply"][k])
            add(f"r{r} plane: copy in", tr["barrier"][k] - tr["plane"][k])
            add(f"r{r} plane: barrier (incl. wait for peer)", tr["barrier_done"][k] - tr["barrier"][k])
            add(f"r{r} plane: reduce + copy out", tr["plane_done"][k] - tr["barrier_done"][k])
            add(f"r{r} plane done -> handle completed", tr["completed"][k] - tr["plane_done"][k])
            add(f"r{r} completed -> caller returns (wake-up)", tr["return"][k] - tr["completed"][k])
        add("plane entry skew (r1 plane - r0 plane)", t1["plane"][k] - t0["plane"][k])
        add("start -> r0 send L", t0["send_L"][k] - start)
    return out, wakes


def raw_pieces(iters: int) -> Dict[str, List[int]]:
    """The pieces alone (one process pair, two threads), one-way ns."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.workers.small_op_raw", "--iters", str(iters)],
                          env=_env({}), cwd=str(ROOT), timeout=600, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(proc.stdout)


def report_job(name: str, run: int, ranks: List[dict], iters: int) -> dict:
    """Print one job's distributions and stage medians; return the summary kept in the JSON."""
    print(f"\n== {name} run {run}  (p10 / p50 / p90 / p99 µs per call, rank 0 | rank 1)")
    summary: dict = {"config": name, "run": run, "latency": {}, "raw": {}}
    for path in ranks[0]["latency"]:
        print(f"  {path:<18} {dist(ranks[0]['latency'][path])} | {dist(ranks[1]['latency'][path])}")
        summary["latency"][path] = [pct(ranks[r]["latency"][path], 0.5) / 1e3 for r in (0, 1)]
    for piece in ranks[0]["raw"]:
        print(f"  raw {piece:<14} {dist(ranks[0]['raw'][piece])} | {dist(ranks[1]['raw'][piece])}")
        summary["raw"][piece] = [pct(ranks[r]["raw"][piece], 0.5) / 1e3 for r in (0, 1)]
    try:
        per_stage, wakes = stages(ranks, iters)
    except RuntimeError as exc:
        log.error("%s: %s", name, exc)
        return summary
    print("  stamped op, median µs (p90):")
    for label, values in per_stage.items():
        print(f"    {label:<52} {pct(values, 0.5):7.1f}  ({pct(values, 0.9):7.1f})")
    counted = iters - TAIL_ONLY
    print("  engine wake-ups: " + ", ".join(f"{k} {v / counted:.0%}" for k, v in sorted(wakes.items())))
    summary["stages"] = {k: [pct(v, 0.1), pct(v, 0.5), pct(v, 0.9)] for k, v in per_stage.items()}
    summary["wakes"] = {k: v / counted for k, v in wakes.items()}
    return summary


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=2, help="jobs per configuration, interleaved")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--no-raw", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"load average before: {' '.join(load)}")
    result: dict = {"load_before": load, "jobs": []}
    if not args.no_raw:
        result["raw"] = raw = raw_pieces(20000)
        print("raw pieces, one-way µs (p10 / p50 / p90 / p99):")
        for piece, ns in raw.items():
            print(f"  {piece:<40} {dist(ns)}")
    names = [c for c in args.configs.split(",") if c]
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            for name in names:
                ranks = run_job(name, args.iters, torch=name == "default", tmp=Path(tmp))
                if ranks is not None:
                    result["jobs"].append(report_job(name, run, ranks, args.iters))
    with open("/proc/loadavg") as f:
        result["load_after"] = f.read().split()[:3]
    print(f"\nload average after: {' '.join(result['load_after'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
